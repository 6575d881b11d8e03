package idemtest

import (
	"errors"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// The Batch cases check idemdriver.LeaseBatcher: every element of a batch
// judged as the single call judges it, in order, results in the order
// given, fencing per element. They are skipped for a store without it.
func leaseBatchCases() []leaseCase {
	return []leaseCase{
		{"AcquireAndCompleteBatch", testLeaseBatch},
		{"ExpiredMismatchAndReleased", testLeaseBatchExpiredMismatchAndReleased},
	}
}

// One AcquireBatch over records in every state (completed, held, expired
// with a recovery point, new, the same new message twice, an invalid ID)
// answers each as Acquire would; one CompleteBatch completes the held
// ones and refuses a stale token with ErrLeaseLost, changing nothing of
// that record.
func testLeaseBatch(t *testing.T, b *leaseBundle) {
	lb, ok := b.s.Store.(idemdriver.LeaseBatcher)
	if !ok {
		t.Skip("the store is not an idemdriver.LeaseBatcher")
	}
	consumer := b.name("c")
	s := b.s.Store
	m := func(id string) idem.Message { return idem.Message{ID: id, Payload: []byte("p")} }
	done := b.mustAcquire("done", consumer, m("done"), longLease, 1)
	if err := s.Complete(b.ctx, &idemdriver.CompleteParams{Consumer: consumer, MessageID: "done", Token: done.Token, Result: []byte("r-done")}); err != nil {
		t.Fatal(err)
	}
	b.mustAcquire("live", consumer, m("live"), longLease, 1)
	old := b.mustAcquire("expired", consumer, m("expired"), longLease, 1)
	if err := s.SaveStep(b.ctx, &idemdriver.StepParams{Consumer: consumer, MessageID: "expired", Token: old.Token, Step: "s", Result: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	b.expire(consumer, "expired")

	prefix := ""
	if idemdriver.RecordsSteps(s) {
		prefix = "run:"
	}
	ids := []string{"new-1", "done", "live", "expired", "new-1", "", "new-2"}
	ps := make([]*idemdriver.AcquireParams, len(ids))
	for i, id := range ids {
		ps[i] = &idemdriver.AcquireParams{Consumer: consumer, MessageID: id, Fingerprint: fingerprint([]byte("p")), Lease: longLease, StepPrefix: prefix}
	}
	res, errs, err := lb.AcquireBatch(b.ctx, ps)
	if err != nil {
		t.Fatalf("AcquireBatch: %v", err)
	}
	if len(res) != len(ps) || len(errs) != len(ps) {
		t.Fatalf("AcquireBatch: %d results and %d errors for %d elements", len(res), len(errs), len(ps))
	}
	for i, id := range ids {
		if id == "" {
			if !errors.Is(errs[i], idem.ErrMissingMessageID) {
				t.Errorf("element %d (empty ID): error %v, want ErrMissingMessageID", i, errs[i])
			}
			continue
		}
		if errs[i] != nil {
			t.Errorf("element %d (%q): error %v", i, id, errs[i])
		}
	}
	if !res[0].Acquired || res[0].Attempt != 1 || !res[6].Acquired || res[6].Attempt != 1 {
		t.Errorf("new-1 and new-2: acquired %v/%v, attempts %d/%d; want both acquired, attempt 1", res[0].Acquired, res[6].Acquired, res[0].Attempt, res[6].Attempt)
	}
	b.wantNotAcquired("done, in the batch", res[1], idemdriver.StateCompleted)
	b.wantResult("done, in the batch", res[1].Result, res[1].ContentType, idem.Result{Body: []byte("r-done")})
	b.wantNotAcquired("live, in the batch", res[2], idemdriver.StateInProgress)
	b.wantNotAcquired("new-1 a second time, in the batch", res[4], idemdriver.StateInProgress)
	if !res[3].Acquired || res[3].Attempt != 2 || res[3].Token <= old.Token {
		t.Fatalf("expired, in the batch: acquired %v, attempt %d, token %d; want the takeover, attempt 2, a token over %d", res[3].Acquired, res[3].Attempt, res[3].Token, old.Token)
	}
	b.wantSteps("expired, in the batch", res[3].Steps, map[string][]byte{"s": []byte("v")})

	cps := []*idemdriver.CompleteParams{
		{Consumer: consumer, MessageID: "new-2", Token: res[6].Token, Result: []byte("r-2")},
		{Consumer: consumer, MessageID: "expired", Token: old.Token, Result: []byte("stale")},
		{Consumer: consumer, MessageID: "expired", Token: res[3].Token, Result: []byte("r-expired")},
		{Consumer: consumer, MessageID: "new-1", Token: res[0].Token, Result: []byte("r-1"), ContentType: "text/plain"},
	}
	cerrs, err := lb.CompleteBatch(b.ctx, cps)
	if err != nil {
		t.Fatalf("CompleteBatch: %v", err)
	}
	for i, want := range []error{nil, idem.ErrLeaseLost, nil, nil} {
		if len(cerrs) != len(cps) {
			t.Fatalf("CompleteBatch: %d errors for %d elements", len(cerrs), len(cps))
		}
		if (want == nil) != (cerrs[i] == nil) || (want != nil && !errors.Is(cerrs[i], want)) {
			t.Errorf("CompleteBatch element %d (%s, token %d): %v, want %v", i, cps[i].MessageID, cps[i].Token, cerrs[i], want)
		}
	}
	for _, w := range []struct{ id, body, ct string }{{"new-1", "r-1", "text/plain"}, {"new-2", "r-2", ""}, {"expired", "r-expired", ""}} {
		r := b.acquire("after the batch", consumer, m(w.id), longLease)
		b.wantNotAcquired(w.id+" after the batch", r, idemdriver.StateCompleted)
		b.wantResult(w.id+" after the batch", r.Result, r.ContentType, idem.Result{Body: []byte(w.body), ContentType: w.ct})
	}
	if r, errs, err := lb.AcquireBatch(b.ctx, nil); err != nil || len(r) != 0 || len(errs) != 0 {
		t.Errorf("AcquireBatch of nothing: %d results, %d errors, %v; want nothing", len(r), len(errs), err)
	}
	b.wantRecords("at the end", consumer, 5)
}
