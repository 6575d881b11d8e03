package idempgxv5_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/jackc/pgx/v5"
)

// seed processes n messages "m000".. for consumer in one batch.
func seed(t *testing.T, b *bundle, consumer string, n int) {
	t.Helper()
	c := b.consumer(t, consumer)
	msgs := make([]idem.Message, n)
	for i := range msgs {
		msgs[i] = idem.Message{ID: fmt.Sprintf("m%03d", i), Payload: []byte("p")}
	}
	if _, err := c.ProcessBatch(context.Background(), msgs, func(context.Context, pgx.Tx, []idem.Message) error { return nil }); err != nil {
		t.Fatal(err)
	}
}

// serverNow is the database server's clock.
func serverNow(t *testing.T, b *bundle) time.Time {
	t.Helper()
	var now time.Time
	if err := b.pool.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	return now
}

// TestPurgeLock: one purge session per (table, consumer), whichever Store
// or process opens it; the lock key is FNV-1a 64 over "idem", NUL,
// "purge", NUL, the table, NUL, the consumer, so that every store of the
// table (idemsql's PostgreSQL dialect, `idem purge`) excludes the others.
// Close releases the lock and gives the connection back.
func TestPurgeLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, poolOpts{})
	first, err := b.store.BeginPurge(ctx, &idemdriver.BeginPurgeParams{Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.BeginPurge(ctx, &idemdriver.BeginPurgeParams{Consumer: "c"}); !errors.Is(err, idemdriver.ErrPurgeInProgress) {
		t.Errorf("second BeginPurge = %v, want ErrPurgeInProgress", err)
	}
	other, err := idempgxv5.New(b.pool, &idempgxv5.Config{Table: b.table})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.BeginPurge(ctx, &idemdriver.BeginPurgeParams{Consumer: "c"}); !errors.Is(err, idemdriver.ErrPurgeInProgress) {
		t.Errorf("BeginPurge from another Store = %v, want ErrPurgeInProgress", err)
	}
	d, err := b.store.BeginPurge(ctx, &idemdriver.BeginPurgeParams{Consumer: "d"})
	if err != nil {
		t.Fatalf("BeginPurge of another consumer = %v", err)
	}
	for _, s := range []idemdriver.PurgeSession{first, d, first} {
		if err := s.Close(ctx); err != nil {
			t.Errorf("Close = %v", err)
		}
	}
	checkPool(t, b.pool)

	h := fnv.New64a()
	h.Write([]byte("idem\x00purge\x00" + b.table + "\x00c"))
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, int64(h.Sum64())); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.BeginPurge(ctx, &idemdriver.BeginPurgeParams{Consumer: "c"}); !errors.Is(err, idemdriver.ErrPurgeInProgress) {
		t.Errorf("BeginPurge while another session holds the key = %v, want ErrPurgeInProgress", err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, int64(h.Sum64())); err != nil {
		t.Fatal(err)
	}
	s, err := b.store.BeginPurge(ctx, &idemdriver.BeginPurgeParams{Consumer: "c"})
	if err != nil {
		t.Fatalf("BeginPurge after the unlock = %v", err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestPurgeSession: batches delete completed and failed records written
// before the horizon, oldest first, with their recovery points, never an
// in_progress record; a batch skips rows locked by an open transaction
// instead of waiting for it.
func TestPurgeSession(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, poolOpts{})
	s := b.store
	seed(t, b, "c", 5)
	if err := b.shift(ctx, "c", time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"done", "open"} {
		a, err := s.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "c", MessageID: id, Fingerprint: fp("x"), Lease: time.Hour})
		if err != nil || !a.Acquired {
			t.Fatalf("Acquire(%q) = %+v, %v", id, a, err)
		}
		for _, step := range []string{"a", "b"} {
			if err := s.SaveStep(ctx, &idemdriver.StepParams{Consumer: "c", MessageID: id, Token: a.Token, Step: step, Result: []byte(step)}); err != nil {
				t.Fatal(err)
			}
		}
		if id == "done" {
			if err := s.Complete(ctx, &idemdriver.CompleteParams{Consumer: "c", MessageID: id, Token: a.Token}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// An open transaction holds the row lock of m000.
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT FROM `+b.table+` WHERE `+keyOf(b.table, "'c'")+` AND message_id = 'm000' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}

	ps, err := s.BeginPurge(ctx, &idemdriver.BeginPurgeParams{Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	defer ps.Close(ctx)
	horizon := serverNow(t, b).Add(time.Second)
	if n, err := ps.CountBefore(ctx, horizon); err != nil || n != 6 {
		t.Errorf("CountBefore = %d, %v; want 6 (5 transactional, 1 completed lease record)", n, err)
	}
	if n, err := ps.DeleteBatch(ctx, &idemdriver.PurgeBatchParams{Horizon: serverNow(t, b).Add(-30 * time.Minute), Limit: 10}); err != nil || n != 4 {
		t.Errorf("DeleteBatch before the lease records = %d, %v; want 4 (m000 is locked)", n, err)
	}
	if n, err := ps.DeleteBatch(ctx, &idemdriver.PurgeBatchParams{Horizon: horizon, Limit: 10}); err != nil || n != 1 {
		t.Errorf("DeleteBatch = %d, %v; want 1 (the completed lease record)", n, err)
	}
	for _, p := range []*idemdriver.PurgeBatchParams{{Limit: 1}, {Horizon: horizon}} {
		if _, err := ps.DeleteBatch(ctx, p); !errors.Is(err, idemdriver.ErrInvalidConfig) {
			t.Errorf("DeleteBatch(%+v) = %v, want ErrInvalidConfig", p, err)
		}
	}
	var left []string
	rows, _ := b.pool.Query(ctx, `SELECT message_id || '/' || step FROM `+b.table+`_steps WHERE consumer = 'c' ORDER BY 1`)
	if left, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(left) != "[open/a open/b]" {
		t.Errorf("steps left after the purge: %q, want those of the in_progress record", left)
	}
	if n := b.countRecords(t, "c"); n != 2 {
		t.Errorf("%d records left, want 2 (m000, locked, and open, in progress)", n)
	}
}

// TestMarkRunning: a MaxGap of zero always adds a run; a later mark within
// MaxGap of the newest run's end extends it, a later one adds a run;
// PruneRuns deletes the runs that ended before its time. Times are the
// server's.
func TestMarkRunning(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, poolOpts{})
	s := b.store
	mark := func(gap time.Duration) {
		t.Helper()
		if err := s.MarkRunning(ctx, &idemdriver.MarkRunningParams{Consumer: "c", MaxGap: gap}); err != nil {
			t.Fatal(err)
		}
	}
	runs := func() []idemdriver.Run {
		t.Helper()
		ps, err := s.BeginPurge(ctx, &idemdriver.BeginPurgeParams{Consumer: "c"})
		if err != nil {
			t.Fatal(err)
		}
		defer ps.Close(ctx)
		r, err := ps.Runs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	before := serverNow(t, b)
	mark(0)
	mark(time.Minute)
	mark(time.Minute)
	r := runs()
	if len(r) != 1 || r[0].Start.Before(before.Add(-time.Millisecond)) || !r[0].End.After(r[0].Start) {
		t.Fatalf("runs after one start and two heartbeats = %+v, want one run from %v", r, before)
	}
	mark(0) // a restart
	if r = runs(); len(r) != 2 {
		t.Fatalf("runs after a restart = %+v, want 2", r)
	}
	if err := b.shift(ctx, "c", time.Hour); err != nil {
		t.Fatal(err)
	}
	mark(time.Minute) // the newest run ended an hour ago: a new run
	if r = runs(); len(r) != 3 || r[2].Start.Sub(r[1].End) < 59*time.Minute {
		t.Fatalf("runs after a mark an hour later = %+v, want a third run", r)
	}
	ps, err := s.BeginPurge(ctx, &idemdriver.BeginPurgeParams{Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	if err := ps.PruneRuns(ctx, r[2].Start); err != nil {
		t.Fatal(err)
	}
	if err := ps.PruneRuns(ctx, time.Time{}); !errors.Is(err, idemdriver.ErrInvalidConfig) {
		t.Errorf("PruneRuns(zero) = %v, want ErrInvalidConfig", err)
	}
	ps.Close(ctx)
	if got := runs(); len(got) != 1 || !got[0].Start.Equal(r[2].Start) {
		t.Errorf("runs after PruneRuns = %+v, want only %+v", got, r[2])
	}
	if err := s.MarkRunning(ctx, &idemdriver.MarkRunningParams{Consumer: "c", MaxGap: -1}); !errors.Is(err, idemdriver.ErrInvalidConfig) {
		t.Errorf("MarkRunning with a negative gap = %v, want ErrInvalidConfig", err)
	}
}

func TestInspectAndStats(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, poolOpts{})
	seed(t, b, "a", 3)
	seed(t, b, "b", 2)
	if _, err := b.pool.Exec(ctx, `UPDATE `+b.table+` SET processed_at = processed_at - interval '1 hour' WHERE `+keyOf(b.table, "'a'")+` AND message_id = 'm000'`); err != nil {
		t.Fatal(err)
	}

	r, err := b.store.Inspect(ctx, "a", "m001")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := idem.SHA256Fingerprint([]byte("p"))
	now := serverNow(t, b)
	if r.Consumer != "a" || r.MessageID != "m001" || string(r.Fingerprint) != string(want) || r.State != idemdriver.StateCompleted ||
		r.ProcessedAt.After(now) || now.Sub(r.ProcessedAt) > time.Minute || r.ProcessedAt.Location() != time.UTC {
		t.Errorf("Inspect = %+v (server now %v)", r, now)
	}
	if _, err := b.store.Inspect(ctx, "a", "nope"); !errors.Is(err, idemdriver.ErrNotFound) {
		t.Errorf("Inspect of a missing record = %v, want ErrNotFound", err)
	}
	if _, err := b.store.Inspect(ctx, "a", "M001"); !errors.Is(err, idemdriver.ErrNotFound) {
		t.Errorf("Inspect is case-insensitive: %v", err)
	}
	if _, err := b.store.Inspect(ctx, "a", ""); !errors.Is(err, idem.ErrMissingMessageID) {
		t.Errorf("Inspect with an empty ID = %v, want ErrMissingMessageID", err)
	}

	stats, err := b.store.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(stats) != 2 || stats[0].Consumer != "a" || stats[0].Count != 3 || stats[1].Consumer != "b" || stats[1].Count != 2 {
		t.Fatalf("Stats = %+v", stats)
	}
	if d := stats[0].Newest.Sub(stats[0].Oldest); d < time.Hour || d > time.Hour+time.Minute {
		t.Errorf("a: newest - oldest = %v, want about 1h", d)
	}
	if !stats[1].Oldest.Equal(stats[1].Newest) {
		t.Errorf("b: oldest %v != newest %v (one transaction)", stats[1].Oldest, stats[1].Newest)
	}
}
