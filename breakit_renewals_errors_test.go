package idem_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// answerStore is the memory store whose renewals answer by the message
// ID's prefix: "ok-" at once, "slowok-" after 1.2s (more than a third of
// a 3s lease), "fasterr-" with an error at once, "slowerr-" with an error
// after 1.2s. It counts the renewals per message. It has the lease
// store's methods only (an interface embedded, not the memory store), so
// every renewal is one Renew call, whatever else the memory store can do.
type answerStore struct {
	idemdriver.LeaseStore
	mu    sync.Mutex
	calls map[string]int
}

var errStoreDown = errors.New("store down")

func (s *answerStore) Renew(ctx context.Context, p *idemdriver.RenewParams) error {
	s.mu.Lock()
	s.calls[p.MessageID]++
	s.mu.Unlock()
	kind, _, _ := strings.Cut(p.MessageID, "-")
	if strings.HasPrefix(kind, "slow") {
		t := time.NewTimer(1200 * time.Millisecond)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if strings.HasSuffix(kind, "err") {
		return errStoreDown
	}
	return s.LeaseStore.Renew(ctx, p)
}

func (s *answerStore) count(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[id]
}

// TestBreakRenewalsErrorsAndSlowAnswers: 40 attempts at a 3s lease, ten
// of each kind of answerStore, held for 6s. Renewals answered at once
// keep their leases; so do renewals answered after 1.2s (each slower
// than a tick: the next goes as soon as one returns). Renewals that fail
// at once are retried at each tick, not more often (two before the
// deadline), and their attempts end by the local deadline with
// ErrLeaseLost; renewals that fail after 1.2s are retried as soon as
// they return (two before the deadline), and end the same way. The
// failing ones cost the others nothing.
func TestBreakRenewalsErrorsAndSlowAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = 3 * time.Second
		store := &answerStore{LeaseStore: idem.NewMemoryStore(nil), calls: map[string]int{}}
		c := leaseConsumer(t, store, lease)
		kinds := []string{"ok", "slowok", "fasterr", "slowerr"}
		held := map[string]*idem.Attempt{}
		for _, k := range kinds {
			for i := range 10 {
				id := fmt.Sprintf("%s-%d", k, i)
				a, out, err := c.Acquire(t.Context(), idem.Message{ID: id, Payload: []byte("p")}, idem.AcquireOptions{})
				if a == nil {
					t.Fatalf("Acquire %s: %v %v", id, out, err)
				}
				held[id] = a
			}
		}
		time.Sleep(2 * lease)
		synctest.Wait()
		for id, a := range held {
			kind, _, _ := strings.Cut(id, "-")
			n := store.count(id)
			cause := context.Cause(a.Context())
			switch kind {
			case "ok", "slowok":
				if cause != nil {
					t.Errorf("%s: context ended (%v) after %d renewals; want the lease kept", id, cause, n)
				}
				if out, err := a.Complete(t.Context(), idem.Result{}); err != nil || out.Status != idem.Processed {
					t.Errorf("%s: Complete = %v %v", id, out.Status, err)
				}
			default:
				if !errors.Is(cause, idem.ErrLeaseLost) {
					t.Errorf("%s: context cause %v; want ErrLeaseLost by the local deadline", id, cause)
				}
				if n != 2 {
					t.Errorf("%s: %d renewals sent before the deadline, want 2", id, n)
				}
				_, _ = a.Abandon(t.Context(), nil)
			}
		}
	})
}
