package idempgxv5_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/internal/faultproxy"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/idempgxv5"
)

// bouncerURL returns PgBouncer's URL (transaction pooling), skipping the
// test when it is not set (failing it under IDEM_TEST_REQUIRE_ALL=1).
func bouncerURL(tb testing.TB) string {
	tb.Helper()
	return testenv.URL(tb, testenv.PgBouncerEnv, "postgres://idem:idem@127.0.0.1:6432/idem_test?sslmode=disable")
}

// bouncerModes are the query exec modes that work through PgBouncer 1.18
// in transaction pooling: neither prepares a named statement.
var bouncerModes = []pgx.QueryExecMode{pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeSimpleProtocol}

// bouncerSetup opens a bundle through PgBouncer in mode: the store's pool
// goes through PgBouncer; the outbox's LISTEN goes to PostgreSQL itself
// (Config.ListenConfig), where notifications reach it.
func bouncerSetup(t *testing.T, mode pgx.QueryExecMode) *bundle {
	listen, err := pgx.ParseConfig(testURL(t))
	if err != nil {
		t.Fatal(err)
	}
	b := setup(t, poolOpts{maxConns: 8, mode: mode, url: bouncerURL(t)})
	if b.store, err = idempgxv5.New(b.pool, &idempgxv5.Config{Table: b.table, ListenConfig: listen}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { noneAcquired(t, b.pool) })
	return b
}

// TestPgBouncerConformance runs the store conformance suites
// (transactional, with batches, purges and migrations; lease; outbox)
// through PgBouncer in transaction pooling, in each query exec mode that
// PgBouncer 1.18 supports: every store operation works there.
func TestPgBouncerConformance(t *testing.T) {
	bouncerURL(t)
	testURL(t)
	for _, mode := range bouncerModes {
		t.Run(modeName(mode), func(t *testing.T) {
			t.Parallel()
			h := idemtest.Harness[pgx.Tx]{New: func(t *testing.T) *idemtest.Setup[pgx.Tx] { return bouncerSetup(t, mode).setup() }}
			t.Run("Tx", func(t *testing.T) { t.Parallel(); idemtest.Run(t, h) })
			t.Run("Lease", func(t *testing.T) {
				t.Parallel()
				idemtest.RunLease(t, idemtest.LeaseHarness{New: func(t *testing.T) *idemtest.LeaseSetup { return bouncerSetup(t, mode).leaseSetup() }})
			})
			t.Run("Outbox", func(t *testing.T) { t.Parallel(); idemtest.RunOutbox(t, h) })
		})
	}
}

// purgers opens n Stores on one table, each on its own pool through
// PgBouncer, and returns them with the table's bundle (on the first pool).
func purgers(t *testing.T, n int) (*bundle, []*idempgxv5.Store) {
	t.Helper()
	u := bouncerURL(t)
	b := setup(t, poolOpts{maxConns: 4, mode: pgx.QueryExecModeCacheDescribe, url: u})
	stores := []*idempgxv5.Store{b.store}
	for range n - 1 {
		s, err := idempgxv5.New(newPool(t, poolOpts{maxConns: 4, mode: pgx.QueryExecModeCacheDescribe, url: u}), &idempgxv5.Config{Table: b.table})
		if err != nil {
			t.Fatal(err)
		}
		stores = append(stores, s)
	}
	return b, stores
}

// exclusive is a Retainer that counts the purge sessions open at once:
// a session counts from the moment BeginPurge returned it (its lock is
// held) until its Close starts (the lock is still held).
type exclusive struct {
	idemdriver.Retainer
	open, most, sessions *atomic.Int64
}

func (e exclusive) BeginPurge(ctx context.Context, p *idemdriver.BeginPurgeParams) (idemdriver.PurgeSession, error) {
	s, err := e.Retainer.BeginPurge(ctx, p)
	if err != nil {
		return nil, err
	}
	e.sessions.Add(1)
	n := e.open.Add(1)
	for m := e.most.Load(); n > m && !e.most.CompareAndSwap(m, n); m = e.most.Load() {
	}
	return &countedSession{PurgeSession: s, open: e.open}, nil
}

type countedSession struct {
	idemdriver.PurgeSession
	open *atomic.Int64
	once sync.Once
}

func (c *countedSession) Close(ctx context.Context) error {
	c.once.Do(func() { c.open.Add(-1) })
	return c.PurgeSession.Close(ctx)
}

// TestPgBouncerPurgeExclusive: purgers of one consumer on four pools
// through PgBouncer in transaction pooling never hold a purge session at
// once, while their statements land on whichever server connection
// PgBouncer picks; each purge that runs deletes records, the others get
// ErrPurgeInProgress; when all are done the lock is free.
func TestPgBouncerPurgeExclusive(t *testing.T) {
	t.Parallel()
	b, stores := purgers(t, 4)
	ctx := t.Context()
	var open, most, sessions atomic.Int64
	const rounds = 15
	var wg sync.WaitGroup
	errs := make(chan error, len(stores)*rounds)
	for _, s := range stores {
		r := exclusive{Retainer: s, open: &open, most: &most, sessions: &sessions}
		wg.Go(func() {
			for range rounds {
				_, err := idem.Purge(ctx, r, idem.PurgeParams{Consumer: "c", RetentionWindow: time.Hour, BatchSize: 1})
				if err != nil && !errors.Is(err, idem.ErrPurgeInProgress) {
					errs <- err
				}
			}
		})
	}
	// Traffic on the same PgBouncer pool meanwhile, so server connections
	// change hands between the purgers' statements.
	c := b.consumer(t, "c")
	for i := range 30 {
		if _, err := c.Process(ctx, idem.Message{ID: fmt.Sprintf("m%d", i), Payload: []byte("p")}, func(context.Context, pgx.Tx, idem.Message) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("purge: %v", err)
	}
	if most.Load() != 1 {
		t.Errorf("at most %d purge sessions were open at once, want 1 (and at least one session)", most.Load())
	}
	t.Logf("%d sessions of %d purges", sessions.Load(), len(stores)*rounds)
	for i, s := range stores {
		sess, err := s.BeginPurge(ctx, &idemdriver.BeginPurgeParams{Consumer: "c"})
		if err != nil {
			t.Fatalf("store %d: BeginPurge after every purge ended: %v", i, err)
		}
		if err := sess.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	checkPool(t, b.pool)
}

// TestPgBouncerPurgeLockTakeover: a purger that holds the lock through
// PgBouncer excludes another purger until its process dies (its
// connections cut, never closed properly): then the server ends its lock
// transaction and the other purger takes the lock over. The dead
// purger's session refuses to run a batch.
func TestPgBouncerPurgeLockTakeover(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	u := bouncerURL(t)
	b := setup(t, poolOpts{maxConns: 4, mode: pgx.QueryExecModeCacheDescribe, url: u})
	proxy, viaProxy := faultproxy.URL(t, u)
	doomed, err := idempgxv5.New(newPool(t, poolOpts{maxConns: 4, mode: pgx.QueryExecModeCacheDescribe, url: viaProxy, noPing: true}), &idempgxv5.Config{Table: b.table})
	if err != nil {
		t.Fatal(err)
	}
	held, err := doomed.BeginPurge(ctx, &idemdriver.BeginPurgeParams{Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close(ctx)
	for i := range 3 {
		if _, err := b.store.BeginPurge(ctx, &idemdriver.BeginPurgeParams{Consumer: "c"}); !errors.Is(err, idemdriver.ErrPurgeInProgress) {
			t.Fatalf("attempt %d while the lock is held: BeginPurge = %v, want ErrPurgeInProgress", i, err)
		}
	}
	proxy.Close() // the purger's process dies: its connections drop
	var taken idemdriver.PurgeSession
	testenv.Eventually(t, 60*time.Second, "the lock taken over", func() bool {
		s, err := b.store.BeginPurge(ctx, &idemdriver.BeginPurgeParams{Consumer: "c"})
		if err != nil && !errors.Is(err, idemdriver.ErrPurgeInProgress) {
			t.Fatalf("BeginPurge: %v", err)
		}
		taken = s
		return err == nil
	}, nil)
	defer taken.Close(ctx)
	if _, err := held.DeleteBatch(ctx, &idemdriver.PurgeBatchParams{Horizon: time.Now(), Limit: 1}); err == nil {
		t.Error("the dead purger's DeleteBatch succeeded, want an error")
	}
	if _, err := taken.DeleteBatch(ctx, &idemdriver.PurgeBatchParams{Horizon: time.Now(), Limit: 1}); err != nil {
		t.Errorf("the new purger's DeleteBatch: %v", err)
	}
}

// TestPgBouncerMigrate is TestMigrate through PgBouncer in transaction
// pooling: the migration lock is transaction-scoped
// (pg_advisory_xact_lock in the migration's transaction), so concurrent
// first runs still apply each migration once.
func TestPgBouncerMigrate(t *testing.T) {
	t.Parallel()
	testMigrate(t, newPool(t, poolOpts{maxConns: 10, mode: pgx.QueryExecModeCacheDescribe, url: bouncerURL(t)}))
}

// TestPgBouncerInspect: Inspect and Stats (idem inspect, idem stats)
// through PgBouncer in transaction pooling read what was processed.
func TestPgBouncerInspect(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, poolOpts{maxConns: 4, mode: pgx.QueryExecModeCacheDescribe, url: bouncerURL(t)})
	seed(t, b, "c", 3)
	r, err := b.store.Inspect(ctx, "c", "m001")
	if err != nil || r.MessageID != "m001" || r.Consumer != "c" {
		t.Errorf("Inspect = %+v, %v; want the record of m001", r, err)
	}
	stats, err := b.store.Stats(ctx)
	if err != nil || len(stats) != 1 || stats[0].Consumer != "c" || stats[0].Count != 3 {
		t.Errorf("Stats = %+v, %v; want 3 records of c", stats, err)
	}
}
