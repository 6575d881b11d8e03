package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// gatedCalls is a service whose calls each wait for a value on release
// before answering 200; it counts the calls running and the most that
// ran at once.
type gatedCalls struct {
	release       chan struct{}
	mu            sync.Mutex
	running, most int
}

func newGatedCalls() *gatedCalls { return &gatedCalls{release: make(chan struct{})} }

func (g *gatedCalls) answer(int, *http.Request) (*http.Response, error) {
	g.mu.Lock()
	g.running++
	g.most = max(g.most, g.running)
	g.mu.Unlock()
	<-g.release
	g.mu.Lock()
	g.running--
	g.mu.Unlock()
	return response(200, nil, ""), nil
}

// counts returns the calls running and the most that ran at once.
func (g *gatedCalls) counts() (running, most int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.running, g.most
}

// numbered is n messages m-0, m-1, ... with payload "p".
func numbered(n int) []idem.Message {
	msgs := make([]idem.Message, n)
	for i := range msgs {
		msgs[i] = idem.Message{ID: fmt.Sprintf("m-%d", i), Payload: []byte("p")}
	}
	return msgs
}

// With MaxCalls 2, five deliveries at once make two calls at a time: the
// other three wait with their messages claimed (in progress in the store),
// and each is called once a call ends. A waiting delivery whose context
// ends is not sent and is redelivered (not dead-lettered as
// outcome-unknown); its redelivery calls the service once.
func TestDeliverMaxCalls(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		g := newGatedCalls()
		release := g.release
		b := setupDeliver(t, idem.Config{}, DelivererOptions{MaxCalls: 2}, g.answer)
		msgs := numbered(6)
		settled := make([]idem.Settlement, len(msgs))
		var wg sync.WaitGroup
		for i := range 5 {
			wg.Go(func() { settled[i] = b.settle(msgs[i]) })
		}
		synctest.Wait()
		// The sixth waits too, on a context ended while it waits.
		ctx, cancel := context.WithCancel(context.Background())
		var sixth idem.Settlement
		wg.Go(func() { sixth = idem.Guard(ctx, b.d, msgs[5]).Settle(0) })
		synctest.Wait()

		called := 0
		for _, m := range msgs {
			if n := b.svc.count(m.ID); n > 0 {
				called++
				continue
			}
			// Waiting: claimed by its delivery, so held for anyone else.
			a, out, err := b.lc.Acquire(context.Background(), m, idem.AcquireOptions{})
			if !errors.Is(err, idem.ErrInProgress) || a != nil || out.Status != idem.InProgress {
				t.Errorf("%s, waiting for a call: Acquire = %v, %v, %v; want it held (InProgress)", m.ID, a != nil, out.Status, err)
			}
		}
		if called != 2 {
			t.Fatalf("%d messages called while the first calls run, want 2 (MaxCalls)", called)
		}
		cancel()
		synctest.Wait()
		if sixth.Action != idem.Redeliver || b.svc.count(msgs[5].ID) != 0 {
			t.Fatalf("delivery whose context ended while it waited: %v (%v), %d calls; want Redeliver, no call", sixth.Action, sixth.Err, b.svc.count(msgs[5].ID))
		}
		close(release)
		wg.Wait()
		for i, s := range settled[:5] {
			if s.Action != idem.Ack || b.svc.count(msgs[i].ID) != 1 {
				t.Errorf("%s: %v (%v), %d calls; want Ack after one call", msgs[i].ID, s.Action, s.Err, b.svc.count(msgs[i].ID))
			}
		}
		if _, most := g.counts(); most != 2 {
			t.Errorf("at most %d calls ran at once, want 2", most)
		}
		if s := b.settle(msgs[5]); s.Action != idem.Ack || b.svc.count(msgs[5].ID) != 1 {
			t.Errorf("redelivery of %s: %v (%v), %d calls; want Ack after one call", msgs[5].ID, s.Action, s.Err, b.svc.count(msgs[5].ID))
		}
		if st := b.d.Stats(); st.Delivered != 6 || st.Unknown != 0 || st.Calls != 6 {
			t.Errorf("stats %+v; want 6 delivered, 6 calls, none unknown", st)
		}
	})
}

// At most once with MaxCalls 1 and PointAtCall: a message that finds the
// call free saves its recovery point with its claim; one that waits for
// the call is claimed without one and saves it when it gets the call,
// before the request leaves (without PointAtCall, with its claim). A
// waiting message whose process died (its claim left to run out, with no
// recovery point) is then simply sent by the next attempt, while one
// whose dead process had saved its point is dead-lettered as
// outcome-unknown, never sent twice.
func TestDeliverWaitingMessageSavesItsPointAtCall(t *testing.T) {
	t.Parallel()
	for _, pointAtCall := range []bool{false, true} {
		t.Run(fmt.Sprintf("PointAtCall=%v", pointAtCall), func(t *testing.T) {
			t.Parallel()
			testDeliverWaitingPoint(t, pointAtCall)
		})
	}
}

func testDeliverWaitingPoint(t *testing.T, pointAtCall bool) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		store := idem.NewMemoryStore(nil)
		const lease = time.Second
		lc, err := idem.NewLeaseConsumer(store, idem.Config{Name: "late-point", Lease: lease, PurgeInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		defer lc.Close()
		release := make(chan struct{})
		svc := &fakeService{calls: map[string]int{}, answer: func(_ int, r *http.Request) (*http.Response, error) {
			if r.Header.Get(HeaderMessageID) == "first" {
				<-release
			}
			return response(200, nil, ""), nil
		}}
		target, _ := url.Parse("http://service.test/in")
		d, err := NewDeliverer(lc, DelivererOptions{Target: target, Transport: svc, MaxCalls: 1, PointAtCall: pointAtCall, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		runPoints := func(id string) int {
			steps, err := store.Steps(ctx, "late-point", id)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, s := range steps {
				if strings.HasPrefix(s.Name, deliverPoints+":run:") {
					n++
				}
			}
			return n
		}
		msg := func(id string) idem.Message { return idem.Message{ID: id, Payload: []byte("p-" + id)} }

		var wg sync.WaitGroup
		settled := map[string]idem.Settlement{}
		var mu sync.Mutex
		for _, id := range []string{"first", "waiting"} {
			wg.Go(func() {
				s := idem.Guard(ctx, d, msg(id)).Settle(0)
				mu.Lock()
				settled[id] = s
				mu.Unlock()
			})
			synctest.Wait() // "first" takes the call before "waiting" arrives
		}
		if svc.count("first") != 1 || svc.count("waiting") != 0 {
			t.Fatalf("calls: first %d, waiting %d; want 1, 0", svc.count("first"), svc.count("waiting"))
		}
		if got := runPoints("first"); got != 1 {
			t.Errorf("the message called: %d recovery points, want 1 (saved with its claim)", got)
		}
		if got, want := runPoints("waiting"), map[bool]int{false: 1, true: 0}[pointAtCall]; got != want {
			t.Errorf("the message waiting for the call: %d recovery points, want %d", got, want)
		}
		close(release)
		wg.Wait()
		for _, id := range []string{"first", "waiting"} {
			if s := settled[id]; s.Action != idem.Ack || svc.count(id) != 1 {
				t.Errorf("%s: %v (%v), %d calls; want Ack after one call", id, s.Action, s.Err, svc.count(id))
			}
			if got := runPoints(id); got != 1 {
				t.Errorf("%s after its call: %d recovery points, want 1", id, got)
			}
		}

		// Two claims of a process that died: one waiting for its call (no
		// point), one whose call may have started (its point saved).
		for _, c := range []struct {
			id, prefix string
		}{{"died-waiting", ""}, {"died-calling", d.fin.RunPrefix()}} {
			fp, _ := idem.SHA256Fingerprint(msg(c.id).Payload)
			acq, err := store.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "late-point", MessageID: c.id,
				Fingerprint: fp, Lease: lease, StepPrefix: c.prefix})
			if err != nil || !acq.Acquired {
				t.Fatalf("%s: claim of the dead process: %+v, %v", c.id, acq, err)
			}
		}
		time.Sleep(2 * lease) // the dead process's leases run out
		if s := idem.Guard(ctx, d, msg("died-waiting")).Settle(0); s.Action != idem.Ack || svc.count("died-waiting") != 1 {
			t.Errorf("a message whose process died while it waited for a call: %v (%v), %d calls; want Ack after one call",
				s.Action, s.Err, svc.count("died-waiting"))
		}
		if s := idem.Guard(ctx, d, msg("died-calling")).Settle(0); s.Action != idem.DeadLetter || s.Reason != "outcome-unknown" || svc.count("died-calling") != 0 {
			t.Errorf("a message whose process died during its call: %v %q (%v), %d calls; want a dead letter, outcome-unknown, no call",
				s.Action, s.Reason, s.Err, svc.count("died-calling"))
		}
		if st := d.Stats(); st.Unknown != 1 || st.Calls != 3 {
			t.Errorf("stats %+v; want 3 calls, 1 outcome unknown", st)
		}
	})
}
