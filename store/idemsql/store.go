package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/lastval"
	"github.com/idem-go/idem/internal/pgsql"
	"github.com/idem-go/idem/internal/sqlschema"
	"github.com/idem-go/idem/internal/sqlstore"
)

// maxClaimAttempts bounds how often one claim is re-run when a record that
// conflicted vanished before its fingerprint could be read (a purge deleted
// it in that instant). In practice the first attempt settles.
const maxClaimAttempts = sqlstore.MaxClaimAttempts

// Dialect is the SQL dialect of the database behind a *sql.DB: [Postgres],
// [MySQL] or [SQLite]. The store imports no driver; the caller opens the
// database with the driver of their choice and names its dialect.
type Dialect string

// The supported dialects.
const (
	// Postgres is PostgreSQL 14 or later (tested on 15), through a
	// database/sql driver such as github.com/jackc/pgx/v5/stdlib (tested).
	// The batch statements (batch claims, lease batches) send their arrays
	// as text literals, so no driver-specific array type is needed; with
	// pgx's stdlib, recognised by the type of db.Driver(), they send
	// native text[] and bytea[] parameters instead, as store/idempgxv5
	// does, which the client and the server encode and decode for less
	// CPU. A wrapper around pgx's driver (a tracing driver, say) is not
	// recognised and gets the literals.
	Postgres Dialect = "postgres"
	// MySQL is MariaDB (tested on 10.11) or MySQL 8.0 or later (the same
	// statements; not tested here), with InnoDB, through
	// github.com/go-sql-driver/mysql. The DSN's clientFoundRows and
	// parseTime settings make no difference (both values are tested);
	// interpolateParams=true saves one round trip per statement.
	MySQL Dialect = "mysql"
	// SQLite is SQLite 3.35 or later (for RETURNING), for example through
	// modernc.org/sqlite (pure Go). The DSN must set a busy timeout, WAL for
	// a file database, and BEGIN IMMEDIATE transactions: use [SQLiteDSN].
	SQLite Dialect = "sqlite"
)

// String returns the dialect name: "postgres", "mysql" or "sqlite".
func (d Dialect) String() string { return string(d) }

// Config configures a [Store]. The zero value (or a nil *Config) is valid.
type Config struct {
	// Table is the processed-messages table: an identifier or
	// schema.identifier of letters, digits and underscores, at most 48 bytes
	// each, never quoted (on MySQL the "schema" is a database). Migrate
	// creates it, the recovery points table Table + "_steps", the runs
	// table Table + "_runs", and the table that records the applied
	// migrations, Table + "_migrations". Defaults to idem_processed.
	Table string
}

// Store is an [idemdriver.TxStore] over database/sql for PostgreSQL,
// MariaDB/MySQL and SQLite. The transactions it hands to handlers are
// ordinary *sql.Tx values on the caller's *sql.DB; handlers write their
// side effects with them. It also implements [idemdriver.LeaseStore]
// (lease mode, for [idem.LeaseConsumer]; see the package documentation),
// [idemdriver.Retainer] for retention, and the optional
// [idemdriver.BatchClaimer], [idemdriver.Migrator] and
// [idemdriver.Inspector] (for operators: the idem command).
//
// A Store is safe for concurrent use. It owns no goroutine and nothing to
// close: the caller owns the *sql.DB.
type Store struct {
	db      *sql.DB
	dialect Dialect
	table   sqlschema.Table
	// pg is the PostgreSQL dialect's statements and logic, shared with
	// store/idempgxv5; q and lq are MySQL's or SQLite's.
	// (both shapes of the table: schema v1 and v2, and the one in use).
	pg *pgsql.Table
	q  queries
	lq leaseQueries
	// lockScope names the database file for SQLite's in-process purge
	// lock, so two Stores over one file share it.
	lockScope string
	// stmts are MySQL's and SQLite's hot statements, prepared once.
	stmts stmtCache
	// mysqlClaim is the last MySQL claim text built, by lock timeout.
	mysqlClaim lastval.Cache[time.Duration, string]
	// claimMode chooses PostgreSQL's claim statement (claimAdaptive;
	// tests force one), and pgClaimRead is set while the last claim of an
	// adaptive Store found a duplicate: the next runs ClaimRead.
	claimMode   uint8
	pgClaimRead atomic.Bool
	// returning is whether the MySQL server has INSERT ... RETURNING
	// (mysqlReturning), batchStatement whether SQLite runs the batch
	// claim's statement (sqliteBatchStatement): asked of the database by
	// the first batch that needs the answer, then kept for the Store's
	// life.
	returning, batchStatement capability
}

// capability is what a Store learned of its database server, once: unknown
// until set, then the value set first. Concurrent first callers may each
// ask the server; they get the same answer, and the first one set stays.
type capability struct {
	v atomic.Uint32 // 0: unknown; capNo or capYes
}

const (
	capNo  = 1
	capYes = 2
)

// get returns the value and whether it is known.
func (c *capability) get() (v, known bool) {
	switch c.v.Load() {
	case capYes:
		return true, true
	case capNo:
		return false, true
	}
	return false, false
}

// set records v unless a value is known already, and returns the value
// known afterwards.
func (c *capability) set(v bool) bool {
	n := uint32(capNo)
	if v {
		n = capYes
	}
	c.v.CompareAndSwap(0, n)
	return c.v.Load() == capYes
}

// Interface checks.
var (
	_ idemdriver.TxStore[*sql.Tx]      = (*Store)(nil)
	_ idemdriver.BatchClaimer[*sql.Tx] = (*Store)(nil)
	_ idemdriver.StepRecorder          = (*Store)(nil)
	_ idemdriver.Retainer              = (*Store)(nil)
	_ idemdriver.Migrator              = (*Store)(nil)
	_ idemdriver.Inspector             = (*Store)(nil)
)

// ErrTooManyConsumers is returned (wrapped) on PostgreSQL by a claim, an
// Acquire or a batch of a consumer new to a table of schema v2
// (migrations 014 and 015) that already holds 32,767 consumer names, the
// most its smallint keys allow; the message is not claimed. Names that
// have a key are not affected.
var ErrTooManyConsumers = pgsql.ErrTooManyConsumers

// New returns a Store over db for the given dialect. cfg may be nil.
//
// It returns an error matching [idemdriver.ErrInvalidConfig] when db is nil, the
// dialect is unknown or cfg.Table is not a valid table name. For SQLite it
// also checks the connection settings the store depends on (see
// [SQLiteSettingError], which matches idemdriver.ErrInvalidConfig too) and so
// needs the database to answer; for PostgreSQL and MySQL it does not touch
// the database. Call [Store.Migrate] (or `idem migrate`) to create the
// tables.
func New(db *sql.DB, dialect Dialect, cfg *Config) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: idemsql: nil *sql.DB", idemdriver.ErrInvalidConfig)
	}
	if cfg == nil {
		cfg = &Config{}
	}
	table, err := sqlschema.ParseTable(cfg.Table)
	if err != nil {
		return nil, fmt.Errorf("%w: idemsql: %w", idemdriver.ErrInvalidConfig, err)
	}
	s := &Store{db: db, dialect: dialect, table: table}
	switch dialect {
	case Postgres:
		s.pg = pgsql.NewTable(table.Qualified, nativeArrays(db))
	case MySQL:
		s.q = mysqlQueries(table.Qualified)
		s.lq = mysqlLeaseQueries(table.Qualified)
	case SQLite:
		s.q = sqliteQueries(table.Qualified)
		s.lq = sqliteLeaseQueries(table.Qualified)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if s.lockScope, err = checkSQLite(ctx, db); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("%w: idemsql: unknown dialect %q (want %q, %q or %q)",
			idemdriver.ErrInvalidConfig, string(dialect), Postgres, MySQL, SQLite)
	}
	return s, nil
}

// pgxStdlib is the package path of pgx's database/sql driver, whose
// *stdlib.Driver db.Driver() returns for a database opened with
// sql.Open("pgx", ...) or sql.OpenDB(stdlib.GetConnector(...)).
const pgxStdlib = "github.com/jackc/pgx/v5/stdlib"

// nativeArrays reports whether db's driver is pgx's stdlib, found by the
// package of its type (the store imports no driver). That driver passes
// every argument through to pgx (its CheckNamedValue accepts all), which
// encodes []string as text[] and [][]byte as bytea[]: the batch
// statements then send native arrays (pgsql.Queries.NativeArrays), as
// store/idempgxv5 does, instead of array literals in strings with hex
// fingerprints that the client builds and the server parses and decodes.
// Any other driver gets the literals, which every driver can send.
func nativeArrays(db *sql.DB) bool {
	t := reflect.TypeOf(db.Driver())
	if t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t != nil && t.PkgPath() == pgxStdlib
}

// Dialect returns the store's dialect.
func (s *Store) Dialect() Dialect { return s.dialect }

// Table returns the processed-messages table name, as written in SQL.
func (s *Store) Table() string { return s.table.Qualified }

// Begin implements [idemdriver.TxStore]: db.BeginTx with default options, so the
// isolation level is the database's default (READ COMMITTED on
// PostgreSQL, REPEATABLE READ on InnoDB; the claims are correct under
// either) and, on SQLite, the transaction starts as the DSN says
// (BEGIN IMMEDIATE with [SQLiteDSN]). As with any *sql.Tx, cancelling ctx
// rolls the transaction back.
//
// On MySQL and SQLite it first prepares, once, the claim statements that
// earlier claims ran from their text (see ClaimTx), outside the
// transaction: a pool of one connection has none to spare inside it.
func (s *Store) Begin(ctx context.Context) (*sql.Tx, error) {
	if s.dialect != Postgres {
		s.stmts.prepareWanted(ctx, s.db)
	}
	return s.db.BeginTx(ctx, nil)
}

// Commit implements [idemdriver.TxStore]: tx.Commit. An error means the claims
// did not commit, or that the outcome is unknown (a connection lost during
// COMMIT).
func (s *Store) Commit(ctx context.Context, tx *sql.Tx) error {
	return tx.Commit()
}

// Rollback implements [idemdriver.TxStore]: tx.Rollback. Rolling back a
// transaction that already ended (after Commit, even a failed one, or after
// its context was cancelled) returns nil: sql.ErrTxDone is not an error here.
func (s *Store) Rollback(ctx context.Context, tx *sql.Tx) error {
	if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return err
	}
	return nil
}

// ClaimTx implements [idemdriver.TxStore]: it inserts the record of p inside tx
// and reports whether this transaction claimed it. A record that exists, or
// that a concurrent transaction is inserting, makes the insert wait for that
// transaction (the primary key does this) and then gives Claimed=false with
// the stored fingerprint; if that transaction rolled back, the claim is ours.
// A duplicate never raises an error inside the database, so tx stays usable.
//
//   - PostgreSQL: the statements of store/idempgxv5 (internal/pgsql):
//     INSERT ... ON CONFLICT DO NOTHING RETURNING, run with ExecContext
//     (rows affected is 1 when it inserted the record); on a conflict a
//     second statement, with a READ COMMITTED snapshot of its own, reads
//     the stored fingerprint and state, so a record committed by a
//     transaction the claim waited for is seen too. After a claim that
//     found a duplicate, the Store's next claims run the claim that also
//     reads the record in the same statement (pgsql.Queries.ClaimRead,
//     a round trip less for a duplicate, some server CPU more for a new
//     message), until one inserts; a record that statement's snapshot
//     does not show (committed by a transaction it waited for) is read
//     by the second statement as above. The results are the same.
//   - MySQL: INSERT ... ON DUPLICATE KEY UPDATE whose update clause, which
//     runs only for a duplicate, leaves the row as it is and sets
//     LAST_INSERT_ID: the insert ID the server reports tells a duplicate
//     from a new row whatever rows affected says (clientFoundRows=true makes
//     rows affected count a duplicate as 1). The fingerprint is read with a
//     locking read (LOCK IN SHARE MODE), which sees the latest committed
//     row under REPEATABLE READ. See the package documentation.
//   - SQLite: INSERT ... ON CONFLICT DO NOTHING judged by rows affected,
//     then a SELECT; writers are serialised, so nothing is in flight.
//
// On MySQL and SQLite the claim and the read run as statements prepared
// once per connection (database/sql's *sql.Stmt, run in tx with
// Tx.StmtContext): SQLite does not parse them again, and MySQL sends
// one command per statement instead of prepare, execute and close. A
// text's first run, before [Store.Begin] has prepared it, goes as text.
//
// p is checked before any statement runs (idemdriver.ValidateClaimParams),
// so tx stays usable: an invalid consumer name or message ID, or a
// fingerprint outside 1 to idemdriver.MaxFingerprintLength bytes, is an
// error matching idemdriver.ErrInvalidConsumerName, ErrInvalidMessageID,
// ErrMissingMessageID or ErrInvalidPayload. Other errors are the driver's,
// unwrapped (the Consumer wraps them with idem.ErrStore). With a
// REPEATABLE READ or SERIALIZABLE transaction on PostgreSQL, a conflict
// with a row committed after the snapshot is a serialization failure
// (SQLSTATE 40001), which is retryable.
func (s *Store) ClaimTx(ctx context.Context, tx *sql.Tx, p *idemdriver.ClaimParams) (idemdriver.ClaimResult, error) {
	if err := idemdriver.ValidateClaimParams(p); err != nil {
		return idemdriver.ClaimResult{}, err
	}
	if s.dialect == Postgres {
		return s.claimPostgres(ctx, tx, p)
	}
	for range maxClaimAttempts {
		var (
			res   idemdriver.ClaimResult
			found bool
			err   error
		)
		if s.dialect == MySQL {
			res, found, err = s.claimMySQL(ctx, s.prepared(tx), p)
		} else {
			res, found, err = s.claimSQLite(ctx, s.prepared(tx), p)
		}
		if err != nil || found {
			return res, err
		}
		// The conflicting record vanished before we could read it (a purge
		// deleted it): claim again.
	}
	return idemdriver.ClaimResult{}, sqlstore.ErrUnsettled("claim", p.Consumer)
}

// ClaimBatchTx implements [idemdriver.BatchClaimer]: it claims every
// message of p inside tx with one INSERT (split into several only past the
// dialect's placeholder limit) and returns one result per message, in the
// order given. Rows are inserted in byte order of their IDs, so two
// batches that overlap take their row locks in the same order and do not
// deadlock.
//
//   - PostgreSQL: the statement of store/idempgxv5 (internal/pgsql):
//     INSERT ... SELECT FROM unnest(ids, fingerprints) ON CONFLICT DO
//     NOTHING RETURNING message_id, which also reads the fingerprints of
//     the records committed before it began and returns one row when every
//     message was new; the records committed by transactions it waited for
//     are read by one more SELECT.
//   - SQLite: an INSERT ... SELECT of a VALUES list ... ON CONFLICT DO
//     NOTHING RETURNING message_id, then, only when some rows were not
//     returned, one SELECT of their fingerprints.
//   - MariaDB 10.5 and later: a multi-row INSERT IGNORE ... RETURNING
//     message_id, then, only when some rows were not returned, one locking
//     SELECT of their fingerprints.
//   - MySQL (a server without RETURNING): a multi-row INSERT ... ON
//     DUPLICATE KEY UPDATE per 64 messages that reports which rows were
//     duplicates as a bitmask (see the package documentation, "MySQL batch
//     claims"), then one locking SELECT of the duplicates' fingerprints.
//
// p is checked before any statement runs
// (idemdriver.ValidateClaimBatchParams): an empty batch or a message ID
// given twice is an error matching idemdriver.ErrInvalidConfig, invalid
// names as in ClaimTx. Other errors are the driver's.
func (s *Store) ClaimBatchTx(ctx context.Context, tx *sql.Tx, p *idemdriver.ClaimBatchParams) ([]idemdriver.ClaimResult, error) {
	if err := idemdriver.ValidateClaimBatchParams(p); err != nil {
		return nil, err
	}
	if s.dialect == Postgres {
		return pgsql.InTx(ctx, s.pg, querier{tx}, p.Consumer, func(q *pgsql.Queries) ([]idemdriver.ClaimResult, error) {
			return q.ClaimBatchTx(ctx, querier{tx}, p)
		})
	}
	var (
		msgs = sqlstore.Sorted(p)
		res  []idemdriver.ClaimResult
		err  error
	)
	if s.dialect == MySQL {
		res, err = s.claimBatchMySQL(ctx, tx, p.Consumer, msgs, p.LockTimeout)
	} else {
		res, err = s.claimBatchReturning(ctx, tx, p.Consumer, msgs, "")
	}
	if err != nil {
		return nil, err
	}
	return inOrder(p, msgs, res), nil
}
