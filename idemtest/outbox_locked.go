package idemtest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/testenv"
)

// lockedRoundCases are RunOutbox's cases of
// idemdriver.OutboxLockedRounder, each a no-op (logged) on a store
// without it.
func lockedRoundCases[TTx any]() []testCase[TTx] {
	return []testCase[TTx]{
		{"LockedRoundEndsItsRows", lockedRoundEnds[TTx]},
		{"LockedRoundEndFailsAtomically", lockedRoundEndFails[TTx]},
		{"LockedRoundIdleBound", lockedRoundIdleBound[TTx]},
	}
}

// lockedRounder returns b's store as an OutboxLockedRounder, or false
// (logged) when it is not one.
func lockedRounder[TTx any](t *testing.T, b *bundle[TTx]) (idemdriver.OutboxLockedRounder, bool) {
	lr, ok := b.outboxOf().(idemdriver.OutboxLockedRounder)
	if !ok {
		t.Log("the store does not hold a round's rows by their locks (idemdriver.OutboxLockedRounder)")
	}
	return lr, ok
}

// emitRows writes rows in one committed transaction.
func (b *bundle[TTx]) emitRows(rows ...idemdriver.OutgoingRecord) {
	b.t.Helper()
	tx := b.begin()
	if err := b.s.Store.(idemdriver.OutboxTx[TTx]).EmitTx(b.ctx, tx, &idemdriver.EmitParams{Consumer: "c", Messages: rows}); err != nil {
		b.rollback(tx)
		b.t.Fatalf("EmitTx: %v", err)
	}
	b.commit(tx)
}

// allSentFirst returns every row of recs as sent, checking that each is
// at its first attempt.
func allSentFirst(t *testing.T, recs []idemdriver.OutgoingRecord) idemdriver.MarkSentParams {
	t.Helper()
	var sent idemdriver.MarkSentParams
	for _, r := range recs {
		if r.Attempts != 1 {
			t.Errorf("%s at attempt %d, want 1", r.ID, r.Attempts)
		}
		sent.IDs, sent.Seqs = append(sent.IDs, r.ID), append(sent.Seqs, r.Seq)
	}
	return sent
}

func sortedIDs(recs []idemdriver.OutgoingRecord) []string {
	var out []string
	for _, r := range recs {
		out = append(out, r.ID)
	}
	slices.Sort(out)
	return out
}

// lockedRoundEnds: a round takes the pending rows first of their keys,
// in seq order, each at its next attempt; while it publishes, another
// round and a leased claim take none of them, nor the next row of a key
// whose row the round holds; at its end the sent rows are gone, a
// retryable row waits for its retry time with its attempt counted, a
// permanent one is failed and no longer holds back its key. A row under
// another relay's lease is left out. Invalid parameters claim nothing.
func lockedRoundEnds[TTx any](t *testing.T, b *bundle[TTx]) {
	lr, ok := lockedRounder(t, b)
	if !ok {
		return
	}
	if _, err := lr.LockedRound(b.ctx, &idemdriver.LockedRoundParams{Limit: 0, Lease: time.Minute,
		Publish: func(context.Context, []idemdriver.OutgoingRecord) (idemdriver.MarkSentParams, []idemdriver.FailedRow) {
			t.Error("Publish called for a round of limit 0")
			return idemdriver.MarkSentParams{}, nil
		}}); !errors.Is(err, idemdriver.ErrInvalidConfig) {
		t.Errorf("LockedRound of limit 0 = %v, want ErrInvalidConfig", err)
	}
	if _, err := lr.LockedRound(b.ctx, &idemdriver.LockedRoundParams{Limit: 10, Lease: time.Minute}); !errors.Is(err, idemdriver.ErrInvalidConfig) {
		t.Errorf("LockedRound without Publish = %v, want ErrInvalidConfig", err)
	}
	// l1 is leased by a relay that leases its rows: no round takes it.
	b.emitRows(idemdriver.OutgoingRecord{ID: "l1", Destination: "d", Payload: []byte("l1")})
	leased, err := b.outboxOf().ClaimOutgoing(b.ctx, &idemdriver.ClaimOutgoingParams{Limit: 1, Lease: time.Hour})
	if err != nil || len(leased) != 1 || leased[0].ID != "l1" {
		t.Fatalf("ClaimOutgoing = %v, %v; want l1", sortedIDs(leased), err)
	}
	b.emitRows(
		idemdriver.OutgoingRecord{ID: "a1", Destination: "d", Key: "A", Payload: []byte("a1")},
		idemdriver.OutgoingRecord{ID: "a2", Destination: "d", Key: "A", Payload: []byte("a2")},
		idemdriver.OutgoingRecord{ID: "b1", Destination: "d", Key: "B", Payload: []byte("b1")},
		idemdriver.OutgoingRecord{ID: "b2", Destination: "d", Key: "B", Payload: []byte("b2")},
		idemdriver.OutgoingRecord{ID: "c1", Destination: "d", Payload: []byte("c1")},
	)

	var inner []string
	n, err := lr.LockedRound(b.ctx, &idemdriver.LockedRoundParams{Limit: 10, Lease: time.Minute,
		Publish: func(ctx context.Context, recs []idemdriver.OutgoingRecord) (idemdriver.MarkSentParams, []idemdriver.FailedRow) {
			if !slices.Equal(sortedIDs(recs), []string{"a1", "b1", "c1"}) {
				t.Errorf("round claimed %v, want a1, b1 and c1 (a2 and b2 wait for theirs, l1 is leased)", sortedIDs(recs))
			}
			if !slices.IsSortedFunc(recs, func(x, y idemdriver.OutgoingRecord) int { return int(x.Seq - y.Seq) }) {
				t.Error("round's rows not in seq order")
			}
			for _, r := range recs {
				if r.Attempts != 1 || string(r.Payload) != r.ID {
					t.Errorf("round's %s: attempts %d, payload %q; want its first attempt and its payload", r.ID, r.Attempts, r.Payload)
				}
			}
			// While the round holds its rows, a second round and a
			// leased claim take nothing: not its rows, not b2 (b1 still
			// pending), not l1 (leased).
			if _, err := lr.LockedRound(ctx, &idemdriver.LockedRoundParams{Limit: 10, Lease: time.Minute,
				Publish: func(_ context.Context, recs []idemdriver.OutgoingRecord) (idemdriver.MarkSentParams, []idemdriver.FailedRow) {
					inner = sortedIDs(recs)
					return idemdriver.MarkSentParams{}, nil
				}}); err != nil {
				t.Errorf("inner LockedRound: %v", err)
			}
			if got, err := b.outboxOf().ClaimOutgoing(ctx, &idemdriver.ClaimOutgoingParams{Limit: 10, Lease: time.Hour}); err != nil || len(got) != 0 {
				t.Errorf("ClaimOutgoing during a round = %v, %v; want nothing", sortedIDs(got), err)
			}
			var sent idemdriver.MarkSentParams
			var failed []idemdriver.FailedRow
			for _, r := range recs {
				switch r.ID {
				case "b1":
					failed = append(failed, idemdriver.FailedRow{ID: r.ID, Attempt: r.Attempts, Seq: r.Seq, Permanent: true, Error: "no such destination"})
				case "c1":
					failed = append(failed, idemdriver.FailedRow{ID: r.ID, Attempt: r.Attempts, Seq: r.Seq, RetryAfter: time.Hour, Error: "broker down"})
				default:
					sent.IDs, sent.Seqs = append(sent.IDs, r.ID), append(sent.Seqs, r.Seq)
				}
			}
			return sent, failed
		}})
	if err != nil || n != 3 {
		t.Fatalf("LockedRound = %d, %v; want 3 rows", n, err)
	}
	if len(inner) != 0 {
		t.Errorf("a round during another claimed %v, want nothing", inner)
	}
	st := b.stats()
	if st.Pending != 4 || st.Failed != 1 {
		t.Errorf("after the round: %+v; want 4 pending (a2, b2, c1 waiting for its retry, l1 leased), 1 failed (b1)", st)
	}
	// a2 and b2 are next of their keys (a1 sent, b1 failed for good); c1
	// waits an hour, l1 is leased.
	n, err = lr.LockedRound(b.ctx, &idemdriver.LockedRoundParams{Limit: 10, Lease: time.Minute,
		Publish: func(_ context.Context, recs []idemdriver.OutgoingRecord) (idemdriver.MarkSentParams, []idemdriver.FailedRow) {
			if !slices.Equal(sortedIDs(recs), []string{"a2", "b2"}) {
				t.Errorf("second round claimed %v, want a2 and b2", sortedIDs(recs))
			}
			return allSentFirst(t, recs), nil
		}})
	if err != nil || n != 2 {
		t.Fatalf("second LockedRound = %d, %v; want 2 rows", n, err)
	}
	if err := b.outboxOf().MarkSent(b.ctx, &idemdriver.MarkSentParams{IDs: []string{"l1"}}); err != nil {
		t.Fatalf("MarkSent: %v", err)
	}
	if ops, ok := b.outboxOf().(idemdriver.OutboxOperator); ok {
		page, err := ops.ListFailedOutgoing(b.ctx, &idemdriver.ListOutgoingParams{Limit: 10})
		if err != nil || len(page.Rows) != 1 || page.Rows[0].ID != "b1" || page.Rows[0].Error != "no such destination" || page.Rows[0].Attempts != 1 {
			t.Errorf("failed rows = %+v, %v; want b1 at attempt 1 with its error", page, err)
		}
	}
	b.wantPending("at the end", 1) // c1, waiting for its retry
	n, err = lr.LockedRound(b.ctx, &idemdriver.LockedRoundParams{Limit: 10, Lease: time.Minute,
		Publish: func(_ context.Context, recs []idemdriver.OutgoingRecord) (idemdriver.MarkSentParams, []idemdriver.FailedRow) {
			t.Errorf("a round claimed %v, want nothing (c1 waits an hour)", sortedIDs(recs))
			return idemdriver.MarkSentParams{}, nil
		}})
	if err != nil || n != 0 {
		t.Errorf("LockedRound of nothing = %d, %v", n, err)
	}
}

// lockedRoundEndFails: when the end of a round fails (here a failed row
// the store refuses), nothing of it commits: the sent rows are still
// there, no attempt is counted, and the next round takes the rows again.
func lockedRoundEndFails[TTx any](t *testing.T, b *bundle[TTx]) {
	lr, ok := lockedRounder(t, b)
	if !ok {
		return
	}
	b.emitRows(
		idemdriver.OutgoingRecord{ID: "x1", Destination: "d", Key: "X", Payload: []byte("x1")},
		idemdriver.OutgoingRecord{ID: "y1", Destination: "d", Payload: []byte("y1")},
	)
	n, err := lr.LockedRound(b.ctx, &idemdriver.LockedRoundParams{Limit: 10, Lease: time.Minute,
		Publish: func(_ context.Context, recs []idemdriver.OutgoingRecord) (idemdriver.MarkSentParams, []idemdriver.FailedRow) {
			var sent idemdriver.MarkSentParams
			var failed []idemdriver.FailedRow
			for _, r := range recs {
				if r.ID == "x1" {
					sent.IDs, sent.Seqs = append(sent.IDs, r.ID), append(sent.Seqs, r.Seq)
				} else {
					failed = append(failed, idemdriver.FailedRow{ID: r.ID, Attempt: 0, Seq: r.Seq, Error: "e"}) // attempt 0: refused
				}
			}
			return sent, failed
		}})
	if n != 2 || !errors.Is(err, idemdriver.ErrInvalidConfig) {
		t.Fatalf("LockedRound = %d, %v; want 2 rows and ErrInvalidConfig", n, err)
	}
	b.wantPending("after a round whose end failed", 2)
	n, err = lr.LockedRound(b.ctx, &idemdriver.LockedRoundParams{Limit: 10, Lease: time.Minute,
		Publish: func(_ context.Context, recs []idemdriver.OutgoingRecord) (idemdriver.MarkSentParams, []idemdriver.FailedRow) {
			return allSentFirst(t, recs), nil // the failed round counted no attempt
		}})
	if err != nil || n != 2 {
		t.Fatalf("LockedRound = %d, %v; want both rows again", n, err)
	}
	b.wantPending("after the second round", 0)
}

// lockedRoundIdleBound: a round whose publish outlasts its Lease loses
// its rows: the store (its server) ends the round's transaction, another
// relay claims them while the publish still runs, and the stalled round
// ends with an error, deleting nothing.
func lockedRoundIdleBound[TTx any](t *testing.T, b *bundle[TTx]) {
	lr, ok := lockedRounder(t, b)
	if !ok {
		return
	}
	b.emitRows(idemdriver.OutgoingRecord{ID: "s1", Destination: "d", Key: "S", Payload: []byte("s1")})
	var taken []idemdriver.OutgoingRecord
	n, err := lr.LockedRound(b.ctx, &idemdriver.LockedRoundParams{Limit: 10, Lease: 200 * time.Millisecond,
		Publish: func(ctx context.Context, recs []idemdriver.OutgoingRecord) (idemdriver.MarkSentParams, []idemdriver.FailedRow) {
			testenv.Eventually(t, realTimeout, "another relay to claim the stalled round's row", func() bool {
				got, err := b.outboxOf().ClaimOutgoing(b.ctx, &idemdriver.ClaimOutgoingParams{Limit: 10, Lease: time.Hour})
				taken = append(taken, got...)
				return err == nil && len(taken) > 0
			}, func() string { return "nothing claimed" })
			return idemdriver.MarkSentParams{IDs: []string{recs[0].ID}, Seqs: []int64{recs[0].Seq}}, nil
		}})
	if n != 1 || err == nil {
		t.Errorf("stalled LockedRound = %d, %v; want 1 row and an error", n, err)
	}
	if len(taken) != 1 || taken[0].ID != "s1" || taken[0].Attempts != 1 {
		t.Errorf("claimed %+v during the stall, want s1 at attempt 1", taken)
	}
	b.wantPending("after the stalled round", 1) // s1, leased by the other claim
}
