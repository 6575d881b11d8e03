package idem

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/idem-go/idem/idemdriver"
)

// The lease engine: one held lease on one message (or HTTP key) with its
// background renewal, its recovery points and its end. LeaseConsumer.Process
// runs a handler on it; package idemhttp runs an HTTP handler on it.

// ErrAttemptEnded is returned by the methods of an [Attempt] called after
// it ended (Complete, Release or Abandon succeeded, or the lease was lost
// at a write): the attempt holds nothing any more.
var ErrAttemptEnded = errors.New("idem: attempt already ended")

// AcquireOptions tunes one [LeaseConsumer.Acquire].
type AcquireOptions struct {
	// Wait, when positive, makes a delivery that finds another attempt
	// holding a live lease on the same payload wait up to this long for
	// that attempt to end, polling the store (every 20ms, growing to
	// 250ms): it then gets the stored result (Duplicate), or the lease
	// (the other attempt released it or its lease ran out). Zero (the
	// default) answers InProgress at once. The wait ends early, with
	// InProgress and an error matching ErrInProgress and the context's
	// cause, when ctx ends.
	Wait time.Duration
	// OnWait, if set, is called once, before the first poll, when the
	// delivery starts waiting.
	OnWait func()
	// StepPrefix, when not empty, saves a recovery point of the attempt
	// with its acquisition: the step named StepPrefix followed by the
	// attempt's token in decimal (idemdriver.PrefixStep), with an empty
	// result, as Attempt.SaveStep would right after Acquire. It is what a
	// front end records before an effect that must not run twice, so that
	// an attempt taking over after a crash knows this one may have acted.
	// On a store that is an idemdriver.StepRecorder the point is saved by
	// the Acquire itself, in the same atomic write
	// (idemdriver.AcquireParams.StepPrefix): no store call of its own. On
	// another store Acquire saves it with SaveStep once it holds the
	// lease; if that fails, the attempt is released (or abandoned) and
	// Acquire returns Failed with the error (matching ErrStore or
	// ErrLeaseLost), nothing having run. The attempt's Steps include the
	// point; those of earlier attempts are as Acquire found them.
	// StepPrefix plus a 19-digit token must be a valid step name (an
	// error matching ErrInvalidConfig otherwise).
	StepPrefix string
}

// Acquire claims msg in lease mode and returns the held lease as an
// *Attempt, whose lease is renewed in the background every Lease/3 until
// the attempt ends (by the consumer's one renewal timer, shared by all its
// attempts; renewals that come due are sent by at most 16 goroutines of
// the consumer, started while there are some to send, or, on a store that
// renews in batches (idemdriver.LeaseBatchRenewer), in batches of up to
// 500 per store round trip): the caller runs
// the side effects (Attempt.Step,
// Attempt.SaveStep for recovery points) and then ends it with exactly one
// of Attempt.Complete, Attempt.Release or Attempt.Abandon. An attempt
// that is never ended keeps renewing its lease.
//
// When msg is not acquired, Acquire returns a nil *Attempt and the settled
// outcome, as Process would: Duplicate (Outcome.Result is the stored
// result; error nil), InProgress (ErrInProgress), FingerprintMismatch,
// Rejected, a poison Failed (ErrPoison: the record is terminal, or the
// attempts that died without a result exceeded MaxAttempts) or Failed with
// ErrStore or ErrClosed. The hooks (Config.Hooks) see one delivery from
// Acquire to the attempt's end: the start, the claim, then the outcome and
// the end when the attempt ends (or at once when not acquired).
func (c *LeaseConsumer) Acquire(ctx context.Context, msg Message, opt AcquireOptions) (*Attempt, Outcome, error) {
	ctx, t := c.begin(ctx, msg.ID, 0)
	if t != nil {
		defer t.endPanic(ctx, msg.ID, nil)
	}
	a, out, err := c.acquire(ctx, t, msg, opt)
	if a == nil {
		t.end(ctx, out, err)
	}
	return a, out, err
}

func (c *LeaseConsumer) acquire(ctx context.Context, t *track, msg Message, opt AcquireOptions) (*Attempt, Outcome, error) {
	// The attempt if msg is acquired, allocated with the acquisition's
	// parameters (one allocation for a new message).
	a := &Attempt{}
	ap := &a.acq
	fp, prefix, atomicStep, out, err := c.prepAcquire(msg, opt, a)
	if out.Status != 0 {
		return nil, out, err
	}
	var waitUntil time.Time
	delay := 20 * time.Millisecond
	if d := c.storeTimeout(); d > 0 {
		// The attempt's context, made now: the Acquire runs on it, its
		// store timeout kept by the renewal scheduler (no timer nor
		// context of its own), and it is Attempt.Context once the
		// message is held (held). Cancelled when the message is not
		// held, so that a caller's long-lived context keeps no child.
		ap.bound.init(ctx, d)
		defer func() {
			if ap.bound.cancel != nil { // not handed over by held
				ap.bound.cancel(context.Canceled)
			}
		}()
	}
	for {
		// The lease cannot have started before this instant, by our clock.
		leaseFrom := time.Now()
		since := t.now()
		ap.p = idemdriver.AcquireParams{
			Consumer: c.cfg.Name, MessageID: msg.ID, Fingerprint: fp, Lease: c.cfg.Lease, StepPrefix: prefix,
		}
		var acq idemdriver.AcquireResult
		var err error
		if c.renewals.startCall(&ap.bound) {
			acq, err = c.storeAcquire(&ap.bound, &ap.p)
			err = timedOut(&ap.bound, err)
			c.renewals.endCall(&ap.bound)
		} else {
			actx, cancel := callCtx(ctx, c.storeTimeout())
			acq, err = c.storeAcquire(actx, &ap.p)
			err = timedOut(actx, err)
			cancel()
		}
		held, out, err := c.judgeAcquire(ctx, t, a, msg, fp, acq, err, leaseFrom, since, opt.StepPrefix, atomicStep)
		if held != nil && c.coAcquire != nil && ctx.Err() != nil {
			// The caller left while its acquisition was in a coalesced
			// batch, which it could not leave: the lease is released
			// at once rather than held by nobody until it runs out.
			out, err := held.releaseLeft(ctx)
			return nil, out, err
		}
		if held != nil || out.Status != InProgress || opt.Wait <= 0 {
			return held, out, err
		}
		if waitUntil.IsZero() {
			waitUntil = leaseFrom.Add(opt.Wait)
			if opt.OnWait != nil {
				opt.OnWait()
			}
		}
		left := time.Until(waitUntil)
		if left <= 0 {
			return nil, out, err
		}
		tm := time.NewTimer(min(delay, left))
		select {
		case <-ctx.Done():
			tm.Stop()
			err := fmt.Errorf("%w: message %q: the caller stopped waiting: %w", ErrInProgress, msg.ID, context.Cause(ctx))
			out.Err = err
			return nil, out, err
		case <-tm.C:
		}
		delay = min(delay*3/2, 250*time.Millisecond)
	}
}

// prepAcquire checks msg and opt before an acquisition: it returns msg's
// fingerprint (summed into a's acquisition parameters), the prefix of
// the recovery point the store saves with the acquisition (prefix, with
// atomicStep, on an idemdriver.StepRecorder; empty otherwise) and, when
// msg cannot be acquired (a Rejected message, an invalid StepPrefix), its
// outcome (a Status other than zero) and error.
func (c *LeaseConsumer) prepAcquire(msg Message, opt AcquireOptions, a *Attempt) (fp []byte, prefix string, atomicStep bool, out Outcome, err error) {
	out, fp = c.prepareInto(msg, &a.acq.fp)
	if out.Status != 0 {
		return nil, "", false, out, out.Err
	}
	atomicStep = opt.StepPrefix != "" && idemdriver.RecordsSteps(c.store)
	if atomicStep {
		prefix = opt.StepPrefix
	} else if opt.StepPrefix != "" {
		if err := idemdriver.ValidateStepName(idemdriver.PrefixStep(opt.StepPrefix, math.MaxInt64)); err != nil {
			out, err := c.failed(msg.ID, err)
			return nil, "", false, out, err
		}
	}
	return fp, prefix, atomicStep, Outcome{}, nil
}

// judgeAcquire settles the store's answer to the acquisition of msg
// (acq, or the store's error err), made at leaseFrom: the attempt a,
// started (held), when msg was acquired; else nil and the outcome of a
// record that another attempt holds or finished (existing), or Failed
// with ErrStore.
func (c *LeaseConsumer) judgeAcquire(ctx context.Context, t *track, a *Attempt, msg Message, fp []byte, acq idemdriver.AcquireResult, err error, leaseFrom, since time.Time, stepPrefix string, atomicStep bool) (*Attempt, Outcome, error) {
	if err != nil {
		out, err := c.failed(msg.ID, c.storeErr(ctx, "acquire", msg.ID, err))
		return nil, out, err
	}
	if acq.Acquired {
		return c.held(ctx, a, t, msg, acq, leaseFrom, since, stepPrefix, atomicStep)
	}
	out, err := c.existing(msg.ID, fp, acq)
	return nil, out, err
}

// acquireParams is an acquisition's parameters, the array its default
// fingerprint is summed into and the context of its store calls
// (callBound, which becomes the attempt's Context), allocated with the
// attempt (Attempt.acq).
type acquireParams struct {
	p     idemdriver.AcquireParams
	fp    [sha256.Size]byte
	bound callBound
}

// held starts the attempt that acquired msg: its renewals, its hooks, the
// crash-loop check, and the recovery point of prefix (already saved by the
// Acquire when saved is true). a is the attempt allocated by acquire,
// with only its acq set.
func (c *LeaseConsumer) held(ctx context.Context, a *Attempt, t *track, msg Message, acq idemdriver.AcquireResult, leaseFrom, since time.Time, prefix string, saved bool) (*Attempt, Outcome, error) {
	a.Message, a.Consumer, a.Number, a.Token = msg, c.cfg.Name, acq.Attempt, acq.Token
	a.c, a.t, a.steps, a.validUntil = c, t, acq.Steps, leaseFrom.Add(c.cfg.Lease)
	if prefix != "" && saved {
		a.point = prefix // in steps once they are read (stepsLocked)
	}
	t.claim(ctx, -1, msg.ID, acq.Attempt, acq.Token, since)
	if h := c.hooks; h != nil && acq.Attempt > 1 && len(h.takeover) > 0 {
		h.onLease(ctx, h.takeover, LeaseEvent{MessageID: msg.ID, Attempt: acq.Attempt, Token: acq.Token, Latency: time.Since(leaseFrom)})
	}
	a.hctx = ctx
	if b := &a.acq.bound; b.ctx != nil && b.ctx.Err() == nil {
		// The Acquire's context, derived from ctx and no longer in the
		// scheduler (its call ended): the attempt's, one context fewer.
		// Handed over: acquire's deferred cancel leaves it.
		a.ctx, a.cancelCtx = b.ctx, b.cancel
		b.cancel = nil
	} else {
		// No store timeout, or the caller's context ended, or the store
		// timeout fired as the Acquire returned.
		a.ctx, a.cancelCtx = context.WithCancelCause(ctx)
	}
	c.renewals.add(a, time.Now())
	defer a.dropOnPanic()
	if acq.Attempt > c.cfg.MaxAttempts {
		// Earlier attempts died without releasing (their leases expired):
		// a crash loop. Stop it here.
		cause := fmt.Errorf("%d attempts (MaxAttempts %d) ended without a result or a release: their leases expired", acq.Attempt-1, c.cfg.MaxAttempts)
		out, err := a.release(ctx, cause, func() bool { return true })
		if !a.isEnded() {
			out, err = a.Abandon(ctx, err)
		}
		return nil, out, err
	}
	if prefix != "" && !saved {
		// A store without idemdriver.StepRecorder: the point costs a
		// write of its own, before anything runs.
		if err := a.SaveStep(ctx, idemdriver.PrefixStep(prefix, acq.Token), nil); err != nil {
			out, rerr := a.release(ctx, err, func() bool { return false })
			if !a.isEnded() {
				out, rerr = a.Abandon(ctx, rerr)
			}
			return nil, out, rerr
		}
	}
	return a, Outcome{}, nil
}

// dropOnPanic is deferred by held once the attempt is started: a store
// that panics before the attempt is handed to the caller (while its
// recovery point is saved, or the crash-loop check releases it) ends it
// without a store write, as Abandon does (its renewals stop, its lease
// runs out and a later attempt takes over), and the panic goes on; the
// caller's own recovery reports the delivery to the hooks, once.
func (a *Attempt) dropOnPanic() {
	r := recover()
	if r == nil {
		return
	}
	a.mu.Lock()
	ended := a.ended
	a.ended = true
	a.mu.Unlock()
	if !ended {
		a.c.renewals.remove(a)
		a.cancel(fmt.Errorf("idem: panic while acquiring message %q: %v", a.Message.ID, r))
	}
	panic(r)
}

// Attempt is one lease-mode attempt at a message: the lease it holds,
// renewed in the background, with its fencing token and recovery points.
// It comes from [LeaseConsumer.Acquire] (the caller ends it) or is given
// to a [LeaseHandler] by [LeaseConsumer.Process] (which ends it when the
// handler returns). Its methods are safe for concurrent use.
type Attempt struct {
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

	c         *LeaseConsumer
	t         *track
	hctx      context.Context         // the hooks' context, as the start hooks returned it
	ctx       context.Context         // hctx, also cancelled when the attempt's lease is lost or it ends
	cancelCtx context.CancelCauseFunc // cancels ctx
	rs        renewalState            // guarded by c.renewals.mu
	// acq is the acquisition's parameters and its callBound (acq.bound,
	// whose cancellable context becomes ctx, and its cancel cancelCtx).
	acq acquireParams
	// fin is the context of the final write Process makes (callBound;
	// its ctx is nil when Process made none).
	fin callBound

	mu sync.Mutex
	// lctx is LeaseContext, made by its first call (most attempts never
	// ask for it); cancelLease cancels it. cause is the cause of the
	// attempt's end or lost lease, set by the first cancel: a lctx made
	// after that is made cancelled with it.
	lctx        context.Context
	cancelLease context.CancelCauseFunc
	cause       error
	steps       map[string][]byte // nil until a step is saved or found
	validUntil  time.Time         // the lease is held until at least then, by our clock
	lost        bool              // the store said another attempt owns the record
	ended       bool
	releaseStep string // saved with the release (SaveStepOnRelease)
	// point is the prefix of the recovery point the Acquire saved with
	// the claim (AcquireOptions.StepPrefix; the step is
	// idemdriver.PrefixStep(point, Token)), not yet in steps: put there
	// when they are first read (stepsLocked), as most attempts never do,
	// so that the point costs no map and no name of its own.
	point string
}

// Context returns the attempt's context: derived from the context given
// to Acquire (as the HookProcessStart hooks returned it), and cancelled
// with cause ErrLeaseLost (see context.Cause) when the lease is lost: a
// renewal found another attempt owning the record, or the lease ran out
// by the local clock because no renewal reached the store in time.
// Another attempt may then take over, so side effects must stop. It is
// also cancelled, with cause ErrAttemptEnded, when the attempt ends.
func (a *Attempt) Context() context.Context { return a.ctx }

// LeaseContext is Context without the caller's cancellation: it ends only
// when the lease is lost (cause ErrLeaseLost) or the attempt ends (cause
// ErrAttemptEnded), not when the context given to Acquire ends. It bounds
// the work that must go on while the lease is held even after the caller
// left, such as retrying the final write of a result.
func (a *Attempt) LeaseContext() context.Context {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.lctx == nil {
		a.lctx, a.cancelLease = context.WithCancelCause(withoutCancel(a.hctx))
		if a.cause != nil {
			a.cancelLease(a.cause)
		}
	}
	return a.lctx
}

// cancel cancels the attempt's contexts (Context, and LeaseContext if it
// was made) with cause; the first cause given stays.
func (a *Attempt) cancel(cause error) {
	a.mu.Lock()
	if a.cause == nil {
		a.cause = cause
	}
	cancelLease := a.cancelLease
	a.mu.Unlock()
	if cancelLease != nil {
		cancelLease(cause)
	}
	a.cancelCtx(cause)
}

// leaseLost reports whether the attempt's contexts were cancelled because
// its lease was lost (what LeaseContext's cause says).
func (a *Attempt) leaseLost() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return errors.Is(a.cause, ErrLeaseLost)
}

// Lost reports whether the store said that this attempt no longer owns
// its record: a renewal or a write of it was refused with ErrLeaseLost
// (another attempt took the message over, or the store judged the lease
// over). A lease that only ran out by the local clock (Deadline passed)
// is not lost until the store says so: the fenced final write decides.
// Process abandons a lost attempt after its handler rather than write its
// result or release it; code that ends its attempts itself (a batch's
// CompleteBatch) does the same.
func (a *Attempt) Lost() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lost
}

// Deadline returns the instant, by the local clock, until which the lease
// is known to be held: the start of the last successful renewal (or of
// the Acquire) plus Config.Lease. The store's own expiry (by its clock) is
// no earlier, provided the two clocks run at the same rate. Past it, the
// attempt's context is cancelled unless a renewal lands.
func (a *Attempt) Deadline() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.validUntil
}

// Valid checks that the attempt still holds its lease, by the local
// deadline and by the store's clock: it renews the lease (a fenced write,
// judged by the store) and returns nil when the renewal succeeded, or
// when the store could not be reached but the local deadline (Deadline)
// is still ahead. It returns an error matching ErrLeaseLost when another
// attempt owns the record, or when the deadline passed and the store
// could not confirm the lease; ErrAttemptEnded after the attempt ended.
// Call it before an effect that must not run twice; Step calls it before
// every step.
func (a *Attempt) Valid(ctx context.Context) error {
	if err := a.state(); err != nil {
		return err
	}
	start := time.Now()
	err := a.renew(ctx)
	switch {
	case err == nil:
		a.renewed(start)
		return nil
	case errors.Is(err, ErrLeaseLost):
		a.markLost(ctx, "renew", start, err)
		return a.lostErr("is no longer the record's owner")
	}
	if time.Now().Before(a.Deadline()) {
		_ = a.c.storeErr(ctx, "renew", a.Message.ID, err)
		return nil
	}
	a.expire()
	return errors.Join(a.lostErr("has passed its lease and the store could not confirm it"), storeError("renew", err))
}

// state returns ErrAttemptEnded after the end, and ErrLeaseLost when the
// store said another attempt owns the record or the attempt's context was
// cancelled because the lease ran out by the local clock.
func (a *Attempt) state() error {
	if err := a.owned(); err != nil {
		return err
	}
	if a.leaseLost() {
		return a.lostErr("ran out of lease by the local clock with no renewal confirmed")
	}
	return nil
}

// owned returns ErrAttemptEnded after the end, and ErrLeaseLost when the
// store said another attempt owns the record; nil otherwise, whatever the
// local clock says.
func (a *Attempt) owned() error {
	a.mu.Lock()
	ended, lost := a.ended, a.lost
	a.mu.Unlock()
	switch {
	case ended:
		return fmt.Errorf("%w: attempt %d (token %d) of message %q", ErrAttemptEnded, a.Number, a.Token, a.Message.ID)
	case lost:
		return a.lostErr("is no longer the record's owner")
	}
	return nil
}

func (a *Attempt) lostErr(why string) error {
	return fmt.Errorf("%w: attempt %d (token %d) of message %q %s", ErrLeaseLost, a.Number, a.Token, a.Message.ID, why)
}

func (a *Attempt) isEnded() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ended
}

// renewed records a successful renewal that started at start.
func (a *Attempt) renewed(start time.Time) {
	a.mu.Lock()
	if u := start.Add(a.c.cfg.Lease); u.After(a.validUntil) {
		a.validUntil = u
	}
	a.mu.Unlock()
}

// markLost records that the store rejected a write of this attempt with
// ErrLeaseLost, cancels the attempt's context and reports it.
func (a *Attempt) markLost(ctx context.Context, op string, since time.Time, err error) {
	a.mu.Lock()
	a.lost = true
	a.mu.Unlock()
	a.cancel(ErrLeaseLost)
	a.c.leaseLost(ctx, a, op, since, err)
}

// expire cancels the attempt's context: its lease ran out by the local
// clock with no renewal confirmed. Whether it still owns the record is
// decided by the store's fencing at the next write.
func (a *Attempt) expire() { a.cancel(ErrLeaseLost) }

// renew writes one renewal, bounded by the store timeout and by the
// lease's local deadline: a renewal that hangs past the lease is as good
// as lost.
func (a *Attempt) renew(ctx context.Context) error {
	cctx, cancel := callCtx(ctx, a.c.storeTimeout())
	defer cancel()
	dctx, cancelDeadline := context.WithDeadline(cctx, a.Deadline())
	defer cancelDeadline()
	err := a.c.store.Renew(dctx, &idemdriver.RenewParams{Consumer: a.Consumer, MessageID: a.Message.ID, Token: a.Token, Lease: a.c.cfg.Lease})
	return timedOut(cctx, err)
}

// Key returns the idempotency key for the external call named step, the
// same on every attempt and redelivery: DeriveKey(consumer, message ID, step).
// Send it as the third party's idempotency key (Stripe's Idempotency-Key)
// so that a call made before a crash is not made twice.
func (a *Attempt) Key(step string) string { return DeriveKey(a.Consumer, a.Message.ID, step) }

// Step runs fn once across all attempts at the message: a recovery point
// (Stripe's atomic phases). If an earlier attempt completed the step, Step
// returns its saved result without calling fn. Otherwise it checks that
// the lease is still held (Valid: by the local deadline and the store's
// clock) and only then calls fn, so a step never starts after the lease is
// gone (an attempt paused past its lease, by a stop signal or a long GC
// pause, does not run its next step when it wakes); then it saves the
// result under this attempt's fencing token before returning it. When ctx
// ends while fn runs and fn returns a result anyway (its effect made), the
// result is saved on a context detached from ctx, bounded by the store
// timeout, so that the next attempt does not make the effect again. Once
// fn has returned a result, the point is sent to the store even past the
// lease's local deadline (Deadline): the store's fencing alone refuses it,
// when another attempt took over.
//
// Errors: ctx's cause, without calling fn, when ctx has already ended
// (the result could not be saved on it, so an effect fn made anyway would
// be made again by the next attempt); ErrLeaseLost when the lease was
// gone before fn, when fn failed
// because the lease ended meanwhile (its context's cause, see
// context.Cause), or when the save was refused because another attempt
// took over; the attempt must then stop. fn's own error otherwise, and
// ErrStore when the save failed. name is 1 to 255 bytes.
func (a *Attempt) Step(ctx context.Context, name string, fn func(ctx context.Context) ([]byte, error)) ([]byte, error) {
	if err := idemdriver.ValidateStepName(name); err != nil {
		return nil, err
	}
	a.mu.Lock()
	res, done := a.stepsLocked()[name]
	a.mu.Unlock()
	if done {
		return res, nil
	}
	if err := ctx.Err(); err != nil {
		// fn would run on an ended context whose SaveStep must fail: an
		// effect it made anyway (a function deaf to its context) would
		// be made again by the next attempt.
		return nil, context.Cause(ctx)
	}
	if err := a.Valid(ctx); err != nil {
		return nil, err
	}
	res, err := fn(ctx)
	if err != nil {
		if cerr := a.leaseCause(ctx); cerr != nil {
			return nil, errors.Join(cerr, err)
		}
		return nil, err
	}
	sctx := ctx
	if ctx.Err() != nil {
		// ctx ended while fn ran and fn made its effect anyway (it
		// returned no error): record it on a detached context, bounded
		// by the store timeout, so that the next attempt does not make
		// it again. The fencing token still refuses the write if another
		// attempt took the record over.
		dctx, cancel := detachedCallCtx(ctx, a.c.storeTimeout())
		defer cancel()
		sctx = dctx
	}
	// The effect is made: its point is saved unless the store refuses it
	// (another attempt took over), even past the local deadline, which
	// only says that the lease may be gone.
	if err := a.saveStep(sctx, name, res, true); err != nil {
		return nil, err
	}
	return res, nil
}

// leaseCause returns an ErrLeaseLost error when ctx or the attempt's own
// context ended because the lease was lost, nil otherwise.
func (a *Attempt) leaseCause(ctx context.Context) error {
	if (ctx.Err() != nil && errors.Is(context.Cause(ctx), ErrLeaseLost)) || a.leaseLost() {
		return a.lostErr("lost its lease while the step ran")
	}
	return nil
}

// SaveStep records a recovery point without running anything: the step
// name is marked completed with result under this attempt's fencing
// token, and later attempts see it (Completed, Steps). A step that exists
// keeps its first result. It is what an attempt records just before an
// effect that cannot be undone or repeated (a reverse proxy records one
// before the first byte goes to its upstream), so that an attempt taking
// over after a crash knows the effect may have happened.
//
// Errors: ErrLeaseLost when the lease is gone (the local deadline passed
// and the store's fencing refused the write, or another attempt owns the
// record), ErrStore when the store failed, ErrAttemptEnded after the end.
func (a *Attempt) SaveStep(ctx context.Context, name string, result []byte) error {
	return a.saveStep(ctx, name, result, false)
}

// saveStep is SaveStep; made says that the step's effect was made
// already (Step, after its function): the point is then sent to the store
// past the local deadline too, whose fencing alone decides, since a
// point not saved makes the next attempt repeat the effect.
func (a *Attempt) saveStep(ctx context.Context, name string, result []byte, made bool) error {
	if err := idemdriver.ValidateStepName(name); err != nil {
		return err
	}
	check := a.state
	if made {
		check = a.owned
	}
	if err := check(); err != nil {
		return err
	}
	since := time.Now()
	cctx, cancel := callCtx(ctx, a.c.storeTimeout())
	err := timedOut(cctx, a.c.store.SaveStep(cctx, &idemdriver.StepParams{Consumer: a.Consumer, MessageID: a.Message.ID, Token: a.Token, Step: name, Result: result}))
	cancel()
	switch {
	case errors.Is(err, ErrLeaseLost):
		a.markLost(ctx, "step", since, err)
		return a.lostErr("lost its lease before its recovery point was saved")
	case err != nil:
		if cerr := a.leaseCause(ctx); cerr != nil {
			return errors.Join(cerr, err)
		}
		return a.c.storeErr(ctx, "save step", a.Message.ID, err)
	}
	a.keepStep(name, result)
	return nil
}

// keepStep records locally that step name is saved with result, unless
// it was already.
func (a *Attempt) keepStep(name string, result []byte) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.keepStepLocked(name, result)
}

// keepStepLocked is keepStep with a.mu held.
func (a *Attempt) keepStepLocked(name string, result []byte) {
	if _, done := a.stepsLocked()[name]; !done {
		if a.steps == nil {
			a.steps = map[string][]byte{}
		}
		a.steps[name] = slices.Clone(result)
	}
}

// stepsLocked returns a.steps with the recovery point the Acquire saved
// (a.point) in it; a.mu is held.
func (a *Attempt) stepsLocked() map[string][]byte {
	if p := a.point; p != "" {
		a.point = ""
		a.keepStepLocked(idemdriver.PrefixStep(p, a.Token), nil)
	}
	return a.steps
}

// SaveStepOnRelease names a recovery point, with an empty result, that
// the attempt's Release saves with the release: in the same atomic store
// write on a store that is an idemdriver.StepRecorder
// (idemdriver.ReleaseParams.Step), so the point costs no store call of its
// own; on another store with a SaveStep just before the release (a
// failure of which fails the Release as the release's own would). It
// writes nothing by itself; a later call replaces the name and "" clears
// it. Complete and Abandon do not save it. A front end uses it to record
// that the attempt's outcome is known when it releases the key. name is
// checked as SaveStep's (an error matching ErrInvalidConfig).
func (a *Attempt) SaveStepOnRelease(name string) error {
	if name != "" {
		if err := idemdriver.ValidateStepName(name); err != nil {
			return err
		}
	}
	a.mu.Lock()
	a.releaseStep = name
	a.mu.Unlock()
	return nil
}

// Completed reports whether the step name is completed: by an earlier
// attempt, or by this one.
func (a *Attempt) Completed(name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.stepsLocked()[name]
	return ok
}

// Steps returns a copy of the completed steps and their results, those of
// earlier attempts (as Acquire found them) and this attempt's.
func (a *Attempt) Steps() map[string][]byte {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := maps.Clone(a.stepsLocked())
	if out == nil {
		out = map[string][]byte{}
	}
	for k, v := range out {
		out[k] = slices.Clone(v)
	}
	return out
}

// checkEnd returns ErrAttemptEnded when the attempt already ended.
func (a *Attempt) checkEnd() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ended {
		return fmt.Errorf("%w: attempt %d (token %d) of message %q", ErrAttemptEnded, a.Number, a.Token, a.Message.ID)
	}
	return nil
}

// finish ends the attempt: stops the renewals, cancels its context and
// reports the outcome to the hooks.
func (a *Attempt) finish(out Outcome, err error) (Outcome, error) {
	a.mu.Lock()
	if a.ended {
		a.mu.Unlock()
		return out, err
	}
	a.ended = true
	finCancel := a.fin.cancel
	a.mu.Unlock()
	a.c.renewals.remove(a)
	a.cancel(ErrAttemptEnded)
	if finCancel != nil {
		finCancel(ErrAttemptEnded)
	}
	a.t.end(a.hctx, out, err)
	return out, err
}

// endOnPanic is deferred by the ending writes: a store that panics ends
// the attempt with a Failed outcome for the hooks, and the panic goes on.
func (a *Attempt) endOnPanic() {
	r := recover()
	if r == nil {
		return
	}
	err := fmt.Errorf("idem: panic while ending the attempt: %v", r)
	_, _ = a.finish(Outcome{Status: Failed, MessageID: a.Message.ID, Err: err, Attempt: a.Number}, err)
	panic(r)
}

// Complete records res as the message's result while this attempt's token
// owns the record, and ends the attempt: Processed, nil. ctx bounds the
// store call (and Config.StoreTimeout); pass one detached from a caller that may leave
// (context.WithoutCancel with a timeout) so the result is stored anyway.
//
// An error matching ErrLeaseLost means another attempt took over: the
// result was not stored and the attempt has ended (Failed). An error
// matching ErrStore means the store failed: the attempt is still held
// (its renewals go on), so the caller may call Complete again (with
// backoff, while Context is not done), or Release or Abandon it; the
// Failed outcome is then not reported to the hooks yet.
func (a *Attempt) Complete(ctx context.Context, res Result) (Outcome, error) {
	return a.complete(ctx, res, nil)
}

// complete is Complete; with bound (a callBound whose context derives
// from ctx) the store call runs on bound's context when it can.
func (a *Attempt) complete(ctx context.Context, res Result, bound *callBound) (Outcome, error) {
	if err := a.checkEnd(); err != nil {
		return Outcome{Status: Failed, MessageID: a.Message.ID, Err: err, Attempt: a.Number}, err
	}
	defer a.endOnPanic()
	a.c.renewals.ending(a)
	since := time.Now()
	var err error
	if a.c.renewals.startCall(bound) {
		bound.cp = a.completeParams(res) // no allocation of its own
		err = timedOut(bound, a.c.storeComplete(bound, &bound.cp))
		bound.cp = idemdriver.CompleteParams{}
		a.c.renewals.endCall(bound)
	} else {
		p := a.completeParams(res)
		cctx, cancel := callCtx(ctx, a.c.storeTimeout())
		err = timedOut(cctx, a.c.storeComplete(cctx, &p))
		cancel()
	}
	return a.completed(ctx, res, since, err)
}

// completeParams is the store's parameters of the completion of a with
// res.
func (a *Attempt) completeParams(res Result) idemdriver.CompleteParams {
	return idemdriver.CompleteParams{
		Consumer: a.Consumer, MessageID: a.Message.ID, Token: a.Token, Result: res.Body, ContentType: res.ContentType,
	}
}

// completed settles the store's answer (err) to the completion of a with
// res, sent at since: Processed and the attempt ended; Failed and ended
// when another attempt took over (ErrLeaseLost); Failed with ErrStore and
// still held when the store failed.
func (a *Attempt) completed(ctx context.Context, res Result, since time.Time, err error) (Outcome, error) {
	if errors.Is(err, ErrLeaseLost) {
		err = fmt.Errorf("%w: attempt %d (token %d) of message %q finished after another attempt took over; its result was not stored", err, a.Number, a.Token, a.Message.ID)
		a.markLost(ctx, "complete", since, err)
		return a.finish(Outcome{Status: Failed, MessageID: a.Message.ID, Err: err, Attempt: a.Number}, err)
	}
	if err != nil {
		err = a.c.storeErr(ctx, "complete", a.Message.ID, err)
		return Outcome{Status: Failed, MessageID: a.Message.ID, Err: err, Attempt: a.Number}, err
	}
	return a.finish(Outcome{Status: Processed, MessageID: a.Message.ID, Result: res.Body, ContentType: res.ContentType, Attempt: a.Number}, nil)
}

// Release ends a failed attempt after cause: the lease ends now and the
// message is available to the next attempt (Failed, cause), or, when cause
// is not retryable (Config.Retryable; see Permanent) or this was attempt
// MaxAttempts, the record becomes terminal (Failed, Poison, ErrPoison).
// ctx bounds the store call, as for Complete.
//
// An error matching ErrLeaseLost (joined with cause) means another attempt
// owns the record; the attempt has ended. One matching ErrStore means the
// release failed and the attempt is still held: the caller may retry, or
// Abandon it (the lease then runs out and a later attempt takes over).
func (a *Attempt) Release(ctx context.Context, cause error) (Outcome, error) {
	if cause == nil {
		cause = errors.New("idem: released without a cause")
	}
	return a.release(ctx, cause, func() bool { return !a.c.cfg.Retryable(cause) || a.Number >= a.c.cfg.MaxAttempts })
}

// release writes the release; isTerminal (which may call the user's
// Retryable, so it runs under endOnPanic) says whether it is terminal.
func (a *Attempt) release(ctx context.Context, cause error, isTerminal func() bool) (Outcome, error) {
	if err := a.checkEnd(); err != nil {
		return Outcome{Status: Failed, MessageID: a.Message.ID, Err: err, Attempt: a.Number}, err
	}
	defer a.endOnPanic()
	terminal := isTerminal()
	a.mu.Lock()
	step := a.releaseStep
	a.mu.Unlock()
	if step != "" && !idemdriver.RecordsSteps(a.c.store) {
		if err := a.SaveStep(ctx, step, nil); err != nil {
			cause = errors.Join(cause, err)
			if errors.Is(err, ErrLeaseLost) {
				return a.finish(Outcome{Status: Failed, MessageID: a.Message.ID, Err: cause, Attempt: a.Number}, cause)
			}
			return Outcome{Status: Failed, MessageID: a.Message.ID, Err: cause, Attempt: a.Number}, cause
		}
		step = ""
	}
	since := time.Now()
	cctx, cancel := callCtx(ctx, a.c.storeTimeout())
	err := timedOut(cctx, a.c.store.Release(cctx, &idemdriver.ReleaseParams{
		Consumer: a.Consumer, MessageID: a.Message.ID, Token: a.Token, Error: cause.Error(), Terminal: terminal, Step: step,
	}))
	cancel()
	if err == nil && step != "" {
		a.keepStep(step, nil)
	}
	switch {
	case errors.Is(err, ErrLeaseLost):
		a.markLost(ctx, "release", since, err)
		cause = errors.Join(cause, err)
		return a.finish(Outcome{Status: Failed, MessageID: a.Message.ID, Err: cause, Attempt: a.Number}, cause)
	case err != nil:
		cause = errors.Join(cause, a.c.storeErr(ctx, "release", a.Message.ID, err))
		return Outcome{Status: Failed, MessageID: a.Message.ID, Err: cause, Attempt: a.Number}, cause
	case terminal:
		cause = fmt.Errorf("%w: message %q, after attempt %d (MaxAttempts %d): %w", ErrPoison, a.Message.ID, a.Number, a.c.cfg.MaxAttempts, cause)
	case a.t != nil:
		a.t.released = true
	}
	return a.finish(Outcome{Status: Failed, MessageID: a.Message.ID, Err: cause, Attempt: a.Number, Poison: terminal}, cause)
}

// Abandon ends the attempt without a store write: the renewals stop and
// the record stays in progress until its lease runs out, when a later
// attempt takes it over (seeing this attempt's recovery points). It is
// the end of an attempt whose Complete or Release failed, or whose lease
// was lost. The outcome is Failed with err (an error matching
// ErrLeaseLost when the lease was lost and err is nil).
func (a *Attempt) Abandon(ctx context.Context, err error) (Outcome, error) {
	if e := a.checkEnd(); e != nil {
		return Outcome{Status: Failed, MessageID: a.Message.ID, Err: e, Attempt: a.Number}, e
	}
	if err == nil {
		err = a.leaseCause(ctx)
	}
	if err == nil {
		err = fmt.Errorf("idem: attempt %d (token %d) of message %q abandoned; a later attempt takes over when its lease runs out", a.Number, a.Token, a.Message.ID)
	}
	return a.finish(Outcome{Status: Failed, MessageID: a.Message.ID, Err: err, Attempt: a.Number}, err)
}
