package operate_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/cmd/idem/internal/deadletter"
	"github.com/idem-go/idem/cmd/idem/internal/operate"
)

// run runs one operator command over store and returns its output.
func run(t *testing.T, store *idem.MemoryStore, args ...string) (string, error) {
	t.Helper()
	open := func(context.Context, string, string, string) (operate.Opened, error) {
		return operate.Opened{Store: store, Where: "memory", Close: func() error { return nil }}, nil
	}
	root := &cobra.Command{Use: "idem", SilenceErrors: true, SilenceUsage: true}
	root.AddCommand(operate.Commands(open, nil, func() time.Time { return time.Now() })...)
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.ExecuteContext(t.Context())
	return out.String(), err
}

// payments is the consumer "payments" of store, one attempt per message.
func payments(t *testing.T, store *idem.MemoryStore) *idem.LeaseConsumer {
	t.Helper()
	c, err := idem.NewLeaseConsumer(store, idem.Config{Name: "payments", MaxAttempts: 1, PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestFailedRetryRelease(t *testing.T) {
	store := idem.NewMemoryStore(nil)
	c := payments(t, store)
	_, _ = c.Process(t.Context(), idem.Message{ID: "pay-1", Payload: []byte("x")}, func(context.Context, *idem.Attempt) (idem.Result, error) {
		return idem.Result{}, errors.New("card declined")
	})
	a, _, err := c.Acquire(t.Context(), idem.Message{ID: "pay-2", Payload: []byte("y")}, idem.AcquireOptions{})
	if err != nil || a == nil {
		t.Fatalf("Acquire: %v", err)
	}

	out, err := run(t, store, "failed", "--store", "mem:", "--consumer", "payments", "--json")
	var page console.RecordPageView
	if err != nil || json.Unmarshal([]byte(out), &page) != nil || len(page.Records) != 1 || page.Records[0].Error != "card declined" {
		t.Fatalf("failed --json: %v %s", err, out)
	}
	out, err = run(t, store, "failed", "--store", "mem:", "--consumer", "payments", "--in-progress")
	if err != nil || !strings.Contains(out, `"pay-2"`) || !strings.Contains(out, "live until") {
		t.Fatalf("failed --in-progress: %v %s", err, out)
	}

	var v console.ActionView
	out, err = run(t, store, "retry", "--store", "mem:", "--consumer", "payments", "--id", "pay-1", "--json")
	if err != nil || json.Unmarshal([]byte(out), &v) != nil || !v.Changed || v.Record.Attempt != 0 {
		t.Fatalf("retry: %v %s", err, out)
	}
	out, err = run(t, store, "retry", "--store", "mem:", "--consumer", "payments", "--id", "pay-1")
	if err != nil || !strings.Contains(out, "nothing changed") {
		t.Errorf("second retry: %v %s", err, out)
	}
	if _, err := run(t, store, "retry", "--store", "mem:", "--consumer", "payments", "--id", "nope"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("retry of a missing record: %v, want ErrNotFound", err)
	}

	_, err = run(t, store, "release", "--store", "mem:", "--consumer", "payments", "--id", "pay-2")
	var ue operate.UsageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "--token 1") {
		t.Errorf("release without --token: %v, want a usage error naming the token", err)
	}
	out, err = run(t, store, "release", "--store", "mem:", "--consumer", "payments", "--id", "pay-2", "--token", "1")
	if err != nil || !strings.Contains(out, "released") {
		t.Fatalf("release: %v %s", err, out)
	}
	if _, err := a.Complete(t.Context(), idem.Result{}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Errorf("released holder's Complete: %v, want ErrLeaseLost", err)
	}
	if _, err := run(t, store, "release", "--store", "mem:", "--consumer", "payments", "--id", "pay-1", "--token", "7"); !errors.Is(err, idem.ErrWrongState) {
		t.Errorf("release of a token never held: %v, want ErrWrongState", err)
	}
	if _, err := run(t, store, "failed", "--store", "mem:"); !errors.As(err, &ue) {
		t.Errorf("failed without --consumer: %v, want a usage error", err)
	}
	if _, err := run(t, store, "failed", "--store", "mem:", "--consumer", "payments", "--cursor", "bad"); !errors.As(err, &ue) {
		t.Errorf("bad cursor: %v, want a usage error", err)
	}
	if _, err := run(t, store, "failed", "--store", "mem:", "--consumer", "paymnets"); !errors.Is(err, console.ErrUnknownConsumer) || !strings.Contains(err.Error(), `"payments"`) {
		t.Errorf("unknown consumer: %v, want ErrUnknownConsumer naming payments", err)
	}
}

func TestCheckListen(t *testing.T) {
	for _, tc := range []struct {
		addr, token string
		ok          bool
	}{
		{"127.0.0.1:8089", "", true},
		{"[::1]:8089", "", true},
		{"localhost:8089", "", true},
		{":8089", "", false},
		{"0.0.0.0:8089", "", false},
		{"10.1.2.3:8089", "", false},
		{"0.0.0.0:8089", "t", true},
		{"nonsense", "", false},
	} {
		err := operate.CheckListen(tc.addr, tc.token)
		if (err == nil) != tc.ok {
			t.Errorf("CheckListen(%q, token %q) = %v, want ok %v", tc.addr, tc.token, err, tc.ok)
		}
	}
}

// TestUsageErrorsNameWhatIsMissing: replay without --consumer names that
// flag alone, and failed with --broker but no --dead-letter asks for
// --dead-letter, not for --consumer; both are usage errors (exit 2) and
// open neither the store nor the broker.
func TestUsageErrorsNameWhatIsMissing(t *testing.T) {
	store := idem.NewMemoryStore(nil)
	var ue operate.UsageError
	_, err := run(t, store, "replay", "--store", "mem:", "--broker", "nats://127.0.0.1:1", "--dead-letter", "payments.dead", "--position", "5")
	if !errors.As(err, &ue) || !errors.Is(err, console.ErrBadAction) || !strings.HasPrefix(err.Error(), "missing --consumer:") {
		t.Errorf("replay without --consumer: %v, want a usage error starting with \"missing --consumer:\"", err)
	}
	_, err = run(t, store, "replay", "--store", "mem:", "--consumer", "payments")
	if !errors.As(err, &ue) || !strings.HasPrefix(err.Error(), "missing --dead-letter, --position:") {
		t.Errorf("replay with --consumer only: %v, want a usage error naming --dead-letter and --position", err)
	}
	_, err = run(t, store, "failed", "--store", "mem:", "--broker", "nats://127.0.0.1:1")
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "--dead-letter") {
		t.Errorf("failed --broker without --dead-letter: %v, want a usage error asking for --dead-letter", err)
	}
}

// TestUnbrowsableBrokerNamedOnce: dead letters asked of a broker whose
// queues cannot be browsed (RabbitMQ) fail with an error that names the
// broker once, and says why.
func TestUnbrowsableBrokerNamedOnce(t *testing.T) {
	const where = "RabbitMQ at amqp://guest:xxxxx@127.0.0.1:5672/"
	openBroker := func(context.Context, string) (console.DeadLetters, func(), error) {
		return deadletter.Unbrowsable{Broker: where}, func() {}, nil
	}
	root := &cobra.Command{Use: "idem", SilenceErrors: true, SilenceUsage: true}
	root.AddCommand(operate.Commands(nil, openBroker, time.Now)...)
	root.SetOut(io.Discard)
	root.SetArgs([]string{"failed", "--broker", "amqp://guest:guest@127.0.0.1:5672/", "--dead-letter", "payments.dead"})
	err := root.ExecuteContext(t.Context())
	if !errors.Is(err, console.ErrNoDeadLetters) || strings.Count(err.Error(), where) != 1 || !strings.Contains(err.Error(), "cannot be read") {
		t.Errorf("failed --dead-letter on RabbitMQ: %v, want ErrNoDeadLetters naming the broker once and why", err)
	}
}

// TestEmptyPagesSaySo: a page with nothing on it says so in words under
// its table's header, rather than leave the header alone.
func TestEmptyPagesSaySo(t *testing.T) {
	store := idem.NewMemoryStore(nil)
	c := payments(t, store)
	if _, err := c.Process(t.Context(), idem.Message{ID: "pay-1", Payload: []byte("x")}, func(context.Context, *idem.Attempt) (idem.Result, error) {
		return idem.Result{}, nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--consumer", "payments"}, `no failed records of consumer "payments" on this page`},
		{[]string{"--consumer", "payments", "--in-progress"}, `no records of consumer "payments" in progress on this page`},
		{[]string{"--outbox"}, "no outbox rows failed for good on this page"},
	} {
		out, err := run(t, store, append([]string{"failed", "--store", "mem:"}, tt.args...)...)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if err != nil || lines[len(lines)-1] != tt.want {
			t.Errorf("failed %s: %v, output %q, want its last line %q", strings.Join(tt.args, " "), err, out, tt.want)
		}
	}

	openBroker := func(context.Context, string) (console.DeadLetters, func(), error) {
		return noDeadLetters{}, func() {}, nil
	}
	root := &cobra.Command{Use: "idem", SilenceErrors: true, SilenceUsage: true}
	root.AddCommand(operate.Commands(nil, openBroker, time.Now)...)
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"failed", "--broker", "nats://127.0.0.1:4222", "--dead-letter", "payments.dead"})
	err := root.ExecuteContext(t.Context())
	if lines := strings.Split(strings.TrimSpace(out.String()), "\n"); err != nil || lines[len(lines)-1] != "no dead letters on this page" {
		t.Errorf("failed --dead-letter: %v, output %q, want its last line to say there are none", err, out.String())
	}
}

// noDeadLetters is a broker whose dead-letter destinations are empty.
type noDeadLetters struct{ console.DeadLetters }

func (noDeadLetters) Where() string { return "NATS at nats://127.0.0.1:4222" }

func (noDeadLetters) Newest(context.Context, string, string, int) ([]console.DeadLetter, string, error) {
	return nil, "", nil
}
