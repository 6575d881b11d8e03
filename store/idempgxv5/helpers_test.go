package idempgxv5_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// testURL returns the test database URL, skipping the test when it is not
// set (failing it under IDEM_TEST_REQUIRE_ALL=1).
func testURL(tb testing.TB) string {
	tb.Helper()
	return testenv.URL(tb, testenv.PostgresEnv, "postgres://idem:idem@127.0.0.1:5432/idem_test?sslmode=disable")
}

type poolOpts struct {
	maxConns int32
	// countWrites, if set, counts every Write on the pool's network
	// connections: each is one flush of pgx's send buffer.
	countWrites *atomic.Int64
	// messages, if set, counts the protocol messages pgx sends on the
	// pool's network connections, by type (see frontendMessages).
	messages *frontendMessages
	noPing   bool
	// mode, if set, is the connections' DefaultQueryExecMode.
	mode pgx.QueryExecMode
	// url, if set, replaces the test database URL (PgBouncer's).
	url string
	// part, if set, makes the store's table partitioned.
	part *idempgxv5.Partitions
}

// newPool opens a pool on the test database, closed at cleanup.
func newPool(tb testing.TB, o poolOpts) *pgxpool.Pool {
	tb.Helper()
	u := o.url
	if u == "" {
		u = testURL(tb)
	}
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		tb.Fatalf("parse the test database URL: %v", err)
	}
	cfg.MaxConns = 8
	if o.maxConns > 0 {
		cfg.MaxConns = o.maxConns
	}
	if n := o.countWrites; n != nil {
		wrapConns(cfg, func(c net.Conn) net.Conn { return &countingConn{Conn: c, writes: n} })
	}
	if m := o.messages; m != nil {
		wrapConns(cfg, func(c net.Conn) net.Conn { return &messageConn{Conn: c, m: m} })
	}
	if o.mode != 0 {
		cfg.ConnConfig.DefaultQueryExecMode = o.mode
	}
	if o.noPing {
		cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("pool: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// wrapConns makes each network connection of cfg's pool wrap(c) of the
// connection c it dials.
func wrapConns(cfg *pgxpool.Config, wrap func(net.Conn) net.Conn) {
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return wrap(c), nil
	}
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// randName returns prefix followed by 16 random hex digits.
func randName(prefix string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// bundle is one test's isolated store: fresh processed and side-effect
// tables, dropped at cleanup.
type bundle struct {
	pool    *pgxpool.Pool
	store   *idempgxv5.Store
	table   string
	effects string
	// best is the hand-written consumer's processed table (benchmarks
	// only; see benchSetup).
	best string
	// checked is the processed table of the hand-written consumer with
	// idem's guarantee (benchmarks only; see checkedSetup), "" when the
	// benchmark has none.
	checked string
	// part is the store's partitioned layout, nil for the default one.
	part *idempgxv5.Partitions
}

func setup(tb testing.TB, o poolOpts) *bundle {
	tb.Helper()
	pool := newPool(tb, o)
	return setupPart(tb, pool, o.part)
}

// setupOn creates fresh tables on pool.
func setupOn(tb testing.TB, pool *pgxpool.Pool) *bundle {
	return setupPart(tb, pool, nil)
}

// setupPart creates fresh tables on pool, in the partitioned layout when
// part is set.
func setupPart(tb testing.TB, pool *pgxpool.Pool, part *idempgxv5.Partitions) *bundle {
	tb.Helper()
	ctx := context.Background()
	b := &bundle{pool: pool, table: randName("idem_t_"), effects: randName("idem_fx_"), part: part}
	store, err := idempgxv5.New(pool, &idempgxv5.Config{Table: b.table, Partitions: part})
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	b.store = store
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := dropTables(ctx, pool, b.table, b.effects); err != nil {
			tb.Errorf("drop test tables: %v", err)
		}
	})
	if err := store.Migrate(ctx); err != nil {
		tb.Fatalf("Migrate: %v", err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+b.effects+` (id bigserial PRIMARY KEY, key text NOT NULL)`); err != nil {
		tb.Fatalf("create effects table: %v", err)
	}
	return b
}

// dropTables drops the tables whose names start with one of prefixes (a
// store's table, and the tables its migrations add beside it: _migrations,
// _steps, ...), in the current schema.
func dropTables(ctx context.Context, pool *pgxpool.Pool, prefixes ...string) error {
	rows, err := pool.Query(ctx, `SELECT quote_ident(tablename) FROM pg_tables
		WHERE schemaname = current_schema() AND EXISTS (SELECT FROM unnest($1::text[]) p WHERE starts_with(tablename, p))`, prefixes)
	if err != nil {
		return err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(names) == 0 {
		return err
	}
	if _, err = pool.Exec(ctx, `DROP TABLE IF EXISTS `+strings.Join(names, ", ")); err != nil {
		return err
	}
	// The outbox's notify trigger functions (<table>_outbox_notify).
	for _, n := range names {
		if _, err := pool.Exec(ctx, `DROP FUNCTION IF EXISTS `+strings.Trim(n, `"`)+`_notify()`); err != nil {
			return err
		}
	}
	// The outbox's domains (<table>_outbox_id, <table>_outbox_str).
	rows, err = pool.Query(ctx, `SELECT quote_ident(typname) FROM pg_type
		WHERE typtype = 'd' AND typnamespace = current_schema()::regnamespace AND EXISTS (SELECT FROM unnest($1::text[]) p WHERE starts_with(typname, p))`, prefixes)
	if err != nil {
		return err
	}
	domains, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(domains) == 0 {
		return err
	}
	_, err = pool.Exec(ctx, `DROP DOMAIN IF EXISTS `+strings.Join(domains, ", "))
	return err
}

// writeEffect inserts one side-effect row inside tx.
func (b *bundle) writeEffect(ctx context.Context, tx pgx.Tx, key string) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+b.effects+` (key) VALUES ($1)`, key)
	return err
}

func (b *bundle) countEffects(tb testing.TB, key string) int {
	tb.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+b.effects+` WHERE key = $1`, key).Scan(&n); err != nil {
		tb.Fatalf("count effects: %v", err)
	}
	return n
}

func (b *bundle) countRecords(tb testing.TB, consumer string) int {
	tb.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+b.table+` WHERE `+b.consumerIs(), consumer).Scan(&n); err != nil {
		tb.Fatalf("count records: %v", err)
	}
	return n
}

// shift moves every time recorded for consumer back by d: its records'
// processed_at, lease_expires_at and updated_at (NULL for transactional
// records), and its runs (idemtest's Setup.Shift).
func (b *bundle) shift(ctx context.Context, consumer string, d time.Duration) error {
	iv := `$2::bigint * interval '1 microsecond'`
	if b.part != nil {
		// The records move to older partitions: create them first.
		var lo, hi *time.Time
		if err := b.pool.QueryRow(ctx, `SELECT min(processed_at), max(processed_at) FROM `+b.table+` WHERE `+b.consumerIs(), consumer).Scan(&lo, &hi); err != nil {
			return err
		}
		if lo != nil {
			step := b.part.Bucket
			if step == 0 {
				step = time.Hour
			}
			for t := lo.Add(-d); !t.After(hi.Add(-d)); t = t.Add(step) {
				if err := idempgxv5.EnsurePartitionsAt(ctx, b.store, t); err != nil {
					return err
				}
			}
		}
	}
	for _, q := range []string{
		`UPDATE ` + b.table + ` SET processed_at = processed_at - ` + iv + `, lease_expires_at = lease_expires_at - ` + iv +
			`, updated_at = updated_at - ` + iv + ` WHERE ` + b.consumerIs(),
		`UPDATE ` + b.table + `_runs SET started_at = started_at - ` + iv + `, ended_at = ended_at - ` + iv + ` WHERE consumer = $1`,
	} {
		if _, err := b.pool.Exec(ctx, q, consumer, d.Microseconds()); err != nil {
			return err
		}
	}
	return nil
}

// expireLease ends the live lease of consumer's in_progress record id at
// the server's now() (a lease ending at now has run out), changing
// nothing else; a lease that already ended keeps its expiry. It fails
// when there is no in_progress record.
func (b *bundle) expireLease(ctx context.Context, consumer, id string) error {
	tag, err := b.pool.Exec(ctx, `UPDATE `+b.table+` SET lease_expires_at = LEAST(lease_expires_at, now())
		WHERE `+b.consumerIs()+` AND message_id = $2 AND state = 1`, consumer, id)
	if err != nil {
		return err
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("no in_progress record %q of consumer %q", id, consumer)
	}
	return nil
}

// consumer returns a Consumer on the bundle's store without a purge loop.
func (b *bundle) consumer(tb testing.TB, name string) *idem.Consumer[pgx.Tx] {
	tb.Helper()
	c, err := idem.NewConsumer[pgx.Tx](b.store, idem.Config{Name: name, PurgeInterval: -1})
	if err != nil {
		tb.Fatalf("NewConsumer: %v", err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// effectHandler writes one side effect keyed by the message ID.
func (b *bundle) effectHandler() idem.Handler[pgx.Tx] {
	return func(ctx context.Context, tx pgx.Tx, msg idem.Message) error {
		return b.writeEffect(ctx, tx, msg.ID)
	}
}

// checkPool fails the test if the pool keeps acquired connections, or has
// an idle connection that is closed, busy or inside a transaction.
func checkPool(tb testing.TB, pool *pgxpool.Pool) {
	tb.Helper()
	noneAcquired(tb, pool)
	ctx := context.Background()
	idle := pool.AcquireAllIdle(ctx)
	for _, c := range idle {
		pc := c.Conn().PgConn()
		if c.Conn().IsClosed() || pc.IsBusy() || pc.TxStatus() != 'I' {
			tb.Errorf("idle connection in bad state: closed=%v busy=%v txstatus=%c", c.Conn().IsClosed(), pc.IsBusy(), pc.TxStatus())
		} else if err := c.Ping(ctx); err != nil {
			tb.Errorf("idle connection does not answer: %v", err)
		}
		c.Release()
	}
}

// noneAcquired waits until pool has no acquired connection, and fails the
// test if one stays acquired (leaked). It waits because a running
// Consumer's heartbeat (MarkRunning) may hold a connection for a moment,
// and because pgxpool destroys a connection whose statement was cancelled
// (as Close cancels a heartbeat in flight) in the background, counting it
// as acquired until then.
func noneAcquired(tb testing.TB, pool *pgxpool.Pool) {
	tb.Helper()
	testenv.Eventually(tb, 5*time.Second, "no acquired connections", func() bool { return pool.Stat().AcquiredConns() == 0 },
		func() string { return fmt.Sprintf("%d acquired (leaked)", pool.Stat().AcquiredConns()) })
}

// waitForLockWaiters waits until n sessions wait on a lock on the server
// while running a statement containing query.
func waitForLockWaiters(tb testing.TB, pool *pgxpool.Pool, query string, n int) {
	tb.Helper()
	var got int
	testenv.Eventually(tb, 30*time.Second, fmt.Sprintf("%d lock waiters", n), func() bool {
		err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND strpos(query, $1) > 0`, query).Scan(&got)
		if err != nil {
			tb.Fatalf("pg_stat_activity: %v", err)
		}
		return got >= n
	}, func() string { return fmt.Sprintf("%d waiting", got) })
}

// consumerIs is the condition on the bundle's processed table that
// selects the consumer named by $1: by its key on the default layout
// (schema v2), by name on the partitioned one.
func (b *bundle) consumerIs() string {
	if b.part != nil {
		return `consumer = $1`
	}
	return keyOf(b.table, `$1`)
}

// keyOf is the condition on the processed table t of schema v2 that
// selects the consumer named by p.
func keyOf(t, p string) string {
	return `consumer_key = (SELECT key FROM ` + t + `_consumers WHERE name = ` + p + `)`
}

// recordsInsert is the head of an INSERT ... SELECT of records of
// consumer (an SQL literal) into the processed table t, of schema v2
// (the consumer's key, the name added to the consumers table) or not:
// the columns cols follow the consumer's, and the caller appends their
// values, after the consumer's.
func recordsInsert(t string, v2 bool, consumer, cols string) string {
	if !v2 {
		return `INSERT INTO ` + t + ` (consumer, ` + cols + `) SELECT ` + consumer + `, `
	}
	return `WITH k AS (INSERT INTO ` + t + `_consumers (key, name) SELECT COALESCE(max(key), 0) + 1, ` + consumer + ` FROM ` + t + `_consumers
		ON CONFLICT (name) DO UPDATE SET name = excluded.name RETURNING key)
	INSERT INTO ` + t + ` (consumer_key, ` + cols + `) SELECT (SELECT key FROM k), `
}

// recordsFrom is the processed table t as a FROM item whose column
// consumer is the name, whichever its shape (schema v2: joined with the
// consumers table).
func recordsFrom(tb testing.TB, pool *pgxpool.Pool, t string) string {
	tb.Helper()
	var v1 bool
	if err := pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = $1::regclass AND attname = 'consumer' AND NOT attisdropped)`, t).Scan(&v1); err != nil {
		tb.Fatal(err)
	}
	if v1 {
		return t
	}
	return `(SELECT c.name AS consumer, r.* FROM ` + t + ` r JOIN ` + t + `_consumers c ON c.key = r.consumer_key) AS recs`
}
