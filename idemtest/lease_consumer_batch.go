package idemtest

import (
	"errors"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// The ConsumerBatch cases check LeaseConsumer.AcquireBatch and
// CompleteBatch over the store, batching or not: every message of a
// batch held or settled exactly as Acquire would hold or settle it, and
// every completion fenced by its attempt's token as Complete's.
func leaseConsumerBatchCases() []leaseCase {
	return []leaseCase{
		{"AcquireAndCompleteBatch", testLeaseConsumerBatch},
		{"ExpiredMismatchAndReleased", testLeaseConsumerBatchExpiredMismatchAndReleased},
	}
}

// One AcquireBatch over messages in every state (new, completed, held by
// a live attempt, expired after an attempt that saved its recovery point,
// the same new ID twice, an empty ID) holds the new and the expired ones
// (the takeover seeing the dead attempt's point) and settles the others
// as Acquire would: Duplicate with the stored result, InProgress,
// Rejected. One CompleteBatch then stores the held ones' results and
// refuses the dead attempt's stale token with ErrLeaseLost, leaving the
// takeover's result in place; an ended attempt is not sent.
func testLeaseConsumerBatch(t *testing.T, b *leaseBundle) {
	c := b.consumer("c", idem.Config{})
	m := func(id string) idem.Message { return idem.Message{ID: id, Payload: []byte("p")} }
	opt := idem.AcquireOptions{StepPrefix: "run:"}
	var calls atomic.Int64
	b.process("done", c, m("done"), result(&calls, idem.Result{Body: []byte("r-done")}), idem.Processed, nil)
	live, out, err := c.Acquire(b.ctx, m("live"), opt)
	if live == nil {
		t.Fatalf("Acquire(live): %v, %v", out, err)
	}
	defer func() { _, _ = live.Abandon(b.ctx, nil) }()
	dead, out, err := c.Acquire(b.ctx, m("expired"), opt)
	if dead == nil {
		t.Fatalf("Acquire(expired): %v, %v", out, err)
	}
	deadPoint := idemdriver.PrefixStep("run:", dead.Token)
	b.expire(c.Name(), "expired")

	ids := []string{"new-1", "done", "live", "expired", "new-1", "", "new-2"}
	msgs := make([]idem.Message, len(ids))
	for i, id := range ids {
		msgs[i] = m(id)
	}
	atts, outs, err := c.AcquireBatch(b.ctx, msgs, opt)
	if err != nil {
		t.Fatalf("AcquireBatch: %v", err)
	}
	if len(atts) != len(msgs) || len(outs) != len(msgs) {
		t.Fatalf("AcquireBatch: %d attempts and %d outcomes for %d messages", len(atts), len(outs), len(msgs))
	}
	for i, held := range []bool{true, false, false, true, false, false, true} {
		if (atts[i] != nil) != held {
			t.Fatalf("message %d (%q): held %v, want %v (outcome %v, %v)", i, ids[i], atts[i] != nil, held, outs[i].Status, outs[i].Err)
		}
		if held && outs[i].Status != 0 {
			t.Errorf("message %d (%q): held with outcome %v, want a zero Outcome", i, ids[i], outs[i].Status)
		}
	}
	b.wantOutcome("done, in the batch", "done", outs[1], outs[1].Err, idem.Duplicate, nil)
	b.wantResult("done, in the batch", outs[1].Result, outs[1].ContentType, idem.Result{Body: []byte("r-done")})
	b.wantOutcome("live, in the batch", "live", outs[2], outs[2].Err, idem.InProgress, idem.ErrInProgress)
	b.wantOutcome("new-1 a second time, in the batch", "new-1", outs[4], outs[4].Err, idem.InProgress, idem.ErrInProgress)
	b.wantOutcome("an empty ID, in the batch", "", outs[5], outs[5].Err, idem.Rejected, idem.ErrMissingMessageID)
	for _, i := range []int{0, 6} {
		a := atts[i]
		if a.Number != 1 || !a.Completed(idemdriver.PrefixStep("run:", a.Token)) {
			t.Errorf("%s: attempt %d, its recovery point saved %v; want attempt 1 with its point", ids[i], a.Number, a.Completed(idemdriver.PrefixStep("run:", a.Token)))
		}
	}
	take := atts[3]
	if take.Number != 2 || take.Token <= dead.Token {
		t.Fatalf("expired, in the batch: attempt %d, token %d; want the takeover, attempt 2, a token over %d", take.Number, take.Token, dead.Token)
	}
	b.wantSteps("expired, in the batch", take.Steps(), map[string][]byte{deadPoint: nil, idemdriver.PrefixStep("run:", take.Token): nil})

	ended, out, err := c.Acquire(b.ctx, m("ended"), idem.AcquireOptions{})
	if ended == nil {
		t.Fatalf("Acquire(ended): %v, %v", out, err)
	}
	if _, err := ended.Release(b.ctx, errors.New("let go")); err == nil {
		t.Fatal("Release(ended): nil error, want the cause")
	}
	batch := []*idem.Attempt{atts[6], dead, take, atts[0], ended}
	results := []idem.Result{{Body: []byte("r-2")}, {Body: []byte("stale")}, {Body: []byte("r-expired")}, {Body: []byte("r-1"), ContentType: "text/plain"}, {}}
	couts, err := c.CompleteBatch(b.ctx, batch, results)
	if err != nil {
		t.Fatalf("CompleteBatch: %v", err)
	}
	if len(couts) != len(batch) {
		t.Fatalf("CompleteBatch: %d outcomes for %d attempts", len(couts), len(batch))
	}
	b.wantOutcome("new-2 completed", "new-2", couts[0], couts[0].Err, idem.Processed, nil)
	b.wantOutcome("the dead attempt's stale token", "expired", couts[1], couts[1].Err, idem.Failed, idem.ErrLeaseLost)
	b.wantOutcome("the takeover completed", "expired", couts[2], couts[2].Err, idem.Processed, nil)
	b.wantOutcome("new-1 completed", "new-1", couts[3], couts[3].Err, idem.Processed, nil)
	b.wantOutcome("an ended attempt", "ended", couts[4], couts[4].Err, idem.Failed, idem.ErrAttemptEnded)
	for _, w := range []struct{ id, body, ct string }{{"new-1", "r-1", "text/plain"}, {"new-2", "r-2", ""}, {"expired", "r-expired", ""}} {
		out := b.process(w.id+" redelivered", c, m(w.id), result(&calls, idem.Result{}), idem.Duplicate, nil)
		b.wantResult(w.id+" redelivered", out.Result, out.ContentType, idem.Result{Body: []byte(w.body), ContentType: w.ct})
	}
	b.wantCalls("handler", &calls, 1)
	if _, err := c.CompleteBatch(b.ctx, []*idem.Attempt{atts[0]}, nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("CompleteBatch with no results: %v, want ErrInvalidConfig", err)
	}
	if _, _, err := c.AcquireBatch(b.ctx, msgs, idem.AcquireOptions{Wait: 1}); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("AcquireBatch with Wait: %v, want ErrInvalidConfig", err)
	}
	b.wantRecords("at the end", c.Name(), 6)
}
