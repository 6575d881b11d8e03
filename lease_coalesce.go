package idem

import (
	"context"
	"fmt"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/coalesce"
)

// The coalescing of a LeaseConsumer's store calls (Config.Coalesce): the
// Acquire and Complete calls its goroutines make while one is in flight
// go to the store together, in one idemdriver.LeaseBatcher call.

// acquireGroup and completeGroup coalesce the Acquire and Complete calls
// of a LeaseConsumer.
type (
	acquireGroup  = coalesce.Group[*idemdriver.AcquireParams, idemdriver.AcquireResult]
	completeGroup = coalesce.Group[*idemdriver.CompleteParams, struct{}]
)

// selfCoalescing is a store that batches concurrent calls itself (the
// batching layer of idem consume): its calls are sent alone, one layer
// of batching being enough, and the layer's own.
type selfCoalescing interface{ CoalescesCalls() bool }

// initCoalesce makes c's coalescing groups when its store is an
// idemdriver.LeaseBatcher that does not coalesce calls itself and
// Config.Coalesce is over 1.
func (c *LeaseConsumer) initCoalesce() {
	b, ok := c.store.(idemdriver.LeaseBatcher)
	if sc, self := c.store.(selfCoalescing); !ok || c.cfg.Coalesce <= 1 || (self && sc.CoalescesCalls()) {
		return
	}
	c.coAcquire = &acquireGroup{Max: c.cfg.Coalesce, One: b.Acquire, Many: b.AcquireBatch}
	c.coComplete = &completeGroup{Max: c.cfg.Coalesce,
		One: func(ctx context.Context, p *idemdriver.CompleteParams) (struct{}, error) {
			return struct{}{}, b.Complete(ctx, p)
		},
		Many: func(ctx context.Context, ps []*idemdriver.CompleteParams) ([]struct{}, []error, error) {
			errs, err := b.CompleteBatch(ctx, ps)
			return make([]struct{}, len(ps)), errs, err // no allocation: zero-size elements
		}}
}

// storeAcquire is the store's Acquire of p, coalesced with the
// concurrent ones when c coalesces.
func (c *LeaseConsumer) storeAcquire(ctx context.Context, p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
	if g := c.coAcquire; g != nil {
		return g.Do(ctx, p)
	}
	return c.store.Acquire(ctx, p)
}

// storeComplete is the store's Complete of p, coalesced with the
// concurrent ones when c coalesces.
func (c *LeaseConsumer) storeComplete(ctx context.Context, p *idemdriver.CompleteParams) error {
	if g := c.coComplete; g != nil {
		_, err := g.Do(ctx, p)
		return err
	}
	return c.store.Complete(ctx, p)
}

// releaseLeft ends the attempt a, acquired by a coalesced Acquire whose
// caller's context (ctx) ended while its call was in the store: the
// lease is released at once, not terminally, on a context detached from
// ctx and bounded by the store timeout (abandoned when the release
// fails: it then runs out). The outcome is Failed, with an error
// matching ctx's cause.
func (a *Attempt) releaseLeft(ctx context.Context) (Outcome, error) {
	cause := fmt.Errorf("idem: message %q: the caller left while its acquisition was in a coalesced store call; the lease is released: %w", a.Message.ID, context.Cause(ctx))
	dctx, cancel := detachedCallCtx(ctx, a.c.storeTimeout())
	defer cancel()
	out, err := a.release(dctx, cause, func() bool { return false })
	if !a.isEnded() {
		out, err = a.Abandon(dctx, err)
	}
	return out, err
}
