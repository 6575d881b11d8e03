package idem

import (
	"context"
	"fmt"
	"time"

	"github.com/idem-go/idem/idemdriver"
)

// The batch-native calls of the lease engine: a broker's fetched batch
// claimed in one store call and its results recorded in another, each
// message judged and held exactly as Acquire and Complete judge and hold
// one.

// AcquireBatch is Acquire for the messages of a batch (a broker's fetch),
// in one store call: idemdriver.LeaseBatcher.AcquireBatch when the store
// is one (and more than one message is to be claimed), else the store's
// Acquire for each message in turn. It returns one *Attempt and one
// Outcome per message, in the order given: atts[i] is the held lease of
// msgs[i], exactly as Acquire returns it (renewed by the consumer's one
// renewal scheduler, its recovery point saved with the claim when
// opt.StepPrefix is set, ended by the caller with Complete, CompleteBatch,
// Release or Abandon), and outs[i] is then zero; or atts[i] is nil and
// outs[i] is the settled outcome Acquire would return (Duplicate with the
// stored result, InProgress, FingerprintMismatch, Rejected, a poison
// Failed after MaxAttempts or on a terminal record, Failed with ErrStore),
// its error in outs[i].Err. The store judges the messages in order, so the
// second of two messages with one ID in a batch finds the record held by
// the first: InProgress. The hooks see one delivery per message, as
// Acquire's.
//
// err is nil unless the batch itself is invalid: more than
// idemdriver.MaxLeaseBatch messages, or opt.Wait set (a batch does not
// wait for a live lease; InProgress is answered at once). Both match
// ErrInvalidConfig; nothing is claimed then and atts and outs are nil. A
// store failure of the whole batch is each message's Failed outcome
// (ErrStore): a message the store may have acquired is held by nobody and
// is taken over when its lease runs out, as after a single Acquire whose
// reply was lost.
//
// The store call is bounded by Config.StoreTimeout from its start (one
// bound for the batch) and by ctx. Each attempt's Context derives from
// ctx, as the HookProcessStart hooks returned it for its message. With
// hooks, a Delivery in ctx (an adapter's, of the whole batch) becomes
// each message's own for its hooks and its attempt's Context: Header is
// the message's Headers, BatchHeaders nil.
func (c *LeaseConsumer) AcquireBatch(ctx context.Context, msgs []Message, opt AcquireOptions) ([]*Attempt, []Outcome, error) {
	if opt.Wait > 0 {
		return nil, nil, fmt.Errorf("%w: AcquireBatch does not wait for a live lease (AcquireOptions.Wait %v)", ErrInvalidConfig, opt.Wait)
	}
	if err := idemdriver.ValidateBatchSize(len(msgs)); err != nil {
		return nil, nil, err
	}
	atts := make([]*Attempt, len(msgs))
	outs := make([]Outcome, len(msgs))
	// One claim per message: its hooks' context and track, its attempt
	// (with its parameters), fingerprint and whether it is settled.
	type claim struct {
		hctx       context.Context
		t          *track
		a          *Attempt
		fp         []byte
		prefix     string
		atomicStep bool
		since      time.Time
		settled    bool
	}
	cs := make([]claim, len(msgs))
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		// A store (or a hook's Retryable) that panics: every message
		// not yet settled ends Failed for the hooks, an attempt held
		// already is abandoned, and the panic goes on.
		perr := fmt.Errorf("idem: panic while acquiring a batch: %v", r)
		for i := range cs {
			switch cl := &cs[i]; {
			case atts[i] != nil:
				_, _ = atts[i].Abandon(cl.hctx, perr)
			case !cl.settled && cl.hctx != nil:
				cl.t.end(cl.hctx, Outcome{Status: Failed, MessageID: msgs[i].ID, Err: perr}, perr)
			}
		}
		panic(r)
	}()
	ps := make([]*idemdriver.AcquireParams, 0, len(msgs))
	idx := make([]int, 0, len(msgs)) // idx[j] is the message of ps[j]
	// An adapter's Delivery of the whole batch (BatchHeaders): for the
	// hooks each message is a delivery of its own, with its own headers
	// (the ones a tracing hook continues the producer's trace from).
	d, perMessage := Delivery{}, false
	if c.hooks != nil {
		d, perMessage = DeliveryFromContext(ctx)
	}
	for i, m := range msgs {
		cl := &cs[i]
		mctx := ctx
		if perMessage {
			md := d
			md.Header, md.BatchHeaders = nil, nil
			if m.Headers != nil {
				md.Header = m.Headers
			}
			mctx = WithDelivery(ctx, md)
		}
		cl.hctx, cl.t = c.begin(mctx, m.ID, 0)
		cl.a = &Attempt{}
		var out Outcome
		var err error
		cl.fp, cl.prefix, cl.atomicStep, out, err = c.prepAcquire(m, opt, cl.a)
		if out.Status != 0 {
			c.settleClaim(cl.hctx, cl.t, &outs[i], out, err)
			cl.settled = true
			continue
		}
		cl.a.acq.p = idemdriver.AcquireParams{
			Consumer: c.cfg.Name, MessageID: m.ID, Fingerprint: cl.fp, Lease: c.cfg.Lease, StepPrefix: cl.prefix,
		}
		ps = append(ps, &cl.a.acq.p)
		idx = append(idx, i)
	}
	if len(ps) == 0 {
		return atts, outs, nil
	}
	// The leases cannot have started before this instant, by our clock.
	leaseFrom := time.Now()
	for _, i := range idx {
		cs[i].since = cs[i].t.now()
	}
	res, errs := c.acquireMany(ctx, ps)
	for j, i := range idx {
		cl := &cs[i]
		a, out, err := c.judgeAcquire(cl.hctx, cl.t, cl.a, msgs[i], cl.fp, res[j], errs[j], leaseFrom, cl.since, opt.StepPrefix, cl.atomicStep)
		cl.settled = true
		if a != nil {
			atts[i] = a
			continue
		}
		c.settleClaim(cl.hctx, cl.t, &outs[i], out, err)
	}
	return atts, outs, nil
}

// settleClaim records out as the outcome of a message not acquired and
// ends its delivery for the hooks.
func (c *LeaseConsumer) settleClaim(ctx context.Context, t *track, dst *Outcome, out Outcome, err error) {
	out.Err = err
	*dst = out
	t.end(ctx, out, err)
}

// acquireMany sends the acquisitions ps in one store call (AcquireBatch
// on an idemdriver.LeaseBatcher, for more than one), else one Acquire
// each, and returns one result and one error per element: a failure of
// the whole batch is every element's error.
func (c *LeaseConsumer) acquireMany(ctx context.Context, ps []*idemdriver.AcquireParams) ([]idemdriver.AcquireResult, []error) {
	res := make([]idemdriver.AcquireResult, len(ps))
	errs := make([]error, len(ps))
	if b, ok := c.store.(idemdriver.LeaseBatcher); ok && len(ps) > 1 {
		cctx, cancel := callCtx(ctx, c.storeTimeout())
		r, es, err := b.AcquireBatch(cctx, ps)
		err = timedOut(cctx, err)
		cancel()
		if err == nil && (len(r) != len(ps) || len(es) != len(ps)) {
			err = fmt.Errorf("the store answered %d results and %d errors for %d acquisitions", len(r), len(es), len(ps))
		}
		for j := range ps {
			if err != nil {
				errs[j] = err
				continue
			}
			res[j], errs[j] = r[j], es[j]
		}
		return res, errs
	}
	for j, p := range ps {
		cctx, cancel := callCtx(ctx, c.storeTimeout())
		res[j], errs[j] = c.store.Acquire(cctx, p)
		errs[j] = timedOut(cctx, errs[j])
		cancel()
	}
	return res, errs
}

// CompleteBatch is Complete for many attempts of this consumer, in one
// store call: idemdriver.LeaseBatcher.CompleteBatch when the store is one
// (and more than one attempt is to be completed), else the store's
// Complete for each attempt in turn. It records results[i] as the result
// of atts[i]'s message while atts[i]'s token owns the record, and returns
// one Outcome per attempt, in the order given, each as Complete returns
// it: Processed (Err nil) and the attempt ended; Failed with an error
// matching ErrLeaseLost and the attempt ended when another attempt took
// its record over (the others are unaffected); Failed with ErrStore when
// the store failed, for that attempt or for the whole batch, the attempt
// still held (the caller may complete it again, Release or Abandon it);
// Failed with ErrAttemptEnded, not sent, for an attempt that had ended.
// ctx bounds the store call with Config.StoreTimeout, as for Complete.
//
// err is nil unless the batch itself is invalid (an error matching
// ErrInvalidConfig; nothing is sent and outs is nil): len(results) is not
// len(atts), more than idemdriver.MaxLeaseBatch attempts, an attempt nil,
// of another consumer, or given twice.
func (c *LeaseConsumer) CompleteBatch(ctx context.Context, atts []*Attempt, results []Result) ([]Outcome, error) {
	switch {
	case len(results) != len(atts):
		return nil, fmt.Errorf("%w: CompleteBatch of %d attempts with %d results", ErrInvalidConfig, len(atts), len(results))
	case len(atts) > idemdriver.MaxLeaseBatch:
		return nil, idemdriver.ValidateBatchSize(len(atts))
	}
	seen := make(map[*Attempt]struct{}, len(atts))
	for i, a := range atts {
		if a == nil || a.c != c {
			return nil, fmt.Errorf("%w: CompleteBatch: attempt %d is nil or not of consumer %q", ErrInvalidConfig, i, c.cfg.Name)
		}
		if _, dup := seen[a]; dup {
			return nil, fmt.Errorf("%w: CompleteBatch: attempt %d of message %q given twice", ErrInvalidConfig, i, a.Message.ID)
		}
		seen[a] = struct{}{}
	}
	outs := make([]Outcome, len(atts))
	ps := make([]idemdriver.CompleteParams, 0, len(atts))
	idx := make([]int, 0, len(atts)) // idx[j] is the attempt of ps[j]
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		// A store that panics: every attempt sent ends Failed for the
		// hooks (as Complete's endOnPanic), and the panic goes on.
		perr := fmt.Errorf("idem: panic while ending the attempt: %v", r)
		for _, i := range idx {
			a := atts[i]
			_, _ = a.finish(Outcome{Status: Failed, MessageID: a.Message.ID, Err: perr, Attempt: a.Number}, perr)
		}
		panic(r)
	}()
	for i, a := range atts {
		if err := a.checkEnd(); err != nil {
			outs[i] = Outcome{Status: Failed, MessageID: a.Message.ID, Err: err, Attempt: a.Number}
			continue
		}
		c.renewals.ending(a)
		ps = append(ps, a.completeParams(results[i]))
		idx = append(idx, i)
	}
	if len(ps) == 0 {
		return outs, nil
	}
	since := time.Now()
	errs := c.completeMany(ctx, ps)
	for j, i := range idx {
		outs[i], _ = atts[i].completed(ctx, results[i], since, errs[j])
	}
	return outs, nil
}

// completeMany sends the completions ps in one store call (CompleteBatch
// on an idemdriver.LeaseBatcher, for more than one), else one Complete
// each, and returns one error per element: a failure of the whole batch
// is every element's error.
func (c *LeaseConsumer) completeMany(ctx context.Context, ps []idemdriver.CompleteParams) []error {
	errs := make([]error, len(ps))
	if b, ok := c.store.(idemdriver.LeaseBatcher); ok && len(ps) > 1 {
		pp := make([]*idemdriver.CompleteParams, len(ps))
		for j := range ps {
			pp[j] = &ps[j]
		}
		cctx, cancel := callCtx(ctx, c.storeTimeout())
		es, err := b.CompleteBatch(cctx, pp)
		err = timedOut(cctx, err)
		cancel()
		if err == nil && len(es) != len(ps) {
			err = fmt.Errorf("the store answered %d errors for %d completions", len(es), len(ps))
		}
		for j := range ps {
			if err != nil {
				errs[j] = err
			} else {
				errs[j] = es[j]
			}
		}
		return errs
	}
	for j := range ps {
		cctx, cancel := callCtx(ctx, c.storeTimeout())
		errs[j] = timedOut(cctx, c.store.Complete(cctx, &ps[j]))
		cancel()
	}
	return errs
}
