package pgsql

import (
	"context"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/lastval"
	"github.com/idem-go/idem/internal/sqlschema"
	"github.com/idem-go/idem/internal/sqlstore"
)

// ClaimArgs are the arguments of q.Claim for p. The consumer (its name,
// or on schema v2 its key: ConsumerArg) and the lock timeout are the same
// on every claim of a consumer: their boxed values are kept, so a claim
// boxes only the message ID and the fingerprint.
func (q *Queries) ClaimArgs(p *idemdriver.ClaimParams) []any {
	return q.AppendClaimArgs(make([]any, 0, 4), p)
}

// AppendClaimArgs appends the arguments of q.Claim for p to dst (see
// ClaimArgs), for a caller that holds them in an array of its own.
func (q *Queries) AppendClaimArgs(dst []any, p *idemdriver.ClaimParams) []any {
	return append(dst, q.ConsumerArg(p.Consumer), p.MessageID, p.Fingerprint, LockTimeoutArg(p.LockTimeout))
}

// ConsumerArg is the consumer parameter of q's statements on the
// processed table for the consumer named name: the name itself on schema
// v1; on v2 its key (a boxed int16), which the Table that made q resolved
// before handing q out (Table.Queries), or nil (SQL NULL, which no record
// has and the claim's NOT NULL refuses) for a name it did not resolve.
func (q *Queries) ConsumerArg(name string) any {
	if !q.V2 {
		return consumerArg(name)
	}
	if q.one != nil {
		return q.one
	}
	return q.keys.get(name)
}

// LockTimeoutArg is the lock timeout parameter of the claims: d in whole
// milliseconds (rounded up) as text, or nil (NULL: the session's
// setting) when d is not positive.
func LockTimeoutArg(d time.Duration) any {
	if d <= 0 {
		return nil
	}
	return lockTimeoutArgs.Get(d, func(d time.Duration) any {
		return strconv.FormatInt(int64((d+time.Millisecond-1)/time.Millisecond), 10)
	})
}

// consumerArg returns name as a claim argument, reusing the last one boxed
// when it is the same name (the common case: one consumer per process, or
// a few taking turns).
func consumerArg(name string) any {
	return consumerArgs.Get(name, func(name string) any { return name })
}

// The last lock timeout argument and consumer name argument built: every
// claim of a consumer has the same ones.
var (
	lockTimeoutArgs lastval.Cache[time.Duration, any]
	consumerArgs    lastval.Cache[string, any]
)

// lockNotAvailable is PostgreSQL's SQLSTATE for a lock wait ended by
// lock_timeout.
const lockNotAvailable = "55P03"

// WrapLockTimeout returns err marked with idemdriver.ErrLockTimeout when
// it is PostgreSQL's lock_not_available (SQLSTATE 55P03, by the
// SQLState method of the driver's error: pgconn.PgError and others), and
// err unchanged otherwise.
func WrapLockTimeout(err error) error {
	var st interface{ SQLState() string }
	if err != nil && errors.As(err, &st) && st.SQLState() == lockNotAvailable {
		return fmt.Errorf("%w: %w", idemdriver.ErrLockTimeout, err)
	}
	return err
}

// ScanClaim reads the row of a claim that returns claimed (bool), the
// stored fingerprint and the state (Partitioned.Claim). settled is false
// when the claim returned no row.
func ScanClaim(row sqlstore.Row) (res idemdriver.ClaimResult, settled bool, err error) {
	var (
		claimed bool
		fp      []byte
		state   sql.NullInt64
	)
	switch err := row.Scan(&claimed, &fp, &state); {
	case errors.Is(err, sqlstore.ErrNoRows):
		return res, false, nil
	case err != nil:
		return res, false, err
	case claimed:
		return sqlstore.Claimed, true, nil
	}
	return sqlstore.Existing(fp, state), true, nil
}

// Inserted returns what the scan of q.Claim's row, which ended with err,
// means: true when the claim inserted the record (its row), false when
// it conflicted (no row: Settle then reads the record), or err.
func Inserted(err error) (bool, error) {
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, sqlstore.ErrNoRows):
		return false, nil
	}
	return false, err
}

// ClaimTx claims p inside tx: q.Claim, and Settle when it conflicted. p
// must have been validated.
func (q *Queries) ClaimTx(ctx context.Context, tx sqlstore.Querier, p *idemdriver.ClaimParams) (idemdriver.ClaimResult, error) {
	args := q.ClaimArgs(p)
	var claimed bool
	inserted, err := Inserted(tx.QueryRow(ctx, q.Claim, args...).Scan(&claimed))
	switch {
	case err != nil:
		return idemdriver.ClaimResult{}, WrapLockTimeout(err)
	case inserted:
		return sqlstore.Claimed, nil
	}
	res, err := q.Settle(ctx, tx, p, args)
	return res, WrapLockTimeout(err)
}

// Settle finishes a claim of p whose statement (q.Claim, with args, the
// arguments ClaimArgs gives) conflicted: it puts back the lock timeout
// the claim saved and reads the record, with a snapshot of its own (so a
// record that a transaction the claim waited for committed is seen), and
// claims again if the record is gone (a purge deleted it). The read
// takes the first two of args (consumer and message ID), so that a
// duplicate boxes no argument twice.
func (q *Queries) Settle(ctx context.Context, tx sqlstore.Querier, p *idemdriver.ClaimParams, args []any) (idemdriver.ClaimResult, error) {
	var (
		rec struct {
			fp      []byte
			state   sql.NullInt64
			claimed bool
		}
		dest = [2]any{&rec.fp, &rec.state}
	)
	for range sqlstore.MaxClaimAttempts {
		rec.fp = nil
		if err := tx.QueryRow(ctx, q.fingerprint, args[:2]...).Scan(dest[:]...); err != nil {
			return idemdriver.ClaimResult{}, err
		}
		if rec.fp != nil {
			return sqlstore.Existing(rec.fp, rec.state), nil
		}
		switch inserted, err := Inserted(tx.QueryRow(ctx, q.Claim, args...).Scan(&rec.claimed)); {
		case err != nil:
			return idemdriver.ClaimResult{}, err
		case inserted:
			return sqlstore.Claimed, nil
		}
	}
	return idemdriver.ClaimResult{}, sqlstore.ErrUnsettled("claim", p.Consumer)
}

// ClaimBatchTx claims the messages of p inside tx with one statement (q's
// batch claim, in byte order of the IDs), plus one SELECT of the records
// committed by transactions it waited for, and returns one result per
// message in the order of p.Messages. p must have been validated.
func (q *Queries) ClaimBatchTx(ctx context.Context, tx sqlstore.Querier, p *idemdriver.ClaimBatchParams) ([]idemdriver.ClaimResult, error) {
	res, err := q.claimBatchTx(ctx, tx, p, nil)
	return res, WrapLockTimeout(err)
}

// ClaimBatchFrom is ClaimBatchTx whose first batch claim the caller has
// already sent, with the statement and arguments of ClaimBatchQuery(p)
// (pipelined with BEGIN, say): first are its rows (or its error). Any
// statement that follows runs on tx, after first is closed. p must have
// been validated.
func (q *Queries) ClaimBatchFrom(ctx context.Context, tx sqlstore.Querier, p *idemdriver.ClaimBatchParams, first sqlstore.Rows, firstErr error) ([]idemdriver.ClaimResult, error) {
	if firstErr != nil {
		return nil, WrapLockTimeout(firstErr)
	}
	res, err := q.claimBatchTx(ctx, tx, p, first)
	return res, WrapLockTimeout(err)
}

// ClaimBatchQuery returns the batch claim statement of all of p's messages
// (in byte order of their IDs) and its arguments: the first statement of
// ClaimBatchTx, for a caller that sends it itself (see ClaimBatchFrom).
func (q *Queries) ClaimBatchQuery(p *idemdriver.ClaimBatchParams) (string, []any) {
	return q.claimBatchArgs(p, sqlstore.Sorted(p))
}

func (q *Queries) claimBatchTx(ctx context.Context, tx sqlstore.Querier, p *idemdriver.ClaimBatchParams, first sqlstore.Rows) ([]idemdriver.ClaimResult, error) {
	var got map[string]idemdriver.ClaimResult // made when some message was not inserted
	pending := sqlstore.Sorted(p)
	for attempt := 0; len(pending) > 0; attempt++ {
		if attempt == sqlstore.MaxClaimAttempts {
			return nil, sqlstore.ErrUnsettled("batch claim", p.Consumer)
		}
		rows := first
		if attempt > 0 || rows == nil {
			query, args := q.claimBatchArgs(p, pending)
			var err error
			if rows, err = tx.Query(ctx, query, args...); err != nil {
				return nil, err
			}
		}
		all := false
		err := sqlstore.ForEach(rows, func(r sqlstore.Row) error {
			var (
				id    sql.NullString
				fp    []byte
				state sql.NullInt64
			)
			if err := r.Scan(&id, &fp, &state); err != nil {
				return err
			}
			if got == nil && id.Valid {
				got = make(map[string]idemdriver.ClaimResult, len(p.Messages))
			}
			switch {
			case !id.Valid: // every message was inserted
				all = true
			case fp == nil:
				got[id.String] = sqlstore.Claimed
			case !got[id.String].Claimed: // a row this statement inserted wins
				got[id.String] = sqlstore.Existing(fp, state)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		if all && attempt == 0 { // every message new: the common case, no map to read
			return sqlstore.AllClaimed(len(p.Messages)), nil
		}
		if got == nil {
			got = make(map[string]idemdriver.ClaimResult, len(p.Messages))
		}
		if all {
			for _, m := range pending {
				got[m.MessageID] = sqlstore.Claimed
			}
			break
		}
		// Conflicts with records committed while the statement waited:
		// read them with a new snapshot, and claim again what vanished.
		waited := sqlstore.Unsettled(pending, got)
		if len(waited) == 0 {
			break
		}
		rows, err = tx.Query(ctx, q.fingerprints, q.ConsumerArg(p.Consumer), TextArray(sqlstore.IDs(waited)))
		if err := sqlstore.ReadExisting(rows, err, got); err != nil {
			return nil, err
		}
		pending = sqlstore.Unsettled(waited, got)
	}
	return sqlstore.InOrder(p, got)
}

// claimBatchArgs returns the batch claim statement of pending (messages
// of p) and its arguments, with native arrays when q.NativeArrays is set.
func (q *Queries) claimBatchArgs(p *idemdriver.ClaimBatchParams, pending []idemdriver.ClaimMessage) (string, []any) {
	ids := make([]string, len(pending))
	lt := LockTimeoutArg(p.LockTimeout)
	if q.NativeArrays {
		fps := make([][]byte, len(pending))
		for i, m := range pending {
			ids[i], fps[i] = m.MessageID, m.Fingerprint
		}
		return q.claimBatchNative, []any{q.ConsumerArg(p.Consumer), ids, fps, lt}
	}
	fps := make([]string, len(pending))
	for i, m := range pending {
		ids[i], fps[i] = m.MessageID, hex.EncodeToString(m.Fingerprint)
	}
	return q.claimBatch, []any{q.ConsumerArg(p.Consumer), TextArray(ids), TextArray(fps), lt}
}

// Acquire runs the acquire statement until it settles (see Queries.acquire),
// on db outside any transaction, and reads a takeover's recovery points
// with one more statement, whose new snapshot sees a step that the
// previous owner committed while the takeover waited for the row. The
// point of p.StepPrefix, saved by the acquire statement itself, is left
// out of them. p must have been validated.
func (q *Queries) Acquire(ctx context.Context, db sqlstore.Querier, p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
	query, args := q.AcquireQuery(p)
	return q.AcquireFrom(ctx, db, p, ScanAcquire(db.QueryRow(ctx, query, args...)))
}

// AcquireQuery returns the acquire statement of p and its arguments, for
// a caller that sends it itself (in a pipeline of many) and finishes
// with AcquireFrom.
func (q *Queries) AcquireQuery(p *idemdriver.AcquireParams) (string, []any) {
	c := q.ConsumerArg(p.Consumer)
	if p.StepPrefix == "" {
		return q.acquire, []any{c, p.MessageID, p.Fingerprint, sqlstore.DurationMicros(p.Lease)}
	}
	if q.V2 { // the recovery point's consumer name last
		return q.acquireStep, []any{c, p.MessageID, p.Fingerprint, sqlstore.DurationMicros(p.Lease), p.StepPrefix, p.Consumer}
	}
	return q.acquireStep, []any{c, p.MessageID, p.Fingerprint, sqlstore.DurationMicros(p.Lease), p.StepPrefix}
}

// AcquireRow is the row of one acquire statement, as ScanAcquire read it.
type AcquireRow struct {
	won bool
	r   sqlstore.LeaseRecord
	err error
}

// ScanAcquire reads the row of an acquire statement (AcquireQuery).
func ScanAcquire(row sqlstore.Row) AcquireRow {
	var a AcquireRow
	a.err = row.Scan(a.r.ScanArgs(&a.won)...)
	return a
}

// AcquireFrom finishes the Acquire of p whose first acquire statement
// answered first: what Acquire does after each statement, the statements
// that follow (again, when the row judged was not the one the statement
// could see; a takeover's recovery points) running on db. p must have
// been validated.
func (q *Queries) AcquireFrom(ctx context.Context, db sqlstore.Querier, p *idemdriver.AcquireParams, first AcquireRow) (idemdriver.AcquireResult, error) {
	var last *sqlstore.LeaseRecord
	a := first
	for i := range sqlstore.MaxClaimAttempts {
		if i > 0 {
			query, args := q.AcquireQuery(p)
			a = ScanAcquire(db.QueryRow(ctx, query, args...))
		}
		switch {
		case errors.Is(a.err, sqlstore.ErrNoRows):
			// Inserted by a transaction the statement waited for
			// (invisible to its snapshot), or deleted meanwhile: again.
			continue
		case a.err != nil:
			return idemdriver.AcquireResult{}, a.err
		case a.won:
			var steps map[string][]byte
			if a.r.Token > 1 { // a takeover: earlier attempts may have saved steps
				var err error
				if steps, err = sqlstore.ReadSteps(ctx, db, q.steps, p.Consumer, p.MessageID); err != nil {
					return idemdriver.AcquireResult{}, err
				}
				if p.StepPrefix != "" {
					delete(steps, idemdriver.PrefixStep(p.StepPrefix, a.r.Token))
				}
			}
			return sqlstore.Acquired(a.r.Token, a.r.Attempt, steps), nil
		case a.r.Acquirable:
			// The snapshot shows a record the DO UPDATE would have taken:
			// the row it judged was newer. Again.
			r := a.r
			last = &r
			continue
		}
		return a.r.NotAcquired(), nil
	}
	// The record kept changing (or vanishing) between snapshots: leases
	// ending as fast as they are taken, or a purge. Report what was seen.
	if last != nil {
		return last.NotAcquired(), nil
	}
	return idemdriver.AcquireResult{}, sqlstore.ErrAcquireUnsettled(p)
}

// CompleteQuery returns the fenced complete statement of p and its
// arguments (a statement whose rows affected are 0 when p.Token owns
// nothing), for a caller that sends it itself.
func (q *Queries) CompleteQuery(p *idemdriver.CompleteParams) (string, []any) {
	return q.complete, []any{sqlstore.NonNil(p.Result), p.ContentType, q.ConsumerArg(p.Consumer), p.MessageID, p.Token}
}

// Renew extends the lease of p.Token to now plus p.Lease (validated).
func (q *Queries) Renew(ctx context.Context, db sqlstore.Querier, p *idemdriver.RenewParams) error {
	return sqlstore.Fenced(ctx, db, "renew", p.Consumer, p.MessageID, p.Token, q.renew,
		sqlstore.DurationMicros(p.Lease), q.ConsumerArg(p.Consumer), p.MessageID, p.Token)
}

// Complete completes the record of p.Token (p validated, content type
// checked).
func (q *Queries) Complete(ctx context.Context, db sqlstore.Querier, p *idemdriver.CompleteParams) error {
	query, args := q.CompleteQuery(p)
	return sqlstore.Fenced(ctx, db, "complete", p.Consumer, p.MessageID, p.Token, query, args...)
}

// Release ends the attempt of p.Token (p validated), saving p.Step in the
// same statement when it is set.
func (q *Queries) Release(ctx context.Context, db sqlstore.Querier, p *idemdriver.ReleaseParams) error {
	if p.Step == "" {
		return sqlstore.Fenced(ctx, db, "release", p.Consumer, p.MessageID, p.Token, q.release,
			sqlstore.ErrorText(p.Error), p.Terminal, q.ConsumerArg(p.Consumer), p.MessageID, p.Token)
	}
	var (
		owned int64
		row   sqlstore.Row
	)
	if q.V2 { // the key, and the recovery point's consumer name last
		row = db.QueryRow(ctx, q.releaseStep, sqlstore.ErrorText(p.Error), p.Terminal, q.ConsumerArg(p.Consumer), p.MessageID, p.Token, p.Step, p.Consumer)
	} else {
		row = db.QueryRow(ctx, q.releaseStep, sqlstore.ErrorText(p.Error), p.Terminal, p.Consumer, p.MessageID, p.Token, p.Step)
	}
	if err := row.Scan(&owned); err != nil {
		return err
	}
	if owned == 0 {
		return sqlstore.LeaseLost("release", p.Consumer, p.MessageID, p.Token)
	}
	return nil
}

// SaveStep saves the recovery point of p (validated) while p.Token owns
// the record.
func (q *Queries) SaveStep(ctx context.Context, db sqlstore.Querier, p *idemdriver.StepParams) error {
	var (
		owned int64
		row   sqlstore.Row
	)
	if q.V2 { // the key, and the recovery point's consumer name last
		row = db.QueryRow(ctx, q.saveStep, q.ConsumerArg(p.Consumer), p.MessageID, p.Token, p.Step, sqlstore.NonNil(p.Result), p.Consumer)
	} else {
		row = db.QueryRow(ctx, q.saveStep, p.Consumer, p.MessageID, p.Token, p.Step, sqlstore.NonNil(p.Result))
	}
	if err := row.Scan(&owned); err != nil {
		return err
	}
	if owned == 0 {
		return sqlstore.LeaseLost("save step", p.Consumer, p.MessageID, p.Token)
	}
	return nil
}

// LockTx is the transaction that holds a purge lock: its statements and
// its end. Rollback must end the transaction even when the connection is
// broken (discarding the connection then).
type LockTx interface {
	sqlstore.Querier
	Rollback(ctx context.Context) error
}

// ErrPurgeLockLost is returned by a purge batch whose lock transaction has
// ended before the purge did (the server ended it: a lost connection,
// idle_in_transaction_session_timeout, a pooler's idle transaction
// timeout), so another purger may hold the lock: the batch is not run.
var ErrPurgeLockLost = errors.New("purge lock lost: the transaction holding it has ended")

// BeginPurge takes consumer's purge lock and returns the purge session.
//
// The lock is a transaction-scoped advisory lock
// (pg_try_advisory_xact_lock, key sqlstore.LockKey("purge", table,
// consumer)) taken by a transaction of its own, begun with begin and
// held, idle, for as long as the purge runs; the session's Close ends it
// with a rollback, which releases the lock (as does the server when the
// connection is lost, the purger having crashed). Nothing in that
// transaction writes, and it keeps no snapshot between its statements
// (see holdLock: backend_xmin and backend_xid stay NULL while it idles),
// so it holds back neither vacuum nor CREATE INDEX CONCURRENTLY nor
// anyone's writes. A session lock would not do behind a pooler in
// transaction mode (PgBouncer): the server connection that took it goes
// back to the pooler's pool with the lock still held, and the unlock runs
// on another one.
//
// The session's statements (runs, counts, batches) run on db, the pool,
// each in a transaction of its own, so a purge uses two connections at
// once. Before each batch the lock transaction is asked again for the
// lock (re-entrant: true while it lives), so a batch never runs after the
// lock was lost (ErrPurgeLockLost). The transaction's own
// idle_in_transaction_session_timeout is LockIdle.
// It returns
// idemdriver.ErrPurgeInProgress when another transaction or session holds
// the lock.
func (q *Queries) BeginPurge(ctx context.Context, db sqlstore.Querier, consumer string, begin func(ctx context.Context) (LockTx, error)) (idemdriver.PurgeSession, error) {
	return q.BeginPurgeWith(ctx, db, consumer, begin, nil)
}

// DeleteFunc deletes one purge batch of consumer's records written before
// horizonUS (µs), at most limit, and returns how many it deleted.
type DeleteFunc func(ctx context.Context, consumer string, horizonUS int64, limit int) (int64, error)

// DeleteRows is the DeleteFunc of the default layout on db: one statement
// that deletes the oldest completed and failed records before the horizon
// with their recovery points, skipping rows locked by others.
func (q *Queries) DeleteRows(db sqlstore.Querier) DeleteFunc {
	return func(ctx context.Context, consumer string, horizonUS int64, limit int) (int64, error) {
		var n int64
		if !q.V2 {
			err := db.QueryRow(ctx, q.purgeBatch, consumer, horizonUS, int64(limit)).Scan(&n)
			return n, err
		}
		var key int32
		switch err := db.QueryRow(ctx, q.consumerKey, consumer).Scan(&key); {
		case errors.Is(err, sqlstore.ErrNoRows):
			return 0, nil // a consumer that never wrote a record
		case err != nil:
			return 0, err
		}
		err := db.QueryRow(ctx, q.purgeBatch, key, horizonUS, int64(limit), consumer).Scan(&n)
		return n, err
	}
}

// BeginPurgeWith is BeginPurge whose batches run del (nil: DeleteRows on
// db), each after checking that the lock is still held.
func (q *Queries) BeginPurgeWith(ctx context.Context, db sqlstore.Querier, consumer string, begin func(ctx context.Context) (LockTx, error), del DeleteFunc) (idemdriver.PurgeSession, error) {
	if del == nil {
		del = q.DeleteRows(db)
	}
	key := sqlstore.LockKey("purge", q.Table, consumer)
	tx, err := begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("purge lock: %w", err)
	}
	rollback := func(ctx context.Context) error {
		rctx, cancel := sqlstore.Detached(ctx)
		defer cancel()
		return tx.Rollback(rctx)
	}
	locked, err := holdLock(ctx, tx, key)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("purge lock: %w", err), rollback(ctx))
	}
	if !locked {
		return nil, errors.Join(idemdriver.ErrPurgeInProgress, rollback(ctx))
	}
	batch := func(ctx context.Context, consumer string, horizonUS int64, limit int) (int64, error) {
		if held, err := holdLock(ctx, tx, key); err != nil || !held {
			return 0, errors.Join(ErrPurgeLockLost, err)
		}
		return del(ctx, consumer, horizonUS, limit)
	}
	release := func(ctx context.Context) error {
		if err := rollback(ctx); err != nil {
			return fmt.Errorf("purge unlock: %w", err)
		}
		return nil
	}
	return sqlstore.NewSession(db, &q.Runs, consumer, batch, release), nil
}

// Migrate applies the migrations of migs the table has not had, in
// order. A transaction (begun by begin) takes the migration lock
// (pg_try_advisory_xact_lock, key sqlstore.LockKey("migrate", table),
// tried again until it holds it: see migrateLock), so
// processes migrating one table at once run one after the other and the
// later ones find nothing to do, and runs the migrations, each recorded
// in it, then commits: DDL is transactional, a failed migration leaves
// nothing behind.
//
// A NoTransaction migration (CREATE INDEX CONCURRENTLY, which builds an
// index without blocking the table's writers, cannot run in a transaction
// block) runs in that transaction without the word CONCURRENTLY when its
// SmallTable has fewer than sqlschema.SmallRows rows (a plain build then
// holds its lock for milliseconds, while a concurrent one waits for every
// older transaction of the database). Otherwise it ends that transaction
// with the migrations before it. Then, the
// lock taken again by a transaction that reads nothing but the migrations
// table, writes nothing and holds no snapshot while it idles (so the
// index builds, which wait for the transactions holding older snapshots,
// do not wait for it), db runs the migration's statements, each in a
// transaction of its own on any connection (so PgBouncer's transaction
// pooling works too: db needs a connection besides the lock
// transaction's, and only for this; a statement that is not
// sqlschema.Concurrent runs in a transaction of begin's with a lock
// timeout, again while it times out, and one marked sqlschema.RepeatMark
// until it changes no row: see runOnline), and records its version; the
// migrations after it go on in the next step. The lock transaction's
// idle_in_transaction_session_timeout is an hour, local to it, so that a
// shorter one meant for handlers does not end it during a long build.
// Each step commits on its own: a failure leaves the migrations before
// it applied and recorded.
func (q *Queries) Migrate(ctx context.Context, begin func(context.Context) (sqlstore.Tx, error), db sqlstore.Querier, migs []sqlschema.Migration) error {
	for {
		more, err := q.migrateStep(ctx, begin, db, migs)
		if err != nil || !more {
			return err
		}
	}
}

// lockIdle sets a lock transaction's idle_in_transaction_session_timeout
// to LockIdle, a statement that takes no snapshot.
const lockIdle = `SET LOCAL idle_in_transaction_session_timeout = '` + LockIdle + `'`

// holdLock asks tx for the transaction-scoped advisory lock of key
// (TryXactLock) and reports whether tx holds it. When it does, it then
// runs lockIdle: the lock's SELECT leaves its portal open, and with it
// the SELECT's snapshot, until the transaction's next statement (the
// extended protocol's unnamed portal), and lockIdle, a SET, replaces it
// and keeps no snapshot once done. A transaction that idles holding a
// lock thus keeps no snapshot (backend_xmin NULL), which vacuum and
// CREATE INDEX CONCURRENTLY would otherwise wait for.
func holdLock(ctx context.Context, tx sqlstore.Querier, key int64) (bool, error) {
	var held bool
	if err := tx.QueryRow(ctx, TryXactLock, key).Scan(&held); err != nil || !held {
		return false, err
	}
	if _, err := tx.Exec(ctx, lockIdle); err != nil {
		return false, err
	}
	return true, nil
}

// migrateLock begins a transaction holding the migration lock, whose
// idle_in_transaction_session_timeout is an hour. It tries
// for the lock and, while another process holds it, ends its transaction
// and tries again in a new one after a pause (10 ms, doubling up to half a
// second): a transaction waiting in pg_advisory_xact_lock would hold a
// snapshot, and CREATE INDEX CONCURRENTLY, run while the holder's
// transaction idles, waits for every transaction that held a snapshot
// older than its own when it looked, so a waiter would wait for the
// holder, the holder for its index build, and the build for the waiter.
func (q *Queries) migrateLock(ctx context.Context, begin func(context.Context) (sqlstore.Tx, error)) (sqlstore.Tx, error) {
	key := sqlstore.LockKey("migrate", q.Table)
	pause := 10 * time.Millisecond
	for {
		tx, err := begin(ctx)
		if err != nil {
			return nil, fmt.Errorf("migrate: %w", err)
		}
		held, err := holdLock(ctx, tx, key)
		if err == nil && held {
			return tx, nil
		}
		rctx, cancel := sqlstore.Detached(ctx)
		rerr := tx.Rollback(rctx)
		cancel()
		if err != nil || rerr != nil {
			return nil, fmt.Errorf("migrate lock: %w", errors.Join(err, rerr))
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("migrate lock: %w", ctx.Err())
		case <-t.C:
		}
		pause = min(2*pause, 500*time.Millisecond)
	}
}

// smallTable reports whether table (empty: none) has fewer than
// sqlschema.SmallRows rows; reading at most that many.
func smallTable(ctx context.Context, db sqlstore.Querier, table string) (bool, error) {
	if table == "" {
		return false, nil
	}
	var n int64
	err := db.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM `+table+` LIMIT `+strconv.Itoa(sqlschema.SmallRows)+`) AS s`).Scan(&n)
	return n < sqlschema.SmallRows, err
}

// migrateStep is one step of Migrate: in a transaction holding the
// migration lock, the pending migrations up to the first NoTransaction
// one whose table is not small; or, when that one is first, that one
// alone (migrateConcurrently). It reports whether migrations were left
// for another step.
func (q *Queries) migrateStep(ctx context.Context, begin func(context.Context) (sqlstore.Tx, error), db sqlstore.Querier, migs []sqlschema.Migration) (more bool, err error) {
	tx, err := q.migrateLock(ctx, begin)
	if err != nil {
		return false, err
	}
	defer func() {
		rctx, cancel := sqlstore.Detached(ctx)
		defer cancel()
		_ = tx.Rollback(rctx) // after Commit, a no-op
	}()
	todo, err := sqlstore.Pending(ctx, tx, migs, q.Migrations)
	if err != nil {
		return false, err
	}
	n := 0
	for ; n < len(todo); n++ {
		m := todo[n]
		if m.NoTransaction {
			small, err := smallTable(ctx, tx, m.SmallTable)
			if err != nil {
				return false, fmt.Errorf("migration %s: %w", m.Name, err)
			}
			if !small {
				break
			}
			m = m.InTransaction()
		}
		if err := sqlstore.Run(ctx, tx, tx, m, q.Migrations); err != nil {
			return false, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("migrate commit: %w", err)
	}
	if n > 0 || len(todo) == 0 {
		return n < len(todo), nil
	}
	return len(todo) > 1, q.migrateConcurrently(ctx, begin, db, todo[0])
}

// migrateConcurrently runs m, a NoTransaction migration, on db unless
// another process did meanwhile, holding the migration lock in a
// transaction of its own (a second connection) that reads nothing but the
// migrations table: a transaction that had read the table being indexed
// would hold a lock that DROP INDEX CONCURRENTLY waits for.
func (q *Queries) migrateConcurrently(ctx context.Context, begin func(context.Context) (sqlstore.Tx, error), db sqlstore.Querier, m sqlschema.Migration) error {
	lock, err := q.migrateLock(ctx, begin)
	if err != nil {
		return err
	}
	defer func() {
		rctx, cancel := sqlstore.Detached(ctx)
		defer cancel()
		_ = lock.Rollback(rctx) // it wrote nothing
	}()
	var done bool
	if err := lock.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+q.Migrations.Name+` WHERE version = $1::int)`, m.Version).Scan(&done); err != nil {
		return fmt.Errorf("migration %s: %w", m.Name, err)
	}
	if done {
		return nil
	}
	if _, err := lock.Exec(ctx, lockIdle); err != nil { // ends the SELECT's snapshot: see holdLock
		return fmt.Errorf("migration %s: %w", m.Name, err)
	}
	// db refuses when its pool has no connection besides the lock
	// transaction's, for which begin would wait forever.
	if _, err := db.Exec(ctx, `SELECT 1`); err != nil {
		return fmt.Errorf("migration %s: %w", m.Name, err)
	}
	for _, st := range m.Statements() {
		if err := runOnline(ctx, begin, db, st); err != nil {
			return fmt.Errorf("migration %s: %w", m.Name, err)
		}
	}
	if _, err := db.Exec(ctx, q.Migrations.Record, m.Version); err != nil {
		return fmt.Errorf("record migration %s: %w", m.Name, err)
	}
	return nil
}

// OnlineLockTimeout is the lock_timeout of a statement of a NoTransaction
// migration that is not sqlschema.Concurrent (runOnline): the longest it
// waits for a table's lock, and so the longest the statements queued
// behind it (a consumer's claim) wait for it, before it gives way and
// tries again.
const OnlineLockTimeout = "1s"

// runOnline runs st, a statement of a NoTransaction migration, on a live
// table. A Concurrent one runs on db outside any transaction, as it
// must. Another runs in a transaction of its own (begin) whose
// lock_timeout is OnlineLockTimeout: an ALTER TABLE waiting for the
// table's exclusive lock queues every later statement on the table
// behind it, so after a second it gives way (SQLSTATE 55P03) and runs
// again after a pause (sqlstore.RetryLockTimeout: 100 ms, doubling up to
// 5 s, until ctx ends; the error then matches idemdriver.ErrLockTimeout
// and ctx.Err()).
// One marked sqlschema.RepeatMark runs until it changes no row, each run
// committed on its own, so that no run holds its row locks for long.
func runOnline(ctx context.Context, begin func(context.Context) (sqlstore.Tx, error), db sqlstore.Querier, st string) error {
	if sqlschema.Concurrent(st) {
		_, err := db.Exec(ctx, st)
		return err
	}
	for {
		n, err := sqlstore.RetryLockTimeout(ctx, func() (int64, error) {
			n, err := runLockBounded(ctx, begin, st)
			return n, WrapLockTimeout(err)
		})
		if err != nil || n == 0 || !sqlschema.Repeats(st) {
			return err
		}
	}
}

// runLockBounded runs st in a transaction of its own whose lock_timeout
// is OnlineLockTimeout, and commits; it returns the rows st changed.
func runLockBounded(ctx context.Context, begin func(context.Context) (sqlstore.Tx, error), st string) (int64, error) {
	tx, err := begin(ctx)
	if err != nil {
		return 0, err
	}
	n, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '`+OnlineLockTimeout+`'`)
	if err == nil {
		n, err = tx.Exec(ctx, st)
	}
	if err == nil {
		err = tx.Commit(ctx)
	}
	if err != nil {
		rctx, cancel := sqlstore.Detached(ctx)
		defer cancel()
		_ = tx.Rollback(rctx) // after a failed Commit, already ended
		return 0, err
	}
	return n, nil
}

// Err is the error of the statement's row: sqlstore.ErrNoRows when it
// returned none (AcquireFrom runs it again), another when it failed.
func (a AcquireRow) Err() error { return a.err }
