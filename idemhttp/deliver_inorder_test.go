package idemhttp

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemtest"
)

// orderedCalls answers every call 200, except the answers fail says, and
// logs the calls in the order they started, with the most at once and
// each call's Idem-Attempt.
type orderedCalls struct {
	fail          func(id string, n int) int // the status for the n-th call of id; 0 for 200
	mu            sync.Mutex
	order         []string
	attempts      map[string][]string
	running, most int
}

func (o *orderedCalls) answer(n int, r *http.Request) (*http.Response, error) {
	id := r.Header.Get(HeaderMessageID)
	o.mu.Lock()
	o.order = append(o.order, id)
	if o.attempts == nil {
		o.attempts = map[string][]string{}
	}
	o.attempts[id] = append(o.attempts[id], r.Header.Get(HeaderAttempt))
	o.running++
	o.most = max(o.most, o.running)
	o.mu.Unlock()
	time.Sleep(time.Millisecond) // a call that takes time: another would overlap it
	o.mu.Lock()
	o.running--
	o.mu.Unlock()
	if st := o.fail(r.Header.Get(HeaderMessageID), n); st != 0 {
		return response(st, nil, ""), nil
	}
	return response(200, nil, "ok"), nil
}

// With InOrder and MaxCalls 4, ProcessBatch calls a batch's messages one
// at a time in the order given; a 503 is retried in place, after its
// backoff, before the next message is called, and every message is acked.
// The batch is claimed in one store call; the answers before the retry
// are recorded in one CompleteBatch, the rest in another, and the retry
// costs its release, its claim and its completion. With PointAtCall each
// message is claimed on its own, in the same order.
func TestDeliverBatchInOrder(t *testing.T) {
	t.Parallel()
	for _, pointAtCall := range []bool{false, true} {
		t.Run("PointAtCall="+strconv.FormatBool(pointAtCall), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				var trips *idemtest.BatchCounter
				wrap := func(s *idem.MemoryStore) idemdriver.LeaseStore {
					trips = idemtest.CountBatches(s, false)
					return trips
				}
				calls := &orderedCalls{fail: func(id string, n int) int {
					if id == "m-2" && n == 1 {
						return 503
					}
					return 0
				}}
				b := setupDeliverOn(t, wrap, idem.Config{Lease: time.Minute},
					DelivererOptions{MaxCalls: 4, InOrder: true, PointAtCall: pointAtCall}, calls.answer)
				msgs := numbered(6)
				start := time.Now()
				ss := b.settleBatch(msgs)
				for i, s := range ss {
					if s.Action != idem.Ack {
						t.Errorf("%s: %v (%v), want Ack", msgs[i].ID, s.Action, s.Err)
					}
				}
				want := []string{"m-0", "m-1", "m-2", "m-2", "m-3", "m-4", "m-5"}
				if !slices.Equal(calls.order, want) || calls.most != 1 {
					t.Errorf("calls %v, at most %d at once; want %v one at a time", calls.order, calls.most, want)
				}
				if waited := time.Since(start); waited < DefaultDeliveryRetryBase/2 {
					t.Errorf("the batch took %v; want the retry's backoff (at least %v)", waited, DefaultDeliveryRetryBase/2)
				}
				if pointAtCall {
					return
				}
				ab, cb := trips.Batches()
				if c := trips.Calls(); ab != 1 || cb != 2 || c.Release != 1 || c.Acquire != 1 || c.Complete != 1 {
					t.Errorf("store calls %+v, AcquireBatch %d, CompleteBatch %d; want 1 AcquireBatch, 2 CompleteBatch, the retry's Release, Acquire and Complete", c, ab, cb)
				}
			})
		})
	}
}

// With InOrder the same ID twice in a batch is called once: the second,
// in progress under the first's claim, is retried in place once the
// first's answer is recorded, and is a duplicate; the message after it
// is called after that.
func TestDeliverBatchInOrderSameID(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		calls := &orderedCalls{fail: func(string, int) int { return 0 }}
		b := setupDeliver(t, idem.Config{Lease: time.Minute}, DelivererOptions{InOrder: true}, calls.answer)
		msgs := []idem.Message{{ID: "a", Payload: []byte("p")}, {ID: "a", Payload: []byte("p")}, {ID: "b", Payload: []byte("p")}}
		ss := b.settleBatch(msgs)
		if ss[0].Reason != idem.ReasonProcessed || ss[1].Reason != idem.ReasonDuplicate || ss[2].Reason != idem.ReasonProcessed {
			t.Errorf("settlements %s %s %s (%v %v %v); want processed, duplicate, processed",
				ss[0].Reason, ss[1].Reason, ss[2].Reason, ss[0].Err, ss[1].Err, ss[2].Err)
		}
		if want := []string{"a", "b"}; !slices.Equal(calls.order, want) {
			t.Errorf("calls %v, want %v", calls.order, want)
		}
	})
}

// With InOrder, when the batch's context ends, or EndRetries is called,
// while a message waits to be retried in place, the message after it,
// held and never called, is released without a call, and both are
// redelivered: nothing after the failed message is recorded ahead of it.
// The redelivery calls them in order, each once more in all, the one
// never called sent (not dead-lettered as outcome-unknown), as its
// second attempt.
func TestDeliverBatchInOrderStops(t *testing.T) {
	t.Parallel()
	for _, viaCtx := range []bool{true, false} {
		t.Run("ctx="+strconv.FormatBool(viaCtx), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) { testInOrderStops(t, viaCtx) })
		})
	}
}

func testInOrderStops(t *testing.T, viaCtx bool) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	down := true
	var b *deliverBundle
	calls := &orderedCalls{fail: func(id string, _ int) int {
		if id == "m-1" && down {
			// The adapter stops while m-1 waits for its retry.
			if viaCtx {
				cancel()
			} else {
				b.d.EndRetries()
			}
			return 503
		}
		return 0
	}}
	b = setupDeliver(t, idem.Config{Lease: time.Minute}, DelivererOptions{InOrder: true}, calls.answer)
	msgs := numbered(3)
	outs := idem.GuardBatch(ctx, b.d, msgs)
	acts := make([]idem.Action, len(outs))
	for i, o := range outs {
		acts[i] = o.Settle(0).Action
	}
	if want := []idem.Action{idem.Ack, idem.Redeliver, idem.Redeliver}; !slices.Equal(acts, want) {
		t.Fatalf("actions %v, want %v", acts, want)
	}
	if !viaCtx && !errors.Is(outs[2].Err, errRetriesEnded) {
		t.Errorf("m-2's error %v, want errRetriesEnded", outs[2].Err)
	}
	if want := []string{"m-0", "m-1"}; !slices.Equal(calls.order, want) {
		t.Fatalf("calls %v, want %v", calls.order, want)
	}

	down = false
	ss := b.settleBatch(msgs[1:])
	for i, s := range ss {
		if s.Action != idem.Ack || s.Reason != idem.ReasonProcessed {
			t.Errorf("redelivered %s: %v %s (%v), want Ack processed", msgs[i+1].ID, s.Action, s.Reason, s.Err)
		}
	}
	if want := []string{"m-0", "m-1", "m-1", "m-2"}; !slices.Equal(calls.order, want) {
		t.Errorf("calls %v, want %v", calls.order, want)
	}
	if got := calls.attempts["m-2"]; !slices.Equal(got, []string{"2"}) {
		t.Errorf("m-2 called as attempts %v, want [2] (its first claim released unsent)", got)
	}
}
