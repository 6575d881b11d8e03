package idemsql

import (
	"context"
	"database/sql"
	"strconv"
	"sync"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/pgsql"
	"github.com/idem-go/idem/internal/sqlstore"
)

// Interface checks.
var (
	_ idemdriver.OutboxTx[*sql.Tx] = (*Store)(nil)
	_ idemdriver.OutboxStore       = (*Store)(nil)
	_ idemdriver.OutboxSentClaimer = (*Store)(nil)
)

// outboxes caches the outbox statements per dialect and table.
var outboxes sync.Map // dialect + " " + table -> *sqlstore.Outbox

func (s *Store) outbox() *sqlstore.Outbox {
	key := string(s.dialect) + " " + s.table.Qualified
	if o, ok := outboxes.Load(key); ok {
		return o.(*sqlstore.Outbox)
	}
	t := s.table.Qualified + "_outbox"
	var o *sqlstore.Outbox
	switch s.dialect {
	case Postgres:
		o = pgsql.Outbox(t)
	case MySQL:
		o = sqlstore.NewOutbox(sqlstore.OutboxDialect{
			Table:             t,
			Param:             func(int, string) string { return "?" },
			Now:               `UTC_TIMESTAMP(6)`,
			Plus:              func(p string) string { return `(UTC_TIMESTAMP(6) + INTERVAL ` + p + ` MICROSECOND)` },
			Minus:             func(p string) string { return `(UTC_TIMESTAMP(6) - INTERVAL ` + p + ` MICROSECOND)` },
			Micros:            mysqlMicros,
			HeadersOut:        `headers`,
			IgnoreDuplicate:   ` ON DUPLICATE KEY UPDATE id = id`,
			SkipLocked:        ` FOR UPDATE SKIP LOCKED`,
			NoUpdateReturning: true,
			SeqsJoin: `JSON_TABLE(?, '$[*]' COLUMNS (seq BIGINT PATH '$')) AS s
	STRAIGHT_JOIN ` + t + ` AS o ON o.seq = s.seq`,
			// Two relay workers deadlocked on MariaDB 10.11 (error 1213)
			// when the table held little more than the rows they ended:
			// InnoDB ran MarkSent's DELETE ... WHERE seq IN (...) AND id =
			// CASE seq ... as a scan of the whole table, which took an X
			// record lock (not gap; READ COMMITTED) on the PRIMARY index
			// record of each row it read, so one worker's DELETE, holding
			// its own deleted rows, waited for a row the other worker had
			// deleted in the same kind of transaction, whose claim (SELECT
			// ... FOR UPDATE SKIP LOCKED) waited for an X record lock on
			// a PRIMARY record the first had deleted. The join reads
			// only the rows named, in seq order: a worker's DELETE locks
			// no row but its own, which no other worker's statement
			// writes, so it never waits on another worker.
			MarkFailedJSON: `UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id VARCHAR(510) PATH '$[0]', attempt BIGINT PATH '$[1]',
	permanent INT PATH '$[2]', retry BIGINT PATH '$[3]', err LONGTEXT PATH '$[4]', seq BIGINT PATH '$[5]')) AS f
	STRAIGHT_JOIN ` + t + ` AS o ON o.id = UNHEX(f.id)
SET o.lease_until = NULL, o.last_error = f.err,
	o.failed_at = IF(f.permanent = 1, UTC_TIMESTAMP(6), o.failed_at),
	o.available_at = IF(f.permanent = 1, o.available_at, UTC_TIMESTAMP(6) + INTERVAL f.retry MICROSECOND)
WHERE o.attempts = f.attempt AND (f.seq = 0 OR o.seq = f.seq) AND o.sent_at IS NULL`,
			SentJoin: `JSON_TABLE(?, '$[*]' COLUMNS (seq BIGINT PATH '$[0]', id VARCHAR(510) PATH '$[1]')) AS s
	STRAIGHT_JOIN ` + t + ` AS o ON o.seq = s.seq AND o.id = UNHEX(s.id)`,
		})
	default:
		o = sqlstore.NewOutbox(sqlstore.OutboxDialect{
			Table:           t,
			Param:           func(i int, _ string) string { return "?" + strconv.Itoa(i) },
			Now:             sqliteNow,
			Plus:            func(p string) string { return `(` + sqliteNow + ` + ` + p + `)` },
			Minus:           func(p string) string { return `(` + sqliteNow + ` - ` + p + `)` },
			Micros:          func(x string) string { return x },
			HeadersOut:      `headers`,
			IgnoreDuplicate: ` ON CONFLICT (id) DO NOTHING`,
		})
	}
	got, _ := outboxes.LoadOrStore(key, o)
	return got.(*sqlstore.Outbox)
}

// EmitTx implements [idemdriver.OutboxTx]: one multi-row INSERT into the
// outbox table (Table + "_outbox") in tx; a row whose id exists is left as
// it is (ON CONFLICT DO NOTHING; MySQL: ON DUPLICATE KEY UPDATE id = id).
// p is checked first (idemdriver.ValidateEmitParams), so tx stays usable
// on invalid input (errors match idemdriver.ErrInvalidOutgoing or
// ErrInvalidConsumerName). On PostgreSQL the table's trigger notifies
// relays listening through store/idempgxv5 when tx commits, unless
// p.RelayWoken: the caller then wakes a relay of its own process itself,
// and the INSERT (an INSERT ... SELECT that sets idem.outbox_quiet for the
// transaction before writing its rows) keeps the trigger quiet, so the
// commit queues no notification, which PostgreSQL sends holding a
// server-wide lock through the commit's flush. Relays of other processes
// find the rows at their next poll; rows a later EmitTx without
// RelayWoken writes in the same transaction notify nobody either, and are
// sent by the woken relay, which claims every pending row. MySQL and
// SQLite notify nobody, and ignore RelayWoken.
func (s *Store) EmitTx(ctx context.Context, tx *sql.Tx, p *idemdriver.EmitParams) error {
	if s.dialect != Postgres || !p.RelayWoken {
		return s.outbox().Emit(ctx, querier{tx}, p)
	}
	q, args, err := s.outbox().EmitStatementQuiet(p)
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, q, args...)
	return err
}

// ClaimOutgoing implements [idemdriver.OutboxStore]. PostgreSQL: one
// UPDATE ... RETURNING whose row selection is FOR UPDATE SKIP LOCKED.
// MySQL (MariaDB 10.6 or later, MySQL 8.0): a READ COMMITTED transaction
// of SELECT ... FOR UPDATE SKIP LOCKED and an UPDATE of the rows it
// locked. SQLite: one UPDATE ... RETURNING; writers are serialised, so
// nothing is skipped and the lease alone keeps other relays off the rows.
// Errors: idemdriver.ErrInvalidConfig for p out of range, else the
// driver's.
func (s *Store) ClaimOutgoing(ctx context.Context, p *idemdriver.ClaimOutgoingParams) ([]idemdriver.OutgoingRecord, error) {
	return s.outbox().Claim(ctx, querier{s.db}, s.beginReadCommitted, p)
}

func (s *Store) beginReadCommitted(ctx context.Context) (sqlstore.Tx, error) {
	return s.beginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
}

// beginDefault begins a transaction with db's default options (SQLite:
// as the DSN says).
func (s *Store) beginDefault(ctx context.Context) (sqlstore.Tx, error) { return s.beginTx(ctx, nil) }

func (s *Store) beginTx(ctx context.Context, opts *sql.TxOptions) (sqlstore.Tx, error) {
	tx, err := s.db.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return sqlTx{querier{tx}, tx}, nil
}

// sqlTx is a *sql.Tx as an sqlstore.Tx.
type sqlTx struct {
	querier
	tx *sql.Tx
}

func (t sqlTx) Commit(context.Context) error   { return t.tx.Commit() }
func (t sqlTx) Rollback(context.Context) error { return t.tx.Rollback() }

// MarkSent implements [idemdriver.OutboxStore]: one DELETE per 500 IDs
// of p (id IN (...)); with p.Keep, one UPDATE per 500 IDs that marks them
// sent instead. On MySQL with p.Seqs (as the relay calls it), one DELETE
// (or UPDATE) of every row, joined to a JSON array of the rows' seqs and
// IDs in seq order, which locks no other row.
func (s *Store) MarkSent(ctx context.Context, p *idemdriver.MarkSentParams) error {
	return s.outbox().MarkSent(ctx, querier{s.db}, p)
}

// MarkSentClaim implements [idemdriver.OutboxSentClaimer]: MarkSent's
// statements and ClaimOutgoing's in one transaction, committed once where
// the two calls commit once each (each commit a flush of the log on a
// durable server): PostgreSQL: BEGIN, the DELETE (with sent.Keep, the
// UPDATE), the claim's UPDATE ... RETURNING, COMMIT; MySQL: the same in
// the READ COMMITTED transaction of the claim's SELECT ... FOR UPDATE
// SKIP LOCKED and UPDATE; SQLite: the DELETE and the claim's UPDATE ...
// RETURNING in one transaction (begun as the DSN says: BEGIN IMMEDIATE
// with [SQLiteDSN]). The claim sees the ended rows gone. With no sent
// row it is ClaimOutgoing. Errors: idemdriver.ErrInvalidConfig (or
// ErrInvalidOutgoing) for invalid parameters, before any statement runs,
// else the driver's; on an error nothing committed, unless the commit's
// outcome is unknown.
func (s *Store) MarkSentClaim(ctx context.Context, sent *idemdriver.MarkSentParams, claim *idemdriver.ClaimOutgoingParams) ([]idemdriver.OutgoingRecord, error) {
	begin := s.beginReadCommitted
	if s.dialect == SQLite {
		begin = s.beginDefault
	}
	return s.outbox().MarkSentClaim(ctx, querier{s.db}, begin, sent, claim)
}

// MarkFailed implements [idemdriver.OutboxStore]: one UPDATE per 100
// rows of p, each column a CASE on the row's ID; on MySQL one UPDATE of
// every row, joined to a JSON array of the rows by ID, which locks no
// other row. p is checked with idemdriver.ValidateMarkFailedParams.
func (s *Store) MarkFailed(ctx context.Context, p *idemdriver.MarkFailedParams) error {
	return s.outbox().MarkFailed(ctx, querier{s.db}, p)
}

// PurgeOutbox implements [idemdriver.OutboxStore]. PostgreSQL: one
// DELETE of the rows its subquery selects FOR UPDATE SKIP LOCKED. MySQL:
// a READ COMMITTED transaction of SELECT ... FOR UPDATE SKIP LOCKED and a
// DELETE of the rows it locked. So purges of relays side by side take
// disjoint rows and never wait for each other. SQLite: one DELETE;
// writers are serialised. p is checked with
// idemdriver.ValidatePurgeOutboxParams.
func (s *Store) PurgeOutbox(ctx context.Context, p *idemdriver.PurgeOutboxParams) (int64, error) {
	return s.outbox().Purge(ctx, querier{s.db}, s.beginReadCommitted, p)
}

// OutboxStats implements [idemdriver.OutboxStore].
func (s *Store) OutboxStats(ctx context.Context) (idemdriver.OutboxStats, error) {
	return s.outbox().Stats(ctx, querier{s.db})
}
