package idempgxv5

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/jackc/pgx/v5"
)

// The store implements lease mode too.
var _ idemdriver.LeaseStore = (*Store)(nil)

// Limits of the lease-mode text columns, the same as store/idemsql's.
const (
	// MaxContentTypeLength is the longest content type Complete stores,
	// in bytes. Content types are also valid UTF-8 without NUL bytes.
	MaxContentTypeLength = 1024
	// MaxErrorTextLength is the longest error text Release stores, in
	// bytes; a longer one is cut (at a character boundary).
	MaxErrorTextLength = 64 << 10
	// maxStepNameLength is the longest recovery point name.
	maxStepNameLength = 255
	// maxAcquireAttempts bounds how often one Acquire runs its statement
	// again when the record changed under it (see acquireOnce).
	maxAcquireAttempts = 4
)

// stateInProgress is the state column's value for idemdriver.StateInProgress.
const stateInProgress = int16(idemdriver.StateInProgress)

// leaseQueries holds the lease-mode statements of one Store, with its
// table names filled in once (so pgx's statement cache sees one text per
// statement). Leases and remaining leases cross the wire as bigint
// microseconds; every time is computed by the server (now()). They are
// store/idemsql's PostgreSQL statements, so the two stores behave the same
// on one table.
type leaseQueries struct {
	// acquire: consumer, message ID, fingerprint, lease (µs) -> acquired,
	// then the columns of recordCols.
	acquire string
	// steps: consumer, message ID -> step, result.
	steps string
	// renew: lease (µs), consumer, message ID, token.
	renew string
	// complete: result, content type, consumer, message ID, token.
	complete string
	// release: error text, terminal, consumer, message ID, token.
	release string
	// saveStep: consumer, message ID, token, step, result -> 1 if the token
	// owns the record (the step is then saved, or was already), else 0.
	saveStep string
}

func newLeaseQueries(t string) leaseQueries {
	steps := t + `_steps`
	micros := func(x string) string { return `(extract(epoch from ` + x + `) * 1000000)::bigint` }
	// The record as Acquire reports it: state, token, attempt, fingerprint,
	// remaining lease (µs, 0 unless live), result, content type, last
	// error, and whether the caller could take it over now (in_progress,
	// lease ended, same fingerprint).
	//
	// The remaining lease is counted from clock_timestamp(), not now():
	// now() is the time the statement's transaction started (at Bind),
	// which can be earlier than the now() of a takeover or renewal that
	// committed before this statement took its snapshot (at Execute), so
	// lease_expires_at - now() could exceed the lease that was granted.
	// clock_timestamp() is read after the snapshot, so it never is.
	cols := `state, token, attempt, fingerprint,
	CASE WHEN lease_expires_at > now() THEN GREATEST(` + micros(`lease_expires_at`) + ` - ` + micros(`clock_timestamp()`) + `, 0) ELSE 0 END,
	result, content_type, last_error,
	COALESCE(state = 1 AND lease_expires_at <= now() AND fingerprint = $3::bytea, false)`
	pk := `consumer = $1::text AND message_id = $2::text`
	return leaseQueries{
		// One statement inserts a new record, or takes over an expired one
		// (the DO UPDATE runs only when its WHERE holds, judged on the
		// latest committed version of the row, which ON CONFLICT locks),
		// and otherwise reads the record as of the statement's snapshot.
		// The read is a branch with a one-time filter on "up", so a new
		// message costs the INSERT alone. The snapshot misses a record
		// committed by a transaction the insert waited for (no row at
		// all), and may show an older version than the one the WHERE saw:
		// a record that could be taken over although the DO UPDATE did not
		// take it. In both cases Acquire runs the statement again.
		acquire: `WITH up AS (
	INSERT INTO ` + t + ` AS r (consumer, message_id, fingerprint, processed_at, state, token, attempt, lease_expires_at, updated_at)
	VALUES ($1::text, $2::text, $3::bytea, now(), 1, 1, 1, now() + $4::bigint * interval '1 microsecond', now())
	ON CONFLICT (consumer, message_id) DO UPDATE
	SET token = r.token + 1, attempt = r.attempt + 1, lease_expires_at = excluded.lease_expires_at,
		processed_at = excluded.processed_at, updated_at = excluded.updated_at
	WHERE r.state = 1 AND r.lease_expires_at <= now() AND r.fingerprint = excluded.fingerprint
	RETURNING r.token, r.attempt
)
SELECT true, 0::smallint, token, attempt, NULL::bytea, 0::bigint, NULL::bytea, NULL::text, NULL::text, false FROM up
UNION ALL
SELECT false, ` + cols + ` FROM ` + t + `
WHERE ` + pk + ` AND NOT EXISTS (SELECT FROM up)`,
		steps: `SELECT step, result FROM ` + steps + ` WHERE ` + pk,
		renew: `UPDATE ` + t + ` SET lease_expires_at = now() + $1::bigint * interval '1 microsecond', updated_at = now()
WHERE consumer = $2::text AND message_id = $3::text AND state = 1 AND token = $4::bigint`,
		complete: `UPDATE ` + t + ` SET state = 2, result = $1::bytea, content_type = $2::text,
	lease_expires_at = now(), processed_at = now(), updated_at = now()
WHERE consumer = $3::text AND message_id = $4::text AND state = 1 AND token = $5::bigint`,
		release: `UPDATE ` + t + ` SET state = CASE WHEN $2::boolean THEN 3 ELSE 1 END, token = token + 1, last_error = $1::text,
	lease_expires_at = now(), processed_at = now(), updated_at = now()
WHERE consumer = $3::text AND message_id = $4::text AND state = 1 AND token = $5::bigint`,
		// FOR SHARE conflicts with the row lock of a takeover, Complete or
		// Release; under READ COMMITTED the owner check is then made again
		// on the row they committed, so a stale owner's step is never
		// saved after a takeover. The INSERT runs whether or not the outer
		// SELECT reads it (a data-modifying CTE always runs).
		saveStep: `WITH owner AS (
	SELECT FROM ` + t + `
	WHERE ` + pk + ` AND state = 1 AND token = $3::bigint
	FOR SHARE
), ins AS (
	INSERT INTO ` + steps + ` (consumer, message_id, step, result, created_at)
	SELECT $1::text, $2::text, $4::text, $5::bytea, now() FROM owner
	ON CONFLICT (consumer, message_id, step) DO NOTHING
)
SELECT count(*) FROM owner`,
	}
}

// leaseRecord is an existing record as the acquire statement reads it.
type leaseRecord struct {
	state       int16
	token       int64
	attempt     int64
	fingerprint []byte
	remainingUS int64
	result      []byte
	contentType *string
	lastError   *string
	// acquirable: in_progress, lease ended, same fingerprint as the
	// caller's, as of the statement's snapshot.
	acquirable bool
}

// notAcquired reports r to a caller that did not acquire it.
func (r *leaseRecord) notAcquired() idemdriver.AcquireResult {
	res := idemdriver.AcquireResult{
		State:       idemdriver.RecordState(r.state),
		Attempt:     int(r.attempt),
		Fingerprint: r.fingerprint,
	}
	if r.lastError != nil {
		res.Error = *r.lastError
	}
	if r.state == stateInProgress && r.remainingUS > 0 {
		res.LeaseRemaining = time.Duration(r.remainingUS) * time.Microsecond
	}
	if res.State == idemdriver.StateCompleted {
		res.Result = r.result
		if r.contentType != nil {
			res.ContentType = *r.contentType
		}
	}
	return res
}

// leaseMicros is a lease in whole microseconds, rounded up so that a
// positive lease is never 0 (field case C08).
func leaseMicros(d time.Duration) int64 {
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}

// Acquire implements [idemdriver.LeaseStore] with one statement, INSERT ... ON
// CONFLICT (consumer, message_id) DO UPDATE ... WHERE <in_progress, lease
// ended (lease_expires_at <= now()), same fingerprint> RETURNING, whose
// outer SELECT also reads the record when it did not acquire it:
//
//   - a new message is inserted in_progress with token 1, attempt 1 and a
//     lease until the server's now() plus p.Lease (one round trip);
//   - an in_progress record whose lease has ended, or was released, and
//     whose fingerprint is p.Fingerprint is taken over: the next token and
//     attempt, a new lease; one more statement then reads the recovery
//     points saved so far (a new snapshot, which sees a step that a stale
//     owner committed while the takeover waited for the row lock);
//   - otherwise the record is reported as it is: state, attempts,
//     fingerprint, remaining lease (computed by the server, in
//     microseconds), stored result and last error.
//
// Of concurrent calls exactly one acquires: ON CONFLICT locks the row and
// judges the WHERE on its latest committed version. When the statement's
// snapshot shows no record (one that a transaction the insert waited for
// committed) or a record the WHERE would have taken (it changed since),
// the statement runs again with a new snapshot.
//
// p.Lease must be positive (an error matching idem.ErrInvalidConfig
// otherwise: a zero lease never means "no expiry"); the names must be
// valid and the fingerprint 1 to idem.MaxFingerprintLength bytes.
func (s *Store) Acquire(ctx context.Context, p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
	if err := ctx.Err(); err != nil {
		return idemdriver.AcquireResult{}, err
	}
	if err := idemdriver.ValidateAcquireParams(p); err != nil {
		return idemdriver.AcquireResult{}, err
	}
	var last *leaseRecord
	for range maxAcquireAttempts {
		res, rec, settled, err := s.acquireOnce(ctx, p)
		if err != nil || settled {
			return res, err
		}
		if rec != nil {
			last = rec
		}
	}
	// The record kept changing (or vanishing) between snapshots: leases
	// ending as fast as they are taken, or a purge. Report what was seen.
	if last != nil {
		return last.notAcquired(), nil
	}
	return idemdriver.AcquireResult{}, fmt.Errorf("idempgxv5: acquire of consumer %q, message ID %q did not settle after %d attempts",
		p.Consumer, p.MessageID, maxAcquireAttempts)
}

// acquireOnce runs the acquire statement once. settled is false when the
// statement must run again; rec is then the record it saw, if any.
func (s *Store) acquireOnce(ctx context.Context, p *idemdriver.AcquireParams) (res idemdriver.AcquireResult, rec *leaseRecord, settled bool, err error) {
	var (
		won bool
		r   leaseRecord
	)
	err = s.pool.QueryRow(ctx, s.lq.acquire, p.Consumer, p.MessageID, p.Fingerprint, leaseMicros(p.Lease)).
		Scan(&won, &r.state, &r.token, &r.attempt, &r.fingerprint, &r.remainingUS, &r.result, &r.contentType, &r.lastError, &r.acquirable)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// Inserted by a transaction the statement waited for (invisible
		// to its snapshot), or deleted meanwhile: again.
		return res, nil, false, nil
	case err != nil:
		return res, nil, false, err
	}
	if won {
		steps := map[string][]byte{}
		if r.token > 1 { // a takeover: earlier attempts may have saved steps
			if steps, err = s.readSteps(ctx, p.Consumer, p.MessageID); err != nil {
				return res, nil, false, err
			}
		}
		return idemdriver.AcquireResult{Acquired: true, Token: r.token, Attempt: int(r.attempt), Steps: steps}, nil, true, nil
	}
	if r.acquirable {
		// The snapshot shows a record the DO UPDATE would have taken: the
		// row it judged was newer. Again.
		return res, &r, false, nil
	}
	return r.notAcquired(), &r, true, nil
}

// readSteps reads a record's recovery points, byte for byte (an empty
// result is an empty, non-nil slice).
func (s *Store) readSteps(ctx context.Context, consumer, id string) (map[string][]byte, error) {
	rows, err := s.pool.Query(ctx, s.lq.steps, consumer, id)
	if err != nil {
		return nil, err
	}
	steps := map[string][]byte{}
	var (
		name string
		res  []byte
	)
	_, err = pgx.ForEachRow(rows, []any{&name, &res}, func() error {
		v := make([]byte, len(res))
		copy(v, res)
		steps[name] = v
		return nil
	})
	if err != nil {
		return nil, err
	}
	return steps, nil
}

// Renew implements [idemdriver.LeaseStore]: one UPDATE that sets the lease to the
// server's now() plus p.Lease, only while p.Token owns the record
// (in_progress with that token; an expired lease that nobody took over is
// still owned). Otherwise it returns an error matching idem.ErrLeaseLost.
// p.Lease must be positive (idem.ErrInvalidConfig otherwise).
func (s *Store) Renew(ctx context.Context, p *idemdriver.RenewParams) error {
	if err := checkLeaseWrite(ctx, p.Consumer, p.MessageID); err != nil {
		return err
	}
	if p.Lease <= 0 {
		return fmt.Errorf("%w: idempgxv5: lease %v, want a positive duration", idem.ErrInvalidConfig, p.Lease)
	}
	return s.fenced(ctx, "renew", p.Consumer, p.MessageID, p.Token, s.lq.renew,
		leaseMicros(p.Lease), p.Consumer, p.MessageID, p.Token)
}

// Complete implements [idemdriver.LeaseStore]: one UPDATE, fenced by p.Token,
// that makes the record completed with p.Result (stored byte for byte; nil
// as empty) and p.ContentType, ends the lease and stamps processed_at (so
// the retention window counts from completion). The fingerprint stays
// (field case C12). Otherwise an error matching idem.ErrLeaseLost.
//
// The content type must be valid UTF-8 without NUL bytes, at most
// [MaxContentTypeLength] bytes (an error matching idem.ErrInvalidConfig
// otherwise): PostgreSQL text holds nothing else.
func (s *Store) Complete(ctx context.Context, p *idemdriver.CompleteParams) error {
	if err := checkLeaseWrite(ctx, p.Consumer, p.MessageID); err != nil {
		return err
	}
	if err := checkText("content type", p.ContentType, MaxContentTypeLength); err != nil {
		return err
	}
	result := p.Result
	if result == nil {
		result = []byte{} // never NULL, which means "a transactional record"
	}
	return s.fenced(ctx, "complete", p.Consumer, p.MessageID, p.Token, s.lq.complete,
		result, p.ContentType, p.Consumer, p.MessageID, p.Token)
}

// Release implements [idemdriver.LeaseStore]: one UPDATE, fenced by p.Token,
// that ends the lease now, keeps the error text, stamps processed_at and
// moves the record's token on by one, so that the released attempt owns
// nothing (the next attempt's token is one more again). With p.Terminal
// the record becomes failed. The attempt count and the recovery points
// stay. Otherwise an error matching idem.ErrLeaseLost.
//
// The error text is stored as valid UTF-8 without NUL bytes (others become
// U+FFFD), cut to at most [MaxErrorTextLength] bytes: PostgreSQL text holds
// nothing else, and a failure must never fail to be recorded.
func (s *Store) Release(ctx context.Context, p *idemdriver.ReleaseParams) error {
	if err := checkLeaseWrite(ctx, p.Consumer, p.MessageID); err != nil {
		return err
	}
	return s.fenced(ctx, "release", p.Consumer, p.MessageID, p.Token, s.lq.release,
		errorText(p.Error), p.Terminal, p.Consumer, p.MessageID, p.Token)
}

// SaveStep implements [idemdriver.LeaseStore] with one statement: it locks the
// record FOR SHARE while p.Token owns it and inserts the recovery point
// (INSERT ... SELECT FROM the locked record ON CONFLICT DO NOTHING, so a
// step saved before keeps its first result). The lock makes a concurrent
// takeover, Complete or Release either wait for the step or be seen by
// it. An error matching idem.ErrLeaseLost if the token owns nothing.
//
// Step names are 1 to 255 bytes of valid UTF-8 without NUL bytes (an
// error matching idem.ErrInvalidConfig otherwise).
func (s *Store) SaveStep(ctx context.Context, p *idemdriver.StepParams) error {
	if err := checkLeaseWrite(ctx, p.Consumer, p.MessageID); err != nil {
		return err
	}
	if p.Step == "" {
		return fmt.Errorf("%w: idempgxv5: empty step name", idem.ErrInvalidConfig)
	}
	if err := checkText("step name", p.Step, maxStepNameLength); err != nil {
		return err
	}
	result := p.Result
	if result == nil {
		result = []byte{}
	}
	var owned int64
	if err := s.pool.QueryRow(ctx, s.lq.saveStep, p.Consumer, p.MessageID, p.Token, p.Step, result).Scan(&owned); err != nil {
		return err
	}
	if owned == 0 {
		return leaseLost("save step", p.Consumer, p.MessageID, p.Token)
	}
	return nil
}

// fenced runs one conditional UPDATE whose WHERE holds only while token
// owns the record, and judges it by rows affected.
func (s *Store) fenced(ctx context.Context, op, consumer, id string, token int64, query string, args ...any) error {
	tag, err := s.pool.Exec(ctx, query, args...)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return leaseLost(op, consumer, id, token)
	}
	return nil
}

// leaseLost is the error of a fenced write whose token owns nothing.
func leaseLost(op, consumer, id string, token int64) error {
	return fmt.Errorf("%w: idempgxv5: %s of message %q (consumer %q): token %d does not own the record (another attempt took over, or the attempt ended)",
		idem.ErrLeaseLost, op, id, consumer, token)
}

// checkNames checks a consumer name and a message ID.
func checkNames(consumer, id string) error {
	if err := idem.ValidateConsumerName(consumer); err != nil {
		return err
	}
	return idem.ValidateMessageID(id, 0)
}

// checkLeaseWrite checks the context and the names of a fenced write.
func checkLeaseWrite(ctx context.Context, consumer, id string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return checkNames(consumer, id)
}

// checkText checks a text column's value: at most max bytes of valid
// UTF-8 without NUL bytes.
func checkText(what, s string, max int) error {
	switch {
	case len(s) > max:
		return fmt.Errorf("%w: idempgxv5: %s of %d bytes, over the maximum of %d", idem.ErrInvalidConfig, what, len(s), max)
	case !utf8.ValidString(s):
		return fmt.Errorf("%w: idempgxv5: %s %q is not valid UTF-8", idem.ErrInvalidConfig, what, s)
	case strings.IndexByte(s, 0) >= 0:
		return fmt.Errorf("%w: idempgxv5: %s %q contains a NUL byte", idem.ErrInvalidConfig, what, s)
	}
	return nil
}

// errorText makes s storable as PostgreSQL text: valid UTF-8, no NUL
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
