package idem

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
)

// Processor runs one delivery through an Idempotent Consumer with its handler
// already bound. It is what an application hands to a broker adapter
// (Bind, BindLease, or a ProcessorFunc wrapping one of them).
//
// Process returns the Outcome and the same error as Outcome.Err, the
// (value, error) shape a wrapper author expects. An adapter never calls it
// directly: it calls [Guard], which returns one value, the Outcome carrying
// its error, and then [Outcome.Settle], which decides ack, redeliver after a
// delay, or dead-letter, and why. A Processor must be safe for concurrent
// use when the adapter runs more than one message at a time; Bind and
// BindLease are.
type Processor interface {
	Process(ctx context.Context, msg Message) (Outcome, error)
}

// ProcessorFunc adapts a function to Processor, e.g. to wrap another
// Processor with metrics or fault injection in tests.
type ProcessorFunc func(ctx context.Context, msg Message) (Outcome, error)

// Process calls f(ctx, msg).
func (f ProcessorFunc) Process(ctx context.Context, msg Message) (Outcome, error) {
	return f(ctx, msg)
}

// BatchProcessor runs a batch of deliveries through an Idempotent Consumer,
// returning one Outcome per message in the order given (see
// Consumer.ProcessBatch). The error is the batch's failure, if any; each
// Outcome still says what happened to its message.
type BatchProcessor interface {
	ProcessBatch(ctx context.Context, msgs []Message) ([]Outcome, error)
}

// Bind returns the Processor that runs each delivery through c in
// transactional mode, with handler in the claim's transaction.
func Bind[TTx any](c *Consumer[TTx], handler Handler[TTx]) Processor {
	return ProcessorFunc(func(ctx context.Context, msg Message) (Outcome, error) {
		return c.Process(ctx, msg, handler)
	})
}

// BindBatch returns the BatchProcessor that runs each batch through c in one
// transaction (Consumer.ProcessBatch), with handler given the messages that
// were claimed.
func BindBatch[TTx any](c *Consumer[TTx], handler BatchHandler[TTx]) BatchProcessor {
	return batchFunc(func(ctx context.Context, msgs []Message) ([]Outcome, error) {
		return c.ProcessBatch(ctx, msgs, handler)
	})
}

// BindLease returns the Processor that runs each delivery through c in lease
// mode, with handler called while this attempt holds the lease.
func BindLease(c *LeaseConsumer, handler LeaseHandler) Processor {
	return ProcessorFunc(func(ctx context.Context, msg Message) (Outcome, error) {
		return c.Process(ctx, msg, handler)
	})
}

type batchFunc func(ctx context.Context, msgs []Message) ([]Outcome, error)

func (f batchFunc) ProcessBatch(ctx context.Context, msgs []Message) ([]Outcome, error) {
	return f(ctx, msgs)
}

// Guard runs msg through p the way a broker adapter must before it settles
// the delivery, and returns one value: the Outcome, carrying its error in
// Err. It is the only way an adapter calls a Processor, so that nothing a
// Processor gets wrong is ever acknowledged as done:
//
//   - a panic in p becomes a Failed Outcome whose Err is a *PanicError
//     (matching ErrHandlerPanic);
//   - an Outcome without a valid Status, or an ackable one (Processed,
//     Duplicate) returned with a non-nil error, becomes Failed with that error;
//   - an Outcome that is not ackable and has no Err gets the returned error,
//     or one naming its Status, so a dead letter always has a reason;
//   - a Failed Outcome whose Err IsPermanent is marked Poison, so that
//     DeadLetter() is true even for a Processor that did not set it;
//   - an empty MessageID is set to msg.ID.
//
// The adapter then calls Settle on the result (out.Settle(retryDelay)) and
// carries the Settlement out on its broker.
func Guard(ctx context.Context, p Processor, msg Message) (out Outcome) {
	var err error
	func() {
		defer func() {
			if v := recover(); v != nil {
				err = &PanicError{Value: v, Stack: debug.Stack()}
				out = Outcome{Status: Failed, MessageID: msg.ID, Err: err}
			}
		}()
		out, err = p.Process(ctx, msg)
	}()
	if out.MessageID == "" {
		out.MessageID = msg.ID
	}
	switch {
	case out.Status < Processed || out.Status > Rejected:
		if err == nil {
			err = errors.New("idem: the Processor returned an Outcome without a Status")
		}
		return Outcome{Status: Failed, MessageID: out.MessageID, Err: err}
	case out.Ack() && err != nil:
		return Outcome{Status: Failed, MessageID: out.MessageID, Err: err}
	case !out.Ack() && out.Err == nil:
		out.Err = err
		if out.Err == nil {
			out.Err = fmt.Errorf("idem: %s outcome without an error", out.Status)
		}
	}
	if out.Status == Failed && IsPermanent(out.Err) {
		out.Poison = true
	}
	return out
}

// GuardBatch is Guard for a batch: it runs msgs through p and returns
// exactly one Outcome per message, in order, each normalised as Guard
// normalises one (a valid Status, an error on everything that is not an
// ack, Poison for a permanent failure, the MessageID filled in). A panic in
// p, or a result of the wrong length, makes every message Failed with that
// error (a panic matching ErrHandlerPanic): the batch's transaction did not
// commit, so each is redelivered.
func GuardBatch(ctx context.Context, p BatchProcessor, msgs []Message) []Outcome {
	var (
		outs []Outcome
		err  error
	)
	func() {
		defer func() {
			if v := recover(); v != nil {
				outs, err = nil, &PanicError{Value: v, Stack: debug.Stack()}
			}
		}()
		outs, err = p.ProcessBatch(ctx, msgs)
	}()
	if len(outs) != len(msgs) {
		if _, panicked := err.(*PanicError); !panicked {
			err = errors.Join(fmt.Errorf("idem: the BatchProcessor returned %d outcomes for %d messages", len(outs), len(msgs)), err)
		}
		outs = make([]Outcome, len(msgs))
		for i, m := range msgs {
			outs[i] = Outcome{Status: Failed, MessageID: m.ID, Err: err}
		}
		return outs
	}
	for i, m := range msgs {
		out := outs[i]
		outs[i] = Guard(ctx, ProcessorFunc(func(context.Context, Message) (Outcome, error) {
			return out, out.Err
		}), m)
	}
	return outs
}
