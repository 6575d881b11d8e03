//go:build !nodemo

package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/cmd/idem/internal/operate"
	"github.com/idem-go/idem/idemdriver"
)

// refundsConsumer is the consumer of the work the demo stages for the
// console (--console): a consumer of its own, so that nothing the report
// counts (the payments and receipts consumers' records, their outbox rows)
// changes.
const refundsConsumer = "idem-demo-refunds"

// refundsDestination is where the staged refunds' events would go: no
// broker has it, so their publish fails for good.
const refundsDestination = "idem.demo.refunds.issued"

// The staged refunds: the ones refused for good, the one whose lease is
// held, and the ones whose event cannot be published.
var (
	refundsRefused = []string{"refund-0001", "refund-0002", "refund-0003"}
	refundHeld     = "refund-0004"
	refundsEvents  = []string{"refund-0005", "refund-0006"}
)

// errCardExpired and errNoRoute are the staged failures' causes.
var (
	errCardExpired = errors.New("refund refused by the provider: card expired")
	errNoRoute     = fmt.Errorf("no route to %s", refundsDestination)
)

// heldLease is how long the staged lease is held: longer than anyone
// looks at the console, so it shows as in progress with a growing age.
const heldLease = time.Hour

// refundPayload is the body of the staged refund id.
func refundPayload(id string) []byte { return []byte(`{"refund_id":"` + id + `"}`) }

// stageForConsole writes, under refundsConsumer, the work an operator
// opens the console for: refunds that failed for good (lease mode, a
// permanent error each: failed records with their cause), one refund whose
// lease is held and never settled (a lease in progress, with its holder
// token and age), and outbox rows whose publish failed for good (grouped by
// their error). It runs after the report, so the report and the verdict
// are those of the run. Run again on a kept --dir it adds nothing: the
// failed records stay failed, the held lease stays held (or is taken
// again once expired), and the outbox rows are staged only while the
// outbox holds neither pending nor failed rows (a relay that fails rows
// for good would otherwise touch rows of the run).
func (r *demoRun) stageForConsole(ctx context.Context) error {
	st := r.st.Store
	lc, err := idem.NewLeaseConsumer(st, idem.Config{Name: refundsConsumer, PurgeInterval: -1})
	if err != nil {
		return err
	}
	defer lc.Close()
	refuse := func(context.Context, *idem.Attempt) (idem.Result, error) {
		return idem.Result{}, idem.Permanent(errCardExpired)
	}
	for _, id := range refundsRefused {
		out, err := lc.Process(ctx, idem.Message{ID: id, Payload: refundPayload(id)}, refuse)
		if out.Status != idem.Failed {
			return fmt.Errorf("stage the refused refund %s: %s, %w", id, out.Status, err)
		}
	}
	fp, err := idem.SHA256Fingerprint(refundPayload(refundHeld))
	if err != nil {
		return err
	}
	if _, err := st.Acquire(ctx, &idemdriver.AcquireParams{Consumer: refundsConsumer, MessageID: refundHeld, Fingerprint: fp, Lease: heldLease}); err != nil {
		return fmt.Errorf("stage the held lease: %w", err)
	}
	backlog, err := st.OutboxStats(ctx)
	if err != nil || backlog.Pending > 0 || backlog.Failed > 0 {
		return err
	}
	tx, err := r.st.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var rows []idemdriver.OutgoingRecord
	for _, id := range refundsEvents {
		rows = append(rows, idemdriver.OutgoingRecord{ID: idem.OutgoingID(refundsConsumer, id, "issued", 0), Consumer: refundsConsumer,
			SourceID: id, Destination: refundsDestination, Key: id, Payload: refundPayload(id)})
	}
	if err := st.EmitTx(ctx, tx, &idemdriver.EmitParams{Consumer: refundsConsumer, Messages: rows}); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	relay, err := idem.NewRelay(idem.RelayConfig{Store: st, Retention: -1, Logger: slog.New(slog.DiscardHandler),
		Publisher: idem.PublisherFunc(func(_ context.Context, msgs []idem.Outgoing) []error {
			errs := make([]error, len(msgs))
			for i := range msgs {
				errs[i] = idem.Permanent(errNoRoute)
			}
			return errs
		})})
	if err != nil {
		return err
	}
	res, err := relay.RunOnce(ctx)
	if err == nil && res.Failed != len(rows) {
		err = fmt.Errorf("stage the failed outbox rows: %d failed, want %d", res.Failed, len(rows))
	}
	return err
}

// listenConsole listens on --console-addr, refused beyond loopback (the
// console the demo serves has no token). The refusal names the demo's own
// flag and points to idem console for a console with a token: the demo has
// no --token.
func listenConsole(addr string) (net.Listener, error) {
	if err := operate.CheckListen(addr, ""); err != nil {
		if errors.Is(err, operate.ErrExposed) {
			return nil, UsageError{fmt.Errorf("--console-addr %s: %w; the demo's console has none: listen on 127.0.0.1:PORT, [::1]:PORT or localhost:PORT, "+
				"or keep the demo's store (--dir) and serve it with idem console --token", addr, operate.ErrExposed)}
		}
		return nil, UsageError{fmt.Errorf("--console-addr %q: want HOST:PORT, as in %s", addr, operate.DefaultConsoleAddr)}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--console-addr: %w", err)
	}
	return ln, nil
}

// serveConsole serves the console on the demo's store on ln until ctx
// ends, after staging its work (stageForConsole), and tells stderr where
// it is.
func (r *demoRun) serveConsole(ctx context.Context, ln net.Listener, stderr io.Writer) error {
	if err := r.stageForConsole(ctx); err != nil {
		return fmt.Errorf("console: %w", err)
	}
	reg := prometheus.NewRegistry()
	srv, err := console.New(console.Config{
		Store: r.st.Store, Where: r.st.Where,
		Logger:     slog.New(slog.NewJSONHandler(stderr, nil)),
		Registerer: reg, Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
	})
	if err != nil {
		return err
	}
	url := "http://" + ln.Addr().String() + "/"
	fmt.Fprintf(stderr, "idem demo: console on %s (%s); its failed work is under the consumer %s. Ctrl-C stops it.\n", url, r.st.Where, refundsConsumer)
	if r.o.consoleUp != nil {
		r.o.consoleUp(url)
	}
	return operate.Serve(ctx, ln, srv)
}
