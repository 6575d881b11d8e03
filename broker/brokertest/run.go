package brokertest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// testCase is one case of the suite.
type testCase struct {
	name string
	doc  string
	run  func(f *fixture)
	// transactionalOnly cases need idem.BindBatch, which has no lease mode.
	transactionalOnly bool
	// batch cases run only when the Broker is a BatchBroker.
	batch bool
	// modeless cases do not depend on the claim mode: they run once, in
	// transactional mode.
	modeless bool
}

var cases = []testCase{
	{name: "ProcessedOnce", doc: "N messages, concurrency 4: N effect rows, nothing dead-lettered, nothing left to redeliver after a graceful Stop", run: caseProcessedOnce},
	{name: "ProducerDuplicates", doc: "every message published twice, some three times: N effect rows, late repeats seen as Duplicate", run: caseProducerDuplicates},
	{name: "CrashAfterCommit", doc: "a member dies after the commit and before the ack: a new member gets the redelivery as a Duplicate", run: caseCrashAfterCommit},
	{name: "HandlerError", doc: "handlers fail on the first attempt: redelivered after RetryDelay, N rows, no dead letters", run: caseHandlerError},
	{name: "AckTimeout", doc: "a handler outlives the ack timeout: the redelivery waits or is InProgress, one effect", run: caseAckTimeout},
	{name: "BadMessages", doc: "ID-less, invalid ID, fingerprint mismatch and poison messages go to the dead letter, byte for byte, with reasons", run: caseBadMessages},
	{name: "GroupCrashAndJoin", doc: "two members share the work; one crashes mid-stream, a third joins: N rows", run: caseGroupCrashAndJoin},
	{name: "StopWaitsForInFlight", doc: "Stop returns only after the handler in flight finished, and its message is acknowledged", run: caseStopWaitsForInFlight},
	{name: "Batch", doc: "batch mode (BatchBroker only): N rows through idem.BindBatch, duplicates and a crash after a committed batch", run: caseBatch, transactionalOnly: true, batch: true},
	{name: "Lifecycle", doc: "Stop before Run, a second Run (idem.ErrAlreadyRunning), concurrent Stops, and no goroutine of Run left after it returned", run: caseLifecycle, modeless: true},
	{name: "Panics", doc: "a panicking handler and a panicking Processor: nothing acked, redelivered, one row each, no dead letters", run: casePanics},
	{name: "StoreDown", doc: "the store's database closed under a member: nothing acked or dead-lettered, all redelivered and processed once the store is back", run: caseStoreDown},
	{name: "ContextCancelled", doc: "Run's context cancelled mid-handler: Run returns ctx.Err(), the effect is not kept, the message is redelivered and processed once", run: caseContextCancelled},
	{name: "DeadLetterFinal", doc: "dead-lettered messages are neither redelivered nor dead-lettered again for several ack deadlines and past the broker's duplicate window", run: caseDeadLetterFinal},
	{name: "StoreLatency", doc: "20-50ms of store latency per claim, concurrency 1 and a deep prefetch: at most 1.1 deliveries per message, none outlives its ack deadline", run: caseStoreLatency},
	{name: "HandlerTimeout", doc: "a handler blocked until its context ends is cut off by StartOptions.HandlerTimeout: not acknowledged, redelivered, one row, no dead letters", run: caseHandlerTimeout},
	{name: "HugePayload", doc: "a payload near the broker's limit (1 MiB by default) is processed, an ID-less one dead-lettered, byte for byte", run: caseHugePayload, modeless: true},
}

// CaseNames returns the names of the suite's cases, in order, with a short
// description of each: the subtests Run runs in each claim mode (as
// Run/<mode>/<case>, mode being "transactional" or "lease"). Batch runs only
// in transactional mode and only for a BatchBroker; Lifecycle and
// HugePayload, which do not depend on the claim mode, only in
// transactional mode.
func CaseNames() []string {
	out := make([]string, len(cases))
	for i, c := range cases {
		out[i] = c.name + ": " + c.doc
	}
	return out
}

// Run runs the broker conformance suite against the adapter behind h: every
// case in transactional mode (idem.Consumer over idemsql on SQLite, the
// effect written in the claim's transaction) and in lease mode
// (idem.LeaseConsumer, the effect written outside the claim, keyed by
// Attempt.Key), as parallel subtests, each with its own Broker from h.New and
// its own SQLite database. See the package documentation for what an adapter
// must do to pass.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.New == nil {
		t.Fatal("brokertest: Harness.New is nil")
	}
	for _, md := range modes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			for _, c := range cases {
				if (c.transactionalOnly || c.modeless) && md.lease {
					continue
				}
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					f := newFixture(t, h, md)
					if c.batch {
						if _, ok := f.broker.(BatchBroker); !ok {
							t.Skip("brokertest: the Broker is not a BatchBroker")
						}
					}
					c.run(f)
				})
			}
		})
	}
}

// caseProcessedOnce: N messages through one member at concurrency 4.
func caseProcessedOnce(f *fixture) {
	const n = 100
	ms := msgs("once", n)
	f.publish(ms[:n/2]...)
	m1 := f.start(StartOptions{Concurrency: 4, Redelivery: redelivery}, nil)
	f.publish(ms[n/2:]...)
	f.waitEffects(ms)
	f.stop(m1)
	f.checkEffects(ms)
	f.checkNoDeadLetters()

	// After a graceful Stop nothing that matters is left unacknowledged:
	// a fresh member, past the redelivery timeout, processes nothing new.
	m2 := f.start(StartOptions{Concurrency: 4, Redelivery: redelivery}, nil)
	f.quiet(2*redelivery + time.Second)
	f.stop(m2)
	if p := f.rec.count(func(r *record) bool { return r.member == m2.idx && r.status == idem.Processed }); p != 0 {
		f.t.Errorf("brokertest: the member started after Stop processed %d messages, want 0", p)
	}
	if d := f.rec.count(func(r *record) bool { return r.member == m2.idx }); d != 0 {
		f.t.Logf("brokertest: the member started after Stop got %d redeliveries (all duplicates)", d)
	}
	f.checkEffects(ms)
}

// caseProducerDuplicates: every message published twice in a row, every
// fifth a third time after the first was processed.
func caseProducerDuplicates(f *fixture) {
	const n = 60
	ms := msgs("dup", n)
	var late []idem.Message
	for i, m := range ms {
		f.publish(m, m)
		if i%5 == 0 {
			late = append(late, m)
		}
	}
	m1 := f.start(StartOptions{Concurrency: 4, Redelivery: redelivery}, nil)
	f.waitEffects(ms)
	// A repeat published after the first copy was processed, and past the
	// broker's own duplicate window if it has one, must reach the consumer.
	f.publishLate(late...)
	// Duplicates expected per ID: the late repeat, and the immediate one
	// unless the broker dropped it. Redeliveries may add more.
	want := map[string]int{}
	for _, m := range late {
		want[m.ID]++
	}
	if f.dedupeWindow() == 0 {
		for _, m := range ms {
			want[m.ID]++
		}
	}
	f.waitFor(waitLong, func() (bool, string) {
		got := map[string]int{}
		for _, r := range f.rec.filter(func(r *record) bool { return r.done && r.status == idem.Duplicate }) {
			got[r.id]++
		}
		missing := 0
		for id, n := range want {
			if got[id] < n {
				missing += n - got[id]
			}
		}
		return missing == 0, fmt.Sprintf("%d repeats not yet seen as Duplicate", missing)
	})
	f.stop(m1)
	f.checkEffects(ms)
	f.checkNoDeadLetters()
}

// caseCrashAfterCommit: the member crashes right after a message committed,
// before the adapter could ack it.
func caseCrashAfterCommit(f *fixture) {
	const n = 60
	ms := msgs("crash", n)
	f.publish(ms...)

	var (
		processed atomic.Int32
		once      sync.Once
		crashedID = make(chan string, 1)
		m1        *member
		m1Ready   = make(chan struct{})
	)
	m1 = f.start(StartOptions{Concurrency: 4, Redelivery: redelivery}, func(ctx context.Context, msg idem.Message, next func(context.Context, idem.Message) (idem.Outcome, error)) (idem.Outcome, error) {
		out, err := next(ctx, msg)
		if out.Status == idem.Processed && processed.Add(1) == n/4 {
			once.Do(func() {
				<-m1Ready
				f.crash(m1) // before the adapter sees the outcome: no ack
				crashedID <- msg.ID
			})
		}
		return out, err
	})
	close(m1Ready)

	var id string
	select {
	case id = <-crashedID:
	case <-time.After(waitLong):
		f.t.Fatalf("brokertest: after %v: member 1 never processed %d messages (deliveries: %s)", waitLong, n/4, f.rec.summary())
	}
	m2 := f.start(StartOptions{Concurrency: 4, Redelivery: redelivery}, nil)
	f.waitEffects(ms)
	// The message committed by the crashed member comes back: the broker
	// really redelivered it, and idem saw it as a Duplicate.
	f.waitFor(waitLong, func() (bool, string) {
		ok := f.rec.count(func(r *record) bool {
			return r.member == m2.idx && r.id == id && r.done && r.status == idem.Duplicate
		}) > 0
		return ok, fmt.Sprintf("message %q, committed before the crash, not yet redelivered as a Duplicate to the new member", id)
	})
	f.stop(m2)
	f.checkEffects(ms)
	f.checkNoDeadLetters()
}

// errInjected is the failure caseHandlerError injects.
var errInjected = errors.New("brokertest: injected handler failure")

// caseHandlerError: every fourth message fails on its first run.
func caseHandlerError(f *fixture) {
	const n = 60
	ms := msgs("fail", n)
	var mu sync.Mutex
	failed := map[string]bool{}
	failing := map[string]bool{}
	for i, m := range ms {
		if i%4 == 0 {
			failing[m.ID] = true
		}
	}
	f.setHook(func(ctx context.Context, msg idem.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if failing[msg.ID] && !failed[msg.ID] {
			failed[msg.ID] = true
			return errInjected
		}
		return nil
	})
	f.publish(ms...)
	m1 := f.start(StartOptions{Concurrency: 4, Redelivery: redelivery}, nil)
	f.waitEffects(ms)
	f.stop(m1)
	for id := range failing {
		if f.rec.count(func(r *record) bool { return r.id == id && r.status == idem.Failed }) == 0 {
			f.t.Errorf("brokertest: message %q: no Failed outcome recorded for its injected failure", id)
		}
	}
	f.checkEffects(ms)
	f.checkNoDeadLetters()
}

// caseAckTimeout: the first message's handler runs past the ack timeout.
// It holds until the broker redelivers the message (or, for brokers that
// do not redeliver a message in flight, or adapters that keep it alive, until
// 3×Redelivery has passed), then finishes; the redelivery waits for it
// (transactional) or is InProgress and comes back later (lease).
func caseAckTimeout(f *fixture) {
	const n = 40
	ms := msgs("slow", n)
	slow := ms[0]
	entered := make(chan struct{})
	var once sync.Once
	f.setHook(func(ctx context.Context, msg idem.Message) error {
		if msg.ID != slow.ID {
			return nil
		}
		first := false
		once.Do(func() { first = true; close(entered) })
		if !first {
			return nil
		}
		deadline := time.Now().Add(3 * redelivery)
		for f.rec.started(slow.ID) < 2 && time.Now().Before(deadline) {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(poll):
			}
		}
		return nil
	})
	f.publish(slow)
	m1 := f.start(StartOptions{Concurrency: 4, Redelivery: redelivery}, nil)
	select {
	case <-entered:
	case <-time.After(waitLong):
		f.t.Fatalf("brokertest: after %v: the slow message was never delivered", waitLong)
	}
	f.waitFor(waitLong, func() (bool, string) {
		return f.rec.processed()[slow.ID] == 1, "the slow message is not Processed yet"
	})
	f.publish(ms[1:]...)
	f.waitEffects(ms)
	// Let the redeliveries of the slow message settle.
	f.waitFor(waitLong, func() (bool, string) {
		open := f.rec.count(func(r *record) bool { return r.id == slow.ID && !r.done })
		return open == 0, fmt.Sprintf("%d deliveries of the slow message still in flight", open)
	})
	f.stop(m1)
	var statuses []string
	for _, r := range f.rec.filter(func(r *record) bool { return r.id == slow.ID }) {
		statuses = append(statuses, r.status.String())
		switch r.status {
		case idem.Processed, idem.Duplicate:
		case idem.InProgress:
			if !f.mode.lease {
				f.t.Errorf("brokertest: slow message: InProgress in transactional mode")
			}
		default:
			f.t.Errorf("brokertest: slow message: unexpected outcome %v", r.status)
		}
	}
	if len(statuses) < 2 {
		f.t.Logf("brokertest: the slow message was not redelivered while in flight (the adapter kept it alive, or the broker does not redeliver on a timeout); outcomes %v", statuses)
	} else {
		f.t.Logf("brokertest: slow message outcomes: %v", statuses)
	}
	f.checkEffects(ms)
	f.checkNoDeadLetters()
}

// errPoison is the permanent failure caseBadMessages injects.
var errPoison = errors.New("brokertest: poison payload")

// caseBadMessages: messages that can never be processed go to the dead
// letter, byte for byte, with the reason, and nothing else does.
func caseBadMessages(f *fixture) {
	const n = 40
	good := msgs("good", n)
	// IDs at the edge of idem's rules are good: 255 bytes, not ASCII.
	good = append(good,
		idem.Message{ID: strings.Repeat("y", 255), Payload: []byte("255-byte id")},
		idem.Message{ID: "été-🙂", Payload: []byte("non-ASCII id")})
	noID := []idem.Message{{Payload: []byte("no-id: first")}, {Payload: []byte("no-id: second\x00\xff")}}
	// Control characters (every broker can carry these; idem rejects
	// them), and an ID over the 255-byte limit (where the broker carries it).
	invalid := []idem.Message{
		{ID: "bad\x01id", Payload: []byte("invalid id: SOH")},
		{ID: "del\x7f", Payload: []byte("invalid id: DEL")},
		{ID: strings.Repeat("x", 256), Payload: []byte("invalid id: 256 bytes")},
	}
	mismatch := idem.Message{ID: good[0].ID, Payload: []byte("same ID, other payload")}
	// A handler error marked idem.Permanent is dead-lettered at once, in
	// both modes: its claim and effects roll back, and it runs once.
	poison := msgs("poison", 2)
	f.setHook(failPermanently(poison))

	f.publish(good[:n/2]...)
	f.publish(noID...)
	invalid = f.publishCarried(invalid...)
	f.publish(poison...)
	m1 := f.start(StartOptions{Concurrency: 4, Redelivery: redelivery}, nil)
	f.publish(good[n/2:]...)
	f.waitEffects(good)
	// The mismatch is published after its ID was processed, and past the
	// broker's own duplicate window.
	f.publishLate(mismatch)

	want := []expectedDL{
		{id: "", payload: noID[0].Payload, reason: idem.ReasonMissingMessageID, err: idem.ErrMissingMessageID},
		{id: "", payload: noID[1].Payload, reason: idem.ReasonMissingMessageID, err: idem.ErrMissingMessageID},
		{id: mismatch.ID, payload: mismatch.Payload, reason: idem.ReasonFingerprintMismatch, err: idem.ErrFingerprintMismatch},
	}
	for _, m := range invalid {
		want = append(want, expectedDL{id: m.ID, payload: m.Payload, reason: idem.ReasonInvalidMessageID, err: idem.ErrInvalidMessageID})
	}
	for _, p := range poison {
		want = append(want, expectedDL{id: p.ID, payload: p.Payload, reason: idem.ReasonPermanent, err: errPoison})
	}
	f.checkDeadLetters(want)
	f.stop(m1)
	f.checkEffects(good)
	// Not retried: once, or again only if an ack timeout redelivered it
	// while the first run was in flight; a retry loop would have run it at
	// every retry delay (a quarter of a second) through checkDeadLetters'
	// quiet second.
	for _, p := range poison {
		if runs := f.rec.started(p.ID); runs > 2 {
			f.t.Errorf("brokertest: the permanently failing message %q ran %d times, want 1 (2 after an ack timeout): it was retried", p.ID, runs)
		}
	}
}

// failPermanently returns a hook that fails the messages of poison with
// idem.Permanent(errPoison), and lets every other message through.
func failPermanently(poison []idem.Message) func(context.Context, idem.Message) error {
	isPoison := map[string]bool{}
	for _, p := range poison {
		isPoison[p.ID] = true
	}
	return func(ctx context.Context, msg idem.Message) error {
		if isPoison[msg.ID] {
			return idem.Permanent(errPoison)
		}
		return nil
	}
}

// caseGroupCrashAndJoin: two members share the stream; one crashes
// mid-stream and a third joins.
func caseGroupCrashAndJoin(f *fixture) {
	const n = 80
	ms := msgs("group", n)
	a := f.start(StartOptions{Concurrency: 2, Redelivery: redelivery}, nil)
	b := f.start(StartOptions{Concurrency: 2, Redelivery: redelivery}, nil)
	f.publish(ms...)
	f.waitFor(waitLong, func() (bool, string) {
		p := len(f.rec.processed())
		return p >= n/4, fmt.Sprintf("%d of %d messages processed before the crash", p, n/4)
	})
	f.crash(a)
	c := f.start(StartOptions{Concurrency: 2, Redelivery: redelivery}, nil)
	f.waitEffects(ms)
	f.stop(b)
	f.stop(c)
	for _, mb := range []*member{a, b, c} {
		idx := mb.idx
		f.t.Logf("brokertest: member %d processed %d messages", idx, f.rec.count(func(r *record) bool { return r.member == idx && r.status == idem.Processed }))
	}
	f.checkEffects(ms)
	f.checkNoDeadLetters()
}

// caseStopWaitsForInFlight: Stop while a handler is blocked on a barrier.
func caseStopWaitsForInFlight(f *fixture) {
	const n = 30
	// A longer ack timeout, so the blocked message is not redelivered while
	// it is held.
	const ackTimeout = 3 * redelivery
	ms := msgs("stop", n)
	held := ms[0]
	entered := make(chan struct{})
	release := make(chan struct{})
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
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("brokertest: the held handler's context ended before Stop let it finish: %w", ctx.Err())
		}
	})
	f.publish(held)
	m1 := f.start(StartOptions{Concurrency: 2, Redelivery: ackTimeout}, nil)
	select {
	case <-entered:
	case <-time.After(waitLong):
		f.t.Fatalf("brokertest: after %v: the held message was never delivered", waitLong)
	}
	f.publish(ms[1:]...)

	stopped := make(chan error, 1)
	f.memMu.Lock()
	m1.stopped = true
	f.memMu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLong)
		defer cancel()
		stopped <- m1.m.Stop(ctx)
	}()
	select {
	case err := <-stopped:
		close(release)
		f.t.Fatalf("brokertest: Stop returned (%v) while a handler was still running", err)
	case <-time.After(ackTimeout / 4):
	}
	close(release)
	select {
	case err := <-stopped:
		if err != nil {
			f.t.Fatalf("brokertest: Stop: %v", err)
		}
	case <-time.After(waitLong):
		f.t.Fatalf("brokertest: after %v: Stop did not return after the held handler finished", waitLong)
	}
	// Stop has returned: the held message's processing is over, Processed.
	if r := f.rec.filter(func(r *record) bool { return r.id == held.ID && r.member == m1.idx }); len(r) == 0 || !r[0].done || r[0].status != idem.Processed {
		f.t.Fatalf("brokertest: after Stop, the held message's first delivery is %+v, want done and Processed", r)
	}

	m2 := f.start(StartOptions{Concurrency: 2, Redelivery: ackTimeout}, nil)
	f.waitEffects(ms)
	// Past the ack timeout: the held message was acknowledged by Stop, so
	// the broker does not deliver it again.
	f.quiet(ackTimeout + time.Second)
	f.stop(m2)
	if d := f.rec.count(func(r *record) bool { return r.id == held.ID && r.member == m2.idx }); d != 0 {
		f.t.Errorf("brokertest: the message in flight at Stop was delivered %d more times: Stop did not acknowledge it", d)
	}
	f.checkEffects(ms)
	f.checkNoDeadLetters()
}

// caseBatch: the basics through StartBatch with idem.BindBatch.
func caseBatch(f *fixture) {
	bb := f.broker.(BatchBroker)
	const n = 60
	ms := msgs("batch", n)
	for i, m := range ms {
		f.publish(m)
		if i%5 == 0 {
			f.publish(m)
		}
	}
	opts := StartOptions{Concurrency: 2, Redelivery: redelivery, BatchSize: 8}

	var (
		batches  atomic.Int32
		once     sync.Once
		crashed  = make(chan []string, 1)
		m1       *member
		m1Ready  = make(chan struct{})
		maxBatch atomic.Int32
	)
	m1 = f.startBatch(bb, opts, func(ctx context.Context, msgs []idem.Message, next func(context.Context, []idem.Message) ([]idem.Outcome, error)) ([]idem.Outcome, error) {
		if int32(len(msgs)) > maxBatch.Load() {
			maxBatch.Store(int32(len(msgs)))
		}
		outs, err := next(ctx, msgs)
		committed := false
		for _, o := range outs {
			committed = committed || o.Status == idem.Processed
		}
		if err == nil && committed && batches.Add(1) == 2 {
			once.Do(func() {
				<-m1Ready
				f.crash(m1) // the batch committed; its acks are lost
				crashed <- ids(msgs)
			})
		}
		return outs, err
	})
	close(m1Ready)
	var lost []string
	select {
	case lost = <-crashed:
	case <-time.After(waitLong):
		f.t.Fatalf("brokertest: after %v: member 1 never committed two batches (deliveries: %s)", waitLong, f.rec.summary())
	}
	m2 := f.startBatch(bb, opts, nil)
	f.waitEffects(ms)
	f.waitFor(waitLong, func() (bool, string) {
		seen := 0
		for _, id := range lost {
			if f.rec.count(func(r *record) bool { return r.member == m2.idx && r.id == id && r.status == idem.Duplicate }) > 0 {
				seen++
			}
		}
		return seen > 0, fmt.Sprintf("none of the %d messages of the batch committed before the crash redelivered as a Duplicate", len(lost))
	})
	f.stop(m2)
	if mb := maxBatch.Load(); mb > int32(opts.BatchSize) {
		f.t.Errorf("brokertest: a batch of %d messages, more than BatchSize %d", mb, opts.BatchSize)
	}
	f.checkEffects(ms)
	f.checkNoDeadLetters()
}

// handlerTimeout is the StartOptions.HandlerTimeout of the HandlerTimeout
// case: well under the lease mode's 3s lease, whose end would cut the
// handler off too.
const handlerTimeout = 500 * time.Millisecond

// caseHandlerTimeout: the first attempt of one message blocks on something
// only its context ends (a database call on a stalled connection), which
// the adapter's handler timeout does; the message is not acknowledged, is
// redelivered and processed once; the others are processed meanwhile.
func caseHandlerTimeout(f *fixture) {
	const n = 10
	ms := msgs("stuck", n)
	stuck := ms[0].ID
	var mu sync.Mutex
	var attempts int
	var gaveUp error
	f.setHook(func(ctx context.Context, msg idem.Message) error {
		if msg.ID != stuck {
			return nil
		}
		mu.Lock()
		attempts++
		first := attempts == 1
		mu.Unlock()
		if !first {
			return nil
		}
		if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > handlerTimeout {
			f.t.Errorf("brokertest: the handler's context ends %v (deadline set: %v); want within StartOptions.HandlerTimeout (%v)", dl, ok, handlerTimeout)
			return errInjected
		}
		<-ctx.Done()
		mu.Lock()
		gaveUp = ctx.Err()
		mu.Unlock()
		return ctx.Err()
	})
	f.publish(ms...)
	m1 := f.start(StartOptions{Concurrency: 2, Redelivery: redelivery, HandlerTimeout: handlerTimeout}, nil)
	f.waitEffects(ms)
	f.stop(m1)
	mu.Lock()
	if !errors.Is(gaveUp, context.DeadlineExceeded) {
		f.t.Errorf("brokertest: the stuck handler's context ended with %v; want its deadline", gaveUp)
	}
	mu.Unlock()
	if f.rec.count(func(r *record) bool { return r.id == stuck && r.status == idem.Failed }) == 0 {
		f.t.Errorf("brokertest: message %q: no Failed outcome recorded for the attempt cut off", stuck)
	}
	f.checkEffects(ms)
	f.checkNoDeadLetters()
}
