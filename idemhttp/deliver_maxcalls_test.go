package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/idem-go/idem"
)

// With MaxCalls 2, five deliveries at once make two calls at a time: the
// other three wait with their messages claimed (in progress in the store),
// and each is called once a call ends. A waiting delivery whose context
// ends is not sent and is redelivered (not dead-lettered as
// outcome-unknown); its redelivery calls the service once.
func TestDeliverMaxCalls(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var mu sync.Mutex
		running, most := 0, 0
		b := setupDeliver(t, idem.Config{}, DelivererOptions{MaxCalls: 2}, func(int, *http.Request) (*http.Response, error) {
			mu.Lock()
			running++
			most = max(most, running)
			mu.Unlock()
			<-release
			mu.Lock()
			running--
			mu.Unlock()
			return response(200, nil, ""), nil
		})
		msgs := make([]idem.Message, 6)
		for i := range msgs {
			msgs[i] = idem.Message{ID: fmt.Sprintf("m-%d", i), Payload: []byte("p")}
		}
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
		if most != 2 {
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
