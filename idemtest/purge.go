package idemtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

const (
	day    = 24 * time.Hour
	window = 7 * day
	// horizonSlack is how far a purge horizon may sit from the one computed
	// with this process's clock: the store uses the database server's clock.
	horizonSlack = time.Hour
)

func purgeCases[TTx any]() []testCase[TTx] {
	return []testCase[TTx]{
		{"Window", testPurgeWindow[TTx]},
		{"DowntimeSafe", testPurgeDowntimeSafe[TTx]},
		{"DryRun", testPurgeDryRun[TTx]},
		{"PerConsumer", testPurgePerConsumer[TTx]},
		{"NoRecords", testPurgeNoRecords[TTx]},
		{"InvalidParams", testPurgeInvalidParams[TTx]},
		{"ConsumerPurge", testConsumerPurge[TTx]},
		{"WhileProcessing", testPurgeWhileProcessing[TTx]},
		{"ConcurrentPurges", testConcurrentPurges[TTx]},
		{"CancelledReleasesLock", testPurgeCancelled[TTx]},
		{"RetainerPrimitives", testRetainerPrimitives[TTx]},
	}
}

// seed processes ms on c and fails the test if any is not Processed.
func (b *bundle[TTx]) seed(c *idem.Consumer[TTx], ms []idem.Message) {
	b.t.Helper()
	outs, err := c.ProcessBatch(b.ctx, ms, func(context.Context, TTx, []idem.Message) error { return nil })
	if err != nil {
		b.t.Fatalf("seeding %d records: %v", len(ms), err)
	}
	for i, o := range outs {
		if o.Status != idem.Processed {
			b.t.Fatalf("seeding %q: status %v, want Processed", ms[i].ID, o.Status)
		}
	}
}

// purge runs idem.Purge on the Setup's store for consumer with the 7-day
// window.
func (b *bundle[TTx]) purge(ctx context.Context, consumer string, batchSize int, dryRun bool, onBatch func(int64)) (idem.PurgeResult, error) {
	return purgeWith(ctx, b.s.Store, consumer, window, batchSize, dryRun, onBatch)
}

// elapse closes c and makes d of running time pass for its consumer name.
func (b *bundle[TTx]) elapse(c *idem.Consumer[TTx], d time.Duration) {
	b.t.Helper()
	_ = c.Close()
	elapse(b.t, b.ctx, b.s.Store, b.s.Shift, c.Name(), d)
}

// Records the consumer has outrun by the window, in running time, are
// deleted in batches of at most BatchSize; records inside the window stay
// and are still deduplicated.
func testPurgeWindow[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{})
	old, recent := msgs("old-", 5), msgs("new-", 3)
	b.seed(c, old)
	b.elapse(c, 2*window)
	c = b.consumer("c", idem.Config{})
	b.seed(c, recent)
	var batches []int64
	res, err := b.purge(b.ctx, c.Name(), 2, false, func(n int64) { batches = append(batches, n) })
	if err != nil {
		t.Fatalf("Purge: %v", err)
	}
	if res.Deleted != 5 {
		t.Errorf("Purge: Deleted = %d, want 5", res.Deleted)
	}
	if res.Batches < 3 || res.Batches > 4 {
		t.Errorf("Purge with BatchSize 2: Batches = %d, want 3 (or 4) for 5 rows", res.Batches)
	}
	if len(batches) != res.Batches || (len(batches) > 0 && batches[len(batches)-1] != res.Deleted) {
		t.Errorf("OnBatch calls %v, want one per batch ending at %d", batches, res.Deleted)
	}
	wantHorizonNear(t, "Purge", res.Horizon, time.Now().Add(-window))
	b.wantRecords("after the purge", c.Name(), 3)

	var calls atomic.Int64
	h := b.handler(c, &calls)
	b.process("a record inside the window", c, recent[0], h, idem.Duplicate, nil)
	b.process("a purged record, redelivered", c, old[0], h, idem.Processed, nil)
	b.wantCalls("after the purge", &calls, 1)
	res, err = b.purge(b.ctx, c.Name(), 2, false, nil)
	if err != nil || res.Deleted != 0 {
		t.Errorf("second Purge: Deleted %d, err %v; want 0 and nil", res.Deleted, err)
	}
}

// Downtime does not count: a consumer with a 5-minute window that was down
// for 3 hours, then processed new messages, keeps every record of before
// the downtime, whoever runs the purge, so the redeliveries of the
// downtime are duplicates. Its records go only once it has been running
// for 5 minutes since they were written.
func testPurgeDowntimeSafe[TTx any](t *testing.T, b *bundle[TTx]) {
	const win = 5 * time.Minute
	cfg := idem.Config{RetentionWindow: win}
	c := b.consumer("c", cfg)
	before := msgs("before-", 3)
	var calls atomic.Int64
	for _, m := range before {
		b.process("before the downtime", c, m, b.handler(c, &calls), idem.Processed, nil)
	}
	calls.Store(0)
	_ = c.Close()
	downtime(t, b.ctx, b.s.Shift, c.Name(), 3*time.Hour)

	c = b.consumer("c", cfg)
	after := msgs("after-", 3)
	b.seed(c, after)
	res, err := c.Purge(b.ctx)
	if err != nil || res.Deleted != 0 || !res.Horizon.IsZero() {
		t.Errorf("Consumer.Purge after 3 hours down and new messages: %+v, err %v; want nothing deleted and a zero horizon", res, err)
	}
	res, err = purgeWith(b.ctx, b.s.Store, c.Name(), win, 10, false, nil)
	if err != nil || res.Deleted != 0 {
		t.Errorf("idem.Purge from another process after the downtime: %+v, err %v; want nothing deleted", res, err)
	}
	h := b.handler(c, &calls)
	for _, m := range before {
		b.process("a redelivery of before the downtime", c, m, h, idem.Duplicate, nil)
		b.wantEffects("a redelivery of before the downtime", c.Name(), m.ID, 1)
	}
	b.wantCalls("redeliveries of before the downtime", &calls, 0)

	// Running for 3 minutes since: still inside the window.
	b.elapse(c, 3*time.Minute)
	res, err = purgeWith(b.ctx, b.s.Store, c.Name(), win, 10, false, nil)
	if err != nil || res.Deleted != 0 {
		t.Errorf("Purge after 3 minutes of running since the downtime: %+v, err %v; want nothing deleted", res, err)
	}
	// 7 more minutes: everything of before and just after the downtime
	// has been outrun by the window; a message processed now stays.
	elapse(t, b.ctx, b.s.Store, b.s.Shift, c.Name(), 7*time.Minute)
	c = b.consumer("c", cfg)
	now := msgs("now-", 1)
	b.seed(c, now)
	res, err = c.Purge(b.ctx)
	if err != nil || res.Deleted != int64(len(before)+len(after)) {
		t.Errorf("Consumer.Purge after 10 minutes of running: %+v, err %v; want %d deleted", res, err, len(before)+len(after))
	}
	b.wantRecords("after the purge", c.Name(), 1)
	b.process("the message processed after the runs", c, now[0], b.handler(c, &calls), idem.Duplicate, nil)
}

// DryRun counts and deletes nothing.
func testPurgeDryRun[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{})
	old, recent := msgs("old-", 3), msgs("new-", 2)
	b.seed(c, old)
	b.elapse(c, 2*window)
	c = b.consumer("c", idem.Config{})
	b.seed(c, recent)

	res, err := b.purge(b.ctx, c.Name(), 2, true, nil)
	if err != nil {
		t.Fatalf("dry-run Purge: %v", err)
	}
	if res.Deleted != 3 {
		t.Errorf("dry-run Purge: Deleted = %d, want 3 (the rows that would go)", res.Deleted)
	}
	b.wantRecords("after the dry run", c.Name(), 5)

	res, err = b.purge(b.ctx, c.Name(), 2, false, nil)
	if err != nil {
		t.Fatalf("Purge after the dry run: %v", err)
	}
	if res.Deleted != 3 {
		t.Errorf("Purge after the dry run: Deleted = %d, want 3", res.Deleted)
	}
	b.wantRecords("after the purge", c.Name(), 2)
}

// A purge touches one consumer's records and counts that consumer's
// running time only: a consumer that was down while another kept running
// keeps its records.
func testPurgePerConsumer[TTx any](t *testing.T, b *bundle[TTx]) {
	a, z := b.consumer("a", idem.Config{}), b.consumer("z", idem.Config{})
	for _, c := range []*idem.Consumer[TTx]{a, z} {
		b.seed(c, msgs("old-", 3))
	}
	b.elapse(a, 8*day)
	a = b.consumer("a", idem.Config{})
	b.seed(a, msgs("new-", 1))
	res, err := b.purge(b.ctx, a.Name(), 10, false, nil)
	if err != nil || res.Deleted != 3 {
		t.Errorf("Purge of consumer a: Deleted %d, err %v; want 3 and nil", res.Deleted, err)
	}
	b.wantRecords("consumer a after its purge", a.Name(), 1)
	b.wantRecords("consumer z after consumer a's purge", z.Name(), 3)

	// z was down for 30 days while a kept running: z keeps everything.
	_ = z.Close()
	downtime(t, b.ctx, b.s.Shift, z.Name(), 30*day)
	b.elapse(a, 30*day)
	if _, err := b.purge(b.ctx, a.Name(), 10, false, nil); err != nil {
		t.Errorf("Purge of consumer a: %v", err)
	}
	b.wantRecords("consumer z after consumer a's second purge", z.Name(), 3)
	res, err = b.purge(b.ctx, z.Name(), 10, false, nil)
	if err != nil || res.Deleted != 0 {
		t.Errorf("Purge of a consumer down for 30 days while another ran: Deleted %d, err %v; want 0 and nil", res.Deleted, err)
	}
	b.wantRecords("consumer z after its purge", z.Name(), 3)
}

// A consumer with no records: nothing to do, and no horizon.
func testPurgeNoRecords[TTx any](t *testing.T, b *bundle[TTx]) {
	res, err := b.purge(b.ctx, b.name("nobody"), 10, false, nil)
	if err != nil || res.Deleted != 0 || res.Batches != 0 || !res.Horizon.IsZero() {
		t.Errorf("Purge of a consumer with no records: %+v, err %v; want zero result and nil", res, err)
	}
}

// Invalid purge parameters are refused before anything is deleted.
func testPurgeInvalidParams[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{})
	old := msgs("old-", 2)
	b.seed(c, old)
	b.elapse(c, 8*day)
	c = b.consumer("c", idem.Config{})
	b.seed(c, msgs("new-", 1))
	for _, tt := range []struct {
		name string
		p    idem.PurgeParams
		want error
	}{
		{"zero window", idem.PurgeParams{Consumer: c.Name(), BatchSize: 10}, idem.ErrInvalidConfig},
		{"negative window", idem.PurgeParams{Consumer: c.Name(), RetentionWindow: -window, BatchSize: 10}, idem.ErrInvalidConfig},
		{"zero batch size", idem.PurgeParams{Consumer: c.Name(), RetentionWindow: window}, idem.ErrInvalidConfig},
		{"negative batch size", idem.PurgeParams{Consumer: c.Name(), RetentionWindow: window, BatchSize: -1}, idem.ErrInvalidConfig},
		{"empty consumer", idem.PurgeParams{RetentionWindow: window, BatchSize: 10}, idem.ErrInvalidConsumerName},
		{"consumer with a control character", idem.PurgeParams{Consumer: "a\nb", RetentionWindow: window, BatchSize: 10}, idem.ErrInvalidConsumerName},
	} {
		_, err := idem.Purge(b.ctx, b.s.Store, tt.p)
		if !errors.Is(err, tt.want) {
			t.Errorf("Purge with %s: err = %v, want an error matching %v", tt.name, err, tt.want)
		}
	}
	b.wantRecords("after the refused purges", c.Name(), 3)
}

// Consumer.Purge uses the Config's window and batch size.
func testConsumerPurge[TTx any](t *testing.T, b *bundle[TTx]) {
	cfg := idem.Config{RetentionWindow: day, PurgeBatchSize: 2}
	c := b.consumer("c", cfg)
	b.seed(c, msgs("old-", 3))
	b.elapse(c, 36*time.Hour)
	c = b.consumer("c", cfg)
	b.seed(c, msgs("young-", 2))
	b.elapse(c, 12*time.Hour)
	c = b.consumer("c", cfg)
	b.seed(c, msgs("new-", 1))
	res, err := c.Purge(b.ctx)
	if err != nil {
		t.Fatalf("Consumer.Purge: %v", err)
	}
	if res.Deleted != 3 || res.Batches < 2 || res.Batches > 3 {
		t.Errorf("Consumer.Purge with a 1-day window and batches of 2: Deleted %d in %d batches, want 3 in 2 (or 3)", res.Deleted, res.Batches)
	}
	b.wantRecords("after Consumer.Purge", c.Name(), 3)
}

// The inbox keeps flowing while a purge runs: with the purge paused
// between two batches, new messages are processed and committed.
func testPurgeWhileProcessing[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{})
	old := msgs("old-", 6)
	b.seed(c, old)
	b.elapse(c, 8*day)
	c = b.consumer("c", idem.Config{})
	b.seed(c, msgs("kept-", 2))

	paused, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	type result struct {
		res idem.PurgeResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := b.purge(b.ctx, c.Name(), 1, false, func(int64) {
			once.Do(func() {
				close(paused)
				<-resume
			})
		})
		done <- result{res, err}
	}()
	select {
	case <-paused:
	case r := <-done:
		t.Fatalf("Purge returned (%+v, %v) without calling OnBatch", r.res, r.err)
	case <-time.After(blockTimeout):
		t.Fatalf("Purge did not reach its first OnBatch within %v", blockTimeout)
	}

	// The purge is between batches: process new messages meanwhile.
	var calls atomic.Int64
	h := b.handler(c, &calls)
	fresh := msgs("during-", 8)
	outs := make([]idem.Outcome, len(fresh))
	errs := make([]error, len(fresh))
	processed := make(chan struct{})
	go func() {
		race(len(fresh), func(i int) { outs[i], errs[i] = c.Process(b.ctx, fresh[i], h) })
		close(processed)
	}()
	completed := waitFor(t, processed, "processing 8 messages while a purge was paused between batches")
	close(resume)
	if !completed {
		<-processed
	}
	r := <-done
	if r.err != nil || r.res.Deleted != int64(len(old)) {
		t.Errorf("Purge alongside processing: Deleted %d, err %v; want %d and nil", r.res.Deleted, r.err, len(old))
	}
	for i, m := range fresh {
		b.wantOutcome(fmt.Sprintf("message %q processed during the purge", m.ID), m.ID, outs[i], errs[i], idem.Processed, nil)
		b.wantEffects("after the purge", c.Name(), m.ID, 1)
	}
	b.wantRecords("after the purge", c.Name(), 2+len(fresh))
}

// Two purges of one consumer at once: while one is working (here, paused
// in OnBatch) the other does no work: it returns ErrPurgeInProgress, or
// waits for the first and finds nothing left. The total deleted is exact.
func testConcurrentPurges[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{})
	old := msgs("old-", 10)
	b.seed(c, old)
	b.elapse(c, 8*day)
	c = b.consumer("c", idem.Config{})
	b.seed(c, msgs("kept-", 2))

	type result struct {
		res idem.PurgeResult
		err error
	}
	inFirst, release := make(chan struct{}), make(chan struct{})
	var released atomic.Bool
	var once sync.Once
	firstDone, secondDone := make(chan result, 1), make(chan result, 1)
	go func() {
		res, err := b.purge(b.ctx, c.Name(), 2, false, func(int64) {
			once.Do(func() {
				close(inFirst)
				<-release
			})
		})
		firstDone <- result{res, err}
	}()
	select {
	case <-inFirst:
	case r := <-firstDone:
		t.Fatalf("first Purge returned (%+v, %v) without calling OnBatch", r.res, r.err)
	case <-time.After(blockTimeout):
		t.Fatalf("first Purge did not reach its first OnBatch within %v", blockTimeout)
	}

	var secondWorkedEarly atomic.Bool
	go func() {
		res, err := b.purge(b.ctx, c.Name(), 2, false, func(int64) {
			if !released.Load() {
				secondWorkedEarly.Store(true)
			}
		})
		secondDone <- result{res, err}
	}()
	var second result
	gotSecond := false
	select {
	case second = <-secondDone: // refused at once
		gotSecond = true
	case <-time.After(200 * time.Millisecond):
		// A store whose second cleaner waits for the lock is fine too; give
		// it a moment to misbehave, then let the first one finish.
	}
	released.Store(true)
	close(release)
	first := <-firstDone
	if !gotSecond {
		second = <-secondDone
	}

	if first.err != nil {
		t.Errorf("first Purge: %v", first.err)
	}
	if second.err != nil && !errors.Is(second.err, idem.ErrPurgeInProgress) {
		t.Errorf("second Purge: err = %v, want nil or an error matching ErrPurgeInProgress", second.err)
	}
	if secondWorkedEarly.Load() || (gotSecond && second.res.Deleted > 0) {
		t.Errorf("second Purge deleted rows while the first was in progress (result %+v)", second.res)
	}
	if total := first.res.Deleted + second.res.Deleted; total != int64(len(old)) {
		t.Errorf("two concurrent purges deleted %d + %d rows, want %d in total", first.res.Deleted, second.res.Deleted, len(old))
	}
	b.wantRecords("after the concurrent purges", c.Name(), 2)
}

// A purge whose context ends returns its error and releases the purge lock,
// whether it was cancelled before it started or between batches.
func testPurgeCancelled[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{})
	old := msgs("old-", 4)
	b.seed(c, old)
	b.elapse(c, 8*day)
	c = b.consumer("c", idem.Config{})
	b.seed(c, msgs("kept-", 2))

	ctx, cancel := context.WithCancel(b.ctx)
	cancel()
	if _, err := b.purge(ctx, c.Name(), 1, false, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("Purge with a cancelled context: err = %v, want an error matching context.Canceled", err)
	}
	b.wantRecords("after the cancelled purge", c.Name(), 6)

	ctx, cancel = context.WithCancel(b.ctx)
	defer cancel()
	res1, err := b.purge(ctx, c.Name(), 1, false, func(int64) { cancel() })
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("Purge cancelled between batches: err = %v, want nil or an error matching context.Canceled", err)
	}
	cancelledErr := err
	res2, err := b.purge(b.ctx, c.Name(), 1, false, nil)
	if err != nil {
		t.Errorf("Purge after a cancelled purge: err = %v, want nil (the purge lock must be released)", err)
	}
	// A purge that ended early may not know how many rows it had deleted;
	// one that returned nil must.
	if total := res1.Deleted + res2.Deleted; cancelledErr == nil && total != int64(len(old)) {
		t.Errorf("a purge whose context was cancelled (returning nil) then a full one deleted %d + %d rows, want %d in total",
			res1.Deleted, res2.Deleted, len(old))
	}
	b.wantRecords("after the purges", c.Name(), 2)
}

// The Retainer primitives, called directly: runs, the purge lock, bounds
// and validation.
func testRetainerPrimitives[TTx any](t *testing.T, b *bundle[TTx]) {
	retainerCases(t, b.ctx, b.s.Store, b.name("direct"))
}
