package idemsql

import (
	"context"
	"errors"
	"slices"
	"testing"
	"testing/synctest"
)

// queue starts a goroutine per name that takes g and appends its name to
// *order once it holds g (then keeps it), each queued (blocked in lock)
// before the next starts. The i-th channel receives the i-th lock's
// error.
func queue(g *writeGate, ctxs []context.Context, names []string, order *[]string) []chan error {
	done := make([]chan error, len(names))
	for i, name := range names {
		done[i] = make(chan error, 1)
		go func() {
			err := g.lock(ctxs[i])
			if err == nil {
				*order = append(*order, name)
			}
			done[i] <- err
		}()
		synctest.Wait() // queued
	}
	return done
}

// The gate serves its waiters in the order they came; a waiter whose
// context ends leaves the queue with ctx.Err() and the others keep their
// turns.
func TestWriteGateOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var g writeGate
		if err := g.lock(t.Context()); err != nil {
			t.Fatal(err)
		}
		names := []string{"a", "b", "c", "d"}
		ctxs := make([]context.Context, len(names))
		cancels := make([]context.CancelFunc, len(names))
		for i := range names {
			ctxs[i], cancels[i] = context.WithCancel(t.Context())
		}
		defer func() {
			for _, c := range cancels {
				c()
			}
		}()
		var order []string
		done := queue(&g, ctxs, names, &order)
		cancels[1]() // b gives up
		if err := <-done[1]; !errors.Is(err, context.Canceled) {
			t.Fatalf("the cancelled waiter's lock = %v, want context.Canceled", err)
		}
		for _, i := range []int{0, 2, 3} {
			g.unlock()
			if err := <-done[i]; err != nil {
				t.Fatal(err)
			}
		}
		if want := []string{"a", "c", "d"}; !slices.Equal(order, want) {
			t.Errorf("order %v, want %v", order, want)
		}
		g.unlock()
		if g.held || len(g.waiters) != 0 {
			t.Errorf("after the last unlock: held %v, %d waiters", g.held, len(g.waiters))
		}
	})
}

// A waiter handed the gate as its context ends either keeps it (lock
// returns nil) or passes it on to the next waiter: the gate is never
// left held by nobody.
func TestWriteGateHandedOverAsCancelled(t *testing.T) {
	for range 50 {
		synctest.Test(t, func(t *testing.T) {
			var g writeGate
			if err := g.lock(t.Context()); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			var order []string
			done := queue(&g, []context.Context{ctx, t.Context()}, []string{"cancelled", "next"}, &order)
			g.unlock() // hands the gate to "cancelled" ...
			cancel()   // ... whose context ends before it runs
			err := <-done[0]
			if err == nil {
				g.unlock() // it kept the gate: give it back
			} else if !errors.Is(err, context.Canceled) {
				t.Fatalf("lock = %v, want nil or context.Canceled", err)
			}
			if err := <-done[1]; err != nil {
				t.Fatalf("the next waiter's lock = %v", err)
			}
			if order[len(order)-1] != "next" {
				t.Fatalf("order %v, want the next waiter last", order)
			}
			g.unlock()
			if g.held || len(g.waiters) != 0 {
				t.Errorf("after the last unlock: held %v, %d waiters", g.held, len(g.waiters))
			}
		})
	}
}

// lock with an ended context and the gate held returns at once, queueing
// nothing; with the gate free it takes it (the caller's next call fails).
func TestWriteGateEndedContext(t *testing.T) {
	var g writeGate
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := g.lock(ctx); err != nil {
		t.Fatalf("lock of a free gate = %v, want nil", err)
	}
	if err := g.lock(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("lock of a held gate = %v, want context.Canceled", err)
	}
	if len(g.waiters) != 0 {
		t.Errorf("%d waiters, want 0", len(g.waiters))
	}
	g.unlock()
}
