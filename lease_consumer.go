package idem

import (
	"context"
	"errors"
	"fmt"
	"github.com/idem-go/idem/idemdriver"
	"time"
)

// minRetryAfter is the smallest redelivery delay an InProgress outcome asks for.
const minRetryAfter = 100 * time.Millisecond

// LeaseHandler runs one attempt at processing a message in lease mode. Its
// side effects are outside idem's store (an HTTP call, an email), so each
// external call should carry an idempotency key from Attempt.Key, and a
// multi-step handler should wrap each step in Attempt.Step so a later
// attempt resumes after the last completed step.
//
// The returned Result is stored and replayed to duplicates. An error
// releases the lease for a retry, or poisons the message when it is not
// retryable (see Permanent) or the attempt was the last (MaxAttempts).
// ctx is cancelled, with cause ErrLeaseLost, if the lease is lost while the
// handler runs, or runs out by the consumer's clock because no renewal
// reached the store in time: another attempt may then take over, so the
// handler should stop its side effects.
type LeaseHandler func(ctx context.Context, a *Attempt) (Result, error)

// Result is what a lease-mode handler produced, stored with the record and
// returned byte for byte (as Outcome.Result) to every duplicate.
type Result struct {
	// Body is the result bytes; nil and empty are the same.
	Body []byte
	// ContentType describes Body, e.g. "application/json"; may be empty.
	ContentType string
}

// LeaseConsumer is an Idempotent Consumer in lease mode, for side effects
// outside the database: a claim with a lease and a fencing token, renewed
// while the handler runs, completed with the handler's result only while
// the token still owns the record. It is the only mode of the Redis store.
//
// What each mode guarantees: in transactional mode (Consumer) the claim
// and the database effects commit or roll back together, so exactly one
// delivery's effects exist. In lease mode the handler runs at most once at
// a time per message while leases are honoured, and after a crash a later
// attempt takes over when the lease expires; an external call may then be
// made again, which is why it must carry Attempt.Key.
//
// A LeaseConsumer is safe for concurrent use; over an
// idemdriver.LeaseBatcher the Acquire and Complete calls its goroutines
// make at the same time can go to the store together (Config.Coalesce,
// off by default). Close it to stop its purge loop.
type LeaseConsumer struct {
	core
	store    idemdriver.LeaseStore
	renewals renewals
	// coAcquire and coComplete coalesce the concurrent Acquire and
	// Complete calls (Config.Coalesce); nil when the store's calls go
	// alone.
	coAcquire  *acquireGroup
	coComplete *completeGroup
}

// NewLeaseConsumer returns a LeaseConsumer over store. It returns an error
// matching ErrInvalidConsumerName or ErrInvalidConfig when cfg is invalid,
// and starts the background purge loop unless cfg.PurgeInterval is negative.
func NewLeaseConsumer(store idemdriver.LeaseStore, cfg Config) (*LeaseConsumer, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: nil store", ErrInvalidConfig)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &LeaseConsumer{store: store}
	c.renewals.batch, _ = idemdriver.BatchRenewer(store)
	c.start(cfg.withDefaults(), ModeLease, store)
	c.initCoalesce()
	return c, nil
}

// Name returns the consumer name.
func (c *LeaseConsumer) Name() string { return c.cfg.Name }

// Close stops the background purge loop and waits for it. Later calls to
// Process return ErrClosed. Idempotent; always returns nil.
func (c *LeaseConsumer) Close() error { return c.close() }

// Purge deletes completed and failed records outside the retention window;
// see Consumer.Purge.
func (c *LeaseConsumer) Purge(ctx context.Context) (PurgeResult, error) {
	res, _, err := c.purgeNow(ctx)
	return res, err
}

// Process runs one delivery of msg in lease mode: it acquires the message
// (or finds its record), runs handler while renewing the lease every
// Lease/3, and completes the record with the handler's Result.
//
// Outcomes and the returned error (nil exactly when the outcome can be
// acknowledged):
//   - Processed, nil: this attempt ran and its result is stored.
//   - Duplicate, nil: completed before; Outcome.Result is the stored result.
//   - InProgress, ErrInProgress: another attempt holds a live lease;
//     redeliver after Outcome.RetryAfter. Never an ack.
//   - FingerprintMismatch, ErrFingerprintMismatch; Rejected, ErrMissingMessageID,
//     ErrInvalidMessageID or ErrInvalidPayload: dead-letter.
//   - Failed with Poison, ErrPoison: failed MaxAttempts times or
//     permanently; a terminal record keeps the error. Dead-letter.
//   - Failed, the handler's error (or ErrHandlerPanic, ErrStore,
//     ErrLeaseLost): the lease was released or lost; redeliver.
func (c *LeaseConsumer) Process(ctx context.Context, msg Message, handler LeaseHandler) (Outcome, error) {
	return c.ProcessWith(ctx, msg, AcquireOptions{}, handler)
}

// ProcessWith is Process with the options of the acquisition (see
// AcquireOptions: a wait for a live lease, a recovery point saved with the
// acquisition).
func (c *LeaseConsumer) ProcessWith(ctx context.Context, msg Message, opt AcquireOptions, handler LeaseHandler) (Outcome, error) {
	a, out, err := c.Acquire(ctx, msg, opt)
	if a == nil {
		return out, err
	}
	var res Result
	herr := runHandler(func() error {
		var err error
		res, err = handler(a.ctx, a)
		return err
	})
	// The result must be stored even if the caller's context has ended
	// (a client that hung up does not lose it), bounded by finishTimeout:
	// by each store call's own StoreTimeout when that is no longer (one
	// context fewer per message), else by a context of its own.
	fctx := withoutCancel(a.hctx)
	d := c.storeTimeout()
	if d <= 0 || d > finishTimeout {
		var cancel context.CancelFunc
		fctx, cancel = context.WithTimeout(fctx, finishTimeout)
		defer cancel()
	}
	var bound *callBound
	a.mu.Lock()
	lost := a.lost
	if d > 0 && d <= finishTimeout && !a.ended && !lost && herr == nil {
		// One context for the final write, detached from the caller,
		// its store timeout kept by the renewal scheduler (callBound):
		// no timer of its own. Made under a.mu: finish reads it.
		a.fin.init(fctx, d)
		bound = &a.fin
	}
	a.mu.Unlock()
	switch {
	case lost:
		err := a.lostErr("lost its lease while the handler ran")
		if herr != nil {
			err = errors.Join(err, herr)
		}
		return a.Abandon(fctx, err)
	case herr != nil:
		out, err = a.Release(fctx, herr)
	default:
		out, err = a.complete(fctx, res, bound)
	}
	if !a.isEnded() {
		// The final write failed: the lease runs out and a later attempt
		// takes over.
		return a.Abandon(fctx, err)
	}
	return out, err
}

// existing settles a delivery whose record another attempt holds or finished.
func (c *LeaseConsumer) existing(id string, fp []byte, acq idemdriver.AcquireResult) (Outcome, error) {
	out, err := c.duplicate(id, fp, acq.Fingerprint)
	if out.Status == FingerprintMismatch {
		return out, err
	}
	switch acq.State {
	case idemdriver.StateCompleted:
		out.Result, out.ContentType, out.Attempt = acq.Result, acq.ContentType, acq.Attempt
		return out, nil
	case idemdriver.StateInProgress:
		ra := acq.LeaseRemaining
		if ra < minRetryAfter {
			ra = minRetryAfter
		}
		err := fmt.Errorf("%w: message %q, %d attempts so far, lease ends in %v", ErrInProgress, id, acq.Attempt, acq.LeaseRemaining)
		return Outcome{Status: InProgress, MessageID: id, Err: err, RetryAfter: ra, Attempt: acq.Attempt}, err
	case idemdriver.StateFailed:
		err := fmt.Errorf("%w: message %q failed %d attempts: %s", ErrPoison, id, acq.Attempt, acq.Error)
		return Outcome{Status: Failed, MessageID: id, Err: err, Attempt: acq.Attempt, Poison: true}, err
	}
	err = fmt.Errorf("%w: store returned an unacquired record in state %d", ErrStore, acq.State)
	return c.failed(id, err)
}
