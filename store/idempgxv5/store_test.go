package idempgxv5_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/sqlschema"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

func fp(s string) []byte {
	b, _ := idem.SHA256Fingerprint([]byte(s))
	return b
}

func TestNew(t *testing.T) {
	t.Parallel()
	pool := newPool(t, poolOpts{})

	t.Run("Defaults", func(t *testing.T) {
		t.Parallel()
		for _, cfg := range []*idempgxv5.Config{nil, {}} {
			s, err := idempgxv5.New(pool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if s.Table() != "idem_processed" {
				t.Errorf("Table() = %q, want idem_processed", s.Table())
			}
		}
	})
	t.Run("SchemaQualified", func(t *testing.T) {
		t.Parallel()
		s, err := idempgxv5.New(pool, &idempgxv5.Config{Table: "app.inbox"})
		if err != nil || s.Table() != "app.inbox" {
			t.Fatalf("New = %v, %v", s, err)
		}
	})
	t.Run("Invalid", func(t *testing.T) {
		t.Parallel()
		for _, name := range []string{"a b", `x"; DROP TABLE y; --`, "a.b.c", "1abc", "tbl-name"} {
			if _, err := idempgxv5.New(pool, &idempgxv5.Config{Table: name}); !errors.Is(err, idem.ErrInvalidConfig) {
				t.Errorf("Table %q: err = %v, want ErrInvalidConfig", name, err)
			}
		}
		if _, err := idempgxv5.New(nil, nil); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("nil pool: err = %v, want ErrInvalidConfig", err)
		}
	})
}

// TestMigrate: concurrent first runs are serialised by the migration
// lock and apply every migration once; the schema is as documented.
func TestMigrate(t *testing.T) {
	t.Parallel()
	testMigrate(t, newPool(t, poolOpts{maxConns: 10}))
}

// testMigrate is TestMigrate on pool.
func testMigrate(t *testing.T, pool *pgxpool.Pool) {
	ctx := context.Background()
	table := randName("idem_m_")
	t.Cleanup(func() {
		if err := dropTables(context.Background(), pool, table); err != nil {
			t.Errorf("drop test tables: %v", err)
		}
	})
	s, err := idempgxv5.New(pool, &idempgxv5.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}

	// Concurrent first runs: the advisory lock serialises them.
	var wg sync.WaitGroup
	errs := make([]error, 8)
	start := make(chan struct{})
	for i := range errs {
		wg.Go(func() {
			<-start
			errs[i] = s.Migrate(ctx)
		})
	}
	close(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("concurrent Migrate: %v", err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}

	// Every embedded migration is recorded, once.
	parsed, err := sqlschema.ParseTable(table)
	if err != nil {
		t.Fatal(err)
	}
	migs, err := sqlschema.Migrations(sqlschema.Postgres, parsed)
	if err != nil {
		t.Fatal(err)
	}
	var want []int32
	for _, m := range migs {
		want = append(want, int32(m.Version))
	}
	rows, _ := pool.Query(ctx, `SELECT version FROM `+table+`_migrations ORDER BY version`)
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil || !slices.Equal(versions, want) {
		t.Fatalf("versions = %v, %v; want %v", versions, err, want)
	}
	var recent bool
	if err := pool.QueryRow(ctx, `SELECT bool_and(applied_at BETWEEN now() - interval '1 minute' AND now()) FROM `+table+`_migrations`).Scan(&recent); err != nil || !recent {
		t.Errorf("applied_at is not the server's recent time (%v)", err)
	}

	// The schema: primary key, retention index, the failed records'
	// partial index, byte-wise collation.
	var idx int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_indexes WHERE tablename = $1`, table).Scan(&idx); err != nil || idx != 3 {
		t.Errorf("indexes = %d, %v; want 3", idx, err)
	}
	var coll string
	if err := pool.QueryRow(ctx, `SELECT collation_name FROM information_schema.columns WHERE table_name = $1 AND column_name = 'message_id'`, table).Scan(&coll); err != nil || coll != "C" {
		t.Errorf("message_id collation = %q, %v; want C", coll, err)
	}
}

// TestBeginClaimOneRoundTrip counts the writes on the network connection:
// each is one flush of pgx's send buffer, followed by waiting for the
// server, so one write is one round trip.
func TestBeginClaimOneRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var writes atomic.Int64
	b := setup(t, poolOpts{maxConns: 1, countWrites: &writes, noPing: true})
	p := &idemdriver.ClaimParams{Consumer: "c", MessageID: "warm-up", Fingerprint: fp("x")}

	// The connection's first claim and first duplicate prepare the
	// statements (pgx's cache).
	tx, res, err := b.store.BeginClaim(ctx, p)
	if err != nil || !res.Claimed {
		t.Fatalf("BeginClaim = %v, %v", res, err)
	}
	if err := b.store.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if tx, res, err = b.store.BeginClaim(ctx, p); err != nil || res.Claimed {
		t.Fatalf("BeginClaim of a duplicate = %v, %v", res, err)
	}
	if err := b.store.Rollback(ctx, tx); err != nil {
		t.Fatal(err)
	}

	t.Run("New", func(t *testing.T) {
		writes.Store(0)
		tx, res, err := b.store.BeginClaim(ctx, &idemdriver.ClaimParams{Consumer: "c", MessageID: "m1", Fingerprint: fp("x")})
		if err != nil || !res.Claimed {
			t.Fatalf("BeginClaim = %v, %v", res, err)
		}
		if n := writes.Load(); n != 1 {
			t.Errorf("BeginClaim took %d round trips, want 1", n)
		}
		if tx.Conn().PgConn().TxStatus() != 'T' {
			t.Errorf("tx status %c, want T (in a transaction)", tx.Conn().PgConn().TxStatus())
		}
		if err := b.store.Commit(ctx, tx); err != nil {
			t.Fatal(err)
		}
		if n := writes.Load(); n != 2 {
			t.Errorf("BeginClaim and Commit took %d round trips, want 2", n)
		}
	})
	t.Run("Duplicate", func(t *testing.T) {
		writes.Store(0)
		tx, res, err := b.store.BeginClaim(ctx, p)
		if err != nil || res.Claimed || !bytes.Equal(res.Fingerprint, fp("x")) {
			t.Fatalf("BeginClaim = %v, %v; want a duplicate with the stored fingerprint", res, err)
		}
		if n := writes.Load(); n != 2 {
			t.Errorf("duplicate BeginClaim took %d round trips, want 2 (the read and ROLLBACK after the claim conflicted)", n)
		}
		if !res.Ended || tx != nil {
			t.Errorf("duplicate BeginClaim: Ended %v, tx %v; want the transaction ended by the store", res.Ended, tx)
		}
		if n := b.pool.Stat().AcquiredConns(); n != 0 {
			t.Errorf("%d connections acquired after a duplicate BeginClaim; want 0", n)
		}
		if err := b.store.Rollback(ctx, tx); err != nil || writes.Load() != 2 {
			t.Errorf("Rollback(nil) = %v after %d round trips; want nil, and no round trip", err, writes.Load())
		}
	})
	t.Run("PlainBeginForComparison", func(t *testing.T) {
		writes.Store(0)
		tx, err := b.store.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.store.ClaimTx(ctx, tx, &idemdriver.ClaimParams{Consumer: "c", MessageID: "m2", Fingerprint: fp("x")}); err != nil {
			t.Fatal(err)
		}
		if n := writes.Load(); n != 2 {
			t.Errorf("Begin + ClaimTx took %d round trips, want 2", n)
		}
		_ = b.store.Rollback(ctx, tx)
	})
	checkPool(t, b.pool)
}

// TestBeginClaimRecordGone: when the record a claim conflicted with is
// deleted before BeginClaim reads it (a purge), BeginClaim, which has
// ended its transaction, begins again and claims the message.
func TestBeginClaimRecordGone(t *testing.T) {
	ctx := context.Background()
	b := setup(t, poolOpts{maxConns: 2})
	p := &idemdriver.ClaimParams{Consumer: "c", MessageID: "m", Fingerprint: fp("old")}
	tx, res, err := b.store.BeginClaim(ctx, p)
	if err != nil || !res.Claimed {
		t.Fatalf("BeginClaim = %v, %v", res, err)
	}
	if err := b.store.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	deleted := 0
	defer idempgxv5.SetAfterConflict(func() {
		deleted++
		if _, err := b.pool.Exec(ctx, `DELETE FROM `+b.store.Table()+` WHERE `+keyOf(b.table, "'c'")+` AND message_id = 'm'`); err != nil {
			t.Error(err)
		}
	})()
	tx, res, err = b.store.BeginClaim(ctx, &idemdriver.ClaimParams{Consumer: "c", MessageID: "m", Fingerprint: fp("new")})
	if err != nil || !res.Claimed || res.Ended || deleted != 1 {
		t.Fatalf("BeginClaim of a record deleted after the conflict = %+v, %v (hook ran %d times); want Claimed", res, err, deleted)
	}
	if err := b.store.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	var stored []byte
	if err := b.pool.QueryRow(ctx, `SELECT fingerprint FROM `+b.store.Table()+` WHERE `+keyOf(b.table, "'c'")+` AND message_id = 'm'`).Scan(&stored); err != nil || !bytes.Equal(stored, fp("new")) {
		t.Errorf("stored fingerprint %x, %v; want the new claim's %x", stored, err, fp("new"))
	}
	checkPool(t, b.pool)
}

// TestHandlerTx exercises every pgx.Tx method on the transaction a handler
// receives from Consumer.Process (begun by BeginClaim).
func TestHandlerTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, poolOpts{})
	c := b.consumer(t, "handler-tx")

	out, err := c.Process(ctx, idem.Message{ID: "m", Payload: []byte("p")}, func(ctx context.Context, tx pgx.Tx, msg idem.Message) error {
		if tx.Conn() == nil {
			return errors.New("Conn() is nil")
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+b.effects+` (key) VALUES ($1)`, "exec"); err != nil {
			return fmt.Errorf("Exec: %w", err)
		}
		// The claim is visible inside the transaction.
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+b.table+` WHERE `+b.consumerIs()+` AND message_id = $2`, "handler-tx", msg.ID).Scan(&n); err != nil || n != 1 {
			return fmt.Errorf("QueryRow: claim rows = %d, %v", n, err)
		}
		rows, err := tx.Query(ctx, `SELECT key FROM `+b.effects+` ORDER BY id`)
		if err != nil {
			return fmt.Errorf("Query: %w", err)
		}
		keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil || len(keys) != 1 || keys[0] != "exec" {
			return fmt.Errorf("Query: %v, %v", keys, err)
		}
		bt := &pgx.Batch{}
		bt.Queue(`INSERT INTO `+b.effects+` (key) VALUES ($1)`, "batch1")
		bt.Queue(`INSERT INTO `+b.effects+` (key) VALUES ($1)`, "batch2")
		if err := tx.SendBatch(ctx, bt).Close(); err != nil {
			return fmt.Errorf("SendBatch: %w", err)
		}
		if n, err := tx.CopyFrom(ctx, pgx.Identifier{b.effects}, []string{"key"}, pgx.CopyFromRows([][]any{{"copy1"}, {"copy2"}})); err != nil || n != 2 {
			return fmt.Errorf("CopyFrom: %d, %w", n, err)
		}
		if _, err := tx.Prepare(ctx, "ins_fx", `INSERT INTO `+b.effects+` (key) VALUES ($1)`); err != nil {
			return fmt.Errorf("Prepare: %w", err)
		}
		if _, err := tx.Exec(ctx, "ins_fx", "prepared"); err != nil {
			return fmt.Errorf("Exec prepared: %w", err)
		}

		// A nested transaction (savepoint) rolled back: its effect and its
		// error are gone, the outer transaction goes on.
		sp, err := tx.Begin(ctx)
		if err != nil {
			return fmt.Errorf("Begin nested: %w", err)
		}
		if _, err := sp.Exec(ctx, `INSERT INTO `+b.effects+` (key) VALUES ($1)`, "rolled-back"); err != nil {
			return fmt.Errorf("nested Exec: %w", err)
		}
		if _, err := sp.Exec(ctx, `SELECT 1/0`); err == nil {
			return errors.New("nested: division by zero succeeded")
		}
		if err := sp.Rollback(ctx); err != nil {
			return fmt.Errorf("nested Rollback: %w", err)
		}
		// A nested transaction committed (savepoint released).
		sp, err = tx.Begin(ctx)
		if err != nil {
			return fmt.Errorf("Begin nested 2: %w", err)
		}
		if _, err := sp.Exec(ctx, `INSERT INTO `+b.effects+` (key) VALUES ($1)`, "nested"); err != nil {
			return fmt.Errorf("nested 2 Exec: %w", err)
		}
		if err := sp.Commit(ctx); err != nil {
			return fmt.Errorf("nested Commit: %w", err)
		}

		// Large objects work: the transaction is pgx's own.
		lo := tx.LargeObjects()
		oid, err := lo.Create(ctx, 0)
		if err != nil {
			return fmt.Errorf("LargeObjects.Create: %w", err)
		}
		obj, err := lo.Open(ctx, oid, pgx.LargeObjectModeWrite|pgx.LargeObjectModeRead)
		if err != nil {
			return fmt.Errorf("LargeObjects.Open: %w", err)
		}
		if _, err := obj.Write([]byte("hello")); err != nil {
			return fmt.Errorf("large object Write: %w", err)
		}
		if _, err := obj.Seek(0, io.SeekStart); err != nil {
			return err
		}
		got, err := io.ReadAll(obj)
		if err != nil || string(got) != "hello" {
			return fmt.Errorf("large object read %q, %v", got, err)
		}
		if err := obj.Close(); err != nil {
			return err
		}
		return lo.Unlink(ctx, oid)
	})
	if err != nil || out.Status != idem.Processed {
		t.Fatalf("Process = %v, %v", out, err)
	}
	for key, want := range map[string]int{"exec": 1, "batch1": 1, "batch2": 1, "copy1": 1, "copy2": 1, "prepared": 1, "nested": 1, "rolled-back": 0} {
		if n := b.countEffects(t, key); n != want {
			t.Errorf("effect %q: %d rows, want %d", key, n, want)
		}
	}
	checkPool(t, b.pool)
}

// A handler that swallows a failed statement leaves an aborted
// transaction: COMMIT becomes ROLLBACK, the outcome is Failed, nothing is
// kept, and the redelivery processes the message.
func TestCommitOfAbortedTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, poolOpts{})
	c := b.consumer(t, "aborted")
	msg := idem.Message{ID: "m", Payload: []byte("p")}

	out, err := c.Process(ctx, msg, func(ctx context.Context, tx pgx.Tx, msg idem.Message) error {
		if err := b.writeEffect(ctx, tx, msg.ID); err != nil {
			return err
		}
		_, _ = tx.Exec(ctx, `SELECT 1/0`) // error ignored: the transaction is now aborted
		return nil
	})
	if out.Status != idem.Failed || !errors.Is(err, idem.ErrStore) || !errors.Is(err, pgx.ErrTxCommitRollback) {
		t.Fatalf("Process = %v, %v; want Failed with ErrStore and pgx.ErrTxCommitRollback", out, err)
	}
	if n := b.countEffects(t, msg.ID); n != 0 {
		t.Errorf("%d effects kept, want 0", n)
	}
	if n := b.countRecords(t, "aborted"); n != 0 {
		t.Errorf("%d records kept, want 0", n)
	}
	out, err = c.Process(ctx, msg, b.effectHandler())
	if err != nil || out.Status != idem.Processed {
		t.Fatalf("redelivery: %v, %v; want Processed", out, err)
	}
	checkPool(t, b.pool)
}

// Store-level transaction semantics: Rollback after Commit, after a failed
// Commit and twice is nil.
func TestCommitRollbackIdempotent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, poolOpts{})
	p := &idemdriver.ClaimParams{Consumer: "c", MessageID: "m", Fingerprint: fp("x")}

	tx, _, err := b.store.BeginClaim(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.store.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if err := b.store.Rollback(ctx, tx); err != nil {
		t.Errorf("Rollback after Commit = %v, want nil", err)
	}
	if err := b.store.Commit(ctx, tx); !errors.Is(err, pgx.ErrTxClosed) {
		t.Errorf("second Commit = %v, want pgx.ErrTxClosed", err)
	}

	// A Commit that fails because ctx ended: nothing commits, the
	// connection is not reused in an unknown state.
	p.MessageID = "m2"
	tx, res, err := b.store.BeginClaim(ctx, p)
	if err != nil || !res.Claimed {
		t.Fatal(res, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := b.store.Commit(cctx, tx); err == nil {
		t.Fatal("Commit with a cancelled context succeeded")
	}
	if err := b.store.Rollback(ctx, tx); err != nil {
		t.Errorf("Rollback after failed Commit = %v, want nil", err)
	}
	if err := b.store.Rollback(ctx, tx); err != nil {
		t.Errorf("second Rollback = %v, want nil", err)
	}
	if n := b.countRecords(t, "c"); n != 1 {
		t.Errorf("%d records, want 1 (m only)", n)
	}
	checkPool(t, b.pool)
}

// a duplicate in the caller's own transaction must not
// abort it.
func TestProcessTxDuplicateKeepsTxUsable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, poolOpts{})
	c := b.consumer(t, "c05")
	msg := idem.Message{ID: "M", Payload: []byte("p")}
	if out, err := c.Process(ctx, msg, b.effectHandler()); err != nil || out.Status != idem.Processed {
		t.Fatalf("first delivery: %v, %v", out, err)
	}

	for _, tt := range []struct {
		name    string
		payload string
		want    idem.Status
	}{
		{"Duplicate", "p", idem.Duplicate},
		{"FingerprintMismatch", "other", idem.FingerprintMismatch},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tx, err := b.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			key := "W-" + tt.name
			if err := b.writeEffect(ctx, tx, key); err != nil {
				t.Fatal(err)
			}
			out, _ := c.ProcessTx(ctx, tx, idem.Message{ID: "M", Payload: []byte(tt.payload)}, func(context.Context, pgx.Tx, idem.Message) error {
				t.Error("handler ran for a processed message")
				return nil
			})
			if out.Status != tt.want {
				t.Fatalf("ProcessTx = %v, want %v", out, tt.want)
			}
			if tx.Conn().PgConn().TxStatus() != 'T' {
				t.Fatalf("transaction status %c after the duplicate, want T (not aborted)", tx.Conn().PgConn().TxStatus())
			}
			var one int
			if err := tx.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
				t.Fatalf("statement after the duplicate: %v", err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatalf("Commit after the duplicate: %v", err)
			}
			if n := b.countEffects(t, key); n != 1 {
				t.Errorf("business row: %d, want 1", n)
			}
		})
	}

	// A new message in the caller's transaction: claim and effect commit
	// with the caller's own writes.
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.ProcessTx(ctx, tx, idem.Message{ID: "N", Payload: []byte("p")}, b.effectHandler())
	if err != nil || out.Status != idem.Processed {
		t.Fatal(out, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := b.countEffects(t, "N"); n != 1 {
		t.Errorf("effects of N: %d, want 1", n)
	}
	checkPool(t, b.pool)
}

// TestInvalidClaimKeepsTxUsable: ClaimTx, ClaimBatchTx and BeginClaim
// refuse invalid parameters before any statement, so the caller's
// transaction is not aborted by a constraint violation (SQLSTATE 23514,
// then 25P02 for every later statement): it keeps its writes, claims and
// commits.
func TestInvalidClaimKeepsTxUsable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, poolOpts{})
	long := strings.Repeat("x", idemdriver.DefaultMaxIDLength+1)
	good := fp("p")
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := b.writeEffect(ctx, tx, "before"); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		p    idemdriver.ClaimParams
		want error
	}{
		{idemdriver.ClaimParams{Consumer: "c", MessageID: long, Fingerprint: good}, idemdriver.ErrInvalidMessageID},
		{idemdriver.ClaimParams{Consumer: "c", MessageID: "", Fingerprint: good}, idemdriver.ErrMissingMessageID},
		{idemdriver.ClaimParams{Consumer: long, MessageID: "m", Fingerprint: good}, idemdriver.ErrInvalidConsumerName},
		{idemdriver.ClaimParams{Consumer: "c", MessageID: "m", Fingerprint: make([]byte, 65)}, idemdriver.ErrInvalidPayload},
	} {
		if _, err := b.store.ClaimTx(ctx, tx, &tt.p); !errors.Is(err, tt.want) {
			t.Errorf("ClaimTx(%.20q, %.20q) = %v, want %v", tt.p.Consumer, tt.p.MessageID, err, tt.want)
		}
		if _, _, err := b.store.BeginClaim(ctx, &tt.p); !errors.Is(err, tt.want) {
			t.Errorf("BeginClaim(%.20q, %.20q) = %v, want %v", tt.p.Consumer, tt.p.MessageID, err, tt.want)
		}
	}
	for _, p := range []idemdriver.ClaimBatchParams{
		{Consumer: "c", Messages: []idemdriver.ClaimMessage{{MessageID: "ok", Fingerprint: good}, {MessageID: long, Fingerprint: good}}},
		{Consumer: "c", Messages: []idemdriver.ClaimMessage{{MessageID: "ok", Fingerprint: good}, {MessageID: "ok", Fingerprint: good}}},
		{Consumer: "c"},
	} {
		if _, err := b.store.ClaimBatchTx(ctx, tx, &p); err == nil {
			t.Errorf("ClaimBatchTx(%d messages) = nil error, want a validation error", len(p.Messages))
		}
	}
	if st := tx.Conn().PgConn().TxStatus(); st != 'T' {
		t.Fatalf("transaction status %c after the invalid claims, want T (not aborted)", st)
	}
	res, err := b.store.ClaimTx(ctx, tx, &idemdriver.ClaimParams{Consumer: "c", MessageID: "m", Fingerprint: good})
	if err != nil || !res.Claimed {
		t.Fatalf("valid ClaimTx after the invalid ones = %+v, %v", res, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	if n := b.countEffects(t, "before"); n != 1 {
		t.Errorf("effect written before the invalid claims: %d rows, want 1", n)
	}
	if n := b.countRecords(t, "c"); n != 1 {
		t.Errorf("%d records, want 1", n)
	}
	checkPool(t, b.pool)
}

// After many duplicates, mismatches, handler errors, panics, aborted
// transactions and cancellations, no connection is leaked or left in a
// transaction, and every pooled connection works.
func TestConnHygiene(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, poolOpts{maxConns: 4})
	c := b.consumer(t, "hygiene")
	boom := errors.New("boom")
	for i := range 50 {
		id := fmt.Sprintf("m%d", i%10)
		var h idem.Handler[pgx.Tx]
		switch i % 5 {
		case 0:
			h = b.effectHandler()
		case 1:
			h = func(context.Context, pgx.Tx, idem.Message) error { return boom }
		case 2:
			h = func(context.Context, pgx.Tx, idem.Message) error { panic("handler panic") }
		case 3:
			h = func(ctx context.Context, tx pgx.Tx, _ idem.Message) error {
				_, _ = tx.Exec(ctx, `SELECT 1/0`)
				return nil
			}
		case 4:
			h = func(ctx context.Context, tx pgx.Tx, _ idem.Message) error {
				cctx, cancel := context.WithCancel(ctx)
				cancel()
				_, err := tx.Exec(cctx, `SELECT pg_sleep(10)`)
				return err
			}
		}
		payload := "p"
		if i%7 == 0 {
			payload = "other"
		}
		_, _ = c.Process(ctx, idem.Message{ID: id, Payload: []byte(payload)}, h)
		_, _ = c.ProcessBatch(ctx, []idem.Message{{ID: id, Payload: []byte(payload)}, {ID: id + "b", Payload: []byte("p")}},
			func(ctx context.Context, tx pgx.Tx, msgs []idem.Message) error {
				return h(ctx, tx, msgs[0])
			})
	}
	// A claim that fails inside BeginClaim, after BEGIN reached the
	// server (its table does not exist), leaves no transaction.
	missing, err := idempgxv5.New(b.pool, &idempgxv5.Config{Table: b.table + "_none"})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := missing.BeginClaim(ctx, &idemdriver.ClaimParams{Consumer: "hygiene", MessageID: "x", Fingerprint: fp("x")}); err == nil {
		t.Error("BeginClaim on a missing table succeeded")
	} else {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42P01" {
			t.Errorf("BeginClaim error = %v, want undefined_table 42P01", err)
		}
	}
	// BeginClaim with a cancelled context.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, err := b.store.BeginClaim(cctx, &idemdriver.ClaimParams{Consumer: "hygiene", MessageID: "x", Fingerprint: fp("x")}); !errors.Is(err, context.Canceled) {
		t.Errorf("BeginClaim with a cancelled context = %v, want context.Canceled", err)
	}
	checkPool(t, b.pool)
	// The store still works on the same pool.
	if out, err := c.Process(ctx, idem.Message{ID: "after", Payload: []byte("p")}, b.effectHandler()); err != nil || out.Status != idem.Processed {
		t.Fatalf("Process after the failures: %v, %v", out, err)
	}
	checkPool(t, b.pool)
}

// 32 concurrent deliveries of one message commit exactly
// one effect; the others wait on the unique index and are duplicates.
func TestConcurrentDeliveries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const n = 32
	b := setup(t, poolOpts{maxConns: n + 2})
	c := b.consumer(t, "c03")
	msg := idem.Message{ID: "M", Payload: []byte("p")}

	var (
		wg      sync.WaitGroup
		ran     atomic.Int32
		release = make(chan struct{})
		outs    = make([]idem.Outcome, n)
		errs    = make([]error, n)
	)
	for i := range n {
		wg.Go(func() {
			outs[i], errs[i] = c.Process(ctx, msg, func(ctx context.Context, tx pgx.Tx, msg idem.Message) error {
				ran.Add(1)
				<-release // hold the claim until every other copy waits on it
				return b.writeEffect(ctx, tx, msg.ID)
			})
		})
	}
	waitForLockWaiters(t, b.pool, b.table, n-1)
	close(release)
	wg.Wait()

	var processed, dup int
	for i, o := range outs {
		switch {
		case errs[i] != nil:
			t.Errorf("delivery %d: %v", i, errs[i])
		case o.Status == idem.Processed:
			processed++
		case o.Status == idem.Duplicate:
			dup++
		}
	}
	if processed != 1 || dup != n-1 || ran.Load() != 1 {
		t.Errorf("processed=%d duplicate=%d handler runs=%d; want 1, %d, 1", processed, dup, ran.Load(), n-1)
	}
	if got := b.countEffects(t, msg.ID); got != 1 {
		t.Errorf("%d effects committed, want 1", got)
	}
	checkPool(t, b.pool)
}

// A claim that waits for a concurrent transaction: if it commits, the
// waiter sees a duplicate with the committed fingerprint (read by the
// follow-up SELECT, since the claim's snapshot predates the commit); if it
// rolls back, the waiter claims.
func TestClaimWaitsForConcurrentTx(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		commit bool
		batch  bool
	}{
		{"Commit", true, false},
		{"Rollback", false, false},
		{"BatchCommit", true, true},
		{"BatchRollback", false, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setup(t, poolOpts{maxConns: 4})
			p := &idemdriver.ClaimParams{Consumer: "c", MessageID: "M", Fingerprint: fp("first")}
			first, res, err := b.store.BeginClaim(ctx, p)
			if err != nil || !res.Claimed {
				t.Fatal(res, err)
			}

			type result struct {
				res []idemdriver.ClaimResult
				err error
			}
			done := make(chan result, 1)
			second, err := b.store.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = b.store.Rollback(ctx, second) }()
			go func() {
				if tt.batch {
					r, err := b.store.ClaimBatchTx(ctx, second, &idemdriver.ClaimBatchParams{Consumer: "c", Messages: []idemdriver.ClaimMessage{
						{MessageID: "N", Fingerprint: fp("n")}, {MessageID: "M", Fingerprint: fp("second")},
					}})
					done <- result{r, err}
					return
				}
				r, err := b.store.ClaimTx(ctx, second, &idemdriver.ClaimParams{Consumer: "c", MessageID: "M", Fingerprint: fp("second")})
				done <- result{[]idemdriver.ClaimResult{r}, err}
			}()
			waitForLockWaiters(t, b.pool, b.table, 1)
			if tt.commit {
				err = b.store.Commit(ctx, first)
			} else {
				err = b.store.Rollback(ctx, first)
			}
			if err != nil {
				t.Fatal(err)
			}
			r := <-done
			if r.err != nil {
				t.Fatal(r.err)
			}
			got := r.res[len(r.res)-1]
			if tt.commit && (got.Claimed || !bytes.Equal(got.Fingerprint, fp("first"))) {
				t.Errorf("after commit: %+v, want a duplicate with the first fingerprint", got)
			}
			if !tt.commit && !got.Claimed {
				t.Errorf("after rollback: %+v, want claimed", got)
			}
			if tt.batch && !r.res[0].Claimed {
				t.Errorf("N: %+v, want claimed", r.res[0])
			}
			if second.Conn().PgConn().TxStatus() != 'T' {
				t.Errorf("waiting transaction status %c, want T", second.Conn().PgConn().TxStatus())
			}
		})
	}
}

func TestClaimBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, poolOpts{})

	// Committed before: "b" with a matching fingerprint, "d" with another.
	tx, err := b.store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.ClaimBatchTx(ctx, tx, &idemdriver.ClaimBatchParams{Consumer: "c", Messages: []idemdriver.ClaimMessage{
		{MessageID: "b", Fingerprint: fp("b")}, {MessageID: "d", Fingerprint: fp("old")},
	}}); err != nil {
		t.Fatal(err)
	}
	if err := b.store.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}

	tx, err = b.store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.store.Rollback(ctx, tx) }()
	// Unsorted input, IDs that differ only by case and by a trailing space
	// (byte-for-byte comparison), a multi-byte ID.
	msgs := []idemdriver.ClaimMessage{
		{MessageID: "z", Fingerprint: fp("z")},
		{MessageID: "d", Fingerprint: fp("d")},
		{MessageID: "B", Fingerprint: fp("B")},
		{MessageID: "b", Fingerprint: fp("b")},
		{MessageID: "b ", Fingerprint: fp("b ")},
		{MessageID: "é", Fingerprint: fp("é")},
	}
	res, err := b.store.ClaimBatchTx(ctx, tx, &idemdriver.ClaimBatchParams{Consumer: "c", Messages: msgs})
	if err != nil {
		t.Fatal(err)
	}
	want := []idemdriver.ClaimResult{
		{Claimed: true}, {Fingerprint: fp("old")}, {Claimed: true}, {Fingerprint: fp("b")}, {Claimed: true}, {Claimed: true},
	}
	if len(res) != len(want) {
		t.Fatalf("%d results, want %d", len(res), len(want))
	}
	for i := range want {
		if res[i].Claimed != want[i].Claimed || !bytes.Equal(res[i].Fingerprint, want[i].Fingerprint) {
			t.Errorf("message %q: %+v, want %+v", msgs[i].MessageID, res[i], want[i])
		}
	}
	// Claiming the same messages again in the same transaction: duplicates
	// of the transaction's own claims.
	res, err = b.store.ClaimBatchTx(ctx, tx, &idemdriver.ClaimBatchParams{Consumer: "c", Messages: msgs[:1]})
	if err != nil || res[0].Claimed {
		t.Errorf("re-claim in the same transaction: %+v, %v; want not claimed", res, err)
	}
	if res, err := b.store.ClaimBatchTx(ctx, tx, &idemdriver.ClaimBatchParams{Consumer: "c"}); !errors.Is(err, idemdriver.ErrInvalidConfig) {
		t.Errorf("empty batch: %v, %v; want ErrInvalidConfig", res, err)
	}
	// IDs must be distinct (the Consumer settles repeats itself).
	if _, err := b.store.ClaimBatchTx(ctx, tx, &idemdriver.ClaimBatchParams{Consumer: "c", Messages: []idemdriver.ClaimMessage{
		{MessageID: "q", Fingerprint: fp("q")}, {MessageID: "q", Fingerprint: fp("q")},
	}}); err == nil {
		t.Error("batch with a repeated ID: no error")
	}
}

// Concurrent batches with overlapping IDs in opposite orders do not
// deadlock: rows are inserted in ID order.
func TestClaimBatchNoDeadlock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, poolOpts{maxConns: 6})
	c := b.consumer(t, "overlap")
	const rounds = 20
	var wg sync.WaitGroup
	errs := make(chan error, 4*rounds)
	for w := range 4 {
		wg.Go(func() {
			for r := range rounds {
				msgs := make([]idem.Message, 20)
				for i := range msgs {
					k := i
					if w%2 == 1 {
						k = len(msgs) - 1 - i
					}
					msgs[i] = idem.Message{ID: fmt.Sprintf("r%d-%02d", r, k), Payload: []byte("p")}
				}
				if _, err := c.ProcessBatch(ctx, msgs, func(ctx context.Context, tx pgx.Tx, msgs []idem.Message) error {
					for _, m := range msgs {
						if err := b.writeEffect(ctx, tx, m.ID); err != nil {
							return err
						}
					}
					return nil
				}); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	var total, distinct int
	if err := b.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT key) FROM `+b.effects).Scan(&total, &distinct); err != nil {
		t.Fatal(err)
	}
	if total != rounds*20 || distinct != rounds*20 {
		t.Errorf("effects: %d rows, %d distinct; want %d each", total, distinct, rounds*20)
	}
	checkPool(t, b.pool)
}

// Cancelling the context while the handler runs fails the delivery and
// keeps nothing; the connection is not leaked.
func TestContextCancelMidHandler(t *testing.T) {
	t.Parallel()
	b := setup(t, poolOpts{maxConns: 2})
	c := b.consumer(t, "cancel")
	msg := idem.Message{ID: "m", Payload: []byte("p")}

	t.Run("Blocked", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		started := make(chan struct{})
		go func() { <-started; cancel() }()
		out, err := c.Process(ctx, msg, func(ctx context.Context, tx pgx.Tx, msg idem.Message) error {
			if err := b.writeEffect(ctx, tx, msg.ID); err != nil {
				return err
			}
			close(started)
			_, err := tx.Exec(ctx, `SELECT pg_sleep(30)`) // cancelled by the server on ctx
			return err
		})
		if out.Status != idem.Failed || !errors.Is(err, context.Canceled) {
			t.Fatalf("Process = %v, %v; want Failed, context.Canceled", out, err)
		}
	})
	t.Run("IgnoredByHandler", func(t *testing.T) {
		// The handler returns nil after ctx ended: Commit fails, nothing commits.
		ctx, cancel := context.WithCancel(context.Background())
		out, err := c.Process(ctx, msg, func(ctx context.Context, tx pgx.Tx, msg idem.Message) error {
			err := b.writeEffect(ctx, tx, msg.ID)
			cancel()
			return err
		})
		if out.Status != idem.Failed || !errors.Is(err, idem.ErrStore) {
			t.Fatalf("Process = %v, %v; want Failed, ErrStore", out, err)
		}
	})
	if n := b.countEffects(t, msg.ID); n != 0 {
		t.Errorf("%d effects, want 0", n)
	}
	if n := b.countRecords(t, "cancel"); n != 0 {
		t.Errorf("%d records, want 0", n)
	}
	checkPool(t, b.pool)
	if out, err := c.Process(context.Background(), msg, b.effectHandler()); err != nil || out.Status != idem.Processed {
		t.Fatalf("redelivery: %v, %v", out, err)
	}
	checkPool(t, b.pool)
}

// Message IDs and consumer names are stored and compared byte for byte.
func TestIDsByteForByte(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, poolOpts{})
	c := b.consumer(t, "bytes")
	ids := []string{"a", "A", "a ", " a", "é", "e\u0301", "ß", "SS", string(bytes.Repeat([]byte("x"), 255)), "日本"}
	for _, id := range ids {
		if out, err := c.Process(ctx, idem.Message{ID: id, Payload: []byte("p")}, b.effectHandler()); err != nil || out.Status != idem.Processed {
			t.Errorf("ID %q: %v, %v; want Processed", id, out, err)
		}
	}
	for _, id := range ids {
		if out, err := c.Process(ctx, idem.Message{ID: id, Payload: []byte("p")}, b.effectHandler()); err != nil || out.Status != idem.Duplicate {
			t.Errorf("ID %q again: %v, %v; want Duplicate", id, out, err)
		}
		r, err := b.store.Inspect(ctx, "bytes", id)
		if err != nil || r.MessageID != id {
			t.Errorf("Inspect %q = %q, %v", id, r.MessageID, err)
		}
	}
}

// Every pgx query mode works: BeginClaim's pipeline is one multi-statement
// simple query under QueryExecModeSimpleProtocol, and extended-protocol
// messages otherwise.
func TestQueryExecModes(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{
		pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec,
		pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol,
	} {
		t.Run(modeName(mode), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setup(t, poolOpts{maxConns: 4, mode: mode})
			c := b.consumer(t, "modes")
			boom := errors.New("boom")
			steps := []struct {
				msg     idem.Message
				handler idem.Handler[pgx.Tx]
				want    idem.Status
			}{
				{idem.Message{ID: "a", Payload: []byte("p")}, b.effectHandler(), idem.Processed},
				{idem.Message{ID: "a", Payload: []byte("p")}, b.effectHandler(), idem.Duplicate},
				{idem.Message{ID: "a", Payload: []byte("q")}, b.effectHandler(), idem.FingerprintMismatch},
				{idem.Message{ID: "b", Payload: []byte("p")}, func(context.Context, pgx.Tx, idem.Message) error { return boom }, idem.Failed},
				{idem.Message{ID: "b", Payload: []byte("p")}, b.effectHandler(), idem.Processed},
				{idem.Message{ID: "it's \\ 'quoted' $1", Payload: []byte("p")}, b.effectHandler(), idem.Processed},
				{idem.Message{ID: "it's \\ 'quoted' $1", Payload: []byte("p")}, b.effectHandler(), idem.Duplicate},
			}
			for i, s := range steps {
				if out, _ := c.Process(ctx, s.msg, s.handler); out.Status != s.want {
					t.Errorf("step %d (%q): %v, want %v", i, s.msg.ID, out, s.want)
				}
			}
			outs, err := c.ProcessBatch(ctx, []idem.Message{{ID: "a", Payload: []byte("p")}, {ID: "c", Payload: []byte("p")}},
				func(ctx context.Context, tx pgx.Tx, msgs []idem.Message) error {
					return b.writeEffect(ctx, tx, msgs[0].ID)
				})
			if err != nil || outs[0].Status != idem.Duplicate || outs[1].Status != idem.Processed {
				t.Errorf("ProcessBatch = %v, %v", outs, err)
			}
			tx, err := b.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if out, _ := c.ProcessTx(ctx, tx, idem.Message{ID: "a", Payload: []byte("p")}, b.effectHandler()); out.Status != idem.Duplicate {
				t.Errorf("ProcessTx = %v, want Duplicate", out)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Errorf("Commit after a duplicate in ProcessTx: %v", err)
			}
			for id, want := range map[string]int{"a": 1, "b": 1, "c": 1, "it's \\ 'quoted' $1": 1} {
				if n := b.countEffects(t, id); n != want {
					t.Errorf("effects of %q: %d, want %d", id, n, want)
				}
			}
			checkPool(t, b.pool)
		})
	}
}

// BeginClaimBatch begins and claims a batch in one round trip, returns
// the results in the order given, settles a claim that waited for a
// concurrent transaction (the follow-up SELECT runs in the transaction it
// opened), and leaves no transaction open when it fails.
func TestBeginClaimBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var writes atomic.Int64
	// One connection, so that the statement prepared by the first batch
	// is in the cache of the connection the round trips are counted on.
	b := setup(t, poolOpts{maxConns: 1, countWrites: &writes, noPing: true})
	batch := func(msgs ...idemdriver.ClaimMessage) *idemdriver.ClaimBatchParams {
		return &idemdriver.ClaimBatchParams{Consumer: "c", Messages: msgs, LockTimeout: 5 * time.Second}
	}
	// The connection's first batch prepares the statement (pgx's cache).
	tx, res, err := b.store.BeginClaimBatch(ctx, batch(idemdriver.ClaimMessage{MessageID: "b", Fingerprint: fp("b")},
		idemdriver.ClaimMessage{MessageID: "d", Fingerprint: fp("old")}))
	if err != nil || len(res) != 2 || !res[0].Claimed || !res[1].Claimed {
		t.Fatalf("BeginClaimBatch = %+v, %v; want both claimed", res, err)
	}
	if err := b.store.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}

	t.Run("NewAndExisting", func(t *testing.T) {
		msgs := []idemdriver.ClaimMessage{
			{MessageID: "z", Fingerprint: fp("z")},
			{MessageID: "d", Fingerprint: fp("d")},
			{MessageID: "b", Fingerprint: fp("b")},
			{MessageID: "a", Fingerprint: fp("a")},
		}
		writes.Store(0)
		tx, res, err := b.store.BeginClaimBatch(ctx, batch(msgs...))
		if err != nil {
			t.Fatal(err)
		}
		if n := writes.Load(); n != 1 {
			t.Errorf("BeginClaimBatch took %d round trips, want 1", n)
		}
		if tx.Conn().PgConn().TxStatus() != 'T' {
			t.Errorf("tx status %c, want T (in a transaction)", tx.Conn().PgConn().TxStatus())
		}
		want := []idemdriver.ClaimResult{{Claimed: true}, {Fingerprint: fp("old")}, {Fingerprint: fp("b")}, {Claimed: true}}
		if len(res) != len(want) {
			t.Fatalf("%d results, want %d", len(res), len(want))
		}
		for i := range want {
			if res[i].Claimed != want[i].Claimed || !bytes.Equal(res[i].Fingerprint, want[i].Fingerprint) {
				t.Errorf("message %q: %+v, want %+v", msgs[i].MessageID, res[i], want[i])
			}
		}
		if err := b.store.Commit(ctx, tx); err != nil {
			t.Fatal(err)
		}
		if n := b.countRecords(t, "c"); n != 4 {
			t.Errorf("%d records, want 4 (b, d, a, z)", n)
		}
	})

	checkPool(t, b.pool)
	b = setup(t, poolOpts{maxConns: 4})

	t.Run("WaitsThenSettles", func(t *testing.T) {
		first, res, err := b.store.BeginClaim(ctx, &idemdriver.ClaimParams{Consumer: "c", MessageID: "M", Fingerprint: fp("first")})
		if err != nil || !res.Claimed {
			t.Fatal(res, err)
		}
		type result struct {
			tx  pgx.Tx
			res []idemdriver.ClaimResult
			err error
		}
		done := make(chan result, 1)
		go func() {
			tx, res, err := b.store.BeginClaimBatch(ctx, batch(idemdriver.ClaimMessage{MessageID: "N", Fingerprint: fp("n")},
				idemdriver.ClaimMessage{MessageID: "M", Fingerprint: fp("second")}))
			done <- result{tx, res, err}
		}()
		waitForLockWaiters(t, b.pool, b.table, 1)
		if err := b.store.Commit(ctx, first); err != nil {
			t.Fatal(err)
		}
		r := <-done
		if r.err != nil {
			t.Fatal(r.err)
		}
		if len(r.res) != 2 || !r.res[0].Claimed || r.res[1].Claimed || !bytes.Equal(r.res[1].Fingerprint, fp("first")) {
			t.Errorf("after the commit: %+v; want N claimed and M a duplicate with the first fingerprint", r.res)
		}
		if err := b.store.Rollback(ctx, r.tx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("Refused", func(t *testing.T) {
		for _, p := range []*idemdriver.ClaimBatchParams{
			{Consumer: "c"},
			batch(idemdriver.ClaimMessage{MessageID: "q", Fingerprint: fp("q")}, idemdriver.ClaimMessage{MessageID: "q", Fingerprint: fp("q")}),
		} {
			if tx, res, err := b.store.BeginClaimBatch(ctx, p); !errors.Is(err, idemdriver.ErrInvalidConfig) || tx != nil {
				t.Errorf("BeginClaimBatch(%d messages) = %v, %+v, %v; want no transaction and ErrInvalidConfig", len(p.Messages), tx, res, err)
			}
		}
	})

	t.Run("LockTimeout", func(t *testing.T) {
		// A claim that waits past its lock timeout for a record another
		// transaction holds fails with ErrLockTimeout, and leaves no
		// transaction open.
		holder, res, err := b.store.BeginClaim(ctx, &idemdriver.ClaimParams{Consumer: "c", MessageID: "held", Fingerprint: fp("h")})
		if err != nil || !res.Claimed {
			t.Fatal(res, err)
		}
		defer func() { _ = b.store.Rollback(ctx, holder) }()
		p := batch(idemdriver.ClaimMessage{MessageID: "free", Fingerprint: fp("f")}, idemdriver.ClaimMessage{MessageID: "held", Fingerprint: fp("h")})
		p.LockTimeout = 50 * time.Millisecond
		tx, got, err := b.store.BeginClaimBatch(ctx, p)
		if !errors.Is(err, idemdriver.ErrLockTimeout) || tx != nil {
			t.Fatalf("BeginClaimBatch of a held record = %v, %+v, %v; want no transaction and ErrLockTimeout", tx, got, err)
		}
	})
	checkPool(t, b.pool)
}
