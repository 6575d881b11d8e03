package idempgxv5

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/lastval"
	"github.com/idem-go/idem/internal/sqlstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

var _ idemdriver.OutboxLockedRounder = (*Store)(nil)

// roundKey is what a locked claim's arguments are made of.
type roundKey struct {
	limit int
	lease time.Duration
}

// lastClaimArgs are the boxed arguments of the last round's claim (the
// limit, and the lease's milliseconds, at least 1, as text): a relay's
// rounds share one limit and one lease.
var lastClaimArgs lastval.Cache[roundKey, [2]any]

// lockedClaimArgs returns the arguments of a claim of p.
func lockedClaimArgs(p *idemdriver.LockedRoundParams) [2]any {
	return lastClaimArgs.Get(roundKey{p.Limit, p.Lease}, func(k roundKey) [2]any {
		return [2]any{int64(k.limit), strconv.FormatInt(max(k.lease.Milliseconds(), 1), 10)}
	})
}

// LockedRound implements [idemdriver.OutboxLockedRounder] on one
// connection of the pool, in two round trips: BEGIN and the claim (a
// SELECT of the pending rows FOR UPDATE SKIP LOCKED, with ClaimOutgoing's
// order check, which first sets the transaction's
// idle_in_transaction_session_timeout to p.Lease, as SET LOCAL would) in
// one pgx batch; then, after p.Publish, the DELETE of the sent rows (with
// Keep, their UPDATE) and COMMIT in another (with failed rows, their
// UPDATE first, on its own, planned for its arrays as MarkFailed's is).
// A claim that finds nothing is rolled back (a third round trip, on an
// idle outbox only). The connection is held for the whole round, the
// publish included.
//
// The connection is acquired under ctx and within p.CallTimeout (an
// exhausted pool fails the round with an error matching
// idemdriver.ErrStoreTimeout); the claim runs under ctx, the
// end under no context (a confirmed row left in place is published
// again), each bounded by p.CallTimeout through a deadline on the
// connection (a call cut short closes the connection and fails with an
// error matching idemdriver.ErrStoreTimeout). On an error the
// transaction is rolled back, or the connection closed when the rollback
// fails (the pool drops it). Errors: idemdriver.ErrInvalidConfig for p
// (or for what Publish returns) before anything is written, else pgx's.
func (s *Store) LockedRound(ctx context.Context, p *idemdriver.LockedRoundParams) (int, error) {
	if err := idemdriver.ValidateLockedRoundParams(p); err != nil {
		return 0, err
	}
	o := s.outbox()
	var conn *pgxpool.Conn
	var err error
	if p.CallTimeout > 0 {
		// The acquisition counts towards the claim's bound, as a leased
		// round's does: an exhausted pool fails the round with
		// ErrStoreTimeout rather than hold it for as long as ctx lasts.
		conn, err = s.acquireBy(ctx, time.Now().Add(p.CallTimeout), p.CallTimeout)
	} else {
		conn, err = s.pool.Acquire(ctx)
	}
	if err != nil {
		return 0, err
	}
	defer conn.Release() // a connection left in a transaction is dropped by the pool
	rb := getRoundBatches()
	defer rb.put()
	c := conn.Conn()
	if p.CallTimeout <= 0 {
		bound(c, p.CallTimeout)
	}
	recs, err := rb.lockedClaim(ctx, conn, o, p)
	err = timedCallErr(ctx, p.CallTimeout, err)
	setDeadline(c, time.Time{})
	if err != nil || len(recs) == 0 {
		endRound(conn)
		return 0, err
	}
	sent, failed := p.Publish(ctx, recs)
	bound(c, p.CallTimeout)
	err = timedCallErr(context.Background(), p.CallTimeout, s.lockedEnd(conn, o, rb, &sent, failed))
	setDeadline(c, time.Time{})
	if err != nil {
		endRound(conn)
		return len(recs), err
	}
	return len(recs), nil
}

// bound sets a deadline d from now on c; none for d zero.
func bound(c *pgx.Conn, d time.Duration) {
	if d > 0 {
		setDeadline(c, time.Now().Add(d))
	}
}

// roundBatches are the two pgx batches of a locked round, their queued
// statements and the claim's arguments, kept in roundBatchPool between
// rounds: a round would otherwise allocate each of them anew.
type roundBatches struct {
	claim, end     pgx.Batch
	claimQ, endQ   [2]pgx.QueuedQuery
	claimQP, endQP [2]*pgx.QueuedQuery
	claimArgs      [2]any
}

var roundBatchPool = sync.Pool{New: func() any {
	rb := &roundBatches{}
	for i := range rb.claimQ {
		rb.claimQP[i], rb.endQP[i] = &rb.claimQ[i], &rb.endQ[i]
	}
	return rb
}}

func getRoundBatches() *roundBatches { return roundBatchPool.Get().(*roundBatches) }

// put clears rb of the round's values and returns it to the pool.
func (rb *roundBatches) put() {
	rb.claimQ, rb.endQ, rb.claimArgs = [2]pgx.QueuedQuery{}, [2]pgx.QueuedQuery{}, [2]any{}
	rb.claim.QueuedQueries, rb.end.QueuedQueries = nil, nil
	roundBatchPool.Put(rb)
}

// lockedClaim begins the round's transaction on conn and claims its
// rows, in one batch.
func (rb *roundBatches) lockedClaim(ctx context.Context, conn *pgxpool.Conn, o *sqlstore.Outbox, p *idemdriver.LockedRoundParams) ([]idemdriver.OutgoingRecord, error) {
	rb.claimArgs = lockedClaimArgs(p)
	rb.claimQ[0] = pgx.QueuedQuery{SQL: `BEGIN`}
	rb.claimQ[1] = pgx.QueuedQuery{SQL: o.LockedClaimSQL(), Arguments: rb.claimArgs[:]}
	rb.claim.QueuedQueries = rb.claimQP[:2]
	br := conn.SendBatch(ctx, &rb.claim)
	_, err := br.Exec()
	var recs []idemdriver.OutgoingRecord
	if err == nil {
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			recs, err = sqlstore.ScanLocked(rows)
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return recs, err
}

// lockedEnd writes the outcome of a round's publish and commits: the
// failed rows' UPDATE, then the sent rows' DELETE (or UPDATE) with the
// COMMIT in one batch.
func (s *Store) lockedEnd(conn *pgxpool.Conn, o *sqlstore.Outbox, rb *roundBatches, sent *idemdriver.MarkSentParams, failed []idemdriver.FailedRow) error {
	ctx := context.Background()
	fq, fargs, sq, sargs, err := o.LockedEndStatements(sent, failed)
	if err != nil {
		return err
	}
	if fq != "" {
		var q pgxQuerier = conn
		if s.cachesStatements {
			q = modeQuerier{conn, pgx.QueryExecModeCacheDescribe}
		}
		if _, err := q.Exec(ctx, fq, fargs...); err != nil {
			return err
		}
	}
	b, n := &rb.end, 0
	if sq != "" {
		rb.endQ[n] = pgx.QueuedQuery{SQL: sq, Arguments: sargs}
		n++
	}
	rb.endQ[n] = pgx.QueuedQuery{SQL: `COMMIT`}
	b.QueuedQueries = rb.endQP[:n+1]
	br := conn.SendBatch(ctx, b)
	var tag pgconn.CommandTag
	for range b.Len() {
		if tag, err = br.Exec(); err != nil {
			break
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err == nil && tag.String() != "COMMIT" {
		err = pgx.ErrTxCommitRollback
	}
	return err
}

// endRoundTimeout bounds the ROLLBACK of a round that failed or found
// nothing.
const endRoundTimeout = 5 * time.Second

// endRound rolls back the round's transaction on conn, if it is still
// in one; when that fails the connection is closed, so that the pool
// drops it rather than hand out a connection in a transaction.
func endRound(conn *pgxpool.Conn) {
	c := conn.Conn()
	if c.PgConn().TxStatus() == 'I' {
		return
	}
	bound(c, endRoundTimeout)
	_, err := c.Exec(context.Background(), "ROLLBACK")
	setDeadline(c, time.Time{})
	if err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), endRoundTimeout)
		defer cancel()
		_ = c.Close(ctx)
	}
}
