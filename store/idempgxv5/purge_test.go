package idempgxv5_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/jackc/pgx/v5"
)

// seed processes n messages "m000".. for consumer and ages the first
// `old` of them by age.
func seed(t *testing.T, b *bundle, consumer string, n, old int, age time.Duration) {
	t.Helper()
	ctx := context.Background()
	c := b.consumer(t, consumer)
	msgs := make([]idem.Message, n)
	var oldIDs []string
	for i := range msgs {
		msgs[i] = idem.Message{ID: fmt.Sprintf("m%03d", i), Payload: []byte("p")}
		if i < old {
			oldIDs = append(oldIDs, msgs[i].ID)
		}
	}
	if _, err := c.ProcessBatch(ctx, msgs, func(context.Context, pgx.Tx, []idem.Message) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := b.ageRecords(ctx, consumer, oldIDs, age); err != nil {
		t.Fatal(err)
	}
}

func TestPurge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("Batches", func(t *testing.T) {
		t.Parallel()
		b := setup(t, poolOpts{})
		seed(t, b, "c", 25, 23, 48*time.Hour)
		seed(t, b, "other", 5, 5, 48*time.Hour)
		var calls []int64
		res, err := b.store.Purge(ctx, &idem.PurgeParams{
			Consumer: "c", RetentionWindow: 24 * time.Hour, BatchSize: 10,
			OnBatch: func(n int64) { calls = append(calls, n) },
		})
		if err != nil {
			t.Fatal(err)
		}
		if res.Deleted != 23 || res.Batches != 3 || fmt.Sprint(calls) != "[10 20 23]" {
			t.Errorf("Purge = %+v, OnBatch %v; want 23 deleted in 3 batches, [10 20 23]", res, calls)
		}
		if n := b.countRecords(t, "c"); n != 2 {
			t.Errorf("%d records left, want 2", n)
		}
		if n := b.countRecords(t, "other"); n != 5 {
			t.Errorf("other consumer: %d records left, want 5 (untouched)", n)
		}
		// The horizon is the newest record minus the window, by the server's clock.
		var newest time.Time
		if err := b.pool.QueryRow(ctx, `SELECT max(processed_at) FROM `+b.table+` WHERE consumer = 'c'`).Scan(&newest); err != nil {
			t.Fatal(err)
		}
		if !res.Horizon.Equal(newest.Add(-24 * time.Hour)) {
			t.Errorf("Horizon = %v, want %v", res.Horizon, newest.Add(-24*time.Hour))
		}
		// Nothing left to purge.
		res, err = b.store.Purge(ctx, &idem.PurgeParams{Consumer: "c", RetentionWindow: 24 * time.Hour, BatchSize: 10})
		if err != nil || res.Deleted != 0 || res.Batches != 0 {
			t.Errorf("second Purge = %+v, %v; want nothing deleted", res, err)
		}
		checkPool(t, b.pool)
	})

	// A consumer that was down longer than the window keeps its history:
	// the horizon follows its newest record, not the current time.
	t.Run("DowntimeSafe", func(t *testing.T) {
		t.Parallel()
		b := setup(t, poolOpts{})
		seed(t, b, "c", 10, 10, 30*24*time.Hour) // everything is 30 days old
		if err := b.ageRecords(ctx, "c", []string{"m000", "m001"}, 10*24*time.Hour); err != nil {
			t.Fatal(err) // and two are 40 days old
		}
		res, err := b.store.Purge(ctx, &idem.PurgeParams{Consumer: "c", RetentionWindow: 7 * 24 * time.Hour, BatchSize: 100})
		if err != nil || res.Deleted != 2 {
			t.Errorf("Purge = %+v, %v; want the 2 records older than newest-7d deleted", res, err)
		}
	})

	t.Run("DryRun", func(t *testing.T) {
		t.Parallel()
		b := setup(t, poolOpts{})
		seed(t, b, "c", 12, 7, 48*time.Hour)
		var calls int
		res, err := b.store.Purge(ctx, &idem.PurgeParams{Consumer: "c", RetentionWindow: time.Hour, BatchSize: 2, DryRun: true,
			OnBatch: func(int64) { calls++ }})
		if err != nil || res.Deleted != 7 || calls != 1 {
			t.Errorf("dry run = %+v, %v, %d OnBatch calls; want 7 counted", res, err, calls)
		}
		if n := b.countRecords(t, "c"); n != 12 {
			t.Errorf("dry run deleted rows: %d left, want 12", n)
		}
	})

	t.Run("Empty", func(t *testing.T) {
		t.Parallel()
		b := setup(t, poolOpts{})
		res, err := b.store.Purge(ctx, &idem.PurgeParams{Consumer: "nobody", RetentionWindow: time.Hour, BatchSize: 10})
		if err != nil || res != (idem.PurgeResult{}) {
			t.Errorf("Purge of an empty consumer = %+v, %v; want zero", res, err)
		}
	})

	t.Run("InvalidParams", func(t *testing.T) {
		t.Parallel()
		b := setup(t, poolOpts{})
		for _, p := range []idem.PurgeParams{
			{Consumer: "", RetentionWindow: time.Hour, BatchSize: 1},
			{Consumer: "c", RetentionWindow: 0, BatchSize: 1},
			{Consumer: "c", RetentionWindow: time.Hour, BatchSize: 0},
		} {
			if _, err := b.store.Purge(ctx, &p); !errors.Is(err, idem.ErrInvalidConfig) && !errors.Is(err, idem.ErrInvalidConsumerName) {
				t.Errorf("Purge(%+v) = %v, want a validation error", p, err)
			}
		}
		checkPool(t, b.pool)
	})

	// One cleaner per (table, consumer): a second purge while the first
	// holds the lock gets ErrPurgeInProgress; another consumer does not.
	t.Run("Lock", func(t *testing.T) {
		t.Parallel()
		b := setup(t, poolOpts{})
		seed(t, b, "c", 6, 5, 48*time.Hour)
		seed(t, b, "d", 5, 4, 48*time.Hour)
		inBatch := make(chan struct{})
		resume := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			_, err := b.store.Purge(ctx, &idem.PurgeParams{Consumer: "c", RetentionWindow: time.Hour, BatchSize: 1,
				OnBatch: func(n int64) {
					if n == 1 {
						close(inBatch)
						<-resume
					}
				}})
			done <- err
		}()
		<-inBatch
		if _, err := b.store.Purge(ctx, &idem.PurgeParams{Consumer: "c", RetentionWindow: time.Hour, BatchSize: 1}); !errors.Is(err, idem.ErrPurgeInProgress) {
			t.Errorf("concurrent Purge = %v, want ErrPurgeInProgress", err)
		}
		// Another store on the same table, as another process would have.
		other, err := idempgxv5.New(b.pool, &idempgxv5.Config{Table: b.table})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := other.Purge(ctx, &idem.PurgeParams{Consumer: "c", RetentionWindow: time.Hour, BatchSize: 1}); !errors.Is(err, idem.ErrPurgeInProgress) {
			t.Errorf("concurrent Purge from another Store = %v, want ErrPurgeInProgress", err)
		}
		if res, err := b.store.Purge(ctx, &idem.PurgeParams{Consumer: "d", RetentionWindow: time.Hour, BatchSize: 10}); err != nil || res.Deleted != 4 {
			t.Errorf("Purge of another consumer = %+v, %v; want 4 deleted", res, err)
		}
		close(resume)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		// The lock was released: a new purge runs.
		if _, err := b.store.Purge(ctx, &idem.PurgeParams{Consumer: "c", RetentionWindow: time.Hour, BatchSize: 1}); err != nil {
			t.Errorf("Purge after the first ended = %v", err)
		}
		checkPool(t, b.pool)
	})

	// The lock key is part of the contract: FNV-1a 64 over "idem", NUL,
	// "purge", NUL, the table, NUL, the consumer, so that every store of
	// the table (idemsql's PostgreSQL dialect, `idem purge`) excludes the
	// others. A session holding that key keeps Purge out.
	t.Run("LockKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t, poolOpts{})
		seed(t, b, "c", 3, 2, 48*time.Hour)
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
		if _, err := b.store.Purge(ctx, &idem.PurgeParams{Consumer: "c", RetentionWindow: time.Hour, BatchSize: 10}); !errors.Is(err, idem.ErrPurgeInProgress) {
			t.Errorf("Purge while another session holds the key = %v, want ErrPurgeInProgress", err)
		}
		if _, err := conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, int64(h.Sum64())); err != nil {
			t.Fatal(err)
		}
		if res, err := b.store.Purge(ctx, &idem.PurgeParams{Consumer: "c", RetentionWindow: time.Hour, BatchSize: 10}); err != nil || res.Deleted != 2 {
			t.Errorf("Purge after the unlock = %+v, %v; want 2 deleted", res, err)
		}
	})

	// Cancelling a purge stops it between batches and releases the lock.
	t.Run("Cancel", func(t *testing.T) {
		t.Parallel()
		b := setup(t, poolOpts{})
		seed(t, b, "c", 10, 9, 48*time.Hour)
		cctx, cancel := context.WithCancel(ctx)
		res, err := b.store.Purge(cctx, &idem.PurgeParams{Consumer: "c", RetentionWindow: time.Hour, BatchSize: 2,
			OnBatch: func(n int64) {
				if n == 4 {
					cancel()
				}
			}})
		if !errors.Is(err, context.Canceled) || res.Deleted != 4 || res.Batches != 2 {
			t.Errorf("cancelled Purge = %+v, %v; want 4 deleted in 2 batches, context.Canceled", res, err)
		}
		if res, err := b.store.Purge(ctx, &idem.PurgeParams{Consumer: "c", RetentionWindow: time.Hour, BatchSize: 100}); err != nil || res.Deleted != 5 {
			t.Errorf("Purge after cancel = %+v, %v; want the other 5 deleted", res, err)
		}
		checkPool(t, b.pool)
	})

	// The background loop and Consumer.Purge go through the store.
	t.Run("Consumer", func(t *testing.T) {
		t.Parallel()
		b := setup(t, poolOpts{})
		seed(t, b, "c", 10, 4, 8*24*time.Hour)
		c := b.consumer(t, "c")
		res, err := c.Purge(ctx)
		if err != nil || res.Deleted != 4 {
			t.Errorf("Consumer.Purge = %+v, %v; want 4 deleted (default 7-day window)", res, err)
		}
	})
}

func TestInspectAndStats(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, poolOpts{})
	seed(t, b, "a", 3, 1, time.Hour)
	seed(t, b, "b", 2, 0, 0)

	r, err := b.store.Inspect(ctx, "a", "m001")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := idem.SHA256Fingerprint([]byte("p"))
	var serverNow time.Time
	if err := b.pool.QueryRow(ctx, `SELECT now()`).Scan(&serverNow); err != nil {
		t.Fatal(err)
	}
	if r.Consumer != "a" || r.MessageID != "m001" || string(r.Fingerprint) != string(want) ||
		r.ProcessedAt.After(serverNow) || serverNow.Sub(r.ProcessedAt) > time.Minute {
		t.Errorf("Inspect = %+v (server now %v)", r, serverNow)
	}
	if _, err := b.store.Inspect(ctx, "a", "nope"); !errors.Is(err, idempgxv5.ErrNotFound) {
		t.Errorf("Inspect of a missing record = %v, want ErrNotFound", err)
	}
	if _, err := b.store.Inspect(ctx, "a", "M001"); !errors.Is(err, idempgxv5.ErrNotFound) {
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
