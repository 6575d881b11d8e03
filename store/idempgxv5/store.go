package idempgxv5

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/pgsql"
	"github.com/idem-go/idem/internal/sqlschema"
	"github.com/idem-go/idem/internal/sqlstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Config configures a [Store]. The zero value (or a nil *Config) is valid.
type Config struct {
	// Table is the processed-messages table: an identifier or
	// schema.identifier of letters, digits and underscores, at most 48 bytes
	// each, never quoted. Migrate creates it, the recovery points table
	// Table + "_steps", the runs table Table + "_runs", and the table that
	// records the applied migrations, Table + "_migrations". Defaults to
	// "idem_processed".
	Table string
	// ListenConfig, if set, is where WatchOutgoing (the outbox relay's
	// wake-up) opens its LISTEN connection, instead of taking one from the
	// pool. Behind a pooler in transaction mode (PgBouncer with
	// pool_mode=transaction) LISTEN on a pooled connection never hears a
	// notification, since the server connection that listens goes back to
	// the pooler's pool: point ListenConfig at PostgreSQL itself. Without
	// it a relay behind such a pooler still sends everything, by polling
	// (idem.RelayConfig's MaxPoll bounds how late). The config is copied
	// at New.
	ListenConfig *pgx.ConnConfig
	// Partitions, if set, selects the partitioned layout of the
	// processed-messages table: range-partitioned by processed_at in
	// buckets, purged by dropping whole partitions (see [Partitions]).
	// Nil keeps the default layout: one table whose primary key is
	// (consumer, message_id). The config is copied at New.
	Partitions *Partitions
}

// Store is an [idemdriver.TxStore] for PostgreSQL on pgx v5. The
// transactions it hands to handlers are pgx's own transactions on
// connections of the Store's pool (*pgxpool.Tx from Begin; from
// BeginClaim, pgx's transaction on a connection BeginClaim acquired, which
// its Commit or Rollback gives back). It also implements
// [idemdriver.LeaseStore] for [idem.LeaseConsumer] (lease mode, on the same
// table; see the package doc), [idemdriver.Retainer] for retention, and
// the optional [idemdriver.BatchClaimer], [idemdriver.BeginClaimer] and
// [idemdriver.BeginBatchClaimer] (begin and claim in one round trip), [idemdriver.Migrator] and
// [idemdriver.Inspector].
//
// A handler uses the transaction it is given for its writes and leaves
// ending it to the Consumer: a handler that commits or rolls it back
// itself makes the Consumer's Commit fail with pgx.ErrTxClosed.
//
// A Store is safe for concurrent use. It owns no goroutine and nothing to
// close: the caller owns the pool.
type Store struct {
	pool  *pgxpool.Pool
	table sqlschema.Table
	// tab is the default layout's statements in both shapes (schema v1
	// and v2) and the shape in use.
	tab    *pgsql.Table
	listen *pgx.ConnConfig
	// part is the partitioned layout's state; nil for the default layout.
	part *partitioned
	// own holds the open transactions this Store began (Begin,
	// BeginClaimBatch; a BeginClaim transaction holds its own state:
	// poolTx.own), each mapped to whether it emitted outbox rows: those
	// are quiet, and Commit notifies relays after they commit (see
	// EmitTx), except for rows whose caller wakes a relay itself
	// (relayWoken{}).
	own sync.Map // pgx.Tx -> bool or relayWoken{}
	// wakeWanted and waking coalesce the notifications of wakeRelays.
	wakeWanted, waking atomic.Bool
	// cachesStatements is set when the pool's connections prepare each
	// statement once (pgx's default mode); see MarkFailed.
	cachesStatements bool
}

// Interface checks.
var (
	_ idemdriver.TxStore[pgx.Tx]           = (*Store)(nil)
	_ idemdriver.BatchClaimer[pgx.Tx]      = (*Store)(nil)
	_ idemdriver.BeginClaimer[pgx.Tx]      = (*Store)(nil)
	_ idemdriver.BeginBatchClaimer[pgx.Tx] = (*Store)(nil)
	_ idemdriver.StepRecorder              = (*Store)(nil)
	_ idemdriver.Retainer                  = (*Store)(nil)
	_ idemdriver.Migrator                  = (*Store)(nil)
	_ idemdriver.Inspector                 = (*Store)(nil)
)

// New returns a Store on pool. cfg may be nil. It returns an error matching
// [idemdriver.ErrInvalidConfig] when pool is nil or cfg.Table is not a
// valid table name. New does not touch the database; call [Store.Migrate]
// (or `idem migrate`) to create the tables.
func New(pool *pgxpool.Pool, cfg *Config) (*Store, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: idempgxv5: nil pool", idemdriver.ErrInvalidConfig)
	}
	if cfg == nil {
		cfg = &Config{}
	}
	table, err := sqlschema.ParseTable(cfg.Table)
	if err != nil {
		return nil, fmt.Errorf("%w: idempgxv5: %w", idemdriver.ErrInvalidConfig, err)
	}
	// pgx encodes []string and [][]byte as arrays: NativeArrays.
	st := &Store{pool: pool, table: table, tab: pgsql.NewTable(table.Qualified, true),
		cachesStatements: pool.Config().ConnConfig.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement}
	if cfg.ListenConfig != nil {
		st.listen = cfg.ListenConfig.Copy()
	}
	if cfg.Partitions != nil {
		if st.part, err = newPartitioned(table.Qualified, cfg.Partitions); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// Table returns the processed-messages table name, as written in SQL.
func (s *Store) Table() string { return s.table.Qualified }

// Begin implements [idemdriver.TxStore]: it begins a transaction on a
// connection acquired from the pool (pgxpool.Pool.Begin). The connection
// goes back to the pool at Commit or Rollback. End it with [Store.Commit]
// or [Store.Rollback] (the core does), not with tx's own methods: the
// Store tracks the transactions it began until then, to wake outbox
// relays after a commit that emitted.
func (s *Store) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := s.pool.Begin(ctx)
	if err == nil {
		s.own.Store(tx, false)
	}
	return tx, err
}

// BeginClaim implements [idemdriver.BeginClaimer]: it acquires a
// connection, and sends BEGIN and the claim of p as one pipelined
// pgx.Batch (pgx's Batch.BeginTx), so that beginning and claiming cost one
// network round trip. A new message's result is that of [Store.Begin]
// followed by [Store.ClaimTx]: the transaction is open, and the caller
// commits or rolls it back; it is pgx's own transaction on the acquired
// connection, which goes back to the pool at Commit or Rollback.
//
// A duplicate (the claim conflicted) costs one round trip more: the read
// of the stored fingerprint and state and a ROLLBACK, pipelined. The
// claim was the transaction's first statement and wrote nothing, so the
// Store ends the transaction itself: the result has Ended set, the
// transaction returned is nil, and the connection is back in the pool.
// When the record vanished before it could be read (a purge deleted it),
// BeginClaim begins again on the same connection and claims once more.
//
// With p.CallTimeout set (the Consumer sets it: see [Store.TimesCalls]),
// the acquisition and the statements are bounded by a deadline on the
// connection instead of by ctx alone.
//
// p is checked first (idemdriver.ValidateClaimParams), before any
// connection is acquired. On the partitioned layout the batch is BEGIN,
// the wait for the ID's advisory lock and the claim, still one round
// trip, whose claim also returns the stored fingerprint; a duplicate's
// transaction is left open (Ended false) for the caller to roll back.
// When no partition covers now(), the partitions are created
// (EnsurePartitions) and the claim is made once more. On error no
// transaction is left open: the transaction is rolled back (with a context
// detached from ctx) and the connection goes back to the pool, or is
// closed if its state is unknown.
func (s *Store) BeginClaim(ctx context.Context, p *idemdriver.ClaimParams) (pgx.Tx, idemdriver.ClaimResult, error) {
	if err := idemdriver.ValidateClaimParams(p); err != nil {
		return nil, idemdriver.ClaimResult{}, err
	}
	if s.part != nil {
		tx, res, err := s.beginClaimPart(ctx, p)
		if errors.Is(err, ErrNoPartition) {
			if err = s.EnsurePartitions(ctx); err == nil {
				tx, res, err = s.beginClaimPart(ctx, p)
			}
		}
		return tx, res, err
	}
	var (
		c   *pgxpool.Conn
		err error
	)
	d := p.CallTimeout
	if d > 0 {
		c, err = s.acquireBy(ctx, time.Now().Add(d), d)
	} else {
		c, err = s.pool.Acquire(ctx)
	}
	if err != nil {
		return nil, idemdriver.ClaimResult{}, err
	}
	tx, res, err := s.beginClaimOn(ctx, c, p)
	if d > 0 {
		setDeadline(c.Conn(), time.Time{})
	}
	if tx != nil {
		ptx := &poolTx{Tx: tx, c: c, d: d, own: false}
		return ptx, res, nil
	}
	c.Release()
	return nil, res, timedCallErr(ctx, d, err)
}

// beginClaimOn is BeginClaim on the default layout, on connection c: it
// returns the open transaction of a new message, or the ended one (nil)
// of a duplicate or an error; c is the caller's to give back.
//
// When the claim fails because the table's shape changed under the
// Store (migration 015 ran: pgsql.ShapeChanged), the shape is found
// again and the claim made once more, in a new transaction.
func (s *Store) beginClaimOn(ctx context.Context, c *pgxpool.Conn, p *idemdriver.ClaimParams) (pgx.Tx, idemdriver.ClaimResult, error) {
	q := s.tab.Cached(p.Consumer) // no boxed querier on the hot path
	if q == nil {
		var err error
		if q, err = s.tab.Queries(ctx, querier{c}, p.Consumer, true); err != nil {
			return nil, idemdriver.ClaimResult{}, err
		}
	}
	cb := &claimBatch{}
	q.AppendClaimArgs(cb.args[:0], p)
	reshaped := false
	for range sqlstore.MaxClaimAttempts {
		tx, inserted, err := cb.claim(ctx, c, q.Claim)
		if err == nil && inserted {
			return tx, sqlstore.Claimed, nil
		}
		var (
			res   idemdriver.ClaimResult
			found bool
		)
		if err == nil {
			if afterConflict != nil {
				afterConflict()
			}
			res, found, err = cb.readAndEnd(ctx, tx, q.Record)
		}
		if err != nil {
			abort(ctx, tx)
			if !reshaped && pgsql.ShapeChanged(err) {
				reshaped = true
				s.tab.Reset()
				if q, err = s.tab.Queries(ctx, querier{c}, p.Consumer, true); err == nil {
					q.AppendClaimArgs(cb.args[:0], p) // the consumer parameter is the shape's
					continue
				}
			}
			return nil, idemdriver.ClaimResult{}, pgsql.WrapLockTimeout(err)
		}
		if found {
			res.Ended = true
			return nil, res, nil
		}
		// The record vanished (a purge deleted it) and the transaction
		// has ended: begin again and claim once more.
	}
	return nil, idemdriver.ClaimResult{}, sqlstore.ErrUnsettled("claim", p.Consumer)
}

// afterConflict, when set (by tests), runs in BeginClaim between a claim
// that conflicted and the read of the record.
var afterConflict func()

// claimBatch is what BeginClaim sends and scans, in one allocation: the
// batch of BEGIN and the claim, or of a duplicate's read and ROLLBACK,
// its queue, the claim's arguments and the rows' destinations.
type claimBatch struct {
	b       pgx.Batch
	queued  [2]*pgx.QueuedQuery
	qq      [2]pgx.QueuedQuery
	args    [4]any
	claimed bool
	dest    [1]any
	// The record a duplicate read: its fingerprint and state (nil when
	// NULL, as on a transactional record), and their destinations.
	fp    []byte
	state *int16
	rdest [2]any
}

// queue queues query with args on cb.b as the batch's query n, in cb's
// own QueuedQuery rather than a new one.
func (cb *claimBatch) queue(n int, query string, args []any) {
	cb.qq[n] = pgx.QueuedQuery{SQL: query, Arguments: args}
	cb.b.QueuedQueries = append(cb.b.QueuedQueries, &cb.qq[n])
}

// claim sends BEGIN and the claim statement (args cb.args) on c in one
// round trip and reports whether the claim inserted the record. tx is the
// transaction begun, to be rolled back (abort) on error.
func (cb *claimBatch) claim(ctx context.Context, c *pgxpool.Conn, claim string) (tx pgx.Tx, inserted bool, err error) {
	cb.b = pgx.Batch{QueuedQueries: cb.queued[:0]}
	cb.b.BeginTx(pgx.TxOptions{})
	cb.queue(0, claim, cb.args[:])
	br := c.SendBatch(ctx, &cb.b)
	tx = br.Tx()
	if _, err = br.Exec(); err == nil { // BEGIN
		cb.dest[0] = &cb.claimed
		inserted, err = pgsql.Inserted(row{br.QueryRow()}.Scan(cb.dest[:]...))
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tx, inserted, err
}

// readAndEnd sends the read of the record (statement record, on the
// consumer and message ID of cb.args) and ROLLBACK in tx, in one round
// trip: found is false when the record vanished. On success the
// transaction has ended, whether or not the record was found; tx, which
// pgx does not know ended, must not be used again.
func (cb *claimBatch) readAndEnd(ctx context.Context, tx pgx.Tx, record string) (res idemdriver.ClaimResult, found bool, err error) {
	cb.b = pgx.Batch{QueuedQueries: cb.queued[:0]}
	cb.queue(0, record, cb.args[:2])
	cb.queue(1, "ROLLBACK", nil)
	br := tx.SendBatch(ctx, &cb.b)
	cb.fp, cb.state = nil, nil
	cb.rdest = [2]any{&cb.fp, &cb.state}
	switch err = (row{br.QueryRow()}).Scan(cb.rdest[:]...); {
	case err == nil:
		found = true
		state := sql.NullInt64{Valid: cb.state != nil}
		if state.Valid {
			state.Int64 = int64(*cb.state)
		}
		res = sqlstore.Existing(cb.fp, state)
	case errors.Is(err, sqlstore.ErrNoRows):
		err = nil // the record vanished
	}
	if err == nil {
		_, err = br.Exec() // ROLLBACK
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err == nil && tx.Conn().PgConn().TxStatus() != 'I' {
		err = errors.New("idempgxv5: the transaction did not end at ROLLBACK")
	}
	return res, found, err
}

// ClaimTx implements [idemdriver.TxStore]: one INSERT ... ON CONFLICT DO
// NOTHING RETURNING in tx, and, when it conflicted, one SELECT of the
// stored fingerprint and state. tx may be any pgx transaction, including one the
// caller began itself (Consumer.ProcessTx): p is checked before any
// statement runs (idemdriver.ValidateClaimParams: an invalid name, ID or
// fingerprint is an error matching idemdriver.ErrInvalidConsumerName,
// ErrInvalidMessageID, ErrMissingMessageID or ErrInvalidPayload), and a
// duplicate raises no error inside the database, so tx stays usable.
//
// Under REPEATABLE READ or SERIALIZABLE, a conflict with a row committed
// after tx's snapshot was taken is a serialization failure (SQLSTATE 40001)
// from PostgreSQL; retry the whole transaction.
//
// On the partitioned layout (Config.Partitions) the claim is two
// statements: the wait for the ID's advisory lock, then the look-up in
// every partition and the insert. tx must be READ COMMITTED (otherwise an
// error matching ErrIsolation); a claim when no partition covers now()
// fails with an error matching ErrNoPartition, and tx is then aborted.
func (s *Store) ClaimTx(ctx context.Context, tx pgx.Tx, p *idemdriver.ClaimParams) (idemdriver.ClaimResult, error) {
	if err := idemdriver.ValidateClaimParams(p); err != nil {
		return idemdriver.ClaimResult{}, err
	}
	if s.part != nil {
		return s.part.q.ClaimTx(ctx, querier{tx}, p)
	}
	return pgsql.InTx(ctx, s.tab, querier{tx}, p.Consumer, func(q *pgsql.Queries) (idemdriver.ClaimResult, error) {
		return q.ClaimTx(ctx, querier{tx}, p)
	})
}

// ClaimBatchTx implements [idemdriver.BatchClaimer]: the messages are
// claimed with one INSERT ... SELECT FROM unnest(...) ON CONFLICT DO
// NOTHING statement that also returns the fingerprints of committed
// records, in one round trip. Messages are inserted in byte order of their
// IDs, so that concurrent batches with overlapping IDs take their row
// locks in the same order and do not deadlock. Results come back in the
// order of p.Messages. On the partitioned layout (Config.Partitions) the
// batch's advisory locks are taken first, in one statement in ascending
// key order, then one statement looks the IDs up in every partition and
// inserts the new ones. p is checked first
// (idemdriver.ValidateClaimBatchParams: an empty batch or an ID given
// twice is an error matching idemdriver.ErrInvalidConfig), so tx stays
// usable.
func (s *Store) ClaimBatchTx(ctx context.Context, tx pgx.Tx, p *idemdriver.ClaimBatchParams) ([]idemdriver.ClaimResult, error) {
	if err := idemdriver.ValidateClaimBatchParams(p); err != nil {
		return nil, err
	}
	if s.part != nil {
		return s.part.q.ClaimBatchTx(ctx, querier{tx}, p)
	}
	return pgsql.InTx(ctx, s.tab, querier{tx}, p.Consumer, func(q *pgsql.Queries) ([]idemdriver.ClaimResult, error) {
		return q.ClaimBatchTx(ctx, querier{tx}, p)
	})
}

// BeginClaimBatch implements [idemdriver.BeginBatchClaimer]: it acquires a
// connection, and sends BEGIN and the batch claim of [Store.ClaimBatchTx]
// as one pipelined pgx.Batch, so that beginning and claiming a batch cost
// one network round trip (on the partitioned layout: Begin, then
// ClaimBatchTx). The result is that of [Store.Begin] followed by
// [Store.ClaimBatchTx]: one result per message, in the order of
// p.Messages; the rare claim that waited for a concurrent transaction
// reads what it committed with one more statement in the transaction.
//
// p is checked first (idemdriver.ValidateClaimBatchParams), before any
// connection is acquired. On success the transaction is open, and the
// caller commits or rolls it back. On error no transaction is left open:
// it is rolled back (with a context detached from ctx) and the connection
// goes back to the pool, or is closed if its state is unknown.
func (s *Store) BeginClaimBatch(ctx context.Context, p *idemdriver.ClaimBatchParams) (pgx.Tx, []idemdriver.ClaimResult, error) {
	if err := idemdriver.ValidateClaimBatchParams(p); err != nil {
		return nil, nil, err
	}
	if s.part != nil {
		return s.beginClaimBatchPart(ctx, p)
	}
	tx, res, err := s.beginClaimBatch(ctx, p)
	if pgsql.ShapeChanged(err) { // migration 015 ran: once more, in the new shape
		s.tab.Reset()
		tx, res, err = s.beginClaimBatch(ctx, p)
	}
	return tx, res, err
}

// beginClaimBatch is BeginClaimBatch on the default layout, in the shape
// the Store knows (or finds on the pool).
func (s *Store) beginClaimBatch(ctx context.Context, p *idemdriver.ClaimBatchParams) (pgx.Tx, []idemdriver.ClaimResult, error) {
	q, err := s.tab.Queries(ctx, querier{s.pool}, p.Consumer, true)
	if err != nil {
		return nil, nil, err
	}
	query, args := q.ClaimBatchQuery(p)
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue(query, args...)
	br := s.pool.SendBatch(ctx, b)
	tx := br.Tx()
	first := &batchRows{br: br}
	_, err = br.Exec() // BEGIN
	if err == nil {
		first.rows, err = br.Query()
	}
	if err != nil {
		_ = first.closeBatch() // err is the batch's error
	}
	res, err := q.ClaimBatchFrom(ctx, querier{tx}, p, first, err)
	if cerr := first.closeBatch(); err == nil && cerr != nil {
		err = pgsql.WrapLockTimeout(cerr)
	}
	if err != nil {
		abort(ctx, tx)
		return nil, nil, err
	}
	s.own.Store(tx, false)
	return tx, res, nil
}

// batchRows are the rows of the last statement of a pipelined batch: Close
// (and Err, once the rows are read) also close the batch, so that the
// transaction can run its next statement, and Err reports the batch's
// error.
type batchRows struct {
	br     pgx.BatchResults
	rows   pgx.Rows
	closed bool
	err    error
}

// closeBatch closes the rows and the batch, once, and returns the batch's
// error.
func (r *batchRows) closeBatch() error {
	if !r.closed {
		r.closed = true
		if r.rows != nil {
			r.rows.Close()
		}
		r.err = r.br.Close()
	}
	return r.err
}

func (r *batchRows) Next() bool { return r.rows.Next() }

func (r *batchRows) Scan(dest ...any) error { return r.rows.Scan(dest...) }

func (r *batchRows) Err() error {
	if err := r.rows.Err(); err != nil {
		_ = r.closeBatch()
		return err
	}
	return r.closeBatch()
}

func (r *batchRows) Close() { _ = r.closeBatch() }

// Commit implements [idemdriver.TxStore]: tx.Commit, which returns the
// connection to the pool. An error means nothing committed, or that the
// outcome is unknown (the connection was lost during COMMIT); a COMMIT of a
// transaction aborted by an earlier error is reported as
// pgx.ErrTxCommitRollback.
//
// When tx is one this Store began and rows were emitted into the outbox
// in it, Commit then has the outbox's notification sent, outside the
// transaction and without waiting for it (see [Store.EmitTx]), unless
// their caller wakes a relay itself (idemdriver.EmitParams.RelayWoken); a
// failure of that notification is not reported (relays also poll).
func (s *Store) Commit(ctx context.Context, tx pgx.Tx) error {
	emitted := s.ownEnd(tx)
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	if emitted == true {
		s.wakeRelays()
	}
	return nil
}

// Rollback implements [idemdriver.TxStore]: tx.Rollback, which returns the
// connection to the pool, or closes it when ROLLBACK fails. Rolling back a
// transaction that already ended (committed, rolled back, or a failed
// Commit) returns nil, as does rolling back nil (the transaction
// BeginClaim returns with a duplicate it ended).
func (s *Store) Rollback(ctx context.Context, tx pgx.Tx) error {
	if tx == nil { // BeginClaim's transaction of a duplicate: already ended
		return nil
	}
	s.ownEnd(tx)
	if err := tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return err
	}
	return nil
}

// abort rolls tx back after a failure, even when ctx has ended. pgx closes
// the connection when the ROLLBACK fails, and the pool then destroys it
// instead of reusing it.
func abort(ctx context.Context, tx pgx.Tx) {
	ctx, cancel := sqlstore.Detached(ctx)
	defer cancel()
	_ = tx.Rollback(ctx) // the claim's error is the one to report
}

// beginClaimBatchPart is BeginClaimBatch on the partitioned layout:
// Begin, then ClaimBatchTx (the batch's advisory locks, then the claim);
// when no partition covers now(), the partitions are created
// (EnsurePartitions) and the batch is claimed once more, in a new
// transaction.
func (s *Store) beginClaimBatchPart(ctx context.Context, p *idemdriver.ClaimBatchParams) (pgx.Tx, []idemdriver.ClaimResult, error) {
	for attempt := 0; ; attempt++ {
		tx, err := s.Begin(ctx)
		if err != nil {
			return nil, nil, err
		}
		res, err := s.part.q.ClaimBatchTx(ctx, querier{tx}, p)
		if err == nil {
			return tx, res, nil
		}
		s.own.Delete(tx)
		abort(ctx, tx)
		if attempt > 0 || !errors.Is(err, ErrNoPartition) {
			return nil, nil, err
		}
		if err := s.EnsurePartitions(ctx); err != nil {
			return nil, nil, err
		}
	}
}

// beginClaimPart is BeginClaim on the partitioned layout: BEGIN, the ID's
// advisory lock and the claim in one pipelined batch.
func (s *Store) beginClaimPart(ctx context.Context, p *idemdriver.ClaimParams) (pgx.Tx, idemdriver.ClaimResult, error) {
	q := s.part.q
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue(q.ClaimLock, pgsql.ClaimKey(q.Table, p.Consumer, p.MessageID), pgsql.LockTimeoutArg(p.LockTimeout))
	b.Queue(q.Claim, p.Consumer, p.MessageID, p.Fingerprint)
	br := s.pool.SendBatch(ctx, b)
	tx := br.Tx()
	var res idemdriver.ClaimResult
	_, err := br.Exec() // BEGIN
	if err == nil {
		err = pgsql.ScanLock(row{br.QueryRow()})
	}
	if err == nil {
		res, err = pgsql.ScanPartClaim(row{br.QueryRow()})
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		abort(ctx, tx)
		return nil, idemdriver.ClaimResult{}, pgsql.WrapPartitioned(err)
	}
	s.own.Store(tx, false)
	return tx, res, nil
}
