package idempgxv5_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/jackc/pgx/v5"
)

// testPartitions is the partitioned layout of the conformance runs: exact
// purges, since the suite checks each record against the horizon.
var testPartitions = &idempgxv5.Partitions{Bucket: time.Hour, ExactPurge: true}

// partStore is a partitioned Store as the conformance suite sees it:
// without the lease methods, which the layout does not offer, so that the
// suite skips its lease cases.
type partStore struct {
	idemdriver.TxStore[pgx.Tx]
	idemdriver.BatchClaimer[pgx.Tx]
	idemdriver.BeginClaimer[pgx.Tx]
	idemdriver.BeginBatchClaimer[pgx.Tx]
	idemdriver.Migrator
	idemdriver.Inspector
}

// TestPartitionedConformance runs idem's store conformance suite on the
// partitioned layout, in pgx's default query mode and with the simple
// protocol.
func TestPartitionedConformance(t *testing.T) {
	testURL(t)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		t.Run(modeName(mode), func(t *testing.T) {
			t.Parallel()
			idemtest.Run(t, idemtest.Harness[pgx.Tx]{New: func(t *testing.T) *idemtest.Setup[pgx.Tx] {
				b := setup(t, poolOpts{maxConns: 40, mode: mode, part: testPartitions})
				t.Cleanup(func() { noneAcquired(t, b.pool) })
				s := b.setup()
				s.Store = partStore{b.store, b.store, b.store, b.store, b.store, b.store}
				return s
			}})
		})
	}
}

// waitForLockWaiter waits until some backend waits for an advisory lock
// of this database.
func waitForLockWaiter(t *testing.T, b *bundle) {
	t.Helper()
	ctx := context.Background()
	for {
		var n int
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(time.Millisecond): // polling for an outcome, not a synchronisation sleep
		}
	}
}

// Two transactions claim one ID; the first's record lands in another
// bucket than the one the second inserts into (it is moved to the
// previous bucket before it commits). The second waits on the ID's lock,
// then finds the record: one Claimed, one Duplicate, one row. When the
// first rolls back instead, the second claims.
func TestPartitionedBucketSwitch(t *testing.T) {
	for _, commit := range []bool{true, false} {
		t.Run(map[bool]string{true: "commit", false: "rollback"}[commit], func(t *testing.T) {
			b := setup(t, poolOpts{maxConns: 4, part: testPartitions})
			ctx := context.Background()
			prev := time.Now().Add(-time.Hour)
			if err := idempgxv5.EnsurePartitionsAt(ctx, b.store, prev); err != nil {
				t.Fatal(err)
			}
			p := &idemdriver.ClaimParams{Consumer: "c", MessageID: "m-1", Fingerprint: []byte{1}}
			tx1, res1, err := b.store.BeginClaim(ctx, p)
			if err != nil || !res1.Claimed {
				t.Fatalf("first claim: %+v, %v", res1, err)
			}
			if _, err := tx1.Exec(ctx, `UPDATE `+b.table+` SET processed_at = processed_at - interval '1 hour' WHERE message_id = 'm-1'`); err != nil {
				t.Fatal(err)
			}
			type out struct {
				res idemdriver.ClaimResult
				err error
			}
			done := make(chan out, 1)
			go func() {
				tx2, err := b.store.Begin(ctx)
				if err != nil {
					done <- out{err: err}
					return
				}
				res, err := b.store.ClaimTx(ctx, tx2, p)
				if err == nil {
					err = b.store.Commit(ctx, tx2)
				} else {
					_ = b.store.Rollback(ctx, tx2)
				}
				done <- out{res, err}
			}()
			waitForLockWaiter(t, b)
			if commit {
				err = b.store.Commit(ctx, tx1)
			} else {
				err = b.store.Rollback(ctx, tx1)
			}
			if err != nil {
				t.Fatal(err)
			}
			o := <-done
			if o.err != nil {
				t.Fatalf("second claim: %v", o.err)
			}
			if o.res.Claimed == commit {
				t.Errorf("second claim: %+v, want Claimed %v", o.res, !commit)
			}
			var rows, parts int
			if err := b.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT tableoid) FROM `+b.table+` WHERE message_id = 'm-1'`).Scan(&rows, &parts); err != nil {
				t.Fatal(err)
			}
			if rows != 1 {
				t.Errorf("%d records of m-1, want 1", rows)
			}
		})
	}
}

// A batch claim on the partitioned layout reports the records of older
// partitions, claims the rest, and a transaction that is not READ
// COMMITTED is refused.
func TestPartitionedBatchAndIsolation(t *testing.T) {
	b := setup(t, poolOpts{maxConns: 4, part: testPartitions})
	ctx := context.Background()
	if err := idempgxv5.EnsurePartitionsAt(ctx, b.store, time.Now().Add(-3*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `INSERT INTO `+b.table+` (consumer, message_id, fingerprint, processed_at)
		VALUES ('c', 'old', '\x01'::bytea, now() - interval '3 hours')`); err != nil {
		t.Fatal(err)
	}
	tx, err := b.store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.store.ClaimBatchTx(ctx, tx, &idemdriver.ClaimBatchParams{Consumer: "c", Messages: []idemdriver.ClaimMessage{
		{MessageID: "new", Fingerprint: []byte{2}}, {MessageID: "old", Fingerprint: []byte{2}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if !res[0].Claimed || res[1].Claimed || string(res[1].Fingerprint) != "\x01" {
		t.Errorf("batch: %+v, want new claimed and old existing with fingerprint 01", res)
	}
	if err := b.store.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	rr, err := b.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rr.Rollback(ctx) }()
	_, err = b.store.ClaimTx(ctx, rr, &idemdriver.ClaimParams{Consumer: "c", MessageID: "x", Fingerprint: []byte{1}})
	if !errors.Is(err, idempgxv5.ErrIsolation) {
		t.Errorf("claim under REPEATABLE READ: %v, want ErrIsolation", err)
	}
	if _, err := b.store.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "c", MessageID: "y", Fingerprint: []byte{1}, Lease: time.Minute}); !errors.Is(err, idempgxv5.ErrLeaseUnsupported) {
		t.Errorf("Acquire: %v, want ErrLeaseUnsupported", err)
	}
}

// The purge drops the partitions that every consumer's horizon has
// passed, and only those: records of newer buckets stay, a partition that
// holds a consumer without a horizon past it stays, and the table's size
// falls.
func TestPartitionedPurgeDrops(t *testing.T) {
	b := setup(t, poolOpts{maxConns: 4, part: &idempgxv5.Partitions{Bucket: time.Hour}})
	ctx := context.Background()
	now := time.Now()
	for _, h := range []int{30, 29, 20} {
		if err := idempgxv5.EnsurePartitionsAt(ctx, b.store, now.Add(-time.Duration(h)*time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	// 20,000 records of c 30 hours ago, 5 of c and 5 of other 29 hours
	// ago, 10 of c 20 hours ago.
	if _, err := b.pool.Exec(ctx, `INSERT INTO `+b.table+` (consumer, message_id, fingerprint, processed_at)
		SELECT 'c', 'a-' || g, '\x01'::bytea, now() - interval '30 hours' FROM generate_series(1, 20000) g
		UNION ALL SELECT 'c', 'b-' || g, '\x01'::bytea, now() - interval '29 hours' FROM generate_series(1, 5) g
		UNION ALL SELECT 'other', 'b-' || g, '\x01'::bytea, now() - interval '29 hours' FROM generate_series(1, 5) g
		UNION ALL SELECT 'c', 'd-' || g, '\x01'::bytea, now() - interval '20 hours' FROM generate_series(1, 10) g`); err != nil {
		t.Fatal(err)
	}
	size := func() (n int64) {
		t.Helper()
		if err := b.pool.QueryRow(ctx, `SELECT COALESCE(sum(pg_total_relation_size(inhrelid)), 0) FROM pg_inherits WHERE inhparent = $1::regclass`, b.table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := size()
	// c has run for 48 hours up to now: its 24-hour horizon is now - 24h.
	if _, err := b.pool.Exec(ctx, `INSERT INTO `+b.table+`_runs (consumer, started_at, ended_at) VALUES ('c', now() - interval '48 hours', now())`); err != nil {
		t.Fatal(err)
	}
	var batches []int64
	res, err := idem.Purge(ctx, b.store, idem.PurgeParams{Consumer: "c", RetentionWindow: 24 * time.Hour, BatchSize: 1000,
		OnBatch: func(n int64) { batches = append(batches, n) }})
	if err != nil {
		t.Fatalf("Purge: %v", err)
	}
	if res.Deleted != 20000 || res.Batches != 20 {
		t.Errorf("Purge: %+v, want 20000 deleted in 20 batches (the 30-hour partition)", res)
	}
	var left map[string]int
	rows, err := b.pool.Query(ctx, `SELECT split_part(message_id, '-', 1) || '/' || consumer, count(*)::int FROM `+b.table+` GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	left = map[string]int{}
	for rows.Next() {
		var k string
		var n int
		if err := rows.Scan(&k, &n); err != nil {
			t.Fatal(err)
		}
		left[k] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"b/c": 5, "b/other": 5, "d/c": 10}
	for k, n := range want {
		if left[k] != n {
			t.Errorf("after the purge: %v, want %v", left, want)
			break
		}
	}
	if len(left) != len(want) {
		t.Errorf("after the purge: %v, want %v", left, want)
	}
	if after := size(); after >= before {
		t.Errorf("partitions' total size %d bytes after the purge, %d before: want less", after, before)
	}
	// other purges with a horizon past the 29-hour bucket: that partition
	// goes too, with c's 5 records, reported to other's purge only as its
	// own 5.
	if _, err := b.pool.Exec(ctx, `INSERT INTO `+b.table+`_runs (consumer, started_at, ended_at) VALUES ('other', now() - interval '48 hours', now())`); err != nil {
		t.Fatal(err)
	}
	res, err = idem.Purge(ctx, b.store, idem.PurgeParams{Consumer: "other", RetentionWindow: 24 * time.Hour, BatchSize: 1000})
	if err != nil || res.Deleted != 5 {
		t.Errorf("other's Purge: %+v, %v; want 5 deleted", res, err)
	}
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.table).Scan(&n); err != nil || n != 10 {
		t.Errorf("%d records left (%v), want the 10 of 20 hours ago", n, err)
	}
}

// A claim when no partition covers now(): ClaimTx fails with
// ErrNoPartition (nothing claimed, the transaction aborted); BeginClaim
// creates the partitions and claims.
func TestPartitionedNoPartition(t *testing.T) {
	b := setup(t, poolOpts{maxConns: 4, part: testPartitions})
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, `DO $$ DECLARE p regclass; BEGIN
		FOR p IN SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = '`+b.table+`'::regclass LOOP
			EXECUTE 'DROP TABLE ' || p;
		END LOOP; END $$`); err != nil {
		t.Fatal(err)
	}
	p := &idemdriver.ClaimParams{Consumer: "c", MessageID: "m", Fingerprint: []byte{1}}
	tx, err := b.store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.store.ClaimTx(ctx, tx, p)
	_ = b.store.Rollback(ctx, tx)
	if !errors.Is(err, idempgxv5.ErrNoPartition) {
		t.Fatalf("ClaimTx without a partition: %v, want ErrNoPartition", err)
	}
	tx, res, err := b.store.BeginClaim(ctx, p)
	if err != nil || !res.Claimed {
		t.Fatalf("BeginClaim without a partition: %+v, %v; want Claimed", res, err)
	}
	if err := b.store.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	var n, parts int
	if err := b.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+b.table+`), (SELECT count(*) FROM pg_inherits WHERE inhparent = $1::regclass)`, b.table).Scan(&n, &parts); err != nil {
		t.Fatal(err)
	}
	if n != 1 || parts != 3 {
		t.Errorf("%d records in %d partitions, want 1 in 3 (now and 2 ahead)", n, parts)
	}
}

// Migrate refuses a table of the other layout.
func TestPartitionedLayoutMismatch(t *testing.T) {
	b := setup(t, poolOpts{maxConns: 4})
	s, err := idempgxv5.New(b.pool, &idempgxv5.Config{Table: b.table, Partitions: &idempgxv5.Partitions{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); !errors.Is(err, idemdriver.ErrInvalidConfig) {
		t.Errorf("Migrate of a partitioned store on a default table: %v, want ErrInvalidConfig", err)
	}
	if _, err := idempgxv5.New(b.pool, &idempgxv5.Config{Partitions: &idempgxv5.Partitions{Bucket: 90 * time.Second}}); !errors.Is(err, idemdriver.ErrInvalidConfig) {
		t.Errorf("New with a 90s bucket: %v, want ErrInvalidConfig", err)
	}
}

// Consumer.ProcessBatch on the partitioned store itself (which offers
// BeginClaimBatch): new messages are claimed and their effects commit,
// a redelivered batch is all duplicates, and each ID has one record.
func TestPartitionedProcessBatch(t *testing.T) {
	b := setup(t, poolOpts{maxConns: 4, part: testPartitions})
	ctx := context.Background()
	c, err := idem.NewConsumer(b.store, idem.Config{Name: "batch", PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msgs := []idem.Message{{ID: "a", Payload: []byte("1")}, {ID: "b", Payload: []byte("2")}, {ID: "c", Payload: []byte("3")}}
	effect := func(ctx context.Context, tx pgx.Tx, ms []idem.Message) error {
		for _, m := range ms {
			if _, err := tx.Exec(ctx, `INSERT INTO `+b.effects+` (key) VALUES ($1)`, m.ID); err != nil {
				return err
			}
		}
		return nil
	}
	for round, want := range []idem.Status{idem.Processed, idem.Duplicate} {
		outs, err := c.ProcessBatch(ctx, msgs, effect)
		if err != nil {
			t.Fatalf("round %d: ProcessBatch: %v", round, err)
		}
		for i, o := range outs {
			if o.Status != want {
				t.Errorf("round %d: message %s: %v, want %v", round, msgs[i].ID, o.Status, want)
			}
		}
	}
	var effects, records int
	if err := b.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+b.effects+`), (SELECT count(*) FROM `+b.table+` WHERE consumer = 'batch')`).Scan(&effects, &records); err != nil {
		t.Fatal(err)
	}
	if effects != 3 || records != 3 {
		t.Errorf("%d effects and %d records, want 3 and 3", effects, records)
	}
}
