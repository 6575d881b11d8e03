package idem

import "context"

// Processor runs one delivery through an Idempotent Consumer with its handler
// already bound. It is the seam broker adapters drive: an adapter reads the
// message ID from the broker's place for it, calls Process, and maps the
// Outcome to the broker (Ack for Processed and Duplicate, a delayed
// redelivery for InProgress and Failed, a dead letter for DeadLetter()).
//
// Process returns the Outcome and the same error as Outcome.Err. A
// Processor must be safe for concurrent use when the adapter runs more than
// one message at a time; Bind and BindLease are.
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
