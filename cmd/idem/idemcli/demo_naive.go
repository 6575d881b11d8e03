//go:build !nodemo

package idemcli

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"

	"github.com/idem-go/idem"
)

// processNaive is the consumer of `idem demo --without-idem`: the one a
// team writes before it knows the pattern. It keeps no record of the
// messages it processed, so every delivery (a duplicate the producer
// published, a redelivery after a crash) charges again, and it calls the
// provider with a new idempotency key on every attempt, so a charge made
// before a crash is made a second time by the redelivery. The ledger row is
// written in a transaction of its own; the same faults as with idem (the
// --crash-rate crashes, before and after the commit) are injected.
func (r *demoRun) processNaive(ctx context.Context, m idem.Message) (idem.Outcome, error) {
	var p payment
	if err := json.Unmarshal(m.Payload, &p); err != nil {
		err = idem.Permanent(fmt.Errorf("payment %s: %w", m.ID, err))
		return idem.Outcome{Status: idem.Failed, MessageID: m.ID, Err: err}, err
	}
	failed := func(err error) (idem.Outcome, error) {
		return idem.Outcome{Status: idem.Failed, MessageID: m.ID, Err: err}, err
	}
	key := fmt.Sprintf("naive-%s-%d", m.ID, r.naiveAttempts.Add(1)) // a new key per attempt
	chargeID, err := r.prov.charge(ctx, key, p.PaymentID, p.AmountCents)
	if err != nil {
		return failed(err)
	}
	if rand.Float64() < r.o.crashRate/2 {
		return failed(errCrashBeforeCommit)
	}
	if _, err := r.st.db.ExecContext(ctx, rebind(r.st.dialect,
		`INSERT INTO idem_demo_ledger (payment_id, customer, amount_cents, charge_id) VALUES (?, ?, ?, ?)`),
		p.PaymentID, p.Customer, p.AmountCents, chargeID); err != nil {
		return failed(err)
	}
	if err := r.publishChargedNaive(ctx, p, chargeID); err != nil {
		return failed(err)
	}
	return idem.Outcome{Status: idem.Processed, MessageID: m.ID}, nil
}
