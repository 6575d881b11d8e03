package idempgxv5_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The outbox INSERT travels with the COMMIT (Store.EmitCommit): when the
// INSERT fails at the server, or the COMMIT does, nothing commits (no
// record, no effect, no outgoing row), the error matches ErrStore, the
// connection goes back to the pool clean, and the message processes
// again afterwards. A batch's rows commit the same way.
func TestEmitCommit(t *testing.T) {
	ctx := context.Background()
	b := setup(t, poolOpts{maxConns: 2})
	for _, q := range []string{
		`ALTER TABLE ` + b.table + `_outbox ADD CONSTRAINT ` + b.table + `_refused CHECK (destination <> 'refused')`,
		`CREATE FUNCTION ` + b.effects + `_boom() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'boom at commit'; END $$`,
		`CREATE CONSTRAINT TRIGGER boom AFTER INSERT ON ` + b.effects + ` DEFERRABLE INITIALLY DEFERRED
			FOR EACH ROW WHEN (NEW.key = 'boom') EXECUTE FUNCTION ` + b.effects + `_boom()`,
	} {
		if _, err := b.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_, _ = b.pool.Exec(context.Background(), `DROP FUNCTION IF EXISTS `+b.effects+`_boom() CASCADE`)
	})
	c := b.consumer(t, "ec")
	handler := func(dest string) idem.Handler[pgx.Tx] {
		return func(ctx context.Context, tx pgx.Tx, msg idem.Message) error {
			if err := b.writeEffect(ctx, tx, msg.ID); err != nil {
				return err
			}
			_, err := idem.Emit(ctx, idem.OutgoingMessage{Destination: dest, Key: "k", Payload: msg.Payload})
			return err
		}
	}
	outgoing := func(source string) int {
		t.Helper()
		var n int
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.table+`_outbox WHERE source_id = $1`, source).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	for _, tc := range []struct{ name, id, dest string }{
		{"insert fails", "m1", "refused"},
		{"commit fails", "boom", "ok"},
	} {
		out, err := c.Process(ctx, idem.Message{ID: tc.id, Payload: []byte("p")}, handler(tc.dest))
		if !errors.Is(err, idem.ErrStore) || out.Status != idem.Failed {
			t.Fatalf("%s: Process = %v, %v; want Failed, ErrStore", tc.name, out.Status, err)
		}
		if n, e, o := b.countRecords(t, "ec"), b.countEffects(t, tc.id), outgoing(tc.id); n+e+o != 0 {
			t.Fatalf("%s: %d records, %d effects, %d outgoing rows after the failure; want none", tc.name, n, e, o)
		}
		checkPool(t, b.pool)
	}

	out, err := c.Process(ctx, idem.Message{ID: "m1", Payload: []byte("p")}, handler("ok"))
	if err != nil || out.Status != idem.Processed {
		t.Fatalf("Process after the failures = %v, %v", out.Status, err)
	}
	if e, o := b.countEffects(t, "m1"), outgoing("m1"); e != 1 || o != 1 {
		t.Fatalf("%d effects, %d outgoing rows of m1; want 1 and 1", e, o)
	}

	msgs := []idem.Message{{ID: "b1", Payload: []byte("p")}, {ID: "b2", Payload: []byte("p")}}
	outs, err := c.ProcessBatch(ctx, msgs, func(ctx context.Context, tx pgx.Tx, ms []idem.Message) error {
		for _, m := range ms {
			if _, err := idem.EmitFor(ctx, m.ID, idem.OutgoingMessage{Destination: "ok", Payload: m.Payload}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil || outs[0].Status != idem.Processed || outs[1].Status != idem.Processed {
		t.Fatalf("ProcessBatch = %v, %v", outs, err)
	}
	if o1, o2 := outgoing("b1"), outgoing("b2"); o1 != 1 || o2 != 1 {
		t.Fatalf("batch: %d and %d outgoing rows; want 1 each", o1, o2)
	}
	checkPoolAfterWake(t, b.pool)

	// A transaction the Store did not begin: EmitTx, then Commit.
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.store.EmitCommit(ctx, tx, &idemdriver.EmitParams{Consumer: "ec", Messages: []idemdriver.OutgoingRecord{{ID: "o-own", SourceID: "own", Destination: "ok", Payload: []byte("p")}}}); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(tx.Commit(ctx), pgx.ErrTxClosed) || outgoing("own") != 1 {
		t.Fatalf("EmitCommit on the caller's transaction: the transaction is open, or the row is missing")
	}
	// An invalid row is refused before anything is sent: tx stays usable.
	tx, err = b.store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.store.EmitCommit(ctx, tx, &idemdriver.EmitParams{Consumer: "ec", Messages: []idemdriver.OutgoingRecord{{ID: "o-bad", Payload: []byte("p")}}}); !errors.Is(err, idemdriver.ErrInvalidOutgoing) {
		t.Fatalf("EmitCommit of a row without destination = %v; want ErrInvalidOutgoing", err)
	}
	if err := b.writeEffect(ctx, tx, "after"); err != nil {
		t.Fatalf("tx after a refused EmitCommit: %v", err)
	}
	if err := b.store.Rollback(ctx, tx); err != nil {
		t.Fatal(err)
	}
	checkPoolAfterWake(t, b.pool)
}

// On a connection with a query tracer, EmitCommit takes two round trips
// (EmitTx, then Commit), so that the tracer records a real, successful
// COMMIT rather than the ended-context Commit that closes pgx's Tx after a
// pipelined one.
func TestEmitCommitTraced(t *testing.T) {
	ctx := context.Background()
	tr := &queryLog{}
	pool := tracedPool(t, tr)
	b := setupOn(t, pool)
	c := b.consumer(t, "traced")
	tr.mu.Lock()
	tr.failed, tr.commits = 0, 0 // the migration's
	tr.mu.Unlock()
	out, err := c.Process(ctx, idem.Message{ID: "m1", Payload: []byte("p")}, func(ctx context.Context, tx pgx.Tx, msg idem.Message) error {
		_, err := idem.Emit(ctx, idem.OutgoingMessage{Destination: "d", Payload: msg.Payload})
		return err
	})
	if err != nil || out.Status != idem.Processed {
		t.Fatalf("Process = %v, %v", out.Status, err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+b.table+`_outbox WHERE source_id = 'm1'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d outgoing rows of m1 (%v); want 1", n, err)
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.failed != 0 || tr.commits < 1 {
		t.Fatalf("tracer saw %d failed queries and %d commits; want none failed and the consumer's commit", tr.failed, tr.commits)
	}
}

// tracedPool opens a pool on the test database whose connections have
// tracer (a pgx.QueryTracer, and a pgx.BatchTracer if it is one), closed
// at cleanup (after the tables setupOn made are dropped).
func tracedPool(t *testing.T, tracer pgx.QueryTracer) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// queryLog is a pgx.QueryTracer that counts failed queries and commits.
type queryLog struct {
	mu              sync.Mutex
	failed, commits int
}

type sqlKey struct{}

func (l *queryLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, sqlKey{}, d.SQL)
}

func (l *queryLog) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if d.Err != nil {
		l.failed++
	}
	if q, _ := ctx.Value(sqlKey{}).(string); q == "commit" {
		l.commits++
	}
}

// checkPoolAfterWake is checkPool after a commit that emitted: the Store
// then notifies relays from a goroutine, on a connection of the pool, for
// up to its notify timeout of 10s (a pg_notify's commit waits for every
// other notifying commit of the server), so the pool may lend that one
// connection until then.
func checkPoolAfterWake(tb testing.TB, pool *pgxpool.Pool) {
	tb.Helper()
	testenv.Eventually(tb, 15*time.Second, "no acquired connections", func() bool { return pool.Stat().AcquiredConns() == 0 },
		func() string { return fmt.Sprintf("%d acquired (leaked)", pool.Stat().AcquiredConns()) })
	checkPool(tb, pool)
}
