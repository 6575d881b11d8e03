package operate_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/cmd/idem/internal/operate"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemhttp"
)

// oneDeadLetter is a broker holding one dead letter at position "1",
// whose republished copies it keeps.
type oneDeadLetter struct {
	dl     console.DeadLetter
	copies []console.DeadLetter
}

func (b *oneDeadLetter) Where() string { return "test broker" }

func (b *oneDeadLetter) Newest(context.Context, string, string, int) ([]console.DeadLetter, string, error) {
	return []console.DeadLetter{b.dl}, "", nil
}

func (b *oneDeadLetter) Get(_ context.Context, _, pos string) (console.DeadLetter, error) {
	if pos != b.dl.Position {
		return console.DeadLetter{}, console.ErrNoDeadLetter
	}
	return b.dl, nil
}

func (b *oneDeadLetter) Replayable(context.Context, console.DeadLetter) error { return nil }

func (b *oneDeadLetter) Republish(_ context.Context, dl console.DeadLetter) (string, error) {
	b.copies = append(b.copies, dl)
	return "copy", nil
}

// roundTrip answers the Deliverer's calls in process.
type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// refusedOrder is message order-1 of consumer "orders" of a memory
// store, which the Deliverer dead-lettered because the service answered
// 422 (status, which the caller may change; calls counts the calls), and
// a broker holding its dead letter.
func refusedOrder(t *testing.T) (*idem.MemoryStore, *idemhttp.Deliverer, *oneDeadLetter, *atomic.Int64, *atomic.Int64) {
	t.Helper()
	store := idem.NewMemoryStore(nil)
	lc, err := idem.NewLeaseConsumer(store, idem.Config{Name: "orders", PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lc.Close() })
	var calls, status atomic.Int64
	status.Store(http.StatusUnprocessableEntity)
	target, _ := url.Parse("http://service.test/orders")
	d, err := idemhttp.NewDeliverer(lc, idemhttp.DelivererOptions{Target: target, Transport: roundTrip(func(r *http.Request) (*http.Response, error) {
		calls.Add(1)
		_, _ = io.ReadAll(r.Body)
		return &http.Response{StatusCode: int(status.Load()), Header: http.Header{}, Body: io.NopCloser(strings.NewReader("answer"))}, nil
	})})
	if err != nil {
		t.Fatal(err)
	}
	msg := idem.Message{ID: "order-1", Payload: []byte(`{"order":1}`)}
	if s := idem.Guard(t.Context(), d, msg).Settle(0); s.Action != idem.DeadLetter || s.Reason != idem.ReasonPermanent {
		t.Fatalf("first delivery: %v %s, want a dead letter, reason permanent", s.Action, s.Reason)
	}
	broker := &oneDeadLetter{dl: console.DeadLetter{Position: "1", Destination: "orders.dead", Source: "orders", MessageID: msg.ID,
		Reason: idem.ReasonPermanent, Payload: msg.Payload}}
	return store, d, broker, &status, &calls
}

// TestReplayReopensARefusal: idem replay of a message the Deliverer
// dead-lettered for a 422 reopens its record and republishes it; another
// replay while that copy is on its way is refused unless forced; the
// copy, delivered, calls the fixed service once more and completes the
// record with the 200; a replay after it is refused as processed and
// republishes nothing.
func TestReplayReopensARefusal(t *testing.T) {
	store, d, broker, status, calls := refusedOrder(t)
	msg := idem.Message{ID: broker.dl.MessageID, Payload: broker.dl.Payload}
	replay := func() (string, error) {
		open := func(context.Context, string, string, string) (operate.Opened, error) {
			return operate.Opened{Store: store, Where: "memory", Close: func() error { return nil }}, nil
		}
		openBroker := func(context.Context, string) (console.DeadLetters, func(), error) { return broker, func() {}, nil }
		root := &cobra.Command{Use: "idem", SilenceErrors: true, SilenceUsage: true}
		root.AddCommand(operate.Commands(open, openBroker, time.Now)...)
		var out strings.Builder
		root.SetOut(&out)
		root.SetArgs([]string{"replay", "--store", "mem:", "--broker", "nats://test", "--dead-letter", "orders.dead", "--position", "1", "--consumer", "orders"})
		err := root.ExecuteContext(t.Context())
		return out.String(), err
	}

	status.Store(http.StatusOK)
	out, err := replay()
	if err != nil || !strings.Contains(out, "reopened") || len(broker.copies) != 1 {
		t.Fatalf("idem replay: %q, %v, %d copies; want the record reopened and one copy", out, err, len(broker.copies))
	}
	if _, err := replay(); !errors.Is(err, console.ErrForceable) || !strings.Contains(err.Error(), "retryable already") || len(broker.copies) != 1 {
		t.Errorf("idem replay while the copy is on its way: %v, %d copies; want refused unless forced, no other copy", err, len(broker.copies))
	}
	copyMsg := idem.Message{ID: broker.copies[0].MessageID, Payload: broker.copies[0].Payload}
	if s := idem.Guard(t.Context(), d, copyMsg).Settle(0); s.Action != idem.Ack || s.Reason != idem.ReasonProcessed {
		t.Errorf("the replayed copy: %v %s (%v), want acked, processed", s.Action, s.Reason, s.Err)
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("service called %d times, want 2: the refusal and the replay", n)
	}
	rec, err := store.Inspect(t.Context(), "orders", msg.ID)
	if reason, dead := idemhttp.DeadLetterAnswer(rec.ContentType, rec.Result); err != nil || rec.State != idemdriver.StateCompleted || dead {
		t.Errorf("record after the replay: %+v, %v (dead-letter answer %q); want completed with the success", rec, err, reason)
	}
	if _, err := replay(); err == nil || !strings.Contains(err.Error(), "processed") || len(broker.copies) != 1 {
		t.Errorf("second idem replay: %v, %d copies; want refused as processed and no other copy", err, len(broker.copies))
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("service called %d times after the refused replay, want 2", n)
	}
}

// racedReopen is a store on which another replay reopens the record
// (and, with complete, the reopened record is delivered again) between
// Replay's read and its own reopen.
type racedReopen struct {
	*idem.MemoryStore
	other func()
}

func (s racedReopen) ReopenRecord(ctx context.Context, p *idemdriver.ReopenRecordParams) (idemdriver.ActionResult, error) {
	s.other()
	return s.MemoryStore.ReopenRecord(ctx, p)
}

// A replay that loses the race to reopen the record to another replay
// is refused and publishes nothing; so is one that finds the record
// reopened and completed again since it read it (the token moved).
func TestReplayLosesTheReopenRace(t *testing.T) {
	for _, deliveredAgain := range []bool{false, true} {
		store, d, broker, status, _ := refusedOrder(t)
		status.Store(http.StatusOK)
		st := racedReopen{store, func() {
			rec, err := store.Inspect(t.Context(), "orders", "order-1")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := store.ReopenRecord(t.Context(), &idemdriver.ReopenRecordParams{Consumer: "orders", MessageID: "order-1", Token: rec.Token}); err != nil {
				t.Fatalf("the other replay's reopen: %v", err)
			}
			if deliveredAgain {
				_ = idem.Guard(t.Context(), d, idem.Message{ID: "order-1", Payload: broker.dl.Payload}).Settle(0)
			}
		}}
		a := console.Action{Kind: console.ActionReplay, Consumer: "orders", DeadLetter: "orders.dead", Position: "1"}
		_, err := console.Replay(t.Context(), st, broker, a, time.Now)
		want := "reopened by another replay"
		if deliveredAgain {
			want = "changed since it was read"
		}
		if !errors.Is(err, console.ErrNotReplayable) || !errors.Is(err, idemdriver.ErrWrongState) || !strings.Contains(err.Error(), want) || len(broker.copies) != 0 {
			t.Errorf("replay that lost the race (delivered again %v): %v, %d copies; want refused (%q), none", deliveredAgain, err, len(broker.copies), want)
		}
	}
}
