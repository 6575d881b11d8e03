package idemhttp

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemtest"
)

// settleBatch runs msgs through the Deliverer's ProcessBatch as an
// adapter does (idem.GuardBatch, then Settle).
func (b *deliverBundle) settleBatch(msgs []idem.Message) []idem.Settlement {
	outs := idem.GuardBatch(context.Background(), b.d, msgs)
	ss := make([]idem.Settlement, len(outs))
	for i, o := range outs {
		ss[i] = o.Settle(0)
	}
	return ss
}

// setupCountedDeliver is setupDeliver whose store counts its batch
// round trips.
func setupCountedDeliver(t *testing.T, o DelivererOptions, answer func(n int, r *http.Request) (*http.Response, error)) (*deliverBundle, *idemtest.BatchCounter) {
	t.Helper()
	var trips *idemtest.BatchCounter
	wrap := func(s *idem.MemoryStore) idemdriver.LeaseStore {
		trips = idemtest.CountBatches(s, false)
		return trips
	}
	return setupDeliverOn(t, wrap, idem.Config{}, o, answer), trips
}

// One ProcessBatch of a fetched batch claims it in one store call and
// records the answers that complete messages in one more: 2xx acked, the
// same ID twice in the batch called once (the second in progress,
// redelivered), a refusal dead-lettered with reason permanent, a 503
// redelivered after its backoff (its attempt released). The batch
// redelivered is acked and dead-lettered from the recorded answers
// without a call, only the 503 called again.
func TestDeliverBatch(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b, trips := setupCountedDeliver(t, DelivererOptions{}, func(n int, r *http.Request) (*http.Response, error) {
			switch r.Header.Get(HeaderMessageID) {
			case "refused":
				return response(404, nil, "no such order"), nil
			case "busy":
				if n == 1 {
					return response(503, nil, ""), nil
				}
			}
			return response(200, nil, "ok"), nil
		})
		ids := []string{"a", "b", "a", "refused", "busy"}
		msgs := make([]idem.Message, len(ids))
		for i, id := range ids {
			msgs[i] = idem.Message{ID: id, Payload: []byte("p")}
		}
		ss := b.settleBatch(msgs)
		want := []struct {
			act    idem.Action
			reason string
		}{{idem.Ack, ""}, {idem.Ack, ""}, {idem.Redeliver, ""}, {idem.DeadLetter, idem.ReasonPermanent}, {idem.Redeliver, ""}}
		for i, w := range want {
			if ss[i].Action != w.act || (w.reason != "" && ss[i].Reason != w.reason) {
				t.Errorf("message %d (%s): %v %s (%v), want %v %s", i, ids[i], ss[i].Action, ss[i].Reason, ss[i].Err, w.act, w.reason)
			}
		}
		if ss[4].Delay <= 0 {
			t.Errorf("busy: redelivered after %v, want a backoff", ss[4].Delay)
		}
		for _, id := range []string{"a", "b", "refused", "busy"} {
			if n := b.svc.count(id); n != 1 {
				t.Errorf("%s: %d calls, want 1", id, n)
			}
		}
		ab, cb := trips.Batches()
		if c := trips.Calls(); c.Total() != 1 || c.Release != 1 || ab != 1 || cb != 1 {
			t.Errorf("store calls: %+v, AcquireBatch %d, CompleteBatch %d; want 1 AcquireBatch, 1 CompleteBatch, 1 Release (busy), nothing else", c, ab, cb)
		}

		ss = b.settleBatch(msgs[1:])
		for i, w := range want[1:4] {
			if i == 1 {
				w.act = idem.Ack // a, no longer held by the batch's first
			}
			if ss[i].Action != w.act || (w.reason != "" && ss[i].Reason != w.reason) {
				t.Errorf("redelivered %s: %v %s (%v), want %v %s", ids[i+1], ss[i].Action, ss[i].Reason, ss[i].Err, w.act, w.reason)
			}
		}
		if ss[3].Action != idem.Ack {
			t.Errorf("busy redelivered: %v (%v), want Ack", ss[3].Action, ss[3].Err)
		}
		for id, n := range map[string]int{"a": 1, "b": 1, "refused": 1, "busy": 2} {
			if got := b.svc.count(id); got != n {
				t.Errorf("%s after the redelivery: %d calls, want %d", id, got, n)
			}
		}
		if st := b.d.Stats(); st.Delivered != 3 || st.Replayed != 3 || st.Refused != 2 || st.Calls != 5 {
			t.Errorf("stats %+v: want 3 delivered, 3 replayed (a refusal among them), 2 refused, 5 calls", st)
		}
	})
}

// A message whose earlier attempt died after its call may have started
// (its recovery point saved, no answer recorded) is dead-lettered as
// outcome-unknown by ProcessBatch without a call, while the other
// messages of the batch are delivered.
func TestDeliverBatchAfterCrashIsOutcomeUnknown(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setupDeliver(t, idem.Config{}, DelivererOptions{}, func(int, *http.Request) (*http.Response, error) {
			return response(200, nil, ""), nil
		})
		crashed := idem.Message{ID: "m", Payload: []byte("p")}
		crashAfterSend(t, b.lc, crashed)
		msgs := []idem.Message{crashed, {ID: "n", Payload: []byte("p")}}
		for i := range 2 {
			ss := b.settleBatch(msgs)
			if s := ss[0]; s.Action != idem.DeadLetter || s.Reason != idem.ReasonOutcomeUnknown || !errors.Is(s.Err, idem.ErrOutcomeUnknown) {
				t.Fatalf("batch %d after the crash: %v %s %v, want DeadLetter outcome-unknown", i+1, s.Action, s.Reason, s.Err)
			}
			if ss[1].Action != idem.Ack {
				t.Fatalf("batch %d: n %v (%v), want Ack", i+1, ss[1].Action, ss[1].Err)
			}
		}
		if n, m := b.svc.count("n"), b.svc.count("m"); n != 1 || m != 0 {
			t.Fatalf("calls: n %d, m %d; want 1 and 0", n, m)
		}
	})
}

// With MaxCalls 2 a batch of six runs two calls at a time, and all six
// are acked.
func TestDeliverBatchMaxCalls(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		g := newGatedCalls()
		b := setupDeliver(t, idem.Config{}, DelivererOptions{MaxCalls: 2}, g.answer)
		msgs := numbered(6)
		var ss []idem.Settlement
		var wg sync.WaitGroup
		wg.Go(func() { ss = b.settleBatch(msgs) })
		for range msgs {
			synctest.Wait() // every call that can run is running
			if running, _ := g.counts(); running != 2 && running != 1 {
				t.Errorf("%d calls running, want 2 (1 for the last)", running)
			}
			g.release <- struct{}{}
		}
		wg.Wait()
		for i, s := range ss {
			if s.Action != idem.Ack || b.svc.count(msgs[i].ID) != 1 {
				t.Errorf("%s: %v (%v), %d calls; want Ack after 1 call", msgs[i].ID, s.Action, s.Err, b.svc.count(msgs[i].ID))
			}
		}
		if _, most := g.counts(); most != 2 {
			t.Errorf("at most %d calls at once, want 2", most)
		}
	})
}
