package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// Limits of the lease-mode text columns, the same on every dialect.
const (
	// MaxContentTypeLength is the longest content type Complete stores,
	// in bytes. Content types are also valid UTF-8 without NUL bytes.
	MaxContentTypeLength = 1024
	// MaxErrorTextLength is the longest error text Release stores, in
	// bytes; a longer one is cut (at a character boundary).
	MaxErrorTextLength = 64 << 10
	// maxStepNameLength is the longest recovery point name.
	maxStepNameLength = 255
	// purgeIDChunk is the most message IDs one DELETE ... IN lists.
	purgeIDChunk = 500
)

// Lease-mode record states, as the state column stores them.
const (
	stateInProgress = int64(idemdriver.StateInProgress)
	stateCompleted  = int64(idemdriver.StateCompleted)
)

// leaseRecord is a record as recordCols reads it.
type leaseRecord struct {
	state       int64
	token       int64
	attempt     int64
	fingerprint []byte
	remainingUS int64
	result      []byte
	contentType sql.NullString
	lastError   sql.NullString
	// acquirable: in_progress, lease ended, same fingerprint as the
	// caller's, at the time of the read (the server's clock).
	acquirable bool
}

func (r *leaseRecord) scanArgs() []any {
	return []any{&r.state, &r.token, &r.attempt, &r.fingerprint, &r.remainingUS, &r.result, &r.contentType, &r.lastError, &r.acquirable}
}

// notAcquired reports r to a caller that did not acquire it.
func (r *leaseRecord) notAcquired() idemdriver.AcquireResult {
	res := idemdriver.AcquireResult{
		State:       idemdriver.RecordState(r.state),
		Attempt:     int(r.attempt),
		Fingerprint: r.fingerprint,
		Error:       r.lastError.String,
	}
	if r.state == stateInProgress && r.remainingUS > 0 {
		res.LeaseRemaining = time.Duration(r.remainingUS) * time.Microsecond
	}
	if r.state == stateCompleted {
		res.Result, res.ContentType = r.result, r.contentType.String
	}
	return res
}

// leaseMicros is a lease in whole microseconds, rounded up so that a
// positive lease is never 0.
func leaseMicros(d time.Duration) int64 {
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}

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
// p.Lease must be positive (an error matching idem.ErrInvalidConfig
// otherwise: a zero lease never means "no expiry"); names and the
// fingerprint are checked as in ClaimTx.
func (s *Store) Acquire(ctx context.Context, p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
	if err := ctx.Err(); err != nil {
		return idemdriver.AcquireResult{}, err
	}
	if err := idemdriver.ValidateAcquireParams(p); err != nil {
		return idemdriver.AcquireResult{}, err
	}
	var last *leaseRecord
	for range maxClaimAttempts {
		var (
			res idemdriver.AcquireResult
			rec *leaseRecord
			err error
		)
		switch s.dialect {
		case Postgres:
			res, rec, err = s.acquirePostgres(ctx, p)
		case MySQL:
			res, rec, err = s.acquireMySQL(ctx, p)
		default:
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
		return last.notAcquired(), nil
	}
	return idemdriver.AcquireResult{}, fmt.Errorf("idemsql: acquire of %q: the record kept changing", p.MessageID)
}

// acquired is the result of an Acquire that holds the lease now.
func acquired(token, attempt int64, steps map[string][]byte) idemdriver.AcquireResult {
	if steps == nil {
		steps = map[string][]byte{}
	}
	return idemdriver.AcquireResult{Acquired: true, Token: token, Attempt: int(attempt), Steps: steps}
}

// acquirePostgres runs the acquire statement once. A zero result without
// error means "run again"; rec is the record it saw, if any.
func (s *Store) acquirePostgres(ctx context.Context, p *idemdriver.AcquireParams) (idemdriver.AcquireResult, *leaseRecord, error) {
	var (
		won bool
		r   leaseRecord
	)
	err := s.db.QueryRowContext(ctx, s.lq.acquire, p.Consumer, p.MessageID, p.Fingerprint, leaseMicros(p.Lease)).
		Scan(append([]any{&won}, r.scanArgs()...)...)
	if errors.Is(err, sql.ErrNoRows) {
		// Inserted by a transaction the statement waited for (invisible to
		// its snapshot), or deleted meanwhile: again.
		return idemdriver.AcquireResult{}, nil, nil
	}
	if err != nil {
		return idemdriver.AcquireResult{}, nil, err
	}
	if won {
		var steps map[string][]byte
		if r.token > 1 {
			// A new statement: it sees every step committed before the
			// takeover (a stale owner's SaveStep that held the row lock the
			// takeover waited for included).
			if steps, err = readSteps(ctx, s.db, s.lq.steps, p.Consumer, p.MessageID); err != nil {
				return idemdriver.AcquireResult{}, nil, err
			}
		}
		return acquired(r.token, r.attempt, steps), nil, nil
	}
	if r.acquirable {
		// The snapshot shows a record the DO UPDATE would have taken: the
		// row it saw was newer. Again.
		return idemdriver.AcquireResult{}, &r, nil
	}
	return r.notAcquired(), &r, nil
}

// acquireMySQL inserts a new record or, if it exists, reads it and takes
// it over when it can be.
func (s *Store) acquireMySQL(ctx context.Context, p *idemdriver.AcquireParams) (idemdriver.AcquireResult, *leaseRecord, error) {
	lease := leaseMicros(p.Lease)
	r, err := s.db.ExecContext(ctx, s.lq.acquire, p.Consumer, p.MessageID, p.Fingerprint, lease)
	if err != nil {
		return idemdriver.AcquireResult{}, nil, err
	}
	dup, err := mysqlDuplicates(r, 1)
	if err != nil {
		return idemdriver.AcquireResult{}, nil, err
	}
	if dup == 0 {
		return acquired(1, 1, nil), nil, nil
	}
	// A plain read, a new snapshot (autocommit) that shows the record the
	// insert found. Completed and failed records never change again, and
	// a live lease is reported as it is; only a record that can be taken
	// over needs the locking transaction.
	var rec leaseRecord
	err = s.db.QueryRowContext(ctx, s.lq.record, p.Fingerprint, p.Consumer, p.MessageID).Scan(rec.scanArgs()...)
	if errors.Is(err, sql.ErrNoRows) {
		return idemdriver.AcquireResult{}, nil, nil // purged meanwhile: again
	}
	if err != nil {
		return idemdriver.AcquireResult{}, nil, err
	}
	if !rec.acquirable {
		return rec.notAcquired(), &rec, nil
	}
	return s.takeoverMySQL(ctx, p, lease)
}

// takeoverMySQL takes over an expired record in a short transaction: lock
// it, check again that it can be taken over (another caller may have taken
// it meanwhile), update it and read its recovery points.
func (s *Store) takeoverMySQL(ctx context.Context, p *idemdriver.AcquireParams, lease int64) (res idemdriver.AcquireResult, last *leaseRecord, err error) {
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
	var rec leaseRecord
	if err = tx.QueryRowContext(ctx, s.lq.lockRecord, p.Fingerprint, p.Consumer, p.MessageID).Scan(rec.scanArgs()...); err != nil {
		return res, nil, err
	}
	if !rec.acquirable {
		return rec.notAcquired(), &rec, nil
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
	steps, err := readSteps(ctx, tx, s.lq.steps, p.Consumer, p.MessageID)
	if err != nil {
		return res, nil, err
	}
	if err := tx.Commit(); err != nil {
		return res, nil, err
	}
	return acquired(rec.token+1, rec.attempt+1, steps), nil, nil
}

// acquireSQLite acquires in one BEGIN IMMEDIATE transaction (the DSN's
// _txlock, which New checks): SQLite runs one writer at a time, so nothing
// changes between its statements.
func (s *Store) acquireSQLite(ctx context.Context, p *idemdriver.AcquireParams) (res idemdriver.AcquireResult, last *leaseRecord, err error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return res, nil, err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	var token, attempt int64
	err = tx.QueryRowContext(ctx, s.lq.acquire, p.Consumer, p.MessageID, p.Fingerprint, leaseMicros(p.Lease)).Scan(&token, &attempt)
	switch {
	case err == nil:
		var steps map[string][]byte
		if token > 1 {
			if steps, err = readSteps(ctx, tx, s.lq.steps, p.Consumer, p.MessageID); err != nil {
				return res, nil, err
			}
		}
		if err = tx.Commit(); err != nil {
			return res, nil, err
		}
		return acquired(token, attempt, steps), nil, nil
	case !errors.Is(err, sql.ErrNoRows):
		return res, nil, err
	}
	var rec leaseRecord
	if err = tx.QueryRowContext(ctx, s.lq.record, p.Consumer, p.MessageID, p.Fingerprint).Scan(rec.scanArgs()...); err != nil {
		return res, nil, err
	}
	if err = tx.Commit(); err != nil {
		return res, nil, err
	}
	if rec.acquirable {
		// The lease ended between the two statements (SQLite's clock moved
		// on a millisecond): again.
		return res, &rec, nil
	}
	return rec.notAcquired(), &rec, nil
}

// queryer is a *sql.DB or *sql.Tx.
type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// readSteps reads a record's recovery points.
func readSteps(ctx context.Context, q queryer, query, consumer, id string) (map[string][]byte, error) {
	rows, err := q.QueryContext(ctx, query, consumer, id)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	steps := map[string][]byte{}
	for rows.Next() {
		var (
			name string
			res  []byte
		)
		if err := rows.Scan(&name, &res); err != nil {
			return nil, err
		}
		if res == nil {
			res = []byte{}
		}
		steps[name] = res
	}
	return steps, rows.Err()
}

// leaseLost is the error of a fenced write whose token owns nothing.
func leaseLost(op, consumer, id string, token int64) error {
	return fmt.Errorf("%w: idemsql: %s of message %q (consumer %q): token %d does not own the record (another attempt took over, or the attempt ended)",
		idem.ErrLeaseLost, op, id, consumer, token)
}

// fenced runs one conditional UPDATE whose WHERE holds only while the token
// owns the record, and judges it by rows affected (every fenced UPDATE
// changes a column, so a MySQL server counts the row with or without
// CLIENT_FOUND_ROWS).
func (s *Store) fenced(ctx context.Context, op, consumer, id string, token int64, query string, args ...any) error {
	r, err := s.db.ExecContext(ctx, query, args...)
	if err != nil {
		return err
	}
	n, err := r.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return leaseLost(op, consumer, id, token)
	}
	return nil
}

// checkLeaseWrite checks the names of a fenced write.
func checkLeaseWrite(ctx context.Context, consumer, id string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := idem.ValidateConsumerName(consumer); err != nil {
		return err
	}
	return idem.ValidateMessageID(id, 0)
}

// Renew implements [idemdriver.LeaseStore]: one UPDATE that sets the lease to the
// server's now plus p.Lease, only while p.Token owns the record (in_progress
// with that token; an expired lease that nobody took over is still owned).
// Otherwise it returns an error matching idem.ErrLeaseLost.
func (s *Store) Renew(ctx context.Context, p *idemdriver.RenewParams) error {
	if err := checkLeaseWrite(ctx, p.Consumer, p.MessageID); err != nil {
		return err
	}
	if p.Lease <= 0 {
		return fmt.Errorf("%w: idemsql: lease %v, want a positive duration", idem.ErrInvalidConfig, p.Lease)
	}
	lease := leaseMicros(p.Lease)
	args := []any{lease, p.Consumer, p.MessageID, p.Token}
	return s.fenced(ctx, "renew", p.Consumer, p.MessageID, p.Token, s.lq.renew, args...)
}

// Complete implements [idemdriver.LeaseStore]: one UPDATE, fenced by p.Token,
// that makes the record completed with p.Result (stored byte for byte; nil
// is stored as empty) and p.ContentType, ends the lease and stamps the
// record time (so the retention window counts from completion). The
// fingerprint stays. Otherwise an error matching idem.ErrLeaseLost.
//
// The content type must be valid UTF-8 without NUL bytes, at most
// [MaxContentTypeLength] bytes (an error matching idem.ErrInvalidConfig
// otherwise), so that it is stored as it is on every dialect.
func (s *Store) Complete(ctx context.Context, p *idemdriver.CompleteParams) error {
	if err := checkLeaseWrite(ctx, p.Consumer, p.MessageID); err != nil {
		return err
	}
	if err := checkText("content type", p.ContentType, MaxContentTypeLength); err != nil {
		return err
	}
	result := p.Result
	if result == nil {
		result = []byte{}
	}
	return s.fenced(ctx, "complete", p.Consumer, p.MessageID, p.Token, s.lq.complete,
		result, p.ContentType, p.Consumer, p.MessageID, p.Token)
}

// Release implements [idemdriver.LeaseStore]: one UPDATE, fenced by p.Token,
// that ends the lease now, keeps the error text, and moves the record's
// token on by one so that the released attempt owns nothing (the next
// attempt's token is one more again). With p.Terminal the record becomes
// failed. The attempt count and the recovery points stay. Otherwise an
// error matching idem.ErrLeaseLost.
//
// The error text is stored as valid UTF-8 without NUL bytes (others become
// U+FFFD), cut to at most [MaxErrorTextLength] bytes: PostgreSQL text holds
// nothing else, and a failure must never fail to be recorded.
func (s *Store) Release(ctx context.Context, p *idemdriver.ReleaseParams) error {
	if err := checkLeaseWrite(ctx, p.Consumer, p.MessageID); err != nil {
		return err
	}
	terminal := 0
	if p.Terminal {
		terminal = 1
	}
	return s.fenced(ctx, "release", p.Consumer, p.MessageID, p.Token, s.lq.release,
		errorText(p.Error), terminal, p.Consumer, p.MessageID, p.Token)
}

// SaveStep implements [idemdriver.LeaseStore]: it inserts the recovery point only
// if p.Token owns the record; a step saved before keeps its first result.
// An error matching idem.ErrLeaseLost if the token owns nothing.
//
//   - PostgreSQL: one statement, INSERT ... SELECT FROM (the record, locked
//     FOR SHARE while the token owns it) ON CONFLICT DO NOTHING.
//   - MySQL: a short transaction: a locking read of the record (LOCK IN
//     SHARE MODE) while the token owns it, then INSERT ... ON DUPLICATE KEY
//     UPDATE that keeps an existing step.
//   - SQLite: one statement, INSERT ... SELECT ... ON CONFLICT DO UPDATE
//     (a no-op), judged by rows affected.
//
// Step names are 1 to 255 bytes of valid UTF-8 without NUL bytes (an
// error matching idem.ErrInvalidConfig otherwise).
func (s *Store) SaveStep(ctx context.Context, p *idemdriver.StepParams) error {
	if err := checkLeaseWrite(ctx, p.Consumer, p.MessageID); err != nil {
		return err
	}
	if p.Step == "" {
		return fmt.Errorf("%w: idemsql: empty step name", idem.ErrInvalidConfig)
	}
	if err := checkText("step name", p.Step, maxStepNameLength); err != nil {
		return err
	}
	result := p.Result
	if result == nil {
		result = []byte{}
	}
	switch s.dialect {
	case Postgres:
		var owned int64
		if err := s.db.QueryRowContext(ctx, s.lq.saveStep, p.Consumer, p.MessageID, p.Token, p.Step, result).Scan(&owned); err != nil {
			return err
		}
		if owned == 0 {
			return leaseLost("save step", p.Consumer, p.MessageID, p.Token)
		}
		return nil
	case MySQL:
		return s.saveStepMySQL(ctx, p, result)
	default:
		return s.fenced(ctx, "save step", p.Consumer, p.MessageID, p.Token, s.lq.saveStep,
			p.Consumer, p.MessageID, p.Token, p.Step, result)
	}
}

func (s *Store) saveStepMySQL(ctx context.Context, p *idemdriver.StepParams, result []byte) (err error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	var one int
	err = tx.QueryRowContext(ctx, s.lq.ownStep, p.Consumer, p.MessageID, p.Token).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return leaseLost("save step", p.Consumer, p.MessageID, p.Token)
	}
	if err != nil {
		return err
	}
	if _, err = tx.ExecContext(ctx, s.lq.saveStep, p.Consumer, p.MessageID, p.Step, result); err != nil {
		return err
	}
	return tx.Commit()
}

// checkText checks a text column's value: at most max bytes of valid
// UTF-8 without NUL bytes.
func checkText(what, s string, max int) error {
	switch {
	case len(s) > max:
		return fmt.Errorf("%w: idemsql: %s of %d bytes, over the maximum of %d", idem.ErrInvalidConfig, what, len(s), max)
	case !utf8.ValidString(s):
		return fmt.Errorf("%w: idemsql: %s %q is not valid UTF-8", idem.ErrInvalidConfig, what, s)
	case strings.IndexByte(s, 0) >= 0:
		return fmt.Errorf("%w: idemsql: %s %q contains a NUL byte", idem.ErrInvalidConfig, what, s)
	}
	return nil
}

// errorText makes s storable as text on every dialect: valid UTF-8, no NUL
// bytes, at most MaxErrorTextLength bytes.
func errorText(s string) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	if len(s) > MaxErrorTextLength {
		cut := MaxErrorTextLength
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
	return s
}

// purgeBatch deletes one batch of p.Consumer's completed and failed
// records written before horizon (µs), with their recovery points, and
// returns how many records it deleted. in_progress records are never
// deleted.
func (s *Store) purgeBatch(ctx context.Context, conn purgeConn, consumer string, horizon int64, batch int) (int64, error) {
	switch s.dialect {
	case Postgres:
		// One statement: the batch (FOR UPDATE SKIP LOCKED), the records
		// and their steps.
		var n int64
		err := conn.QueryRowContext(ctx, s.lq.purgeBatch, consumer, horizon, int64(batch)).Scan(&n)
		return n, err
	case MySQL:
		return s.purgeBatchMySQL(ctx, conn, consumer, horizon, batch)
	default:
		return s.purgeBatchSQLite(ctx, conn, consumer, horizon, batch)
	}
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
