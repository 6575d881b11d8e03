package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/pgsql"
	"github.com/idem-go/idem/internal/sqlstore"
)

// Limits of the lease-mode text columns, the same on every dialect (and
// in store/idempgxv5).
const (
	// MaxContentTypeLength is the longest content type Complete stores,
	// in bytes. Content types are also valid UTF-8 without NUL bytes.
	MaxContentTypeLength = sqlstore.MaxContentTypeLength
	// MaxErrorTextLength is the longest error text Release stores, in
	// bytes; a longer one is cut (at a character boundary).
	MaxErrorTextLength = sqlstore.MaxErrorTextLength
	// purgeIDChunk is the most message IDs one DELETE ... IN lists.
	purgeIDChunk = 500
)

// Acquire implements [idemdriver.LeaseStore]: it inserts an in_progress record
// (token 1, attempt 1, lease until the server's now plus p.Lease), or takes
// over an in_progress record whose lease has ended (expiry at or before
// the server's now) and whose fingerprint is p.Fingerprint (the next token
// and attempt, a new lease, and the recovery points saved so far), or
// reports the record as it is: state, attempts, fingerprint, remaining
// lease (computed by the server, in microseconds), stored result and last
// error. Of concurrent calls, exactly one acquires:
//
//   - PostgreSQL: one statement, INSERT ... ON CONFLICT DO UPDATE ... WHERE
//     <lease ended and same fingerprint> RETURNING, which also reads the
//     record when it did not acquire it; run again (with a new snapshot)
//     when the record changed under it. A takeover reads its recovery
//     points with one more statement.
//   - MySQL: INSERT ... ON DUPLICATE KEY UPDATE, whose insert ID says
//     whether the record existed (as in ClaimTx); if it did, a plain read
//     of it, and, only when it can be taken over, a short transaction that
//     locks it (SELECT ... FOR UPDATE), checks again, and updates it.
//   - SQLite: one BEGIN IMMEDIATE transaction: INSERT ... ON CONFLICT DO
//     UPDATE ... WHERE ... RETURNING, then a read.
//
// The recovery point of p.StepPrefix ([idemdriver.StepRecorder]) is saved
// in the transaction that acquires: on PostgreSQL by the acquire
// statement itself; on MySQL, when p.StepPrefix is set, the INSERT of a
// new record runs in a transaction with the INSERT of the point (one
// commit), and a takeover saves it in its locking transaction; on SQLite
// in the BEGIN IMMEDIATE transaction.
//
// p.Lease must be positive (an error matching idemdriver.ErrInvalidConfig
// otherwise: a zero lease never means "no expiry"); names and the
// fingerprint are checked as in ClaimTx (idemdriver.ValidateAcquireParams),
// before any statement. Renew, Complete, Release and SaveStep check theirs
// with the matching idemdriver.Validate function first too. A call whose
// ctx has ended changes nothing.
func (s *Store) Acquire(ctx context.Context, p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
	if err := ctx.Err(); err != nil {
		return idemdriver.AcquireResult{}, err
	}
	if err := idemdriver.ValidateAcquireParams(p); err != nil {
		return idemdriver.AcquireResult{}, err
	}
	if s.dialect == Postgres {
		return pgsql.Retry(ctx, s.pg, querier{s.db}, p.Consumer, func(q *pgsql.Queries) (idemdriver.AcquireResult, error) {
			return q.Acquire(ctx, querier{s.db}, p)
		})
	}
	var last *sqlstore.LeaseRecord
	for range maxClaimAttempts {
		var (
			res idemdriver.AcquireResult
			rec *sqlstore.LeaseRecord
			err error
		)
		if s.dialect == MySQL {
			res, rec, err = s.acquireMySQL(ctx, p)
			s.stmts.noteRefused(err)
		} else {
			res, rec, err = s.acquireSQLite(ctx, p)
		}
		if err != nil || res.Acquired || res.State != 0 {
			return res, err
		}
		if rec != nil {
			last = rec
		}
	}
	// The record kept changing (or vanishing) between statements: leases
	// of a millisecond ending as fast as they are taken, or a purge.
	if last != nil {
		return last.NotAcquired(), nil
	}
	return idemdriver.AcquireResult{}, sqlstore.ErrAcquireUnsettled(p)
}

// RecordsSteps implements [idemdriver.StepRecorder]: Acquire and Release
// save the points of [idemdriver.AcquireParams].StepPrefix and
// [idemdriver.ReleaseParams].Step in the statement or transaction that
// acquires or releases, on every dialect.
func (*Store) RecordsSteps() bool { return true }

// acquireMySQL inserts a new record or, if it exists, reads it and takes
// it over when it can be.
func (s *Store) acquireMySQL(ctx context.Context, p *idemdriver.AcquireParams) (idemdriver.AcquireResult, *sqlstore.LeaseRecord, error) {
	lease := sqlstore.DurationMicros(p.Lease)
	dup, err := s.insertMySQL(ctx, p, lease)
	if err != nil {
		return idemdriver.AcquireResult{}, nil, err
	}
	if dup == 0 {
		return sqlstore.Acquired(1, 1, nil), nil, nil
	}
	// A plain read, a new snapshot (autocommit) that shows the record the
	// insert found. Completed and failed records never change again, and
	// a live lease is reported as it is; only a record that can be taken
	// over needs the locking transaction.
	var rec sqlstore.LeaseRecord
	err = s.db.QueryRowContext(ctx, s.lq.record, p.Fingerprint, p.Consumer, p.MessageID).Scan(rec.ScanArgs()...)
	if errors.Is(err, sql.ErrNoRows) {
		return idemdriver.AcquireResult{}, nil, nil // purged meanwhile: again
	}
	if err != nil {
		return idemdriver.AcquireResult{}, nil, err
	}
	if !rec.Acquirable {
		return rec.NotAcquired(), &rec, nil
	}
	return s.takeoverMySQL(ctx, p, lease)
}

// insertMySQL inserts a new record, and returns 0 when it did (1 when the
// record existed and nothing changed). With p.StepPrefix the insert and
// the point of token 1 are one transaction.
func (s *Store) insertMySQL(ctx context.Context, p *idemdriver.AcquireParams, lease int64) (uint64, error) {
	if p.StepPrefix == "" {
		r, err := s.db.ExecContext(ctx, s.lq.acquire, p.Consumer, p.MessageID, p.Fingerprint, lease)
		if err != nil {
			return 0, err
		}
		return mysqlDuplicates(r, 1)
	}
	var dup uint64
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		r, err := tx.ExecContext(ctx, s.lq.acquire, p.Consumer, p.MessageID, p.Fingerprint, lease)
		if err != nil {
			return err
		}
		if dup, err = mysqlDuplicates(r, 1); err != nil || dup != 0 {
			return err
		}
		_, err = tx.ExecContext(ctx, s.lq.point, p.Consumer, p.MessageID, idemdriver.PrefixStep(p.StepPrefix, 1))
		return err
	})
	return dup, err
}

// inTx runs fn in a transaction, committed when fn returns nil and rolled
// back otherwise.
func (s *Store) inTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// takeoverMySQL takes over an expired record in a short transaction: lock
// it, check again that it can be taken over (another caller may have taken
// it meanwhile), update it and read its recovery points.
func (s *Store) takeoverMySQL(ctx context.Context, p *idemdriver.AcquireParams, lease int64) (res idemdriver.AcquireResult, last *sqlstore.LeaseRecord, err error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return res, nil, err
	}
	defer func() {
		if err != nil || !res.Acquired {
			_ = tx.Rollback()
		}
	}()
	// Lock first, then read: MySQL's UTC_TIMESTAMP is the time its
	// statement began, so a read that waited for the lock (while another
	// caller took the record over with a new lease) would compute a
	// remaining lease longer than the lease. The second read, whose row we
	// hold, does not wait; being a locking read it shows the latest
	// version under any isolation level.
	var one int
	err = tx.QueryRowContext(ctx, s.lq.lock, p.Consumer, p.MessageID).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return res, nil, nil // purged meanwhile: again
	}
	if err != nil {
		return res, nil, err
	}
	var rec sqlstore.LeaseRecord
	if err = tx.QueryRowContext(ctx, s.lq.lockRecord, p.Fingerprint, p.Consumer, p.MessageID).Scan(rec.ScanArgs()...); err != nil {
		return res, nil, err
	}
	if !rec.Acquirable {
		return rec.NotAcquired(), &rec, nil
	}
	// The row is locked and its lease has ended: nobody can renew it or
	// take it over before we commit. token changes, so rows affected is 1
	// whatever CLIENT_FOUND_ROWS says.
	up, err := tx.ExecContext(ctx, s.lq.takeover, lease, p.Consumer, p.MessageID)
	if err != nil {
		return res, nil, err
	}
	if n, err := up.RowsAffected(); err != nil || n != 1 {
		return res, nil, fmt.Errorf("idemsql: takeover of %q updated %d rows (err %v), want 1", p.MessageID, n, err)
	}
	steps, err := sqlstore.ReadSteps(ctx, querier{tx}, s.lq.steps, p.Consumer, p.MessageID)
	if err != nil {
		return res, nil, err
	}
	if p.StepPrefix != "" {
		if _, err = tx.ExecContext(ctx, s.lq.point, p.Consumer, p.MessageID, idemdriver.PrefixStep(p.StepPrefix, rec.Token+1)); err != nil {
			return res, nil, err
		}
	}
	if err = tx.Commit(); err != nil {
		return res, nil, err
	}
	return sqlstore.Acquired(rec.Token+1, rec.Attempt+1, steps), nil, nil
}

// acquireSQLite acquires in one BEGIN IMMEDIATE transaction (the DSN's
// _txlock, which New checks): SQLite runs one writer at a time, so nothing
// changes between its statements.
func (s *Store) acquireSQLite(ctx context.Context, p *idemdriver.AcquireParams) (res idemdriver.AcquireResult, last *sqlstore.LeaseRecord, err error) {
	s.prepareSQLiteLease(ctx)
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		res, last, err = s.acquireSQLiteTx(ctx, s.prepared(tx), p)
		return err
	})
	return res, last, err
}

// acquireSQLiteTx is the body of acquireSQLite, on tx (a transaction): res
// is zero (and last set) when the record could be taken over by the time it
// was read, a case for another try.
func (s *Store) acquireSQLiteTx(ctx context.Context, tx sqlQuerier, p *idemdriver.AcquireParams) (res idemdriver.AcquireResult, last *sqlstore.LeaseRecord, err error) {
	var token, attempt int64
	err = tx.QueryRowContext(ctx, s.lq.acquire, p.Consumer, p.MessageID, p.Fingerprint, sqlstore.DurationMicros(p.Lease)).Scan(&token, &attempt)
	switch {
	case err == nil:
		var steps map[string][]byte
		if token > 1 {
			if steps, err = sqlstore.ReadSteps(ctx, querier{tx}, s.lq.steps, p.Consumer, p.MessageID); err != nil {
				return res, nil, err
			}
		}
		if p.StepPrefix != "" {
			if _, err = tx.ExecContext(ctx, s.lq.point, p.Consumer, p.MessageID, idemdriver.PrefixStep(p.StepPrefix, token)); err != nil {
				return res, nil, err
			}
		}
		return sqlstore.Acquired(token, attempt, steps), nil, nil
	case !errors.Is(err, sql.ErrNoRows):
		return res, nil, err
	}
	var rec sqlstore.LeaseRecord
	if err = tx.QueryRowContext(ctx, s.lq.record, p.Consumer, p.MessageID, p.Fingerprint).Scan(rec.ScanArgs()...); err != nil {
		return res, nil, err
	}
	if rec.Acquirable {
		// The lease ended between the two statements (SQLite's clock moved
		// on a millisecond): again.
		return res, &rec, nil
	}
	return rec.NotAcquired(), &rec, nil
}

// Renew implements [idemdriver.LeaseStore]: one UPDATE that sets the lease to the
// server's now plus p.Lease, only while p.Token owns the record (in_progress
// with that token; an expired lease that nobody took over is still owned).
// Otherwise it returns an error matching idemdriver.ErrLeaseLost.
func (s *Store) Renew(ctx context.Context, p *idemdriver.RenewParams) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := idemdriver.ValidateRenewParams(p); err != nil {
		return err
	}
	if s.dialect == Postgres {
		return s.pgRetry(ctx, p.Consumer, func(q *pgsql.Queries) error { return q.Renew(ctx, querier{s.db}, p) })
	}
	return sqlstore.Fenced(ctx, querier{s.preparedOnDB()}, "renew", p.Consumer, p.MessageID, p.Token, s.lq.renew,
		sqlstore.DurationMicros(p.Lease), p.Consumer, p.MessageID, p.Token)
}

// Complete implements [idemdriver.LeaseStore]: one UPDATE, fenced by p.Token,
// that makes the record completed with p.Result (stored byte for byte; nil
// is stored as empty) and p.ContentType, ends the lease and stamps the
// record time (so the retention window counts from completion). The
// fingerprint stays. Otherwise an error matching idemdriver.ErrLeaseLost.
//
// The content type must be valid UTF-8 without NUL bytes, at most
// [MaxContentTypeLength] bytes (an error matching idemdriver.ErrInvalidConfig
// otherwise), so that it is stored as it is on every dialect.
func (s *Store) Complete(ctx context.Context, p *idemdriver.CompleteParams) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := idemdriver.ValidateCompleteParams(p); err != nil {
		return err
	}
	if err := sqlstore.CheckContentType(p.ContentType); err != nil {
		return err
	}
	if s.dialect == Postgres {
		return s.pgRetry(ctx, p.Consumer, func(q *pgsql.Queries) error { return q.Complete(ctx, querier{s.db}, p) })
	}
	return sqlstore.Fenced(ctx, querier{s.preparedOnDB()}, "complete", p.Consumer, p.MessageID, p.Token, s.lq.complete,
		sqlstore.NonNil(p.Result), p.ContentType, p.Consumer, p.MessageID, p.Token)
}

// Release implements [idemdriver.LeaseStore]: one UPDATE, fenced by p.Token,
// that ends the lease now, keeps the error text, and moves the record's
// token on by one so that the released attempt owns nothing (the next
// attempt's token is one more again). With p.Terminal the record becomes
// failed. The attempt count and the recovery points stay. Otherwise an
// error matching idemdriver.ErrLeaseLost.
//
// With p.Step ([idemdriver.StepRecorder]) the recovery point is saved with
// the release: on PostgreSQL in the same statement (a data-modifying CTE
// on the row the UPDATE changed); on MySQL and SQLite in one transaction,
// the UPDATE then the point.
//
// The error text is stored as valid UTF-8 without NUL bytes (others become
// U+FFFD), cut to at most [MaxErrorTextLength] bytes: PostgreSQL text holds
// nothing else, and a failure must never fail to be recorded.
func (s *Store) Release(ctx context.Context, p *idemdriver.ReleaseParams) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := idemdriver.ValidateReleaseParams(p); err != nil {
		return err
	}
	if s.dialect == Postgres {
		return s.pgRetry(ctx, p.Consumer, func(q *pgsql.Queries) error { return q.Release(ctx, querier{s.db}, p) })
	}
	terminal := 0
	if p.Terminal {
		terminal = 1
	}
	args := []any{sqlstore.ErrorText(p.Error), terminal, p.Consumer, p.MessageID, p.Token}
	if p.Step == "" {
		return sqlstore.Fenced(ctx, querier{s.preparedOnDB()}, "release", p.Consumer, p.MessageID, p.Token, s.lq.release, args...)
	}
	return s.inTx(ctx, func(tx *sql.Tx) error {
		if err := sqlstore.Fenced(ctx, querier{tx}, "release", p.Consumer, p.MessageID, p.Token, s.lq.release, args...); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, s.lq.point, p.Consumer, p.MessageID, p.Step)
		return err
	})
}

// SaveStep implements [idemdriver.LeaseStore]: it inserts the recovery point only
// if p.Token owns the record; a step saved before keeps its first result.
// An error matching idemdriver.ErrLeaseLost if the token owns nothing.
//
//   - PostgreSQL: one statement, INSERT ... SELECT FROM (the record, locked
//     FOR SHARE while the token owns it) ON CONFLICT DO NOTHING.
//   - MySQL: a short transaction: a locking read of the record (LOCK IN
//     SHARE MODE) while the token owns it, then INSERT ... ON DUPLICATE KEY
//     UPDATE that keeps an existing step.
//   - SQLite: one statement, INSERT ... SELECT ... ON CONFLICT DO UPDATE
//     (a no-op), judged by rows affected.
//
// p is checked first (idemdriver.ValidateStepParams): step names follow
// the rules of message IDs, up to idemdriver.MaxStepNameLength bytes (an
// error matching idemdriver.ErrInvalidConfig otherwise).
func (s *Store) SaveStep(ctx context.Context, p *idemdriver.StepParams) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := idemdriver.ValidateStepParams(p); err != nil {
		return err
	}
	switch s.dialect {
	case Postgres:
		return s.pgRetry(ctx, p.Consumer, func(q *pgsql.Queries) error { return q.SaveStep(ctx, querier{s.db}, p) })
	case MySQL:
		return s.saveStepMySQL(ctx, p, sqlstore.NonNil(p.Result))
	}
	return sqlstore.Fenced(ctx, querier{s.preparedOnDB()}, "save step", p.Consumer, p.MessageID, p.Token, s.lq.saveStep,
		p.Consumer, p.MessageID, p.Token, p.Step, sqlstore.NonNil(p.Result))
}

func (s *Store) saveStepMySQL(ctx context.Context, p *idemdriver.StepParams, result []byte) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		var one int
		err := tx.QueryRowContext(ctx, s.lq.ownStep, p.Consumer, p.MessageID, p.Token).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			return sqlstore.LeaseLost("save step", p.Consumer, p.MessageID, p.Token)
		}
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, s.lq.saveStep, p.Consumer, p.MessageID, p.Step, result)
		return err
	})
}

// purgeBatchMySQL deletes a batch in one short transaction: a locking
// SELECT of the batch (oldest first), then DELETEs of the records and of
// the steps of those that were lease-mode records.
func (s *Store) purgeBatchMySQL(ctx context.Context, conn purgeConn, consumer string, horizon int64, batch int) (n int64, err error) {
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	ids, leased, err := purgeIDs(ctx, tx, s.lq.purgeBatch, consumer, horizon, int64(batch))
	if err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, tx.Commit()
	}
	if n, err = deleteIn(ctx, tx, s.lq.purgeRecords, consumer, ids, false); err != nil {
		return 0, err
	}
	if _, err = deleteIn(ctx, tx, s.lq.purgeSteps, consumer, leased, false); err != nil {
		return 0, err
	}
	return n, tx.Commit()
}

// purgeBatchSQLite deletes a batch in one BEGIN IMMEDIATE transaction:
// DELETE ... RETURNING of the records, then of the steps of those that were
// lease-mode records.
func (s *Store) purgeBatchSQLite(ctx context.Context, conn purgeConn, consumer string, horizon int64, batch int) (n int64, err error) {
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	ids, leased, err := purgeIDs(ctx, tx, s.lq.purgeBatch, consumer, horizon, int64(batch))
	if err != nil {
		return 0, err
	}
	if _, err = deleteIn(ctx, tx, s.lq.purgeSteps, consumer, leased, true); err != nil {
		return 0, err
	}
	return int64(len(ids)), tx.Commit()
}

// purgeIDs runs a batch query returning (message ID, token) rows: all the
// IDs, and those of lease-mode records (token > 0), which may have steps.
func purgeIDs(ctx context.Context, tx *sql.Tx, query string, args ...any) (ids, leased []string, err error) {
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			id    string
			token int64
		)
		if err := rows.Scan(&id, &token); err != nil {
			return nil, nil, err
		}
		ids = append(ids, id)
		if token > 0 {
			leased = append(leased, id)
		}
	}
	return ids, leased, rows.Err()
}

// deleteIn runs prefix + an IN list of ids + ")" in chunks, with the
// consumer as the first argument, and returns the rows deleted. numbered
// selects SQLite's ?NNN placeholders.
func deleteIn(ctx context.Context, tx *sql.Tx, prefix, consumer string, ids []string, numbered bool) (int64, error) {
	var total int64
	for part := range slices.Chunk(ids, purgeIDChunk) {
		var b strings.Builder
		b.WriteString(prefix)
		args := make([]any, 0, 1+len(part))
		args = append(args, consumer)
		for i, id := range part {
			if i > 0 {
				b.WriteString(", ")
			}
			if numbered {
				fmt.Fprintf(&b, "?%d", i+2)
			} else {
				b.WriteByte('?')
			}
			args = append(args, id)
		}
		b.WriteByte(')')
		r, err := tx.ExecContext(ctx, b.String(), args...)
		if err != nil {
			return 0, err
		}
		n, err := r.RowsAffected()
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

// pgRetry runs f on the pool with the statements of the PostgreSQL
// table's shape for consumer, again once when the shape changed under it
// (pgsql.Retry).
func (s *Store) pgRetry(ctx context.Context, consumer string, f func(q *pgsql.Queries) error) error {
	_, err := pgsql.Retry(ctx, s.pg, querier{s.db}, consumer, func(q *pgsql.Queries) (struct{}, error) { return struct{}{}, f(q) })
	return err
}
