package idemtest

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
)

// markSentClaim checks idemdriver.OutboxSentClaimer, where the store has
// it: the confirmed rows are ended (deleted, or with keep marked sent)
// before the claim, which sees them gone, so a key whose row was ended
// has its next row claimed in the same call; rows under a lease stay
// out of the claim; invalid parameters end nothing.
func markSentClaim[TTx any](keep bool) func(t *testing.T, b *bundle[TTx]) {
	return func(t *testing.T, b *bundle[TTx]) {
		sc, ok := b.outboxOf().(idemdriver.OutboxSentClaimer)
		if !ok {
			t.Log("the store does not end and claim in one call (idemdriver.OutboxSentClaimer)")
			return
		}
		tx := b.begin()
		rows := []idemdriver.OutgoingRecord{
			{ID: "a1", Destination: "d", Key: "A", Payload: []byte("a1")},
			{ID: "a2", Destination: "d", Key: "A", Payload: []byte("a2")},
			{ID: "b1", Destination: "d", Key: "B", Payload: []byte("b1")},
			{ID: "c1", Destination: "d", Payload: []byte("c1")},
		}
		if err := b.s.Store.(idemdriver.OutboxTx[TTx]).EmitTx(b.ctx, tx, &idemdriver.EmitParams{Consumer: "c", Messages: rows}); err != nil {
			b.rollback(tx)
			t.Fatalf("EmitTx: %v", err)
		}
		b.commit(tx)
		claim := &idemdriver.ClaimOutgoingParams{Limit: 10, Lease: time.Hour}
		ids := func(recs []idemdriver.OutgoingRecord) []string {
			var out []string
			for _, r := range recs {
				out = append(out, r.ID)
			}
			slices.Sort(out)
			return out
		}
		first, err := b.outboxOf().ClaimOutgoing(b.ctx, claim)
		if err != nil || !slices.Equal(ids(first), []string{"a1", "b1", "c1"}) {
			t.Fatalf("ClaimOutgoing = %v, %v; want a1, b1 and c1 (a2 waits for a1)", ids(first), err)
		}
		seqOf := map[string]int64{}
		for _, r := range first {
			seqOf[r.ID] = r.Seq
		}

		// Invalid parameters: an error, and nothing ended.
		if _, err := sc.MarkSentClaim(b.ctx, &idemdriver.MarkSentParams{IDs: []string{"b1"}, Keep: keep}, &idemdriver.ClaimOutgoingParams{Limit: 0, Lease: time.Hour}); !errors.Is(err, idemdriver.ErrInvalidConfig) {
			t.Errorf("MarkSentClaim with a claim of 0 rows = %v, want ErrInvalidConfig", err)
		}
		b.wantPending("after an invalid MarkSentClaim", 4)

		got, err := sc.MarkSentClaim(b.ctx, &idemdriver.MarkSentParams{IDs: []string{"a1", "c1"}, Seqs: []int64{seqOf["a1"], seqOf["c1"]}, Keep: keep}, claim)
		if err != nil {
			t.Fatalf("MarkSentClaim: %v", err)
		}
		if !slices.Equal(ids(got), []string{"a2"}) || got[0].Attempts != 1 || string(got[0].Payload) != "a2" {
			t.Fatalf("MarkSentClaim claimed %v, want a2 alone (its first attempt), the next of key A once a1 ended; b1 is leased", ids(got))
		}
		b.wantPending("after MarkSentClaim", 2) // a2 and b1, both leased

		// With no sent row, it is a claim: everything left is leased.
		got, err = sc.MarkSentClaim(b.ctx, &idemdriver.MarkSentParams{Keep: keep}, claim)
		if err != nil || len(got) != 0 {
			t.Errorf("MarkSentClaim of no rows = %v, %v; want no row (all leased)", ids(got), err)
		}
		if err := b.outboxOf().MarkSent(b.ctx, &idemdriver.MarkSentParams{IDs: []string{"a2", "b1"}, Keep: keep}); err != nil {
			t.Fatalf("MarkSent: %v", err)
		}
		b.wantPending("after every row was sent", 0)
	}
}
