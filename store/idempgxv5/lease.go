package idempgxv5

import (
	"context"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/pgsql"
	"github.com/idem-go/idem/internal/sqlstore"
)

// Limits of the lease-mode text columns, the same as store/idemsql's.
const (
	// MaxContentTypeLength is the longest content type Complete stores,
	// in bytes. Content types are also valid UTF-8 without NUL bytes.
	MaxContentTypeLength = sqlstore.MaxContentTypeLength
	// MaxErrorTextLength is the longest error text Release stores, in
	// bytes; a longer one is cut (at a character boundary).
	MaxErrorTextLength = sqlstore.MaxErrorTextLength
)

// RecordsSteps implements [idemdriver.StepRecorder]: the acquire
// statement saves the point of [idemdriver.AcquireParams].StepPrefix on
// the row it inserts or takes over (a data-modifying CTE of the same
// statement), and Release saves [idemdriver.ReleaseParams].Step the same
// way, on the row its UPDATE changed.
func (*Store) RecordsSteps() bool { return true }

// Acquire implements [idemdriver.LeaseStore] with one statement, INSERT ...
// ON CONFLICT (consumer, message_id) DO UPDATE ... WHERE <in_progress,
// lease ended (lease_expires_at <= now()), same fingerprint> RETURNING,
// whose outer SELECT also reads the record when it did not acquire it:
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
// p is checked first (idemdriver.ValidateAcquireParams): a lease that is
// not positive is an error matching idemdriver.ErrInvalidConfig (a zero
// lease never means "no expiry"), invalid names or fingerprints the
// matching typed errors. A call whose ctx has ended changes nothing.
//
// On the partitioned layout (Config.Partitions) it returns an error
// matching ErrLeaseUnsupported.
func (s *Store) Acquire(ctx context.Context, p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
	if s.part != nil {
		return idemdriver.AcquireResult{}, ErrLeaseUnsupported
	}
	if err := ctx.Err(); err != nil {
		return idemdriver.AcquireResult{}, err
	}
	if err := idemdriver.ValidateAcquireParams(p); err != nil {
		return idemdriver.AcquireResult{}, err
	}
	db := sqlstore.Querier(querier{s.pool})
	for attempt := 0; ; attempt++ {
		q, err := s.tab.Queries(ctx, db, p.Consumer, true)
		if err != nil {
			return idemdriver.AcquireResult{}, err
		}
		res, err := q.Acquire(ctx, db, p)
		if attempt == 0 && s.tab.Changed(err) { // migration 015 ran: once more, in the new shape
			continue
		}
		return res, err
	}
}

// Renew implements [idemdriver.LeaseStore]: one UPDATE that sets the lease
// to the server's now() plus p.Lease, only while p.Token owns the record
// (in_progress with that token; an expired lease that nobody took over is
// still owned). Otherwise it returns an error matching
// idemdriver.ErrLeaseLost. p is checked first
// (idemdriver.ValidateRenewParams: a lease that is not positive matches
// idemdriver.ErrInvalidConfig).
//
// On the partitioned layout (Config.Partitions) it returns an error
// matching ErrLeaseUnsupported.
func (s *Store) Renew(ctx context.Context, p *idemdriver.RenewParams) error {
	if s.part != nil {
		return ErrLeaseUnsupported
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := idemdriver.ValidateRenewParams(p); err != nil {
		return err
	}
	return s.retryErr(ctx, querier{s.pool}, p.Consumer, func(q *pgsql.Queries, db sqlstore.Querier) error { return q.Renew(ctx, db, p) })
}

// Complete implements [idemdriver.LeaseStore]: one UPDATE, fenced by
// p.Token, that makes the record completed with p.Result (stored byte for
// byte; nil as empty) and p.ContentType, ends the lease and stamps
// processed_at (so the retention window counts from completion). The
// fingerprint stays. Otherwise an error matching idemdriver.ErrLeaseLost.
//
// p is checked first (idemdriver.ValidateCompleteParams), and the content
// type must be valid UTF-8 without NUL bytes, at most
// [MaxContentTypeLength] bytes (an error matching
// idemdriver.ErrInvalidConfig otherwise): PostgreSQL text holds nothing
// else.
//
// On the partitioned layout (Config.Partitions) it returns an error
// matching ErrLeaseUnsupported.
func (s *Store) Complete(ctx context.Context, p *idemdriver.CompleteParams) error {
	if s.part != nil {
		return ErrLeaseUnsupported
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := idemdriver.ValidateCompleteParams(p); err != nil {
		return err
	}
	if err := sqlstore.CheckContentType(p.ContentType); err != nil {
		return err
	}
	return s.retryErr(ctx, querier{s.pool}, p.Consumer, func(q *pgsql.Queries, db sqlstore.Querier) error { return q.Complete(ctx, db, p) })
}

// Release implements [idemdriver.LeaseStore]: one UPDATE, fenced by
// p.Token, that ends the lease now, keeps the error text, stamps
// processed_at and moves the record's token on by one, so that the
// released attempt owns nothing (the next attempt's token is one more
// again). With p.Terminal the record becomes failed. The attempt count and
// the recovery points stay. Otherwise an error matching
// idemdriver.ErrLeaseLost. p is checked first
// (idemdriver.ValidateReleaseParams).
//
// The error text is stored as valid UTF-8 without NUL bytes (others become
// U+FFFD), cut to at most [MaxErrorTextLength] bytes: PostgreSQL text holds
// nothing else, and a failure must never fail to be recorded.
//
// On the partitioned layout (Config.Partitions) it returns an error
// matching ErrLeaseUnsupported.
func (s *Store) Release(ctx context.Context, p *idemdriver.ReleaseParams) error {
	if s.part != nil {
		return ErrLeaseUnsupported
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := idemdriver.ValidateReleaseParams(p); err != nil {
		return err
	}
	return s.retryErr(ctx, querier{s.pool}, p.Consumer, func(q *pgsql.Queries, db sqlstore.Querier) error { return q.Release(ctx, db, p) })
}

// SaveStep implements [idemdriver.LeaseStore] with one statement: it locks
// the record FOR SHARE while p.Token owns it and inserts the recovery
// point (INSERT ... SELECT FROM the locked record ON CONFLICT DO NOTHING,
// so a step saved before keeps its first result). The lock makes a
// concurrent takeover, Complete or Release either wait for the step or be
// seen by it. An error matching idemdriver.ErrLeaseLost if the token owns
// nothing. p is checked first (idemdriver.ValidateStepParams: step names
// follow the rules of message IDs, up to idemdriver.MaxStepNameLength
// bytes, an error matching idemdriver.ErrInvalidConfig otherwise).
//
// On the partitioned layout (Config.Partitions) it returns an error
// matching ErrLeaseUnsupported.
func (s *Store) SaveStep(ctx context.Context, p *idemdriver.StepParams) error {
	if s.part != nil {
		return ErrLeaseUnsupported
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := idemdriver.ValidateStepParams(p); err != nil {
		return err
	}
	return s.retryErr(ctx, querier{s.pool}, p.Consumer, func(q *pgsql.Queries, db sqlstore.Querier) error { return q.SaveStep(ctx, db, p) })
}

// retryErr runs f on db (the pool) with the statements of the table's
// shape for consumer, again once when the shape changed under it
// (migration 015 ran).
func (s *Store) retryErr(ctx context.Context, db sqlstore.Querier, consumer string, f func(q *pgsql.Queries, db sqlstore.Querier) error) error {
	for attempt := 0; ; attempt++ {
		q, err := s.tab.Queries(ctx, db, consumer, true)
		if err != nil {
			return err
		}
		if err = f(q, db); attempt == 0 && s.tab.Changed(err) {
			continue
		}
		return err
	}
}
