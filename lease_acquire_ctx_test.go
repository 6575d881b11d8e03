package idem

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
)

// ctxStore records the context of each Acquire.
type ctxStore struct {
	*MemoryStore
	mu   sync.Mutex
	ctxs []context.Context
}

func (s *ctxStore) Acquire(ctx context.Context, p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
	s.mu.Lock()
	s.ctxs = append(s.ctxs, ctx)
	s.mu.Unlock()
	return s.MemoryStore.Acquire(ctx, p)
}

// TestLeaseAcquireContextEnds: the context an Acquire runs on, made from
// a caller's context that lives on, is cancelled when the delivery ends,
// whether the message was held (it was the attempt's context) or not (a
// duplicate): the caller's context keeps no child per delivery. Both are
// derived from the caller's: its values reach the store.
func TestLeaseAcquireContextEnds(t *testing.T) {
	s := &ctxStore{MemoryStore: NewMemoryStore(nil)}
	lc, err := NewLeaseConsumer(s, Config{Name: "c", Lease: time.Minute, PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	type key struct{}
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
	defer cancel()
	msg := Message{ID: "m", Payload: []byte("p")}
	var handlerCtx context.Context
	for i, want := range []Status{Processed, Duplicate} {
		out, err := lc.Process(parent, msg, func(ctx context.Context, a *Attempt) (Result, error) {
			handlerCtx = ctx
			return Result{Body: []byte("r")}, nil
		})
		if err != nil || out.Status != want {
			t.Fatalf("delivery %d: %v %v; want %v", i, out.Status, err, want)
		}
	}
	if len(s.ctxs) != 2 {
		t.Fatalf("%d acquires; want 2", len(s.ctxs))
	}
	for i, ctx := range s.ctxs {
		if ctx.Err() == nil {
			t.Errorf("acquire %d: its context is still live after the delivery ended", i)
		}
		if ctx.Value(key{}) != "v" {
			t.Errorf("acquire %d: the caller's value is lost", i)
		}
	}
	if handlerCtx.Err() == nil || parent.Err() != nil {
		t.Errorf("handler context err %v, caller's %v; want the first ended, the second live", handlerCtx.Err(), parent.Err())
	}
}
