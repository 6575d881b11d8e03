package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// batchFinishTimeout bounds the writes that end a batch's attempts
// (CompleteBatch, the releases), detached from the adapter's context so
// that an adapter that stops does not lose the answers recorded: as the
// lease engine bounds the final write of Process.
const batchFinishTimeout = 10 * time.Second

var _ idem.BatchProcessor = (*Deliverer)(nil)

// ProcessBatch delivers msgs, a broker's fetched batch, each as Process
// delivers it (see Deliverer), and returns one Outcome per message, in
// the order given, each as Process returns it; the adapter settles each
// (idem.GuardBatch, then idem.Outcome.Settle). It makes the batch the
// unit of the store's work: the messages are claimed in one store call
// (idem.LeaseConsumer.AcquireBatch; in at-most-once mode each claim saves
// the message's recovery point, as Process's claim does), the calls of
// the messages held run at most MaxCalls at once (the same MaxCalls as
// the Process calls running beside them; no limit without it) on
// goroutines of ProcessBatch, each on its attempt's context, and the
// answers that complete a message are recorded in one store call
// (idem.LeaseConsumer.CompleteBatch). A call that ended retryable, was
// not sent or was refused by the service's fencing releases its attempt
// as Process does (one store call each), and an attempt whose final
// write failed, or whose lease the store said lost while its call ran
// (idem.Attempt.Lost), is abandoned (its lease runs out), as Process
// abandons it. A message that is not
// held (a duplicate, in progress elsewhere, rejected) gets its outcome
// without a call, as from Process. The ending writes run on a context
// detached from ctx, bounded by 10 seconds.
//
// With PointAtCall (and MaxCalls, in at-most-once mode) ProcessBatch
// runs Process for each message at once instead: a message's recovery
// point is then saved when it gets its call, which a claim of the whole
// batch cannot do. A batch of more than idemdriver.MaxLeaseBatch
// messages is processed in parts of that many, one after the other.
// With InOrder the calls are made one at a time, in the order given, and
// a message to be redelivered is retried in place before the next one is
// called (see DelivererOptions.InOrder).
//
// err is always nil: each Outcome says what happened to its message.
func (d *Deliverer) ProcessBatch(ctx context.Context, msgs []idem.Message) ([]idem.Outcome, error) {
	if d.o.InOrder {
		return d.processInOrder(ctx, msgs), nil
	}
	if d.pointLate() {
		return d.processEach(ctx, msgs), nil
	}
	outs := make([]idem.Outcome, 0, len(msgs))
	for len(msgs) > 0 {
		n := min(len(msgs), idemdriver.MaxLeaseBatch)
		outs = append(outs, d.processPart(ctx, msgs[:n])...)
		msgs = msgs[n:]
	}
	return outs, nil
}

// pointLate reports whether a message that waits for a call saves its
// recovery point when it gets the call (PointAtCall, with MaxCalls, at
// most once): a claim of the whole batch cannot.
func (d *Deliverer) pointLate() bool {
	return d.o.PointAtCall && d.calls != nil && !d.o.AtLeastOnce
}

// processEach runs Process for each of msgs at once.
func (d *Deliverer) processEach(ctx context.Context, msgs []idem.Message) []idem.Outcome {
	outs := make([]idem.Outcome, len(msgs))
	var wg sync.WaitGroup
	for i := range msgs {
		wg.Go(func() { outs[i], _ = d.Process(ctx, msgs[i]) })
	}
	wg.Wait()
	return outs
}

// batchCall is the call of one held message of a batch: the answer to
// record, or the error that releases the attempt.
type batchCall struct {
	ans *answer
	err error
}

// processPart is ProcessBatch for at most idemdriver.MaxLeaseBatch
// messages.
func (d *Deliverer) processPart(ctx context.Context, msgs []idem.Message) []idem.Outcome {
	atts, outs := d.claimBatch(ctx, msgs)
	held := make([]int, 0, len(atts))
	for i, a := range atts {
		if a != nil {
			held = append(held, i)
		}
	}
	calls := d.runCalls(atts, held)

	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), batchFinishTimeout)
	defer cancel()
	var done []*idem.Attempt
	var answers []*answer
	var doneIdx []int // doneIdx[k] is the message of done[k]
	for j, i := range held {
		a, c := atts[i], calls[j]
		if a.Lost() {
			// As Process: the store said the lease lost while the call
			// ran, so its answer is not recorded (nor the attempt
			// released); a later attempt takes the message over.
			err := fmt.Errorf("%w: attempt %d (token %d) of message %q lost its lease while its call ran", idem.ErrLeaseLost, a.Number, a.Token, a.Message.ID)
			if c.err != nil {
				err = errors.Join(err, c.err)
			}
			out, _ := a.Abandon(fctx, err)
			outs[i] = d.settle(out, nil)
			continue
		}
		if c.err != nil {
			out, err := a.Release(fctx, c.err)
			outs[i] = d.settle(abandonHeld(fctx, a, out, err), nil)
			continue
		}
		done = append(done, a)
		answers = append(answers, c.ans)
		doneIdx = append(doneIdx, i)
	}
	for k, out := range d.recordAnswers(fctx, done, answers) {
		outs[doneIdx[k]] = out
	}
	for i := range outs {
		if atts[i] == nil {
			outs[i] = d.settle(outs[i], nil)
		}
	}
	return outs
}

// claimBatch claims msgs, at most idemdriver.MaxLeaseBatch of them, in
// one store call (idem.LeaseConsumer.AcquireBatch; at most once with the
// recovery point of each claim): atts[i] is msgs[i]'s attempt when it is
// held, else nil and outs[i] its outcome, not yet settled.
func (d *Deliverer) claimBatch(ctx context.Context, msgs []idem.Message) ([]*idem.Attempt, []idem.Outcome) {
	var opt idem.AcquireOptions
	if !d.o.AtLeastOnce {
		opt.StepPrefix = d.runPrefix
	}
	atts, outs, err := d.lc.AcquireBatch(ctx, msgs, opt)
	if err != nil {
		// Not reached with a part of at most MaxLeaseBatch messages
		// and no Wait; every message is redelivered if it is.
		atts, outs = make([]*idem.Attempt, len(msgs)), make([]idem.Outcome, len(msgs))
		for i, m := range msgs {
			outs[i] = idem.Outcome{Status: idem.Failed, MessageID: m.ID, Err: err}
		}
	}
	return atts, outs
}

// recordAnswers records answers[k] as the answer of done[k], for each
// k, in one store call (idem.LeaseConsumer.CompleteBatch), and returns
// their settled outcomes in the same order: an attempt whose completion
// failed and left it held is abandoned (abandonHeld).
func (d *Deliverer) recordAnswers(ctx context.Context, done []*idem.Attempt, answers []*answer) []idem.Outcome {
	if len(done) == 0 {
		return nil
	}
	results := make([]idem.Result, len(done))
	for k, ans := range answers {
		results[k] = encodeAnswer(ans)
	}
	couts, err := d.lc.CompleteBatch(ctx, done, results)
	outs := make([]idem.Outcome, len(done))
	for k, a := range done {
		out := idem.Outcome{Status: idem.Failed, MessageID: a.Message.ID, Err: err, Attempt: a.Number}
		if err == nil {
			out = couts[k]
		}
		out = abandonHeld(ctx, a, out, out.Err)
		var mine *answer
		if out.Status == idem.Processed {
			mine = answers[k]
		}
		outs[k] = d.settle(out, mine)
	}
	return outs
}

// runCalls runs the call of each held message (atts[held[j]]) and returns
// their answers or errors, calls[j] for held[j]: on at most MaxCalls
// goroutines (one a message without MaxCalls), each call also taking one
// of the Deliverer's MaxCalls places as Process's calls do.
func (d *Deliverer) runCalls(atts []*idem.Attempt, held []int) []batchCall {
	calls := make([]batchCall, len(held))
	workers := len(held)
	if d.calls != nil {
		workers = min(workers, cap(d.calls))
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				j := int(next.Add(1) - 1)
				if j >= len(held) {
					return
				}
				a := atts[held[j]]
				calls[j].ans, calls[j].err = d.deliverGuarded(a)
			}
		})
	}
	wg.Wait()
	return calls
}

// deliverGuarded is deliver on the attempt's context, a panic turned
// into an *idem.PanicError (which releases the attempt), as the lease
// engine guards a handler.
func (d *Deliverer) deliverGuarded(a *idem.Attempt) (ans *answer, err error) {
	defer func() {
		if r := recover(); r != nil {
			ans, err = nil, &idem.PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	return d.deliver(a.Context(), a, &callSlot{})
}

// abandonHeld ends a whose Complete or Release failed and left it held
// (an error matching idem.ErrStore): it is abandoned, its lease runs out
// and a later attempt takes over, as Process does. out and err are
// returned as they are when a had ended.
func abandonHeld(ctx context.Context, a *idem.Attempt, out idem.Outcome, err error) idem.Outcome {
	if err == nil {
		return out // recorded: the attempt ended (and an Abandon would only build its ErrAttemptEnded)
	}
	if aout, aerr := a.Abandon(ctx, err); !errors.Is(aerr, idem.ErrAttemptEnded) {
		return aout
	}
	return out
}
