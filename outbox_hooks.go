package idem

import (
	"context"
	"time"
)

// HookEmit is called after a transactional Consumer commits outgoing
// messages its handler emitted (see [Emit]), once per transaction that
// emitted; with ProcessTx, once they are written to the caller's
// transaction (which the caller may still roll back).
type HookEmit interface {
	OnEmit(ctx context.Context, e EmitEvent)
}

// EmitEvent describes the outgoing messages of one transaction.
type EmitEvent struct {
	// Consumer is the consumer name.
	Consumer string
	// MessageID is the incoming message's ID; empty for a batch.
	MessageID string
	// Count is the number of outgoing messages written.
	Count int
}

// HookRelay observes a [Relay] (RelayConfig.Hooks): it is called after
// every round that claimed rows or failed (a round that found nothing
// and failed at nothing is not reported), on the relay's goroutine, under
// the rules of [Hook].
type HookRelay interface {
	OnRelay(ctx context.Context, e RelayEvent)
}

// RelayEvent describes one relay round (RunOnce).
type RelayEvent struct {
	// Result counts the rows claimed, sent, retried and failed for good.
	Result RelayResult
	// Err is the round's error (it matches ErrStore), or nil.
	Err error
	// Latency is the round's duration: claim, publish and marks.
	Latency time.Duration
	// OldestAge is the age of the oldest row claimed, from its CreatedAt
	// (the store's clock) to the end of the round (this host's clock): the
	// relay's lag, as far as this round saw it. 0 when nothing was claimed.
	OldestAge time.Duration
}
