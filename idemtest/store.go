package idemtest

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/idem-go/idem/idemdriver"
)

// The Store cases exercise the TxStore contract directly, without a
// Consumer in between.

func storeCases[TTx any]() []testCase[TTx] {
	return []testCase[TTx]{
		{"ClaimReturnsStoredFingerprint", testClaimReturnsStoredFingerprint[TTx]},
		{"ClaimBatchResultsInOrder", testClaimBatchResultsInOrder[TTx]},
		{"RollbackReleasesClaim", testRollbackReleasesClaim[TTx]},
		{"BeginClaimDuplicate", testBeginClaimDuplicate[TTx]},
		{"Validation", testStoreValidation[TTx]},
	}
}

// A claim of a committed key reports Claimed=false with the fingerprint
// stored by the first claim, byte for byte.
func testClaimReturnsStoredFingerprint[TTx any](t *testing.T, b *bundle[TTx]) {
	consumer := b.name("c")
	stored := []byte{0x00, 0xff, 0x20, 0x00}
	tx := b.begin()
	res, err := b.s.Store.ClaimTx(b.ctx, tx, &idemdriver.ClaimParams{Consumer: consumer, MessageID: "m-1", Fingerprint: stored})
	if err != nil || !res.Claimed {
		t.Fatalf("first ClaimTx: %+v, %v; want Claimed and nil", res, err)
	}
	b.commit(tx)

	tx = b.begin()
	res, err = b.s.Store.ClaimTx(b.ctx, tx, &idemdriver.ClaimParams{Consumer: consumer, MessageID: "m-1", Fingerprint: []byte("other")})
	if err != nil {
		t.Fatalf("second ClaimTx: %v", err)
	}
	if res.Claimed || !bytes.Equal(res.Fingerprint, stored) {
		t.Errorf("ClaimTx of a committed key: Claimed %v, Fingerprint %x; want false and %x", res.Claimed, res.Fingerprint, stored)
	}
	if res.Ended {
		t.Errorf("ClaimTx of a committed key reported Ended: only BeginClaim may end the transaction")
	}
	b.rollback(tx)
	b.wantRecords("after the claims", consumer, 1)
}

// ClaimBatchTx returns one result per message in the order given, whatever
// that order is, with the stored fingerprint for existing keys.
func testClaimBatchResultsInOrder[TTx any](t *testing.T, b *bundle[TTx]) {
	consumer := b.name("c")
	fpB := []byte("fingerprint of b")
	tx := b.begin()
	if _, err := b.s.Store.ClaimTx(b.ctx, tx, &idemdriver.ClaimParams{Consumer: consumer, MessageID: "b", Fingerprint: fpB}); err != nil {
		t.Fatalf("ClaimTx: %v", err)
	}
	b.commit(tx)

	tx = b.begin()
	res, err := idemdriver.ClaimBatch(b.ctx, b.s.Store, tx, &idemdriver.ClaimBatchParams{Consumer: consumer, Messages: []idemdriver.ClaimMessage{
		{MessageID: "c", Fingerprint: []byte("c")},
		{MessageID: "b", Fingerprint: []byte("b")},
		{MessageID: "a", Fingerprint: []byte("a")},
	}})
	if err != nil {
		t.Fatalf("ClaimBatchTx: %v", err)
	}
	if len(res) != 3 {
		t.Fatalf("ClaimBatchTx: %d results for 3 messages", len(res))
	}
	want := []idemdriver.ClaimResult{{Claimed: true}, {Fingerprint: fpB}, {Claimed: true}}
	for i, w := range want {
		if res[i].Claimed != w.Claimed || (!w.Claimed && !bytes.Equal(res[i].Fingerprint, w.Fingerprint)) {
			t.Errorf("ClaimBatchTx result %d: Claimed %v, Fingerprint %q; want Claimed %v, Fingerprint %q",
				i, res[i].Claimed, res[i].Fingerprint, w.Claimed, w.Fingerprint)
		}
	}
	b.commit(tx)
	b.wantRecords("after the batch claim", consumer, 3)
}

// A claim waiting on a key held by another transaction takes the key when
// that transaction rolls back.
func testRollbackReleasesClaim[TTx any](t *testing.T, b *bundle[TTx]) {
	consumer := b.name("c")
	p := &idemdriver.ClaimParams{Consumer: consumer, MessageID: "m-1", Fingerprint: []byte("fp")}
	tx1 := b.begin()
	if res, err := b.s.Store.ClaimTx(b.ctx, tx1, p); err != nil || !res.Claimed {
		t.Fatalf("first ClaimTx: %+v, %v", res, err)
	}
	type result struct {
		res idemdriver.ClaimResult
		err error
	}
	second := make(chan result, 1)
	go func() {
		// Begin here too: on a single-writer database it waits for tx1.
		tx2, err := b.s.Store.Begin(b.ctx)
		if err != nil {
			second <- result{err: err}
			return
		}
		res, err := b.s.Store.ClaimTx(b.ctx, tx2, p)
		if err == nil {
			err = b.s.Store.Commit(b.ctx, tx2)
		} else {
			_ = b.s.Store.Rollback(b.ctx, tx2)
		}
		second <- result{res, err}
	}()
	b.rollback(tx1)
	r := <-second
	if r.err != nil || !r.res.Claimed {
		t.Errorf("claim of a key whose first claimant rolled back: %+v, %v; want Claimed and nil", r.res, r.err)
	}
	b.wantRecords("after the rollback and the second claim", consumer, 1)
}

// BeginClaim (when the store has it) of a committed key reports the stored
// fingerprint, and either leaves the transaction open for the caller to
// roll back, or ends it itself (Ended) and returns the zero transaction.
// Either way nothing is left held: many duplicates in a row (more than a
// small pool has connections) leave the store able to claim and commit.
func testBeginClaimDuplicate[TTx any](t *testing.T, b *bundle[TTx]) {
	bc, ok := b.s.Store.(idemdriver.BeginClaimer[TTx])
	if !ok {
		t.Skip("the store has no BeginClaim")
	}
	consumer := b.name("c")
	stored := []byte("stored fingerprint")
	tx, res, err := bc.BeginClaim(b.ctx, &idemdriver.ClaimParams{Consumer: consumer, MessageID: "m-1", Fingerprint: stored})
	if err != nil || !res.Claimed || res.Ended {
		t.Fatalf("BeginClaim of a new key: %+v, %v; want Claimed, not Ended, and nil", res, err)
	}
	b.commit(tx)
	for i := range 24 {
		tx, res, err := bc.BeginClaim(b.ctx, &idemdriver.ClaimParams{Consumer: consumer, MessageID: "m-1", Fingerprint: []byte("other")})
		if err != nil {
			t.Fatalf("BeginClaim %d of a committed key: %v", i, err)
		}
		if res.Claimed || !bytes.Equal(res.Fingerprint, stored) {
			t.Fatalf("BeginClaim %d of a committed key: Claimed %v, Fingerprint %q; want false and %q", i, res.Claimed, res.Fingerprint, stored)
		}
		if !res.Ended {
			b.rollback(tx)
			continue
		}
		if !reflect.ValueOf(&tx).Elem().IsZero() {
			t.Fatalf("BeginClaim %d reported Ended with a transaction (%v); want the zero value", i, tx)
		}
	}
	tx, res, err = bc.BeginClaim(b.ctx, &idemdriver.ClaimParams{Consumer: consumer, MessageID: "m-2", Fingerprint: stored})
	if err != nil || !res.Claimed || res.Ended {
		t.Fatalf("BeginClaim of a new key after the duplicates: %+v, %v; want Claimed, not Ended, and nil", res, err)
	}
	b.commit(tx)
	b.wantRecords("after the claims", consumer, 2)
}
