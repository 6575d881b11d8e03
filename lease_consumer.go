package idem

import (
	"context"
	"errors"
	"fmt"
	"github.com/idem-go/idem/idemdriver"
	"sync"
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

// Attempt is one lease-mode attempt at a message, as its handler sees it.
type Attempt struct {
	leaseFrom time.Time // the lease runs until at least leaseFrom + Lease, by our clock

	// Message is the delivery being processed.
	Message Message
	// Consumer is the consumer name.
	Consumer string
	// Number is the attempt number: 1 for the first, one more for each
	// retry or takeover of an expired lease.
	Number int
	// Token is the attempt's fencing token: a number that strictly
	// increases with every attempt at this message. Pass it to a system
	// that can reject writes from a stale owner.
	Token int64

	store idemdriver.LeaseStore
	core  *core // for the hooks
	mu    sync.Mutex
	steps map[string][]byte
}

// Key returns the idempotency key for the external call named step, the
// same on every attempt and redelivery: DeriveKey(consumer, message ID, step).
// Send it as the third party's idempotency key (Stripe's Idempotency-Key)
// so that a call made before a crash is not made twice.
func (a *Attempt) Key(step string) string { return DeriveKey(a.Consumer, a.Message.ID, step) }

// Step runs fn once across all attempts at the message: a recovery point
// (Stripe's atomic phases). If an earlier attempt completed the step, Step
// returns its saved result without calling fn. Otherwise it calls fn and
// saves the result under this attempt's fencing token before returning it;
// if the lease was lost meanwhile the save fails with ErrLeaseLost and the
// attempt must stop. name is 1 to 255 bytes.
func (a *Attempt) Step(ctx context.Context, name string, fn func(ctx context.Context) ([]byte, error)) ([]byte, error) {
	if name == "" || len(name) > 255 {
		return nil, fmt.Errorf("%w: step name must be 1 to 255 bytes", ErrInvalidConfig)
	}
	a.mu.Lock()
	res, done := a.steps[name]
	a.mu.Unlock()
	if done {
		return res, nil
	}
	res, err := fn(ctx)
	if err != nil {
		return nil, err
	}
	since := a.core.now()
	err = a.store.SaveStep(ctx, &idemdriver.StepParams{Consumer: a.Consumer, MessageID: a.Message.ID, Token: a.Token, Step: name, Result: res})
	if err != nil {
		if errors.Is(err, ErrLeaseLost) {
			a.core.leaseLost(ctx, a, "step", since, err)
			return nil, err
		}
		return nil, a.core.storeErr(ctx, "save step", a.Message.ID, err)
	}
	a.mu.Lock()
	a.steps[name] = res
	a.mu.Unlock()
	return res, nil
}

// Completed reports whether an earlier attempt completed the step name.
func (a *Attempt) Completed(name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.steps[name]
	return ok
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
// A LeaseConsumer is safe for concurrent use. Close it to stop its purge loop.
type LeaseConsumer struct {
	core
	store idemdriver.LeaseStore
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
	c.start(cfg.withDefaults(), ModeLease, store)
	return c, nil
}

// Name returns the consumer name.
func (c *LeaseConsumer) Name() string { return c.cfg.Name }

// Close stops the background purge loop and waits for it. Later calls to
// Process return ErrClosed. Idempotent; always returns nil.
func (c *LeaseConsumer) Close() error { return c.close() }

// Purge deletes completed and failed records outside the retention window;
// see Consumer.Purge.
func (c *LeaseConsumer) Purge(ctx context.Context) (PurgeResult, error) { return c.purgeNow(ctx) }

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
	ctx, t := c.begin(ctx, msg.ID, 0)
	if t != nil {
		defer t.endPanic(ctx, msg.ID, nil)
	}
	out, err := c.process(ctx, t, msg, handler)
	t.end(ctx, out, err)
	return out, err
}

func (c *LeaseConsumer) process(ctx context.Context, t *track, msg Message, handler LeaseHandler) (Outcome, error) {
	out, fp := c.prepare(msg)
	if out.Status != 0 {
		return out, out.Err
	}
	// The lease cannot have started before this instant, by our clock.
	leaseFrom := time.Now()
	acq, err := c.store.Acquire(ctx, &idemdriver.AcquireParams{
		Consumer: c.cfg.Name, MessageID: msg.ID, Fingerprint: fp, Lease: c.cfg.Lease,
	})
	if err != nil {
		return c.failed(msg.ID, c.storeErr(ctx, "acquire", msg.ID, err))
	}
	if !acq.Acquired {
		return c.existing(msg.ID, fp, acq)
	}
	a := &Attempt{leaseFrom: leaseFrom, Message: msg, Consumer: c.cfg.Name, Number: acq.Attempt, Token: acq.Token, store: c.store, core: &c.core, steps: acq.Steps}
	if a.steps == nil {
		a.steps = map[string][]byte{}
	}
	t.claim(ctx, -1, msg.ID, acq.Attempt, acq.Token, leaseFrom)
	if h := c.hooks; h != nil && acq.Attempt > 1 && len(h.takeover) > 0 {
		h.onLease(ctx, h.takeover, LeaseEvent{MessageID: msg.ID, Attempt: acq.Attempt, Token: acq.Token, Latency: time.Since(leaseFrom)})
	}
	if acq.Attempt > c.cfg.MaxAttempts {
		// Earlier attempts died without releasing (their leases expired):
		// a crash loop. Stop it here.
		cause := fmt.Errorf("%d attempts (MaxAttempts %d) ended without a result or a release: their leases expired", acq.Attempt-1, c.cfg.MaxAttempts)
		return c.release(ctx, t, a, cause, true)
	}

	res, lost, herr := c.runLeased(ctx, a, handler)
	if lost {
		err := fmt.Errorf("%w: attempt %d (token %d) of message %q lost its lease while the handler ran", ErrLeaseLost, a.Number, a.Token, msg.ID)
		if herr != nil {
			err = errors.Join(err, herr)
		}
		return Outcome{Status: Failed, MessageID: msg.ID, Err: err, Attempt: a.Number}, err
	}
	if herr != nil {
		terminal := !c.cfg.Retryable(herr) || a.Number >= c.cfg.MaxAttempts
		return c.release(ctx, t, a, herr, terminal)
	}
	// The result must be stored even if the caller's context has ended
	// (a client that hung up does not lose it), bounded by finishTimeout.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	since := c.now()
	err = c.store.Complete(fctx, &idemdriver.CompleteParams{
		Consumer: c.cfg.Name, MessageID: msg.ID, Token: a.Token, Result: res.Body, ContentType: res.ContentType,
	})
	if errors.Is(err, ErrLeaseLost) {
		err = fmt.Errorf("%w: attempt %d (token %d) of message %q finished after another attempt took over; its result was not stored", err, a.Number, a.Token, msg.ID)
		c.leaseLost(ctx, a, "complete", since, err)
		return Outcome{Status: Failed, MessageID: msg.ID, Err: err, Attempt: a.Number}, err
	}
	if err != nil {
		err = c.storeErr(ctx, "complete", msg.ID, err)
		return Outcome{Status: Failed, MessageID: msg.ID, Err: err, Attempt: a.Number}, err
	}
	return Outcome{Status: Processed, MessageID: msg.ID, Result: res.Body, ContentType: res.ContentType, Attempt: a.Number}, nil
}

// existing settles a delivery whose record another attempt holds or finished.
func (c *LeaseConsumer) existing(id string, fp []byte, acq idemdriver.AcquireResult) (Outcome, error) {
	out, err := c.duplicate(id, fp, acq.Fingerprint)
	if out.Status == FingerprintMismatch {
		return out, err
	}
	switch acq.State {
	case idemdriver.StateCompleted:
		out.Result, out.ContentType = acq.Result, acq.ContentType
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

// runLeased runs handler, renewing the lease every Lease/3 until it
// returns. lost reports that a renewal found the lease gone; the handler's
// context was then cancelled with cause ErrLeaseLost.
//
// The renewals run as long as the handler does, whatever happens to ctx: a
// handler still working after the caller's context ended keeps its lease
// (it may still produce effects, so no other attempt may take over). They
// stop, and a renewal in flight is cancelled, as soon as the handler returns.
func (c *LeaseConsumer) runLeased(ctx context.Context, a *Attempt, handler LeaseHandler) (res Result, lost bool, err error) {
	hctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	rctx, stopRenewing := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRenewing()
	renewed := make(chan bool, 1)
	go func() {
		renewed <- c.renewUntil(rctx, a, cancel)
	}()
	err = runHandler(func() error {
		var herr error
		res, herr = handler(hctx, a)
		return herr
	})
	stopRenewing()
	lost = !<-renewed
	return res, lost, err
}

// renewUntil renews a's lease every Lease/3 until ctx ends (the handler
// returned). It returns false if the store reported the lease lost, after
// cancelling the handler's context with cause ErrLeaseLost. If the lease
// runs out by the local clock with no successful renewal, it cancels the
// handler's context the same way but returns true: the store's fencing at
// Complete or Release then says whether the attempt still owns the record.
func (c *LeaseConsumer) renewUntil(ctx context.Context, a *Attempt, cancel context.CancelCauseFunc) bool {
	t := time.NewTicker(c.cfg.Lease / 3)
	defer t.Stop()
	// The lease is only known to be held until validFrom + Lease: if no
	// renewal succeeds by then (the store is unreachable or slow), another
	// attempt may take over, so the handler's context is cancelled rather
	// than left running beside it. Whether the attempt still owns the record
	// is not decided here but by the store's fencing at Complete or Release.
	validFrom := a.leaseFrom
	expiry := time.NewTimer(c.cfg.Lease)
	defer expiry.Stop()
	for {
		select {
		case <-ctx.Done():
			return true
		case <-expiry.C:
			if ctx.Err() == nil {
				cancel(ErrLeaseLost)
			}
			return true
		case <-t.C:
		}
		start := time.Now()
		// A renewal that hangs past the lease is as good as lost.
		callCtx, cancelCall := context.WithDeadline(ctx, validFrom.Add(c.cfg.Lease))
		err := c.store.Renew(callCtx, &idemdriver.RenewParams{Consumer: c.cfg.Name, MessageID: a.Message.ID, Token: a.Token, Lease: c.cfg.Lease})
		cancelCall()
		switch {
		case errors.Is(err, ErrLeaseLost):
			cancel(ErrLeaseLost)
			c.leaseLost(ctx, a, "renew", start, err)
			return false
		case err == nil:
			validFrom = start
			expiry.Reset(time.Until(validFrom.Add(c.cfg.Lease)))
			if h := c.hooks; h != nil && len(h.renewed) > 0 {
				h.onLease(ctx, h.renewed, LeaseEvent{MessageID: a.Message.ID, Attempt: a.Number, Token: a.Token, Latency: time.Since(start)})
			}
		case ctx.Err() == nil:
			_ = c.storeErr(ctx, "renew", a.Message.ID, err)
			c.cfg.Logger.Warn("idem: lease renewal failed; retrying at the next tick",
				"consumer", c.cfg.Name, "message_id", a.Message.ID, "err", err,
				"lease_left", time.Until(validFrom.Add(c.cfg.Lease)))
		}
	}
}

// release ends a failed attempt: available for a retry, or poison.
func (c *LeaseConsumer) release(ctx context.Context, t *track, a *Attempt, cause error, terminal bool) (Outcome, error) {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	since := c.now()
	err := c.store.Release(fctx, &idemdriver.ReleaseParams{
		Consumer: c.cfg.Name, MessageID: a.Message.ID, Token: a.Token, Error: cause.Error(), Terminal: terminal,
	})
	switch {
	case errors.Is(err, ErrLeaseLost):
		c.leaseLost(ctx, a, "release", since, err)
		cause = errors.Join(cause, err)
		terminal = false
	case err != nil:
		cause = errors.Join(cause, c.storeErr(ctx, "release", a.Message.ID, err))
		terminal = false
	case !terminal && t != nil:
		t.released = true
	case terminal:
		cause = fmt.Errorf("%w: message %q, after attempt %d (MaxAttempts %d): %w", ErrPoison, a.Message.ID, a.Number, c.cfg.MaxAttempts, cause)
	}
	return Outcome{Status: Failed, MessageID: a.Message.ID, Err: cause, Attempt: a.Number, Poison: terminal}, cause
}
