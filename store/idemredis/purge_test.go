package idemredis_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idemredis"
)

const day = 24 * time.Hour

// seed completes n messages prefix-0 ... of consumer and returns their IDs.
func (b *testBundle) seed(t *testing.T, consumer, prefix string, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s%d", prefix, i)
		a := b.mustAcquire(t, consumer, ids[i], fp("p"), longLease, 1)
		if err := b.store.SaveStep(b.ctx, &idemdriver.StepParams{Consumer: consumer, MessageID: ids[i], Token: a.Token, Step: "s", Result: []byte("v")}); err != nil {
			t.Fatal(err)
		}
		b.complete(t, consumer, ids[i], a.Token, []byte("r"), "")
	}
	return ids
}

func (b *testBundle) age(t *testing.T, consumer string, ids []string, d time.Duration) {
	t.Helper()
	if err := b.store.AgeRecords(b.ctx, consumer, ids, d); err != nil {
		t.Fatalf("AgeRecords: %v", err)
	}
}

func (b *testBundle) count(t *testing.T, consumer string) int {
	t.Helper()
	n, err := b.store.CountRecords(b.ctx, consumer)
	if err != nil {
		t.Fatalf("CountRecords: %v", err)
	}
	return n
}

func (b *testBundle) purge(t *testing.T, p idem.PurgeParams) idem.PurgeResult {
	t.Helper()
	res, err := b.store.Purge(b.ctx, &p)
	if err != nil {
		t.Fatalf("Purge(%+v): %v", p, err)
	}
	return res
}

// Bounded batches with OnBatch, DryRun, the horizon from the newest
// finished record, in_progress records kept, other consumers untouched,
// and every key of a purged record (its steps too) and its index entry gone.
func TestPurgeBatches(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	old := b.seed(t, "c", "old-", 7)
	fresh := b.seed(t, "c", "new-", 2)
	b.mustAcquire(t, "c", "inflight", fp("p"), longLease, 1)
	other := b.seed(t, "other", "old-", 3)
	b.age(t, "c", append(slices.Clone(old), "inflight"), 8*day)
	b.age(t, "other", other, 8*day)

	p := idem.PurgeParams{Consumer: "c", RetentionWindow: 7 * day, BatchSize: 3}
	p.DryRun = true
	var calls []int64
	p.OnBatch = func(n int64) { calls = append(calls, n) }
	res := b.purge(t, p)
	if res.Deleted != 7 || res.Batches != 1 || !slices.Equal(calls, []int64{7}) || b.count(t, "c") != 10 {
		t.Errorf("DryRun: %+v, OnBatch %v, %d records; want 7 counted in 1 batch, nothing deleted", res, calls, b.count(t, "c"))
	}

	p.DryRun, calls = false, nil
	before := b.serverMillis(t)
	res = b.purge(t, p)
	if res.Deleted != 7 || res.Batches != 3 || !slices.Equal(calls, []int64{3, 6, 7}) {
		t.Errorf("Purge: %+v, OnBatch %v; want 7 deleted in batches of 3: [3 6 7]", res, calls)
	}
	if h := res.Horizon.UnixMilli(); h > before-int64(7*day/time.Millisecond) || h < before-int64(7*day/time.Millisecond)-60_000 {
		t.Errorf("Horizon %v, want the newest completion (just now) minus 7 days", res.Horizon)
	}
	if n := b.count(t, "c"); n != 3 {
		t.Errorf("records of c after the purge: %d, want 3 (2 new, 1 in progress)", n)
	}
	if n := b.count(t, "other"); n != 3 {
		t.Errorf("records of another consumer: %d, want 3 untouched", n)
	}
	for _, id := range old {
		rk := b.store.RecordKey("c", id)
		if n := b.client.Exists(b.ctx, rk, rk+idemredis.StepsSuffix).Val(); n != 0 {
			t.Errorf("purged %s: %d of its keys remain", id, n)
		}
	}
	idx := b.client.ZRange(b.ctx, b.store.ConsumerKey("c", idemredis.DoneSuffix), 0, -1).Val()
	if !slices.Equal(idx, fresh) {
		t.Errorf("index after the purge: %q, want %q", idx, fresh)
	}
	if res := b.purge(t, p); res.Deleted != 0 || res.Batches != 0 {
		t.Errorf("second purge: %+v, want nothing", res)
	}
	if n := b.client.Exists(b.ctx, b.store.ConsumerKey("c", idemredis.PurgeSuffix)).Val(); n != 0 {
		t.Errorf("the purge lock remains after the purge")
	}
	if res := b.purge(t, idem.PurgeParams{Consumer: "nobody", RetentionWindow: day, BatchSize: 10}); res != (idem.PurgeResult{}) {
		t.Errorf("purge of a consumer without records: %+v, want zero", res)
	}
	for _, bad := range []idem.PurgeParams{
		{Consumer: "c", RetentionWindow: 0, BatchSize: 1},
		{Consumer: "c", RetentionWindow: day, BatchSize: 0},
		{Consumer: "", RetentionWindow: day, BatchSize: 1},
	} {
		if _, err := b.store.Purge(b.ctx, &bad); !errors.Is(err, idem.ErrInvalidConfig) && !errors.Is(err, idem.ErrInvalidConsumerName) {
			t.Errorf("Purge(%+v) = %v, want a config error", bad, err)
		}
	}
}

// Downtime safety: a consumer whose every record is older than the window
// (it was down) loses nothing; once it completes a new message, what is
// older than that minus the window goes.
func TestPurgeDowntimeSafe(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ids := b.seed(t, "c", "m-", 5)
	b.age(t, "c", ids[:3], 40*day)
	b.age(t, "c", ids[3:], 30*day)
	p := idem.PurgeParams{Consumer: "c", RetentionWindow: 7 * day, BatchSize: 100}
	res := b.purge(t, p)
	if res.Deleted != 3 || b.count(t, "c") != 2 {
		t.Errorf("after 30 days down: %+v, %d records; want the 3 records 10 days older than the newest deleted", res, b.count(t, "c"))
	}
	if want := time.Now().Add(-37 * day); res.Horizon.Sub(want).Abs() > time.Minute {
		t.Errorf("Horizon %v, want about %v (the newest record, 30 days old, minus 7 days)", res.Horizon, want)
	}
	b.seed(t, "c", "back-", 1)
	if res := b.purge(t, p); res.Deleted != 2 || b.count(t, "c") != 1 {
		t.Errorf("after coming back: %+v, %d records; want the 2 old records deleted", res, b.count(t, "c"))
	}
}

// One cleaner at a time: a purge paused in OnBatch holds the lock (set
// with PX, a TTL in milliseconds, extended after each batch); a second
// purge gets ErrPurgeInProgress; a lock left by a dead cleaner expires.
func TestPurgeLock(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.age(t, "c", b.seed(t, "c", "old-", 4), 8*day)
	b.seed(t, "c", "new-", 1)
	lock := b.store.ConsumerKey("c", idemredis.PurgeSuffix)
	p := idem.PurgeParams{Consumer: "c", RetentionWindow: day, BatchSize: 2}
	batches := 0
	p.OnBatch = func(int64) {
		batches++
		if _, err := b.store.Purge(b.ctx, &idem.PurgeParams{Consumer: "c", RetentionWindow: day, BatchSize: 2}); !errors.Is(err, idem.ErrPurgeInProgress) {
			t.Errorf("purge during a purge: %v, want ErrPurgeInProgress", err)
		}
		if ttl := b.client.PTTL(b.ctx, lock).Val(); ttl <= 25*time.Second || ttl > 30*time.Second {
			t.Errorf("purge lock PTTL %v, want within (25s, 30s]", ttl)
		}
		// Other consumers have their own lock.
		if _, err := b.store.Purge(b.ctx, &idem.PurgeParams{Consumer: "d", RetentionWindow: day, BatchSize: 2}); err != nil {
			t.Errorf("purge of another consumer during a purge: %v", err)
		}
	}
	if res := b.purge(t, p); res.Deleted != 4 || batches != 2 {
		t.Errorf("purge: %+v in %d OnBatch calls, want 4 in 2", res, batches)
	}

	// A dead cleaner's lock, 200ms left.
	if err := b.client.Do(b.ctx, "SET", lock, "dead cleaner", "PX", 200).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Purge(b.ctx, &p); !errors.Is(err, idem.ErrPurgeInProgress) {
		t.Errorf("purge while a dead cleaner's lock lives: %v, want ErrPurgeInProgress", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for b.client.Exists(b.ctx, lock).Val() == 1 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := b.store.Purge(b.ctx, &p); err != nil {
		t.Errorf("purge after the dead cleaner's lock expired: %v", err)
	}
}

// The index and the records live in different hash slots, so they are
// written by separate commands; what a crash between them leaves is
// harmless. An entry written by a Complete that then failed (the record is
// in progress) is skipped and kept until the record completes; an entry
// whose record is gone is removed without being counted; a record aged
// past the horizon while another attempt holds it is never deleted.
func TestPurgeIndexRepairs(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	done := b.store.ConsumerKey("c", idemredis.DoneSuffix)
	b.seed(t, "c", "new-", 1)
	gone := b.seed(t, "c", "gone-", 2)
	b.age(t, "c", gone, 9*day)
	if err := b.client.Del(b.ctx, b.store.RecordKey("c", gone[0]), b.store.RecordKey("c", gone[1])).Err(); err != nil {
		t.Fatal(err)
	}

	// A stale owner completes after a takeover: its index write lands, its
	// record write is refused.
	a1 := b.mustAcquire(t, "c", "taken", fp("p"), longLease, 1)
	if err := b.store.ExpireLease(b.ctx, "c", "taken"); err != nil {
		t.Fatal(err)
	}
	a2 := b.mustAcquire(t, "c", "taken", fp("p"), longLease, 2)
	if err := b.store.Complete(b.ctx, &idemdriver.CompleteParams{Consumer: "c", MessageID: "taken", Token: a1.Token, Result: []byte("stale")}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("stale Complete: %v, want ErrLeaseLost", err)
	}
	b.age(t, "c", []string{"taken"}, 9*day)
	old := b.seed(t, "c", "old-", 3)
	b.age(t, "c", old, 8*day)

	res := b.purge(t, idem.PurgeParams{Consumer: "c", RetentionWindow: 7 * day, BatchSize: 2})
	if res.Deleted != 3 {
		t.Errorf("purge: %+v, want the 3 old records deleted (not the gone ones, not the one in progress)", res)
	}
	idx := b.client.ZRange(b.ctx, done, 0, -1).Val()
	if !slices.Equal(idx, []string{"taken", "new-0"}) {
		t.Errorf("index after the purge: %q, want [taken new-0]", idx)
	}
	if r := b.acquire(t, "c", "taken", fp("p"), longLease); r.Acquired || r.State != idemdriver.StateInProgress || r.Attempt != 2 {
		t.Errorf("the record in progress: %+v, want it kept, held by attempt 2", r)
	}
	b.complete(t, "c", "taken", a2.Token, []byte("r2"), "")
	if res := b.purge(t, idem.PurgeParams{Consumer: "c", RetentionWindow: 7 * day, BatchSize: 2}); res.Deleted != 0 {
		t.Errorf("purge after the takeover completed: %+v, want nothing (completed now)", res)
	}
	if n := b.count(t, "c"); n != 2 {
		t.Errorf("records: %d, want 2", n)
	}
}

// Purge pipelines its per-record scripts with EVALSHA; a server that does
// not have them cached (restarted, failed over, SCRIPT FLUSH) answers
// NOSCRIPT, and the purge sends the scripts' source instead.
func TestPurgeAfterScriptFlush(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.age(t, "c", b.seed(t, "c", "old-", 3), 8*day)
	b.seed(t, "c", "new-", 1)
	if err := b.client.ScriptFlush(b.ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if res := b.purge(t, idem.PurgeParams{Consumer: "c", RetentionWindow: 7 * day, BatchSize: 2}); res.Deleted != 3 {
		t.Errorf("purge after SCRIPT FLUSH: %+v, want 3 deleted", res)
	}
}
