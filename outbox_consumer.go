package idem

import (
	"context"

	"github.com/idem-go/idem/idemdriver"
)

// consumerOutbox is what a transactional Consumer's store offers for the
// outbox: writing rows in a transaction, and looking up what a message
// left unsent. Either may be nil.
type consumerOutbox[TTx any] struct {
	tx     idemdriver.OutboxTx[TTx]
	commit idemdriver.OutboxCommitter[TTx] // nil: EmitTx, then Commit
	store  idemdriver.OutboxStore
}

func newConsumerOutbox[TTx any](s idemdriver.TxStore[TTx]) consumerOutbox[TTx] {
	var o consumerOutbox[TTx]
	o.tx, _ = s.(idemdriver.OutboxTx[TTx])
	if o.tx != nil {
		o.commit, _ = s.(idemdriver.OutboxCommitter[TTx])
	}
	o.store, _ = s.(idemdriver.OutboxStore)
	return o
}

// noOutbox is the emitter of a store without the outbox capability: Emit
// fails with ErrNoOutbox saying so.
var noOutbox = &emitter{}

// emitter returns the emitter for one transaction processing sources,
// adding headers to each emitted message with inject (Config.OutboxHeaders).
func (o consumerOutbox[TTx]) emitter(consumer string, inject HeaderInjector, sources ...string) *emitter {
	if o.tx == nil {
		return noOutbox
	}
	e := newEmitter(consumer, true, sources...)
	e.inject = inject
	return e
}

// initEmitter makes e, part of what Process allocates for one message
// anyway, the emitter of the transaction processing source, and returns
// it (noOutbox for a store without the outbox capability).
func (o consumerOutbox[TTx]) initEmitter(e *emitter, consumer string, inject HeaderInjector, source string) *emitter {
	if o.tx == nil {
		return noOutbox
	}
	e.consumer, e.ok, e.single, e.inject = consumer, true, source, inject
	return e
}

// emitTx writes what the handler emitted into tx and returns how many rows
// it wrote. Its error matches ErrStore.
func (c *Consumer[TTx]) emitTx(ctx context.Context, tx TTx, id string, e *emitter) (int, error) {
	if e == noOutbox {
		return 0, nil
	}
	rows := e.take()
	if len(rows) == 0 {
		return 0, nil
	}
	if err := c.out.tx.EmitTx(ctx, tx, &idemdriver.EmitParams{Consumer: c.cfg.Name, Messages: rows}); err != nil {
		return 0, c.storeErr(ctx, "emit", id, err)
	}
	return len(rows), nil
}

// emitCommit writes what the handler emitted into tx, a transaction the
// Consumer began, and commits tx: in one call when the store implements
// idemdriver.OutboxCommitter and rows were emitted, else EmitTx (if rows
// were emitted) and Commit. It returns how many rows it wrote; its error
// matches ErrStore, and the caller then rolls tx back.
func (c *Consumer[TTx]) emitCommit(ctx context.Context, b *txBound, tx TTx, id string, e *emitter) (int, error) {
	var rows []idemdriver.OutgoingRecord
	if e != noOutbox {
		rows = e.take()
	}
	if len(rows) > 0 && c.out.commit != nil {
		p := &idemdriver.EmitParams{Consumer: c.cfg.Name, Messages: rows, RelayWoken: c.cfg.Relay != nil}
		if err := b.call(func(bctx context.Context) error { return c.out.commit.EmitCommit(bctx, tx, p) }); err != nil {
			return 0, c.storeErr(ctx, "emit and commit", id, err)
		}
		return len(rows), nil
	}
	if len(rows) > 0 {
		p := &idemdriver.EmitParams{Consumer: c.cfg.Name, Messages: rows, RelayWoken: c.cfg.Relay != nil}
		if err := b.call(func(bctx context.Context) error { return c.out.tx.EmitTx(bctx, tx, p) }); err != nil {
			return 0, c.storeErr(ctx, "emit", id, err)
		}
	}
	if err := b.call(func(bctx context.Context) error { return c.store.Commit(bctx, tx) }); err != nil {
		return 0, c.storeErr(ctx, "commit", id, err)
	}
	return len(rows), nil
}

// committed reports n outbox rows of message id ("" for a batch) to the
// emit hooks and wakes the relay, after the commit that wrote them (for
// ProcessTx: after writing them to the caller's transaction).
func (c *Consumer[TTx]) committed(ctx context.Context, id string, n int) {
	if n == 0 {
		return
	}
	if h := c.hooks; h != nil {
		for _, x := range h.emit {
			h.safe(x, func() { x.OnEmit(ctx, EmitEvent{Consumer: h.consumer, MessageID: id, Count: n}) })
		}
	}
	if c.cfg.Relay != nil {
		c.cfg.Relay.Wake()
	}
}

// settleExisting settles a claim that found a record (existingTx) and,
// for a duplicate, finishes the first processing's job: it wakes the
// relay, whose next round claims whatever that processing left unsent
// (its rows are committed: the duplicate saw its record). It never emits
// anything itself and never runs the handler.
//
// The duplicate does not look its outgoing rows up first: no index leads
// from an incoming message to its outgoing rows (one would cost every
// emitted message an index entry), so the lookup walked every pending row,
// a cost that grew with the backlog exactly when redeliveries come in
// storms (after a relay outage, a rebalance). A wake costs nothing here;
// wakes merge, so a storm of duplicates makes the relay run at most one
// round after another.
func (c *Consumer[TTx]) settleExisting(id string, fp []byte, res idemdriver.ClaimResult) (Outcome, error) {
	out, err := c.existingTx(id, fp, res)
	if out.Status == Duplicate && c.cfg.Relay != nil && c.out.store != nil {
		c.cfg.Relay.Wake()
	}
	return out, err
}

// freshIDs returns the IDs of msgs.
func freshIDs(msgs []Message) []string {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	return ids
}
