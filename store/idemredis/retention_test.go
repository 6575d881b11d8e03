package idemredis_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/idemredis"
	"github.com/redis/go-redis/v9"
)

const day = 24 * time.Hour

// seed completes n messages prefix-0 ... of consumer, each with a recovery
// point, and returns their IDs.
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

func (b *testBundle) shift(t *testing.T, consumer string, d time.Duration) {
	t.Helper()
	if err := b.store.Shift(b.ctx, consumer, d); err != nil {
		t.Fatalf("Shift: %v", err)
	}
}

func (b *testBundle) addRun(t *testing.T, consumer string, start, end time.Time) {
	t.Helper()
	if err := b.store.AddRun(b.ctx, consumer, start, end); err != nil {
		t.Fatalf("AddRun: %v", err)
	}
}

func (b *testBundle) markRunning(t *testing.T, consumer string, maxGap time.Duration) {
	t.Helper()
	if err := b.store.MarkRunning(b.ctx, &idemdriver.MarkRunningParams{Consumer: consumer, MaxGap: maxGap}); err != nil {
		t.Fatalf("MarkRunning(%q, %v): %v", consumer, maxGap, err)
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

// serverNow returns the Redis server's TIME, in microseconds.
func (b *testBundle) serverNow(t *testing.T) time.Time {
	t.Helper()
	now, err := b.client.Time(b.ctx).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	return now
}

// begin opens a purge session of consumer, closed at cleanup.
func (b *testBundle) begin(t *testing.T, consumer string) idemdriver.PurgeSession {
	t.Helper()
	s, err := b.store.BeginPurge(b.ctx, &idemdriver.BeginPurgeParams{Consumer: consumer})
	if err != nil {
		t.Fatalf("BeginPurge(%q): %v", consumer, err)
	}
	t.Cleanup(func() { _ = s.Close(b.ctx) })
	return s
}

// runs returns consumer's runs through a purge session.
func (b *testBundle) runs(t *testing.T, consumer string) []idemdriver.Run {
	t.Helper()
	s := b.begin(t, consumer)
	defer s.Close(b.ctx)
	runs, err := s.Runs(b.ctx)
	if err != nil {
		t.Fatalf("Runs: %v", err)
	}
	return runs
}

// MarkRunning by the server's clock: a MaxGap of zero always adds a run
// [now, now]; a positive MaxGap extends the newest run to now when it ended
// no more than MaxGap ago, and otherwise adds a run. Runs come oldest
// first, and each consumer has its own.
func TestMarkRunning(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	before := b.serverNow(t)
	b.markRunning(t, "c", 0)
	after := b.serverNow(t)
	runs := b.runs(t, "c")
	if len(runs) != 1 || !runs[0].Start.Equal(runs[0].End) || runs[0].Start.Before(before) || runs[0].Start.After(after) {
		t.Fatalf("after the first mark: %v, want one run [now, now] within [%v, %v]", runs, before, after)
	}
	b.markRunning(t, "c", 0)
	if runs := b.runs(t, "c"); len(runs) != 2 {
		t.Fatalf("after a second mark with MaxGap 0: %v, want two runs", runs)
	}

	// The newest run ended 30 minutes ago: a MaxGap of an hour extends it.
	b.shift(t, "c", 30*time.Minute)
	shifted := b.runs(t, "c")
	b.markRunning(t, "c", time.Hour)
	runs = b.runs(t, "c")
	if len(runs) != 2 || !runs[1].Start.Equal(shifted[1].Start) || runs[1].End.Sub(runs[1].Start) < 30*time.Minute || runs[0] != shifted[0] {
		t.Errorf("extended: %v (from %v), want the newest run extended by 30 minutes to now, the older one untouched", runs, shifted)
	}

	// Ended two hours ago: a MaxGap of an hour adds a run.
	b.shift(t, "c", 2*time.Hour)
	shifted = b.runs(t, "c")
	b.markRunning(t, "c", time.Hour)
	runs = b.runs(t, "c")
	if len(runs) != 3 || !slices.Equal(runs[:2], shifted) || !runs[2].Start.Equal(runs[2].End) || runs[2].Start.Before(after) {
		t.Errorf("after a gap over MaxGap: %v (from %v), want a new run [now, now] after the two kept", runs, shifted)
	}
	for i := 1; i < len(runs); i++ {
		if runs[i].Start.Before(runs[i-1].Start) {
			t.Errorf("runs not oldest first: %v", runs)
		}
	}
	if runs := b.runs(t, "other"); len(runs) != 0 {
		t.Errorf("runs of a consumer that never ran: %v, want none", runs)
	}
	if ttl := b.client.PTTL(b.ctx, b.store.ConsumerKey("c", idemredis.RunsSuffix)).Val(); ttl != -1 {
		t.Errorf("the runs key has a TTL %v, want none", ttl)
	}
}

// One cleaner per (prefix, consumer): a second BeginPurge, through another
// Store and client, gets ErrPurgeInProgress at once while the first
// session holds the lock; other consumers and other prefixes have their
// own lock. The lock is set with PX and a TTL of 30s, renewed by every
// session call, deleted by Close (which is safe twice), and a session
// that lost it to another holder stops.
func TestPurgeLock(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	other, err := idemredis.New(newClient(t), &idemredis.Config{Prefix: b.prefix})
	if err != nil {
		t.Fatal(err)
	}
	lock := b.store.ConsumerKey("c", idemredis.PurgeSuffix)
	s := b.begin(t, "c")
	begin := func(st *idemredis.Store, consumer string) (idemdriver.PurgeSession, error) {
		return st.BeginPurge(b.ctx, &idemdriver.BeginPurgeParams{Consumer: consumer})
	}
	start := time.Now()
	if _, err := begin(other, "c"); !errors.Is(err, idemdriver.ErrPurgeInProgress) || !errors.Is(err, idem.ErrPurgeInProgress) {
		t.Errorf("second BeginPurge: %v, want ErrPurgeInProgress", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("second BeginPurge took %v, want an immediate answer", d)
	}
	if ttl := b.client.PTTL(b.ctx, lock).Val(); ttl <= 25*time.Second || ttl > 30*time.Second {
		t.Errorf("purge lock PTTL %v, want within (25s, 30s]", ttl)
	}
	if d, err := begin(other, "d"); err != nil {
		t.Errorf("BeginPurge of another consumer: %v", err)
	} else {
		_ = d.Close(b.ctx)
	}
	elsewhere := setup(t, b.client)
	if d, err := begin(elsewhere.store, "c"); err != nil {
		t.Errorf("BeginPurge of the same consumer under another prefix: %v", err)
	} else {
		_ = d.Close(b.ctx)
	}

	// Every call renews the lock.
	if err := b.client.PExpire(b.ctx, lock, time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Runs(b.ctx); err != nil {
		t.Fatal(err)
	}
	if ttl := b.client.PTTL(b.ctx, lock).Val(); ttl <= 25*time.Second {
		t.Errorf("PTTL after a session call: %v, want renewed to 30s", ttl)
	}
	// A lock that expired while nobody else took it is taken again.
	if err := b.client.Del(b.ctx, lock).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CountBefore(b.ctx, time.Now()); err != nil {
		t.Errorf("CountBefore after the lock expired unclaimed: %v", err)
	}
	if _, err := begin(other, "c"); !errors.Is(err, idemdriver.ErrPurgeInProgress) {
		t.Errorf("BeginPurge after the session took its lock again: %v, want ErrPurgeInProgress", err)
	}

	if err := s.Close(b.ctx); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := s.Close(b.ctx); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if n := b.client.Exists(b.ctx, lock).Val(); n != 0 {
		t.Errorf("the purge lock remains after Close")
	}
	if _, err := s.Runs(b.ctx); err == nil {
		t.Errorf("Runs after Close succeeded, want an error")
	}

	// A lock taken over by another cleaner (this one's expired) stops the
	// session, and its Close leaves the other's lock alone.
	s2, err := begin(other, "c")
	if err != nil {
		t.Fatalf("BeginPurge after Close: %v", err)
	}
	if err := b.client.Set(b.ctx, lock, "another cleaner", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s2.DeleteBatch(b.ctx, &idemdriver.PurgeBatchParams{Horizon: time.Now(), Limit: 10}); !errors.Is(err, idemdriver.ErrPurgeInProgress) {
		t.Errorf("DeleteBatch after the lock was taken over: %v, want ErrPurgeInProgress", err)
	}
	_ = s2.Close(b.ctx)
	if v := b.client.Get(b.ctx, lock).Val(); v != "another cleaner" {
		t.Errorf("after Close of a session that lost its lock, the lock is %q, want the other cleaner's", v)
	}
}

// A cleaner that crashed holding the lock (it never calls Close) blocks
// others only until the lock's TTL ends.
func TestPurgeLockExpiresAfterCrash(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	lock := b.store.ConsumerKey("c", idemredis.PurgeSuffix)
	if err := b.client.Do(b.ctx, "SET", lock, "dead cleaner", "PX", 200).Err(); err != nil {
		t.Fatal(err)
	}
	p := &idemdriver.BeginPurgeParams{Consumer: "c"}
	if _, err := b.store.BeginPurge(b.ctx, p); !errors.Is(err, idemdriver.ErrPurgeInProgress) {
		t.Fatalf("BeginPurge while a dead cleaner's lock lives: %v, want ErrPurgeInProgress", err)
	}
	var s idemdriver.PurgeSession
	testenv.Eventually(t, 10*time.Second, "BeginPurge after the dead cleaner's lock expired", func() bool {
		var err error
		s, err = b.store.BeginPurge(b.ctx, p)
		return err == nil
	}, nil)
	_ = s.Close(b.ctx)
}

// DeleteBatch deletes at most Limit settled records written before the
// horizon, oldest first, each with its recovery points and index entry,
// and never an in_progress record, however old, nor a record of another
// consumer. CountBefore counts the same records and deletes nothing.
// Before the horizon means strictly before, in milliseconds rounded up.
func TestDeleteBatch(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	old := b.seed(t, "c", "old-", 7)
	for i, id := range old {
		b.age(t, "c", []string{id}, 8*day+time.Duration(len(old)-i)*time.Minute) // old-0 oldest
	}
	fresh := b.seed(t, "c", "new-", 2)
	b.mustAcquire(t, "c", "inflight", fp("p"), longLease, 1)
	a := b.mustAcquire(t, "c", "released", fp("p"), longLease, 1)
	if err := b.store.Release(b.ctx, &idemdriver.ReleaseParams{Consumer: "c", MessageID: "released", Token: a.Token, Error: "retry"}); err != nil {
		t.Fatal(err)
	}
	b.age(t, "c", []string{"inflight", "released"}, 30*day)
	others := b.seed(t, "other", "old-", 3)
	b.age(t, "other", others, 8*day)
	horizon := b.serverNow(t).Add(-day)

	s := b.begin(t, "c")
	if n, err := s.CountBefore(b.ctx, horizon); err != nil || n != 7 {
		t.Errorf("CountBefore: %d, %v; want 7", n, err)
	}
	if n := b.count(t, "c"); n != 11 {
		t.Errorf("records after CountBefore: %d, want 11 (nothing deleted)", n)
	}
	var got []int64
	for range 4 {
		n, err := s.DeleteBatch(b.ctx, &idemdriver.PurgeBatchParams{Horizon: horizon, Limit: 3})
		if err != nil {
			t.Fatalf("DeleteBatch: %v", err)
		}
		got = append(got, n)
		if len(got) == 1 {
			for i, id := range old {
				if exists := b.client.Exists(b.ctx, b.store.RecordKey("c", id)).Val() == 1; exists != (i >= 3) {
					t.Errorf("after the first batch %s exists=%v; want the 3 oldest deleted first", id, exists)
				}
			}
		}
	}
	if !slices.Equal(got, []int64{3, 3, 1, 0}) {
		t.Errorf("batches deleted %v, want [3 3 1 0]", got)
	}
	for _, id := range old {
		rk := b.store.RecordKey("c", id)
		if n := b.client.Exists(b.ctx, rk, rk+idemredis.StepsSuffix).Val(); n != 0 {
			t.Errorf("purged %s: %d of its keys remain", id, n)
		}
	}
	for _, id := range []string{"inflight", "released"} {
		if r := b.acquire(t, "c", id, fp("p"), longLease); r.Acquired == (id == "inflight") || (id == "inflight" && r.State != idemdriver.StateInProgress) {
			t.Errorf("%s after the purge: %+v, want it kept", id, r)
		}
	}
	idx := b.client.ZRange(b.ctx, b.store.ConsumerKey("c", idemredis.DoneSuffix), 0, -1).Val()
	if !slices.Equal(idx, fresh) {
		t.Errorf("index after the purge: %q, want %q", idx, fresh)
	}
	if n := b.count(t, "other"); n != 3 {
		t.Errorf("records of another consumer: %d, want 3 untouched", n)
	}

	// The horizon is exclusive: a record finished at the horizon stays, one
	// finished a nanosecond before it goes.
	edge := "edge"
	ea := b.mustAcquire(t, "c", edge, fp("p"), longLease, 1)
	b.complete(t, "c", edge, ea.Token, nil, "")
	at, _ := b.client.HGet(b.ctx, b.store.RecordKey("c", edge), "finished_ms").Int64()
	edgeKey := b.store.RecordKey("c", edge)
	if _, err := s.DeleteBatch(b.ctx, &idemdriver.PurgeBatchParams{Horizon: time.UnixMilli(at), Limit: 10}); err != nil || b.client.Exists(b.ctx, edgeKey).Val() != 1 {
		t.Errorf("DeleteBatch with the horizon at the record's time: %v, record exists %d; want it kept", err, b.client.Exists(b.ctx, edgeKey).Val())
	}
	if _, err := s.DeleteBatch(b.ctx, &idemdriver.PurgeBatchParams{Horizon: time.UnixMilli(at).Add(time.Nanosecond), Limit: 10}); err != nil || b.client.Exists(b.ctx, edgeKey).Val() != 0 {
		t.Errorf("DeleteBatch with the horizon a nanosecond after the record's time: %v, record exists %d; want it deleted", err, b.client.Exists(b.ctx, edgeKey).Val())
	}
	if idemredis.CeilUnixMilli(time.UnixMilli(5).Add(time.Nanosecond)) != 6 || idemredis.CeilUnixMilli(time.UnixMilli(5)) != 5 {
		t.Errorf("CeilUnixMilli does not round up to the millisecond")
	}

	for _, bad := range []idemdriver.PurgeBatchParams{{Horizon: horizon}, {Limit: 1}, {Horizon: horizon, Limit: -1}} {
		if _, err := s.DeleteBatch(b.ctx, &bad); !errors.Is(err, idemdriver.ErrInvalidConfig) {
			t.Errorf("DeleteBatch(%+v) = %v, want ErrInvalidConfig", bad, err)
		}
	}
	if _, err := s.CountBefore(b.ctx, time.Time{}); !errors.Is(err, idemdriver.ErrInvalidConfig) {
		t.Errorf("CountBefore(zero) = %v, want ErrInvalidConfig", err)
	}
	if err := s.PruneRuns(b.ctx, time.Time{}); !errors.Is(err, idemdriver.ErrInvalidConfig) {
		t.Errorf("PruneRuns(zero) = %v, want ErrInvalidConfig", err)
	}
}

// The index and the records live in different hash slots, so they are
// written by separate commands; what a crash between them leaves is
// harmless. An entry written by a Complete that then failed (the record is
// in progress) is skipped and kept until the record completes, and later
// batches read past it; an entry whose record is gone is removed without
// being counted; an entry scored before the horizon whose record was
// settled after it is kept.
func TestDeleteBatchIndexRepairs(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	done := b.store.ConsumerKey("c", idemredis.DoneSuffix)
	b.seed(t, "c", "new-", 1)
	gone := b.seed(t, "c", "gone-", 2)
	b.age(t, "c", gone, 9*day)
	if err := b.client.Del(b.ctx, b.store.RecordKey("c", gone[0]), b.store.RecordKey("c", gone[1])).Err(); err != nil {
		t.Fatal(err)
	}
	// A stale owner completes after a takeover: its record write is
	// refused. On one server (this client) the index is written by the
	// same script, so nothing is indexed; through a Cluster client the
	// index write, a command of its own, lands first: written here by
	// hand.
	a1 := b.mustAcquire(t, "c", "taken", fp("p"), longLease, 1)
	if err := b.store.ExpireLease(b.ctx, "c", "taken"); err != nil {
		t.Fatal(err)
	}
	a2 := b.mustAcquire(t, "c", "taken", fp("p"), longLease, 2)
	if err := b.store.Complete(b.ctx, &idemdriver.CompleteParams{Consumer: "c", MessageID: "taken", Token: a1.Token, Result: []byte("stale")}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("stale Complete: %v, want ErrLeaseLost", err)
	}
	if err := b.client.ZScore(b.ctx, done, "taken").Err(); !errors.Is(err, redis.Nil) {
		t.Errorf("the stale Complete indexed the message on a single server (ZSCORE: %v)", err)
	}
	if err := b.client.ZAdd(b.ctx, done, redis.Z{Score: float64(b.serverMillis(t)), Member: "taken"}).Err(); err != nil {
		t.Fatal(err)
	}
	b.age(t, "c", []string{"taken"}, 9*day)
	// Scored early, settled now.
	late := b.seed(t, "c", "late-", 1)
	if err := b.client.ZAdd(b.ctx, done, redis.Z{Score: float64(b.serverMillis(t) - int64(9*day/time.Millisecond)), Member: late[0]}).Err(); err != nil {
		t.Fatal(err)
	}
	old := b.seed(t, "c", "old-", 3)
	b.age(t, "c", old, 8*day)

	s := b.begin(t, "c")
	horizon := b.serverNow(t).Add(-7 * day)
	if n, err := s.CountBefore(b.ctx, horizon); err != nil || n != 3 {
		t.Errorf("CountBefore: %d, %v; want 3", n, err)
	}
	var total int64
	for {
		n, err := s.DeleteBatch(b.ctx, &idemdriver.PurgeBatchParams{Horizon: horizon, Limit: 2})
		if err != nil {
			t.Fatal(err)
		}
		total += n
		if n < 2 {
			break
		}
	}
	if total != 3 {
		t.Errorf("deleted %d, want the 3 old records (not the gone ones, not the one in progress, not the late one)", total)
	}
	idx := b.client.ZRange(b.ctx, done, 0, -1).Val()
	slices.Sort(idx) // taken and late-0 may share a millisecond
	if !slices.Equal(idx, []string{"late-0", "new-0", "taken"}) {
		t.Errorf("index after the purge: %q, want late-0, new-0 and taken", idx)
	}
	if r := b.acquire(t, "c", "taken", fp("p"), longLease); r.Acquired || r.State != idemdriver.StateInProgress || r.Attempt != 2 {
		t.Errorf("the record in progress: %+v, want it kept, held by attempt 2", r)
	}
	b.complete(t, "c", "taken", a2.Token, []byte("r2"), "")
	if n, err := s.DeleteBatch(b.ctx, &idemdriver.PurgeBatchParams{Horizon: horizon, Limit: 2}); err != nil || n != 0 {
		t.Errorf("DeleteBatch after the takeover completed: %d, %v; want nothing (completed now)", n, err)
	}
	if n := b.count(t, "c"); n != 3 {
		t.Errorf("records: %d, want 3", n)
	}
}

// Retention by running time, through idem.Purge: a consumer down for 3
// hours with a 5-minute window keeps the records of before its downtime
// (they are still duplicates after it restarts and takes new messages);
// once it has run for 10 minutes they go, and so do the runs before the
// horizon.
func TestPurgeByRunningTime(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	p := idem.PurgeParams{Consumer: "c", RetentionWindow: 5 * time.Minute, BatchSize: 10}
	b.markRunning(t, "c", 0)
	old := b.seed(t, "c", "old-", 3)
	b.shift(t, "c", 3*time.Hour) // down for 3 hours
	b.markRunning(t, "c", 0)     // restarted
	b.seed(t, "c", "new-", 2)
	res, err := idem.Purge(b.ctx, b.store, p)
	if err != nil || res.Deleted != 0 || !res.Horizon.IsZero() {
		t.Errorf("purge after the downtime: %+v, %v; want nothing deleted, no horizon", res, err)
	}
	for _, id := range old {
		if r := b.acquire(t, "c", id, fp("p"), longLease); r.Acquired || r.State != idemdriver.StateCompleted {
			t.Errorf("%s after the downtime: %+v, want a completed record (a duplicate)", id, r)
		}
	}

	b.shift(t, "c", 10*time.Minute)
	b.markRunning(t, "c", time.Hour) // the run since the restart reaches now
	before := b.serverNow(t)
	res, err = idem.Purge(b.ctx, b.store, p)
	if err != nil || res.Deleted != 5 {
		t.Errorf("purge after 10 minutes of running: %+v, %v; want all 5 records deleted", res, err)
	}
	if want := before.Add(-5 * time.Minute); res.Horizon.Sub(want).Abs() > 10*time.Second {
		t.Errorf("Horizon %v, want about %v (now minus the window)", res.Horizon, want)
	}
	if runs := b.runs(t, "c"); len(runs) != 1 {
		t.Errorf("runs after the purge: %v, want only the current one (older ones pruned)", runs)
	}
	if n := b.client.Exists(b.ctx, b.store.ConsumerKey("c", idemredis.PurgeSuffix)).Val(); n != 0 {
		t.Errorf("the purge lock remains after the purge")
	}
}

// DeleteBatch pipelines its per-record scripts with EVALSHA; a server that
// does not have them cached (restarted, failed over, SCRIPT FLUSH) answers
// NOSCRIPT, and the session sends the scripts' source instead.
func TestDeleteBatchAfterScriptFlush(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.age(t, "c", b.seed(t, "c", "old-", 3), 8*day)
	b.seed(t, "c", "new-", 1)
	if err := b.client.ScriptFlush(b.ctx).Err(); err != nil {
		t.Fatal(err)
	}
	s := b.begin(t, "c")
	if n, err := s.DeleteBatch(b.ctx, &idemdriver.PurgeBatchParams{Horizon: b.serverNow(t).Add(-7 * day), Limit: 10}); err != nil || n != 3 {
		t.Errorf("DeleteBatch after SCRIPT FLUSH: %d, %v; want 3", n, err)
	}
}
