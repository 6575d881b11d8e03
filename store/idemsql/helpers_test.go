package idemsql_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib" // also the "pgx" database/sql driver
	_ "modernc.org/sqlite"           // the "sqlite" database/sql driver

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/idemsql"
)

// The variables naming the test servers, with example values.
const (
	envPostgres = testenv.PostgresEnv
	envMySQL    = testenv.MySQLEnv
)

// dialects is every dialect, for tests that run on each.
var dialects = []idemsql.Dialect{idemsql.SQLite, idemsql.Postgres, idemsql.MySQL}

// serverURL returns the URL in env, skipping the test when it is unset,
// or failing it when IDEM_TEST_REQUIRE_ALL=1.
func serverURL(t testing.TB, env string) string {
	t.Helper()
	example := "postgres://idem:idem@127.0.0.1:5432/idem_test?sslmode=disable"
	if env == envMySQL {
		example = "idem:idem@tcp(127.0.0.1:3306)/idem_test"
	}
	return testenv.URL(t, env, example)
}

// env is one isolated store: a database handle, a Store over fresh
// randomly named tables, and an effects table beside it. Tables are
// dropped and the handle closed at the end of the test.
type env struct {
	t       testing.TB
	dialect idemsql.Dialect
	db      *sql.DB
	store   *idemsql.Store
	table   string // processed-messages table
	effects string // side-effect table (id, key)
}

// envOptions tweaks newEnv.
type envOptions struct {
	// mysqlParams are extra go-sql-driver DSN parameters, e.g.
	// clientFoundRows=true.
	mysqlParams map[string]string
	// noMigrate leaves the tables uncreated.
	noMigrate bool
	// table overrides the random processed-messages table name.
	table string
	// pgURL, if set, replaces the PostgreSQL URL (PgBouncer's), and the
	// handle keeps at most 8 connections open.
	pgURL string
	// pgWrapped opens PostgreSQL through pgx's stdlib behind a connector
	// whose driver is not stdlib's (wrappedDriver), as another
	// database/sql driver would be: the store then sends array literals.
	pgWrapped bool
}

// wrappedDriver is pgx's stdlib driver under a type of this package, so
// that a store over it does not recognise pgx's stdlib.
type wrappedDriver struct{ driver.Driver }

// wrappedConnector is a connector whose Driver is a wrappedDriver; its
// connections are stdlib's.
type wrappedConnector struct{ driver.Connector }

func (c wrappedConnector) Driver() driver.Driver { return wrappedDriver{c.Connector.Driver()} }

// openDB opens the test database of dialect d; for SQLite a new file in a
// temporary directory, opened with idemsql.SQLiteDSN.
func openDB(t testing.TB, d idemsql.Dialect, o envOptions) *sql.DB {
	t.Helper()
	var (
		db  *sql.DB
		err error
	)
	switch d {
	case idemsql.SQLite:
		db, err = sql.Open("sqlite", idemsql.SQLiteDSN(filepath.Join(t.TempDir(), "idem.db")))
	case idemsql.Postgres:
		u := o.pgURL
		if u == "" {
			u = serverURL(t, envPostgres)
		}
		db, err = sql.Open("pgx", u)
		if err == nil && o.pgWrapped {
			var cfg *pgx.ConnConfig
			if cfg, err = pgx.ParseConfig(u); err == nil {
				db.Close()
				db = sql.OpenDB(wrappedConnector{stdlib.GetConnector(*cfg)})
			}
		}
	case idemsql.MySQL:
		cfg, perr := mysql.ParseDSN(serverURL(t, envMySQL))
		if perr != nil {
			t.Fatalf("%s: %v", envMySQL, perr)
		}
		if cfg.Params == nil {
			cfg.Params = map[string]string{}
		}
		for k, v := range o.mysqlParams {
			switch k {
			case "clientFoundRows":
				cfg.ClientFoundRows = v == "true"
			case "interpolateParams":
				cfg.InterpolateParams = v == "true"
			case "parseTime":
				cfg.ParseTime = v == "true"
			default:
				cfg.Params[k] = v
			}
		}
		db, err = sql.Open("mysql", cfg.FormatDSN())
	default:
		t.Fatalf("unknown dialect %q", d)
	}
	if err != nil {
		t.Fatalf("open %s: %v", d, err)
	}
	db.SetMaxOpenConns(50)
	if o.pgURL != "" {
		db.SetMaxOpenConns(8)
	}
	t.Cleanup(func() { db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("ping %s: %v", d, err)
	}
	return db
}

func randomName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// newEnv returns a fresh env for dialect d.
func newEnv(t testing.TB, d idemsql.Dialect, o envOptions) *env {
	t.Helper()
	db := openDB(t, d, o)
	e := &env{t: t, dialect: d, db: db, table: o.table}
	if e.table == "" {
		e.table = randomName("idem_t_")
	}
	e.effects = e.table + "_fx"
	var err error
	e.store, err = idemsql.New(db, d, &idemsql.Config{Table: e.table})
	if err != nil {
		t.Fatalf("idemsql.New: %v", err)
	}
	ctx := context.Background()
	t.Cleanup(func() {
		for _, tb := range []string{e.table, e.table + "_steps", e.table + "_runs", e.table + "_migrations", e.table + "_outbox", e.table + "_consumers", e.effects} {
			if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS "+tb); err != nil {
				t.Errorf("drop %s: %v", tb, err)
			}
		}
		if d == idemsql.Postgres {
			if _, err := db.ExecContext(ctx, "DROP FUNCTION IF EXISTS "+e.table+"_outbox_notify()"); err != nil {
				t.Errorf("drop the outbox notify function: %v", err)
			}
			if _, err := db.ExecContext(ctx, "DROP DOMAIN IF EXISTS "+e.table+"_outbox_id, "+e.table+"_outbox_str"); err != nil {
				t.Errorf("drop the outbox domains: %v", err)
			}
		}
	})
	var fx string
	switch d {
	case idemsql.Postgres:
		fx = `CREATE TABLE ` + e.effects + ` (id bigserial PRIMARY KEY, key text NOT NULL)`
	case idemsql.MySQL:
		fx = "CREATE TABLE " + e.effects + " (id BIGINT AUTO_INCREMENT PRIMARY KEY, `key` VARBINARY(255) NOT NULL, KEY (`key`)) ENGINE=InnoDB"
	default:
		fx = `CREATE TABLE ` + e.effects + ` (id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL)`
	}
	if _, err := db.ExecContext(ctx, fx); err != nil {
		t.Fatalf("create %s: %v", e.effects, err)
	}
	if !o.noMigrate {
		if err := e.store.Migrate(ctx); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
	}
	return e
}

// consumerIs is the condition on the processed table that selects the
// consumer named by the placeholder ?: on PostgreSQL (schema v2) by its
// key, elsewhere by name.
func (e *env) consumerIs() string {
	if e.dialect != idemsql.Postgres {
		return `consumer = ?`
	}
	return `consumer_key = (SELECT key FROM ` + e.table + `_consumers WHERE name = ?)`
}

// q rewrites ?-placeholders as $n on PostgreSQL.
func (e *env) q(query string) string {
	if e.dialect != idemsql.Postgres {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func (e *env) keyCol() string {
	if e.dialect == idemsql.MySQL {
		return "`key`"
	}
	return "key"
}

// writeEffect inserts an effect row with key in tx.
func (e *env) writeEffect(ctx context.Context, tx *sql.Tx, key string) error {
	_, err := tx.ExecContext(ctx, e.q(`INSERT INTO `+e.effects+` (`+e.keyCol()+`) VALUES (?)`), key)
	return err
}

// writeEffects inserts one effect row per key in tx, with one statement.
func (e *env) writeEffects(ctx context.Context, tx *sql.Tx, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	args := make([]any, len(keys))
	for i, k := range keys {
		args[i] = k
	}
	values := strings.TrimSuffix(strings.Repeat("(?), ", len(keys)), ", ")
	_, err := tx.ExecContext(ctx, e.q(`INSERT INTO `+e.effects+` (`+e.keyCol()+`) VALUES `+values), args...)
	return err
}

// countEffects counts the committed effect rows with key.
func (e *env) countEffects(ctx context.Context, key string) (int, error) {
	var n int
	err := e.db.QueryRowContext(ctx, e.q(`SELECT COUNT(*) FROM `+e.effects+` WHERE `+e.keyCol()+` = ?`), key).Scan(&n)
	return n, err
}

// countRecords counts the committed records of consumer.
func (e *env) countRecords(ctx context.Context, consumer string) (int, error) {
	var n int
	err := e.db.QueryRowContext(ctx, e.q(`SELECT COUNT(*) FROM `+e.table+` WHERE `+e.consumerIs()), consumer).Scan(&n)
	return n, err
}

// ageRecords moves the time of consumer's records with ids back by d.
func (e *env) ageRecords(ctx context.Context, consumer string, ids []string, d time.Duration) error {
	us := d.Microseconds()
	for part := range slices.Chunk(ids, 200) {
		in := strings.TrimSuffix(strings.Repeat("?, ", len(part)), ", ")
		var set string
		switch e.dialect {
		case idemsql.Postgres:
			set = `processed_at = processed_at - ? * interval '1 microsecond'`
		case idemsql.MySQL:
			set = `processed_at = processed_at - INTERVAL ? MICROSECOND`
		default:
			set = `processed_at = processed_at - ?`
		}
		args := []any{us, consumer}
		for _, id := range part {
			args = append(args, id)
		}
		if _, err := e.db.ExecContext(ctx, e.q(`UPDATE `+e.table+` SET `+set+` WHERE `+e.consumerIs()+` AND message_id IN (`+in+`)`), args...); err != nil {
			return err
		}
	}
	return nil
}

// consumer returns a Consumer named name over the env's store, without a
// purge loop, closed at the end of the test.
func (e *env) consumer(name string) *idem.Consumer[*sql.Tx] {
	e.t.Helper()
	c, err := idem.NewConsumer[*sql.Tx](e.store, idem.Config{Name: name, PurgeInterval: -1})
	if err != nil {
		e.t.Fatalf("NewConsumer: %v", err)
	}
	e.t.Cleanup(func() { c.Close() })
	return c
}

// effectHandler writes one effect row keyed by the message ID.
func (e *env) effectHandler(ctx context.Context, tx *sql.Tx, msg idem.Message) error {
	return e.writeEffect(ctx, tx, msg.ID)
}

func (e *env) wantEffects(key string, want int) {
	e.t.Helper()
	n, err := e.countEffects(context.Background(), key)
	if err != nil {
		e.t.Fatalf("countEffects(%q): %v", key, err)
	}
	if n != want {
		e.t.Errorf("effects with key %q = %d, want %d", key, n, want)
	}
}

func (e *env) wantRecords(consumer string, want int) {
	e.t.Helper()
	n, err := e.countRecords(context.Background(), consumer)
	if err != nil {
		e.t.Fatalf("countRecords(%q): %v", consumer, err)
	}
	if n != want {
		e.t.Errorf("records of %q = %d, want %d", consumer, n, want)
	}
}

// forEachDialect runs f as a parallel subtest per dialect.
func forEachDialect(t *testing.T, f func(t *testing.T, d idemsql.Dialect)) {
	for _, d := range dialects {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			f(t, d)
		})
	}
}

// shift moves every time recorded for consumer back by d: its records'
// processed_at, lease_expires_at and updated_at, and its runs
// (idemtest's Setup.Shift).
func (e *env) shift(ctx context.Context, consumer string, d time.Duration) error {
	minus := map[idemsql.Dialect]string{
		idemsql.Postgres: `%[1]s = %[1]s - ? * interval '1 microsecond'`,
		idemsql.MySQL:    `%[1]s = %[1]s - INTERVAL ? MICROSECOND`,
		idemsql.SQLite:   `%[1]s = %[1]s - ?`,
	}[e.dialect]
	us := d.Microseconds()
	for table, cols := range map[string][]string{
		e.table:           {"processed_at", "lease_expires_at", "updated_at"},
		e.table + "_runs": {"started_at", "ended_at"},
	} {
		var set []string
		args := []any{}
		for _, c := range cols {
			set = append(set, fmt.Sprintf(minus, c))
			args = append(args, us)
		}
		where := `consumer = ?`
		if table == e.table {
			where = e.consumerIs()
		}
		q := e.q(`UPDATE ` + table + ` SET ` + strings.Join(set, ", ") + ` WHERE ` + where)
		if _, err := e.db.ExecContext(ctx, q, append(args, consumer)...); err != nil {
			return err
		}
	}
	return nil
}

// purge deletes (or with p.DryRun counts) p.Consumer's completed and
// failed records written more than p.RetentionWindow ago by the test's
// clock, through one purge session of store, in batches of p.BatchSize,
// calling p.OnBatch: the store's primitives, without the core's
// running-time horizon (idemtest covers that).
func purge(ctx context.Context, store *idemsql.Store, p *idem.PurgeParams) (idem.PurgeResult, error) {
	res := idem.PurgeResult{Horizon: time.Now().Add(-p.RetentionWindow)}
	s, err := store.BeginPurge(ctx, &idemdriver.BeginPurgeParams{Consumer: p.Consumer})
	if err != nil {
		return res, err
	}
	defer s.Close(ctx)
	if p.DryRun {
		n, err := s.CountBefore(ctx, res.Horizon)
		if res.Deleted = n; n > 0 {
			res.Batches = 1
		}
		return res, err
	}
	for {
		n, err := s.DeleteBatch(ctx, &idemdriver.PurgeBatchParams{Horizon: res.Horizon, Limit: p.BatchSize})
		if err != nil {
			return res, err
		}
		if n > 0 {
			res.Deleted += n
			res.Batches++
			if p.OnBatch != nil {
				p.OnBatch(res.Deleted)
			}
		}
		if n < int64(p.BatchSize) {
			return res, nil
		}
	}
}
