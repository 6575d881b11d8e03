package idemtest

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// badKey is one invalid (consumer, message ID, fingerprint) and the error
// every store entry point must return for it.
type badKey struct {
	name        string
	consumer    string
	id          string
	fingerprint []byte
	want        error
}

// badKeys are the inputs every store method refuses before it talks to its
// database: the rules are the core's, checked again at the store.
func badKeys(consumer string) []badKey {
	fp := []byte("fingerprint")
	return []badKey{
		{"an empty consumer name", "", "m-1", fp, idem.ErrInvalidConsumerName},
		{"a consumer name of 256 bytes", strings.Repeat("c", 256), "m-1", fp, idem.ErrInvalidConsumerName},
		{"a consumer name with a NUL", "a\x00b", "m-1", fp, idem.ErrInvalidConsumerName},
		{"an empty message ID", consumer, "", fp, idem.ErrMissingMessageID},
		{"a message ID of 256 bytes", consumer, strings.Repeat("m", 256), fp, idem.ErrInvalidMessageID},
		{"a message ID with a control character", consumer, "m\n1", fp, idem.ErrInvalidMessageID},
		{"a message ID that is not UTF-8", consumer, "m\xff1", fp, idem.ErrInvalidMessageID},
		{"a message ID with a C1 control", consumer, "m\u00851", fp, idem.ErrInvalidMessageID},
		{"an empty fingerprint", consumer, "m-1", nil, idem.ErrInvalidPayload},
		{"a fingerprint of 65 bytes", consumer, "m-1", make([]byte, 65), idem.ErrInvalidPayload},
	}
}

// Every TxStore entry point called directly (ClaimTx, and ClaimBatchTx and
// BeginClaim where the store has them) refuses invalid input with the
// core's typed errors, and the caller's transaction stays usable: a valid
// claim and a commit after the refused ones succeed.
func testStoreValidation[TTx any](t *testing.T, b *bundle[TTx]) {
	consumer := b.name("c")
	tx := b.begin()
	bc, hasBatch := b.s.Store.(idemdriver.BatchClaimer[TTx])
	for _, k := range badKeys(consumer) {
		_, err := b.s.Store.ClaimTx(b.ctx, tx, &idemdriver.ClaimParams{Consumer: k.consumer, MessageID: k.id, Fingerprint: k.fingerprint})
		if !errors.Is(err, k.want) {
			t.Errorf("ClaimTx with %s: err = %v, want an error matching %v", k.name, err, k.want)
		}
		if hasBatch {
			_, err := bc.ClaimBatchTx(b.ctx, tx, &idemdriver.ClaimBatchParams{Consumer: k.consumer, Messages: []idemdriver.ClaimMessage{
				{MessageID: "ok-1", Fingerprint: []byte("f")}, {MessageID: k.id, Fingerprint: k.fingerprint},
			}})
			if !errors.Is(err, k.want) {
				t.Errorf("ClaimBatchTx with %s: err = %v, want an error matching %v", k.name, err, k.want)
			}
		}
	}
	if hasBatch {
		for _, tt := range []struct {
			name string
			msgs []idemdriver.ClaimMessage
		}{
			{"no messages", nil},
			{"one ID twice", []idemdriver.ClaimMessage{{MessageID: "d", Fingerprint: []byte("f")}, {MessageID: "d", Fingerprint: []byte("f")}}},
		} {
			_, err := bc.ClaimBatchTx(b.ctx, tx, &idemdriver.ClaimBatchParams{Consumer: consumer, Messages: tt.msgs})
			if !errors.Is(err, idem.ErrInvalidConfig) {
				t.Errorf("ClaimBatchTx with %s: err = %v, want an error matching ErrInvalidConfig", tt.name, err)
			}
		}
	}
	res, err := b.s.Store.ClaimTx(b.ctx, tx, &idemdriver.ClaimParams{Consumer: consumer, MessageID: "valid", Fingerprint: []byte("f")})
	if err != nil || !res.Claimed {
		t.Fatalf("a valid ClaimTx after the refused ones, in the same transaction: %+v, %v; want Claimed (the transaction must stay usable)", res, err)
	}
	b.commit(tx)
	b.wantRecords("after the refused claims and one valid claim", consumer, 1)

	if bcl, ok := b.s.Store.(idemdriver.BeginClaimer[TTx]); ok {
		for _, k := range badKeys(consumer) {
			_, _, err := bcl.BeginClaim(b.ctx, &idemdriver.ClaimParams{Consumer: k.consumer, MessageID: k.id, Fingerprint: k.fingerprint})
			if !errors.Is(err, k.want) {
				t.Errorf("BeginClaim with %s: err = %v, want an error matching %v", k.name, err, k.want)
			}
		}
		b.wantRecords("after the refused BeginClaims", consumer, 1)
	}
}

// Every LeaseStore entry point called directly refuses invalid input with
// the core's typed errors and writes nothing.
func testLeaseStoreValidation(t *testing.T, b *leaseBundle) {
	consumer := b.name("c")
	ctx := b.ctx
	a := b.mustAcquire("a valid record", consumer, idem.Message{ID: "m-1", Payload: []byte("p")}, longLease, 1)
	for _, k := range badKeys(consumer) {
		_, err := b.s.Store.Acquire(ctx, &idemdriver.AcquireParams{Consumer: k.consumer, MessageID: k.id, Fingerprint: k.fingerprint, Lease: longLease})
		if !errors.Is(err, k.want) {
			t.Errorf("Acquire with %s: err = %v, want an error matching %v", k.name, err, k.want)
		}
		if len(k.fingerprint) == 0 || len(k.fingerprint) > idemdriver.MaxFingerprintLength {
			continue // the other methods take no fingerprint
		}
		for _, call := range keyedCalls(ctx, b.s.Store, k.consumer, k.id, a.Token) {
			if err := call.fn(); !errors.Is(err, k.want) {
				t.Errorf("%s with %s: err = %v, want an error matching %v", call.name, k.name, err, k.want)
			}
		}
	}
	for _, tt := range []struct {
		name string
		err  error
		want error
	}{
		{"Acquire with a zero lease", func() error {
			_, err := b.s.Store.Acquire(ctx, &idemdriver.AcquireParams{Consumer: consumer, MessageID: "m-2", Fingerprint: []byte("f")})
			return err
		}(), idem.ErrInvalidConfig},
		{"Renew with a zero lease", b.s.Store.Renew(ctx, &idemdriver.RenewParams{Consumer: consumer, MessageID: "m-1", Token: a.Token}), idem.ErrInvalidConfig},
		{"SaveStep with an empty step name", b.s.Store.SaveStep(ctx, &idemdriver.StepParams{Consumer: consumer, MessageID: "m-1", Token: a.Token}), idem.ErrInvalidConfig},
		{"SaveStep with a step name of 256 bytes", b.s.Store.SaveStep(ctx, &idemdriver.StepParams{Consumer: consumer, MessageID: "m-1", Token: a.Token, Step: strings.Repeat("s", 256)}), idem.ErrInvalidConfig},
		{"Complete with token 0", b.s.Store.Complete(ctx, &idemdriver.CompleteParams{Consumer: consumer, MessageID: "m-1"}), idem.ErrLeaseLost},
	} {
		if !errors.Is(tt.err, tt.want) {
			t.Errorf("%s: err = %v, want an error matching %v", tt.name, tt.err, tt.want)
		}
	}
	b.wantRecords("after the refused calls", consumer, 1)
	if err := b.s.Store.Complete(ctx, &idemdriver.CompleteParams{Consumer: consumer, MessageID: "m-1", Token: a.Token}); err != nil {
		t.Errorf("Complete of the valid record after the refused calls: %v", err)
	}
}

// keyedCall is one LeaseStore method called with a given key and token.
type keyedCall struct {
	name string
	fn   func() error
}

func keyedCalls(ctx context.Context, s idemdriver.LeaseStore, consumer, id string, token int64) []keyedCall {
	return []keyedCall{
		{"Renew", func() error {
			return s.Renew(ctx, &idemdriver.RenewParams{Consumer: consumer, MessageID: id, Token: token, Lease: longLease})
		}},
		{"Complete", func() error {
			return s.Complete(ctx, &idemdriver.CompleteParams{Consumer: consumer, MessageID: id, Token: token})
		}},
		{"Release", func() error {
			return s.Release(ctx, &idemdriver.ReleaseParams{Consumer: consumer, MessageID: id, Token: token})
		}},
		{"SaveStep", func() error {
			return s.SaveStep(ctx, &idemdriver.StepParams{Consumer: consumer, MessageID: id, Token: token, Step: "s"})
		}},
	}
}
