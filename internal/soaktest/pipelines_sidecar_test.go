package soaktest

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemnats"
)

// The sidecar pipeline's names and environment.
const (
	sideStream   = "SIDE"
	sideIn       = "side.in"
	sideDead     = "side.in.dead" // idem consume's default on NATS: FROM.dead
	sideGroup    = "soak-side"
	idemBinEnv   = "IDEM_SOAK_IDEM_BIN"
	sideArgsEnv  = "IDEM_SOAK_SIDE_ARGS" // the flags of idem consume, one per line
	sideConsumer = "soak-side"
)

// buildIdem builds cmd/idem (as interop's tests do, so that they share
// the build cache) into dir and returns the binary's path.
func buildIdem(dir string) (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "idem")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/idem")
	cmd.Dir = filepath.Join(wd, "..", "..")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/idem: %v\n%s", err, out)
	}
	return bin, nil
}

// service is the sidecar's HTTP service: it counts the requests of each
// message ID (Idem-Message-Id) and answers 200.
type service struct {
	mu    sync.Mutex
	calls map[string]int
}

func (s *service) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get("Idem-Message-Id")
	s.mu.Lock()
	s.calls[id]++
	s.mu.Unlock()
	_, _ = w.Write([]byte("ok"))
}

func (s *service) snapshot() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.calls)
}

// --- idem consume (the sidecar, at most once) on MariaDB (lease mode) and
// NATS JetStream ---

type sidecar struct {
	bin    string
	args   []string
	pg     *pgNATS // its NATS server and proxy
	stream jetstream.Stream
	svc    *service
	http   *httptest.Server
}

// startSidecar sets the pipeline up on pg-nats's NATS and mariadb-amqp's
// MariaDB, both through their proxies; bin is the idem binary.
func startSidecar(t *testing.T, bin string, pg *pgNATS, my *mariadbAMQP) *sidecar {
	p := &sidecar{bin: bin, pg: pg, svc: &service{calls: map[string]int{}}}
	p.http = httptest.NewServer(p.svc)
	t.Cleanup(p.http.Close)
	var err error
	p.stream, err = pg.js.CreateOrUpdateStream(t.Context(), jetstream.StreamConfig{Name: sideStream,
		Subjects: []string{sideIn, sideDead}, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := mysql.ParseDSN(my.dsn)
	if err != nil {
		t.Fatal(err)
	}
	store := url.URL{Scheme: "mariadb", User: url.UserPassword(cfg.User, cfg.Passwd), Host: cfg.Addr, Path: "/" + cfg.DBName}
	p.args = []string{"consume", "--broker", pg.natsURL, "--from", sideIn, "--to", p.http.URL + "/effect",
		"--store", store.String(), "--consumer", sideConsumer, "--group", sideGroup, "--concurrency", "4",
		"--retry-delay", "200ms", "--log-level", "warn"}
	return p
}

func (p *sidecar) name() string { return "idem-consume" }

func (p *sidecar) env() []string {
	return []string{idemBinEnv + "=" + p.bin, sideArgsEnv + "=" + strings.Join(p.args, "\n")}
}

func (p *sidecar) publish(ctx context.Context, id string, payload []byte) error {
	_, err := p.pg.prod.Publish(ctx, sideIn, payload, idemnats.WithMessageID(id))
	return err
}

// faults: the servers' are pg-nats's (NATS) and mariadb-amqp's.
func (p *sidecar) faults() []fault { return nil }

// deadLetters reads the dead letters' original message IDs by reason.
func (p *sidecar) deadLetters(ctx context.Context) (map[string]string, error) {
	info, err := p.stream.Info(ctx, jetstream.WithSubjectFilter(sideDead))
	if err != nil {
		return nil, err
	}
	total := int(info.State.Subjects[sideDead])
	dead := map[string]string{}
	if total == 0 {
		return dead, nil
	}
	oc, err := p.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{sideDead}})
	if err != nil {
		return nil, err
	}
	for got := 0; got < total; {
		batch, err := oc.Fetch(min(500, total-got), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, err
		}
		before := got
		for m := range batch.Messages() {
			got++
			dead[m.Headers().Get(idem.HeaderOriginalMessageID)] = m.Headers().Get(idem.HeaderDeadLetterReason)
		}
		if got == before {
			return nil, fmt.Errorf("read %d of %d dead letters", got, total)
		}
	}
	return dead, nil
}

func (p *sidecar) drained(ctx context.Context, ids []string) (bool, string) {
	calls := p.svc.snapshot()
	dead, err := p.deadLetters(ctx)
	if err != nil {
		return false, err.Error()
	}
	done := 0
	for _, id := range ids {
		if calls[id] > 0 || dead[id] != "" {
			done++
		}
	}
	cons, err := p.stream.Consumer(ctx, sideGroup)
	if err != nil {
		return false, err.Error()
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return false, err.Error()
	}
	return done == len(ids) && info.NumPending == 0 && info.NumAckPending == 0,
		fmt.Sprintf("%d of %d called or dead-lettered, %d pending and %d unacked in JetStream", done, len(ids), info.NumPending, info.NumAckPending)
}

// check: at most once, a message is called once, or dead-lettered as
// outcome-unknown when a sidecar died (or lost its store) after its
// recovery point, called or not; never twice, never dropped.
func (p *sidecar) check(ctx context.Context, ids []string, r *result) {
	calls := p.svc.snapshot()
	dead, err := p.deadLetters(ctx)
	if err != nil {
		r.problem("read the dead letters: %v", err)
		return
	}
	n := maps.Clone(calls)
	r.count("dead letters", 0)
	r.count("outcome-unknown, called", 0)
	r.count("outcome-unknown, never called", 0)
	for id, reason := range dead {
		switch {
		case reason != idem.ReasonOutcomeUnknown:
			r.count("dead letters", 1)
			r.problem("%s: dead-lettered, reason %q", id, reason)
		case calls[id] > 0:
			r.count("outcome-unknown, called", 1)
		default:
			// At most once: dead-lettered, not lost; the checker counts it
			// as an effect so that it is not taken for a loss.
			r.count("outcome-unknown, never called", 1)
			n[id] = 1
		}
	}
	r.effectCounts(ids, n)
}

// runSidecar runs idem consume with the pipeline's flags as a child that
// dies with this process (a SIGKILL of the role kills it too), and maps
// its exit: 1 (it could not reach a server, say) is a set-up error,
// anything else (2: a Go panic) a crash.
func runSidecar() int {
	args := strings.Split(strings.TrimSuffix(os.Getenv(sideArgsEnv), "\n"), "\n")
	cmd := exec.Command(os.Getenv(idemBinEnv), args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	// Pdeathsig follows the thread that started the child.
	runtime.LockOSThread()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Run(); err != nil {
		if cmd.ProcessState != nil && cmd.ProcessState.ExitCode() == 1 {
			return exitSetup
		}
		fmt.Fprintf(os.Stderr, "soak: idem consume: %v\n", err)
		return 1
	}
	return 0
}
