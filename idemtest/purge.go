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

// purge runs Store.Purge for consumer.
func (b *bundle[TTx]) purge(ctx context.Context, consumer string, batchSize int, dryRun bool, onBatch func(int64)) (idem.PurgeResult, error) {
	return b.s.Store.Purge(ctx, &idem.PurgeParams{
		Consumer:        consumer,
		RetentionWindow: window,
		BatchSize:       batchSize,
		DryRun:          dryRun,
		OnBatch:         onBatch,
	})
}

// wantHorizon checks a purge horizon against the newest record's age.
func (b *bundle[TTx]) wantHorizon(what string, got time.Time, newestAge time.Duration) {
	b.t.Helper()
	want := time.Now().Add(-newestAge - window)
	if d := got.Sub(want); got.IsZero() || d > horizonSlack || d < -horizonSlack {
		b.t.Errorf("%s: Horizon = %v, want about %v (the newest record, %v old, minus the %v window)", what, got, want, newestAge, window)
	}
}

// Records older than the window, counted back from the consumer's newest
// record, are deleted in batches of at most BatchSize; records inside the
// window stay and are still deduplicated.
func testPurgeWindow[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{})
	old, mid, recent := msgs("old-", 5), msgs("mid-", 3), msgs("new-", 4)
	b.seed(c, old)
	b.seed(c, mid)
	b.seed(c, recent)
	b.age(c.Name(), msgIDs(old), 8*day)
	b.age(c.Name(), msgIDs(mid), 6*day)

	var mu sync.Mutex
	var seen []int64
	res, err := b.purge(b.ctx, c.Name(), 2, false, func(n int64) {
		mu.Lock()
		seen = append(seen, n)
		mu.Unlock()
	})
	if err != nil {
		t.Fatalf("Purge: %v", err)
	}
	if res.Deleted != 5 {
		t.Errorf("Purge: Deleted = %d, want 5", res.Deleted)
	}
	// 5 rows in batches of 2: 3 DELETEs, or 4 if the store stops only on an
	// empty batch.
	if res.Batches < 3 || res.Batches > 4 {
		t.Errorf("Purge with BatchSize 2: Batches = %d, want 3 (or 4) for 5 rows", res.Batches)
	}
	b.wantHorizon("Purge", res.Horizon, 0)
	mu.Lock()
	prev := int64(0)
	for _, n := range seen {
		if n < prev || n-prev > 2 {
			t.Errorf("OnBatch reported %v: want non-decreasing totals growing by at most BatchSize (2)", seen)
			break
		}
		prev = n
	}
	if len(seen) == 0 || seen[len(seen)-1] != res.Deleted {
		t.Errorf("OnBatch reported %v, want its last total to be Deleted (%d)", seen, res.Deleted)
	}
	mu.Unlock()
	b.wantRecords("after the purge", c.Name(), len(mid)+len(recent))

	var calls atomic.Int64
	h := b.handler(c, &calls)
	b.process("a record inside the window", c, mid[0], h, idem.Duplicate, nil)
	b.process("a recent record", c, recent[0], h, idem.Duplicate, nil)
	b.process("a purged record, redelivered after the window", c, old[0], h, idem.Processed, nil)

	// A second purge finds nothing more (and the purge lock was released).
	res, err = b.purge(b.ctx, c.Name(), 2, false, nil)
	if err != nil || res.Deleted != 0 {
		t.Errorf("second Purge: Deleted %d, err %v; want 0 and nil", res.Deleted, err)
	}
}

// Downtime-safe retention: after a month without traffic every record is
// 30 days old, but the horizon counts back from the newest record, so
// nothing inside the window is deleted. Only records older than the newest
// by more than the window go.
func testPurgeDowntimeSafe[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{})
	ms := msgs("r-", 6)
	b.seed(c, ms)
	ids := msgIDs(ms)
	b.age(c.Name(), ids, 30*day)
	b.age(c.Name(), ids[:2], 3*day) // 33 days: 3 days before the newest

	res, err := b.purge(b.ctx, c.Name(), 2, false, nil)
	if err != nil {
		t.Fatalf("Purge: %v", err)
	}
	if res.Deleted != 0 {
		t.Errorf("Purge after 30 days of downtime with a 7-day window: Deleted = %d, want 0 (horizon from the newest record, not from now)", res.Deleted)
	}
	b.wantHorizon("Purge after downtime", res.Horizon, 30*day)
	b.wantRecords("after the purge", c.Name(), len(ms))

	b.age(c.Name(), ids[:1], 10*day) // 43 days: 13 days before the newest
	res, err = b.purge(b.ctx, c.Name(), 2, false, nil)
	if err != nil {
		t.Fatalf("second Purge: %v", err)
	}
	if res.Deleted != 1 {
		t.Errorf("second Purge: Deleted = %d, want 1 (the record 13 days older than the newest)", res.Deleted)
	}
	b.wantRecords("after the second purge", c.Name(), len(ms)-1)
	var calls atomic.Int64
	b.process("a record 3 days older than the newest", c, ms[1], b.handler(c, &calls), idem.Duplicate, nil)
}

// DryRun counts and deletes nothing.
func testPurgeDryRun[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{})
	old, recent := msgs("old-", 3), msgs("new-", 2)
	b.seed(c, old)
	b.seed(c, recent)
	b.age(c.Name(), msgIDs(old), 8*day)

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

// A purge touches one consumer's records, and its horizon is that
// consumer's newest record, not the table's.
func testPurgePerConsumer[TTx any](t *testing.T, b *bundle[TTx]) {
	a, z := b.consumer("a", idem.Config{}), b.consumer("z", idem.Config{})
	for _, c := range []*idem.Consumer[TTx]{a, z} {
		old := msgs("old-", 3)
		b.seed(c, old)
		b.seed(c, msgs("new-", 1))
		b.age(c.Name(), msgIDs(old), 8*day)
	}
	res, err := b.purge(b.ctx, a.Name(), 10, false, nil)
	if err != nil || res.Deleted != 3 {
		t.Errorf("Purge of consumer a: Deleted %d, err %v; want 3 and nil", res.Deleted, err)
	}
	b.wantRecords("consumer a after its purge", a.Name(), 1)
	b.wantRecords("consumer z after consumer a's purge", z.Name(), 4)

	// Consumer idle has been idle for 30 days while busy kept going: idle's
	// horizon is its own newest record minus the window.
	idle, busy := b.consumer("idle", idem.Config{}), b.consumer("busy", idem.Config{})
	im := msgs("m-", 3)
	b.seed(idle, im)
	b.seed(busy, msgs("m-", 3))
	b.age(idle.Name(), msgIDs(im), 30*day)
	res, err = b.purge(b.ctx, idle.Name(), 10, false, nil)
	if err != nil || res.Deleted != 0 {
		t.Errorf("Purge of a consumer idle for 30 days while another was busy: Deleted %d, err %v; want 0 and nil", res.Deleted, err)
	}
	b.wantRecords("idle consumer after its purge", idle.Name(), 3)
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
	b.seed(c, msgs("new-", 1))
	b.age(c.Name(), msgIDs(old), 8*day)
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
		_, err := b.s.Store.Purge(b.ctx, &tt.p)
		if !errors.Is(err, tt.want) {
			t.Errorf("Purge with %s: err = %v, want an error matching %v", tt.name, err, tt.want)
		}
	}
	b.wantRecords("after the refused purges", c.Name(), 3)
}

// Consumer.Purge uses the Config's window and batch size.
func testConsumerPurge[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{RetentionWindow: day, PurgeBatchSize: 2})
	old, young := msgs("old-", 3), msgs("young-", 2)
	b.seed(c, old)
	b.seed(c, young)
	b.seed(c, msgs("new-", 1))
	b.age(c.Name(), msgIDs(old), 2*day)
	b.age(c.Name(), msgIDs(young), 12*time.Hour)
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
	b.seed(c, msgs("kept-", 2))
	b.age(c.Name(), msgIDs(old), 8*day)

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
	b.seed(c, msgs("kept-", 2))
	b.age(c.Name(), msgIDs(old), 8*day)

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
	b.seed(c, msgs("kept-", 2))
	b.age(c.Name(), msgIDs(old), 8*day)

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
