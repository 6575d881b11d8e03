package operate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/idem-go/idem/cmd/idem/internal/console"
)

// DefaultConsoleAddr is where the console listens by default: loopback
// only.
const DefaultConsoleAddr = "127.0.0.1:8089"

// ErrExposed means a console would listen beyond the loopback interface
// without a token.
var ErrExposed = errors.New("the console would listen beyond this machine without a token")

// CheckListen refuses addr when its host is not a loopback address (an
// empty host is every interface) and token is empty.
func CheckListen(addr, token string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return UsageError{fmt.Errorf("--addr %q: want HOST:PORT, as in %s", addr, DefaultConsoleAddr)}
	}
	if token != "" || host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return UsageError{fmt.Errorf("%w: --addr %s; set --token (or IDEM_CONSOLE_TOKEN), or listen on 127.0.0.1", ErrExposed, addr)}
}

func newConsoleCmd(open Opener, openBroker BrokerOpener) *cobra.Command {
	var (
		sf                     storeFlags
		broker                 string
		deadLetters            []string
		addr, token            string
		readOnly, showPayloads bool
	)
	cmd := &cobra.Command{
		Use:   "console",
		Short: "Serve a web console of the store: consumers, failed work, dead letters, messages, and the retry, release, replay and purge actions",
		Long: `console serves a web console on --addr (127.0.0.1:8089 by default): the
consumers and the outbox backlog, the failed records and leases in progress
of a consumer, the outbox rows failed for good grouped by error, one
message's record; with --broker, the dead letters of each --dead-letter
destination grouped by cause; and the actions retry, release, replay
(a dead letter to its source) and purge now, each confirmed on a
page of its own before it runs, CSRF-protected, run once per confirmation
and audit-logged to stderr (JSON). Every page has a JSON twin under /api/.

Safe by default: it listens on loopback only, and refuses any other address
without --token (or IDEM_CONSOLE_TOKEN), which every request must then
carry (a sign-in cookie, or Authorization: Bearer); --read-only removes
every action; outbox payloads are hidden unless --show-payloads.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if token == "" {
				token = os.Getenv("IDEM_CONSOLE_TOKEN")
			}
			if err := CheckListen(addr, token); err != nil {
				return err
			}
			if broker == "" {
				broker = os.Getenv("IDEM_BROKER")
			}
			var dls console.DeadLetters
			if broker != "" {
				bf := brokerFlags{broker: broker}
				d, closeBroker, err := bf.open(cmd.Context(), openBroker)
				if err != nil {
					return err
				}
				defer closeBroker()
				dls = d
			}
			st, err := sf.open(cmd.Context(), open)
			if err != nil {
				return err
			}
			defer st.Close()
			if err := console.Probe(cmd.Context(), st.Store); err != nil {
				return fmt.Errorf("%s: %w", st.Where, err)
			}
			reg := prometheus.NewRegistry()
			log := slog.New(slog.NewJSONHandler(cmd.ErrOrStderr(), nil))
			srv, err := console.New(console.Config{
				Store: st.Store, Where: st.Where, Token: token, ReadOnly: readOnly, ShowPayloads: showPayloads,
				DeadLetters: dls, DeadLetterDests: deadLetters,
				Logger: log, Registerer: reg, Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
			})
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "idem console on http://%s/ (%s)\n", ln.Addr(), st.Where)
			return Serve(cmd.Context(), ln, srv)
		},
	}
	sf.add(cmd)
	cmd.Flags().StringVar(&addr, "addr", DefaultConsoleAddr, "listen address; beyond loopback only with --token")
	cmd.Flags().StringVar(&token, "token", "", "access token every request must carry (or IDEM_CONSOLE_TOKEN)")
	cmd.Flags().BoolVar(&readOnly, "read-only", false, "no actions at all")
	cmd.Flags().BoolVar(&showPayloads, "show-payloads", false, "show payloads and headers (outbox rows, dead letters) and the store's own error messages")
	cmd.Flags().StringVar(&broker, "broker", "", "broker URL of the dead letters: nats://..., redis://..., kafka://... (or IDEM_BROKER)")
	cmd.Flags().StringArrayVar(&deadLetters, "dead-letter", nil, "a dead-letter destination the dead-letters page lists, DEST or DEST=CONSUMER (repeatable)")
	return cmd
}

// The console server's timeouts: a client that sends its request slowly,
// or reads the answer slowly, or keeps an idle connection, does not keep
// a connection (and its goroutine) for longer.
const (
	ReadHeaderTimeout = 10 * time.Second
	ReadTimeout       = 30 * time.Second
	WriteTimeout      = 60 * time.Second
	IdleTimeout       = 2 * time.Minute
)

// Serve serves h on ln until ctx ends, then shuts down within 5 seconds,
// with the timeouts above.
func Serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	hs := &http.Server{Handler: h, ReadHeaderTimeout: ReadHeaderTimeout, ReadTimeout: ReadTimeout,
		WriteTimeout: WriteTimeout, IdleTimeout: IdleTimeout}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = hs.Shutdown(sctx)
	<-errc
	return nil
}
