package brokertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idem-go/idem"
)

// The lifecycle and edge cases every adapter used to test on its own.

// caseLifecycle: the Runner contract. Stop before Run, two Runs at once, a
// Run after Run returned, concurrent Stops, and no goroutine of Run left
// once it has returned.
func caseLifecycle(f *fixture) {
	opts := StartOptions{Concurrency: 2, Redelivery: redelivery}

	// Stop before Run, twice: Run returns nil at once; a later Run is a
	// second Run.
	r0, _ := f.newRunner(opts, nil)
	for i := range 2 {
		if err := r0.Stop(f.ctx); err != nil {
			f.t.Fatalf("brokertest: Stop %d before Run: %v, want nil", i+1, err)
		}
	}
	if err := f.result("Run after Stop", r0.run(f.ctx)); err != nil {
		f.t.Fatalf("brokertest: Run after Stop: %v, want nil", err)
	}
	if err := f.result("a second Run after Stop", r0.run(f.ctx)); !errors.Is(err, idem.ErrAlreadyRunning) {
		f.t.Fatalf("brokertest: a second Run after Stop: %v, want idem.ErrAlreadyRunning", err)
	}

	// Two Runs at once: one runs, the other returns ErrAlreadyRunning at
	// once, whichever got there first.
	r1, idx := f.newRunner(opts, nil)
	first, second := r1.run(f.ctx), r1.run(f.ctx)
	var running <-chan error
	select {
	case err := <-first:
		running = second
		if !errors.Is(err, idem.ErrAlreadyRunning) {
			f.t.Fatalf("brokertest: one of two concurrent Runs returned %v, want idem.ErrAlreadyRunning", err)
		}
	case err := <-second:
		running = first
		if !errors.Is(err, idem.ErrAlreadyRunning) {
			f.t.Fatalf("brokertest: one of two concurrent Runs returned %v, want idem.ErrAlreadyRunning", err)
		}
	case <-time.After(waitLong):
		f.t.Fatalf("brokertest: after %v: neither of two concurrent Runs returned", waitLong)
	}
	// The one running consumes.
	ms := msgs("life", 10)
	f.publish(ms...)
	f.waitEffects(ms)

	// Eight Stops at once: all return nil once Run has, which returns nil.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(f.ctx, waitLong)
			defer cancel()
			errs <- r1.Stop(ctx)
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			f.t.Errorf("brokertest: concurrent Stop: %v, want nil", err)
		}
	}
	if err := f.result("Run after Stop", running); err != nil {
		f.t.Fatalf("brokertest: Run after Stop: %v, want nil", err)
	}
	if err := f.result("Run after Run returned", r1.run(f.ctx)); !errors.Is(err, idem.ErrAlreadyRunning) {
		f.t.Fatalf("brokertest: Run after Run returned: %v, want idem.ErrAlreadyRunning", err)
	}

	// No goroutine that Run started outlives it. (A short wait: a
	// client library may take a moment to unwind a goroutine it closed.)
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, stacks := r1.goroutines()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("brokertest: %d goroutines started by Run still running after Run returned:\n%s", n, stacks)
		}
		time.Sleep(poll)
	}
	if p := f.rec.count(func(r *record) bool { return r.member == idx && r.status == idem.Processed }); p != len(ms) {
		f.t.Errorf("brokertest: the running consumer processed %d messages, want %d", p, len(ms))
	}
	f.checkEffects(ms)
	f.checkNoDeadLetters()
}

// errPanicked is what casePanics' Processor panics with.
var errPanicked = errors.New("brokertest: injected panic")

// casePanics: a handler that panics (idem recovers it as a Failed outcome)
// and a Processor wrapper that panics (the adapter's idem.Guard recovers
// it): neither delivery is acknowledged; both come back and are processed
// once; nothing is dead-lettered.
func casePanics(f *fixture) {
	const n = 20
	ms := msgs("panic", n)
	inHandler, inProcessor := ms[0], ms[1]
	var once1, once2 sync.Once
	f.setHook(func(ctx context.Context, msg idem.Message) error {
		if msg.ID == inHandler.ID {
			once1.Do(func() { panic(errPanicked) })
		}
		return nil
	})
	f.publish(ms...)
	m1 := f.start(StartOptions{Concurrency: 4, Redelivery: redelivery}, func(ctx context.Context, msg idem.Message, next func(context.Context, idem.Message) (idem.Outcome, error)) (idem.Outcome, error) {
		if msg.ID == inProcessor.ID {
			once2.Do(func() { panic(errPanicked) })
		}
		return next(ctx, msg)
	})
	f.waitEffects(ms)
	f.stop(m1)
	for _, m := range []idem.Message{inHandler, inProcessor} {
		if runs := f.rec.started(m.ID); runs < 2 {
			f.t.Errorf("brokertest: message %q: %d deliveries, want the panicking one and a redelivery", m.ID, runs)
		}
	}
	if !f.rec.any(func(r *record) bool { return r.id == inHandler.ID && errors.Is(r.err, idem.ErrHandlerPanic) }) {
		f.t.Errorf("brokertest: message %q: no Failed outcome matching idem.ErrHandlerPanic for its handler's panic", inHandler.ID)
	}
	f.checkEffects(ms)
	f.checkNoDeadLetters()
}

// caseStoreDown: the store's database handle is closed under a running
// member. Every delivery fails with idem.ErrStore: nothing is acknowledged
// and nothing is dead-lettered, the broker redelivers; once a member with a
// working handle on the same database runs, each message is processed once.
func caseStoreDown(f *fixture) {
	const n = 8
	ms := msgs("down", n)
	db, store := f.openStore()
	down, _ := f.bind(store)
	if err := db.Close(); err != nil {
		f.t.Fatalf("brokertest: close the store's database: %v", err)
	}
	m1 := f.startWith(StartOptions{Concurrency: 2, Redelivery: redelivery}, down, nil)
	f.publish(ms...)
	// Redelivered while the store is down: some message failed twice (a
	// partitioned log retries its head in place, so not necessarily all).
	f.waitFor(waitLong, func() (bool, string) {
		fails := map[string]int{}
		for _, r := range f.rec.filter(func(r *record) bool { return r.done && r.status == idem.Failed }) {
			fails[r.id]++
		}
		again := 0
		for _, c := range fails {
			if c >= 2 {
				again++
			}
		}
		return again > 0 && len(fails) >= min(n, 2), fmt.Sprintf("%d messages failed, %d of them more than once", len(fails), again)
	})
	f.stop(m1)
	for _, r := range f.rec.filter(func(r *record) bool { return r.member == m1.idx }) {
		if r.status != idem.Failed || !errors.Is(r.err, idem.ErrStore) {
			f.t.Errorf("brokertest: with the store down, message %q ended %v (%v), want Failed with idem.ErrStore", r.id, r.status, r.err)
		}
	}
	if rows := rowCount(f.effects()); rows != 0 {
		f.t.Errorf("brokertest: %d effect rows while the store was down, want 0", rows)
	}
	f.checkNoDeadLetters()

	// The store is back.
	m2 := f.start(StartOptions{Concurrency: 2, Redelivery: redelivery}, nil)
	f.waitEffects(ms)
	f.stop(m2)
	f.checkEffects(ms)
	f.checkNoDeadLetters()
}

// caseContextCancelled: Run's context is cancelled while a handler runs.
// The handler sees it, its effect does not stay (rolled back with the
// claim in transactional mode, never written in lease mode), Run returns
// ctx.Err(), and the next member gets the message and processes it once.
func caseContextCancelled(f *fixture) {
	held := msgs("cancel", 1)[0]
	entered := make(chan struct{})
	var once sync.Once
	f.setHook(func(ctx context.Context, msg idem.Message) error {
		if msg.ID != held.ID {
			return nil
		}
		first := false
		once.Do(func() { first = true; close(entered) })
		if !first {
			return nil
		}
		<-ctx.Done()
		return ctx.Err()
	})
	r, idx := f.newRunner(StartOptions{Concurrency: 1, Redelivery: redelivery}, nil)
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	done := r.run(ctx)
	f.publish(held)
	select {
	case <-entered:
	case err := <-done:
		f.t.Fatalf("brokertest: Run returned (%v) before the handler ran", err)
	case <-time.After(waitLong):
		f.t.Fatalf("brokertest: after %v: the message was never delivered", waitLong)
	}
	cancel()
	if err := f.result("Run after its context was cancelled", done); !errors.Is(err, context.Canceled) {
		f.t.Fatalf("brokertest: Run after its context was cancelled: %v, want ctx.Err() (context.Canceled)", err)
	}
	if recs := f.rec.filter(func(r *record) bool { return r.member == idx }); len(recs) != 1 || recs[0].status == idem.Processed {
		f.t.Fatalf("brokertest: the cancelled consumer's deliveries: %+v, want one, not Processed", recs)
	}
	if rows := rowCount(f.effects()); rows != 0 {
		f.t.Fatalf("brokertest: %d effect rows after the cancelled handler, want 0", rows)
	}
	m2 := f.start(StartOptions{Concurrency: 1, Redelivery: redelivery}, nil)
	f.waitEffects([]idem.Message{held})
	f.stop(m2)
	f.checkEffects([]idem.Message{held})
	f.checkNoDeadLetters()
}

// caseHugePayload: a payload at the broker's limit (PayloadLimiter) or of
// 1 MiB is processed, its effect row byte for byte; an ID-less one is
// dead-lettered byte for byte (again, if the broker redelivered it before
// its ack landed). Neither is lost.
func caseHugePayload(f *fixture) {
	size := 1 << 20
	if l, ok := f.broker.(PayloadLimiter); ok {
		size = l.PayloadLimit()
	}
	big := idem.Message{ID: "huge-1", Payload: bytes.Repeat([]byte("0123456789abcdef"), size/16+1)[:size]}
	noID := idem.Message{Payload: bytes.Repeat([]byte("fedcba9876543210"), size/16+1)[:size]}
	f.publish(big, noID)
	m1 := f.start(StartOptions{Concurrency: 2, Redelivery: redelivery}, nil)
	f.waitEffects([]idem.Message{big})
	// Dead-lettering a payload this size may outlast a short ack deadline
	// (1s on the fakes), and the ID-less message's redelivery is
	// dead-lettered again: its copies are accepted, each byte for byte.
	f.checkDeadLetters([]expectedDL{{id: "", payload: noID.Payload, reason: idem.ReasonMissingMessageID, err: idem.ErrMissingMessageID, again: true}})
	f.stop(m1)
	f.checkEffects([]idem.Message{big})
}
