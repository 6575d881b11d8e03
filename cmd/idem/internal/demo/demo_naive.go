//go:build !nodemo

package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/connect"
)

// naiveQueue is how many payments a naive consumer holds, acknowledged
// but not yet charged, in its worker queue.
const naiveQueue = 16

// naiveReport is what `idem demo --without-idem` adds to the report: where
// its losses come from.
type naiveReport struct {
	// AckedBeforeCharge counts deliveries the naive consumer acknowledged
	// on receipt, before charging them (all of them).
	AckedBeforeCharge int64 `json:"acked_before_charge"`
	// DroppedAfterAck counts acknowledged payments whose ledger row was
	// never committed: a crash took the one being charged and those
	// waiting in the worker queue with it. The broker, told they were
	// done, never delivers them again; unless a duplicate brings one back,
	// each is a lost payment (some were charged by the provider already).
	DroppedAfterAck int64 `json:"dropped_after_ack"`
}

// naiveWorker is the consumer of `idem demo --without-idem`, one per
// member: the one a team writes before it knows the pattern. It
//
//   - acknowledges each message on receipt and charges it afterwards, from
//     a worker queue, so the broker's ack deadline never gets near: a crash
//     between the ack and the ledger commit loses the payment, because the
//     broker will not deliver it again;
//   - keeps no record of the messages it processed, so every delivery (a
//     duplicate the producer published, a redelivery of an ack lost with a
//     crash) charges again;
//   - calls the provider with a new idempotency key on every attempt.
//
// The same faults as with idem are injected, at the same points (after the
// provider call, before the ledger commit; after the commit), with the same
// --crash-rate.
type naiveWorker struct {
	r     *demoRun
	die   func() // kills the member, as a crash kills the process
	queue chan idem.Message
	done  chan struct{}

	mu     sync.Mutex
	closed bool // no more enqueues: the member stopped
}

// startNaive starts the worker of one member; die kills the member.
func (r *demoRun) startNaive(ctx context.Context, die func()) *naiveWorker {
	w := &naiveWorker{r: r, die: die, queue: make(chan idem.Message, naiveQueue), done: make(chan struct{})}
	go w.work(ctx)
	return w
}

// Process acknowledges m at once (the adapter acks a Processed outcome)
// after putting it in the worker queue.
func (w *naiveWorker) Process(ctx context.Context, m idem.Message) (idem.Outcome, error) {
	w.r.deliveries.Add(1)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return idem.Outcome{Status: idem.Failed, MessageID: m.ID, Err: errCrash}, errCrash
	}
	w.r.naivePending.Add(1)
	select {
	case w.queue <- m:
	case <-ctx.Done():
		w.r.naivePending.Add(-1)
		return idem.Outcome{Status: idem.Failed, MessageID: m.ID, Err: ctx.Err()}, ctx.Err()
	}
	w.r.naiveAcked.Add(1)
	return idem.Outcome{Status: idem.Processed, MessageID: m.ID}, nil
}

// stop ends the worker once the member has stopped: what is queued is
// charged, unless the member crashed (then it is dropped).
func (w *naiveWorker) stop() {
	w.mu.Lock()
	if !w.closed {
		w.closed = true
		close(w.queue)
	}
	w.mu.Unlock()
	<-w.done
}

func (w *naiveWorker) work(ctx context.Context) {
	defer close(w.done)
	dead := false
	for m := range w.queue {
		if !dead {
			err := w.r.chargeNaive(ctx, m)
			switch {
			case errors.Is(err, errCrash):
				dead = true
				w.r.crashes.Add(1)
				w.die()
			case err != nil:
				w.r.log.Error("naive consumer: the charge failed; the message was acked already", "message_id", m.ID, "err", err)
			}
			if err == nil || errors.Is(err, errCrashAfterCommit) {
				w.r.naivePending.Add(-1)
				continue
			}
		}
		w.r.naiveDropped.Add(1)
		w.r.naivePending.Add(-1)
	}
}

// chargeNaive charges one payment as the naive consumer does: the provider
// with a new key, then the ledger row in a transaction of its own.
func (r *demoRun) chargeNaive(ctx context.Context, m idem.Message) error {
	var p payment
	if err := json.Unmarshal(m.Payload, &p); err != nil {
		return fmt.Errorf("payment %s: %w", m.ID, err)
	}
	key := fmt.Sprintf("naive-%s-%d", m.ID, r.naiveAttempts.Add(1)) // a new key per attempt
	chargeID, err := r.prov.charge(ctx, key, p.PaymentID, p.AmountCents)
	if err != nil {
		return err
	}
	if r.draws.crash("payments-before-commit", m.ID, r.o.CrashRate/2) {
		return errCrashBeforeCommit
	}
	if _, err := r.st.DB.ExecContext(ctx, connect.Rebind(r.st.Dialect,
		`INSERT INTO idem_demo_ledger (payment_id, customer, amount_cents, charge_id) VALUES (?, ?, ?, ?)`),
		p.PaymentID, p.Customer, p.AmountCents, chargeID); err != nil {
		return err
	}
	if r.draws.crash("payments-after-commit", m.ID, r.o.CrashRate/2) {
		return errCrashAfterCommit // the event is never published
	}
	return r.publishChargedNaive(ctx, p, chargeID)
}
