package idemtest

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// batchStateRecord is one record the ExpiredMismatchAndReleased cases
// put in a state before the batch: its ID, and whether its attempt 1
// saved recovery point "s", then had its lease expire (expired) or
// released the record after a retryable failure (released).
type batchStateRecord struct {
	id                      string
	step, released, expired bool
}

// batchStateRecords are the records of the store-level case: two expired,
// two released, one of each with a recovery point.
var batchStateRecords = []batchStateRecord{
	{id: "exp", step: true, expired: true},
	{id: "exp2", expired: true},
	{id: "rel", step: true, released: true},
	{id: "rel2", released: true},
}

// batchStateElements are the store-level batch, in order: each record
// once with another fingerprint and once with its own, in both orders, so
// that a record's first element in the batch is sometimes the mismatched
// one (a store claiming the first element of each record in one statement
// must still judge the second as Acquire would).
var batchStateElements = []struct {
	id    string
	other bool
}{
	{"exp", true}, {"rel", false}, {"exp", false}, {"rel", true},
	{"exp2", false}, {"exp2", true}, {"rel2", true}, {"rel2", false},
}

// putBatchStates puts consumer's records in the states of
// batchStateRecords, each with fingerprint fp.
func (b *leaseBundle) putBatchStates(consumer string, fp []byte) {
	b.t.Helper()
	s := b.s.Store
	for _, r := range batchStateRecords {
		res, err := s.Acquire(b.ctx, &idemdriver.AcquireParams{Consumer: consumer, MessageID: r.id, Fingerprint: fp, Lease: longLease})
		if err != nil || !res.Acquired {
			b.t.Fatalf("Acquire %s: %+v %v", r.id, res, err)
		}
		if r.step {
			if err := s.SaveStep(b.ctx, &idemdriver.StepParams{Consumer: consumer, MessageID: r.id, Token: res.Token, Step: "s", Result: []byte("v")}); err != nil {
				b.t.Fatalf("SaveStep %s: %v", r.id, err)
			}
		}
		if r.released {
			if err := s.Release(b.ctx, &idemdriver.ReleaseParams{Consumer: consumer, MessageID: r.id, Token: res.Token, Error: "boom"}); err != nil {
				b.t.Fatalf("Release %s: %v", r.id, err)
			}
		}
		if r.expired {
			b.expire(consumer, r.id)
		}
	}
}

// An AcquireBatch holding records whose lease expired and records that a
// failed attempt released, each met once with another fingerprint and
// once with its own, answers every element as Acquire, called element by
// element in the batch's order on records in the same states, answers:
// another fingerprint never takes a record over (not acquired, the stored
// fingerprint returned, so the consumer reports a FingerprintMismatch);
// its own takes it over as attempt 2 with attempt 1's recovery points;
// and once taken over, the other fingerprint finds it in progress. The
// takeovers complete in one CompleteBatch, and the other fingerprint then
// finds them completed, its own fingerprint still stored.
func testLeaseBatchExpiredMismatchAndReleased(t *testing.T, b *leaseBundle) {
	lb, ok := b.s.Store.(idemdriver.LeaseBatcher)
	if !ok {
		t.Skip("the store is not an idemdriver.LeaseBatcher")
	}
	fp, other := fingerprint([]byte("p")), fingerprint([]byte("other"))
	batched, single := b.name("batch"), b.name("single")
	b.putBatchStates(batched, fp)
	b.putBatchStates(single, fp)
	params := func(consumer string) []*idemdriver.AcquireParams {
		ps := make([]*idemdriver.AcquireParams, len(batchStateElements))
		for i, e := range batchStateElements {
			f := fp
			if e.other {
				f = other
			}
			ps[i] = &idemdriver.AcquireParams{Consumer: consumer, MessageID: e.id, Fingerprint: f, Lease: longLease}
		}
		return ps
	}
	res, errs, err := lb.AcquireBatch(b.ctx, params(batched))
	if err != nil {
		t.Fatalf("AcquireBatch: %v", err)
	}
	if len(res) != len(batchStateElements) || len(errs) != len(batchStateElements) {
		t.Fatalf("AcquireBatch: %d results and %d errors for %d elements", len(res), len(errs), len(batchStateElements))
	}
	var cps []*idemdriver.CompleteParams
	for i, p := range params(single) {
		e := batchStateElements[i]
		what := fmt.Sprintf("element %d (%s, %s fingerprint)", i, e.id, map[bool]string{true: "another", false: "its own"}[e.other])
		one, oneErr := b.s.Store.Acquire(b.ctx, p)
		if errs[i] != nil || oneErr != nil {
			t.Errorf("%s: error %v in the batch, %v alone; want none", what, errs[i], oneErr)
			continue
		}
		got := res[i]
		if got.Acquired != one.Acquired || got.State != one.State || got.Attempt != one.Attempt ||
			!bytes.Equal(got.Fingerprint, one.Fingerprint) || !maps.EqualFunc(got.Steps, one.Steps, bytes.Equal) {
			t.Errorf("%s: the batch answered acquired %v, state %v, attempt %d, fingerprint %x, steps %q; Acquire alone acquired %v, state %v, attempt %d, fingerprint %x, steps %q",
				what, got.Acquired, got.State, got.Attempt, got.Fingerprint, got.Steps, one.Acquired, one.State, one.Attempt, one.Fingerprint, one.Steps)
		}
		if e.other {
			if got.Acquired {
				t.Errorf("%s: taken over (attempt %d) by another fingerprint", what, got.Attempt)
			}
			if !bytes.Equal(got.Fingerprint, fp) {
				t.Errorf("%s: fingerprint %x returned, want the stored %x", what, got.Fingerprint, fp)
			}
			continue
		}
		if !got.Acquired || got.Attempt != 2 {
			t.Errorf("%s: acquired %v, attempt %d; want the takeover, attempt 2", what, got.Acquired, got.Attempt)
			continue
		}
		if e.id == "exp" || e.id == "rel" {
			b.wantSteps(what, got.Steps, map[string][]byte{"s": []byte("v")})
		}
		cps = append(cps, &idemdriver.CompleteParams{Consumer: batched, MessageID: e.id, Token: got.Token, Result: []byte("r-" + e.id)})
	}
	// The elements taken over after one with another fingerprint came
	// first saw it in progress: the record was theirs.
	for _, i := range []int{3, 5} {
		b.wantNotAcquired(fmt.Sprintf("element %d (%s, another fingerprint, after the takeover)", i, batchStateElements[i].id), res[i], idemdriver.StateInProgress)
	}
	if len(cps) != len(batchStateRecords) {
		t.Fatalf("%d takeovers in the batch, want %d (one per record)", len(cps), len(batchStateRecords))
	}
	cerrs, err := lb.CompleteBatch(b.ctx, cps)
	if err != nil {
		t.Fatalf("CompleteBatch: %v", err)
	}
	for i, e := range cerrs {
		if e != nil {
			t.Errorf("CompleteBatch of %s: %v", cps[i].MessageID, e)
		}
	}
	after, errs, err := lb.AcquireBatch(b.ctx, params(batched)[:1])
	if err != nil || errs[0] != nil {
		t.Fatalf("AcquireBatch after the completions: %v %v", err, errs[0])
	}
	b.wantNotAcquired("exp, another fingerprint, after its completion", after[0], idemdriver.StateCompleted)
	if !bytes.Equal(after[0].Fingerprint, fp) || string(after[0].Result) != "r-exp" {
		t.Errorf("exp after its completion: fingerprint %x, result %q; want %x and r-exp", after[0].Fingerprint, after[0].Result, fp)
	}
	b.wantRecords("at the end", batched, len(batchStateRecords))
}

// A LeaseConsumer.AcquireBatch over messages whose records are expired,
// released after a retryable failure (Process with a failing handler),
// completed, live and poison, some with another payload, settles each
// message as Acquire, called message by message in the batch's order on a
// second consumer in the same states, does: another payload is a
// FingerprintMismatch (ErrFingerprintMismatch, dead-lettered, never
// acknowledged, no attempt) whatever the state, the expired and the
// released records with their own payload are held as attempt 2, and the
// completed one is a Duplicate with its result. The held attempts then
// complete.
func testLeaseConsumerBatchExpiredMismatchAndReleased(t *testing.T, b *leaseBundle) {
	cfg := idem.Config{MaxAttempts: 3}
	batched, single := b.consumer("batch", cfg), b.consumer("single", cfg)
	ms := b.fingerprintPaths(batched)
	b.fingerprintPaths(single)
	changed := func(name string) idem.Message {
		return idem.Message{ID: ms[name].ID, Payload: []byte(`{"amount":500}`)}
	}
	msgs := []idem.Message{
		changed("expired"), ms["released"], ms["expired"], changed("released"),
		changed("completed"), changed("live"), ms["completed"], changed("poison"),
	}
	wantHeld := []bool{false, true, true, false, false, false, false, false}
	atts, outs, err := batched.AcquireBatch(b.ctx, msgs, idem.AcquireOptions{})
	if err != nil {
		t.Fatalf("AcquireBatch: %v", err)
	}
	if len(atts) != len(msgs) || len(outs) != len(msgs) {
		t.Fatalf("AcquireBatch: %d attempts and %d outcomes for %d messages", len(atts), len(outs), len(msgs))
	}
	var held []*idem.Attempt
	for i, m := range msgs {
		what := fmt.Sprintf("message %d (%s, payload %s)", i, m.ID, m.Payload)
		one, oneOut, _ := single.Acquire(b.ctx, m, idem.AcquireOptions{})
		if one != nil {
			// Held to the end, as the batch's attempts are.
			defer func() { _, _ = one.Complete(b.ctx, idem.Result{Body: []byte("single")}) }()
		}
		if (atts[i] != nil) != wantHeld[i] || (one != nil) != wantHeld[i] {
			t.Errorf("%s: held %v in the batch, %v alone; want %v (outcomes %v %v, %v %v)", what, atts[i] != nil, one != nil, wantHeld[i], outs[i].Status, outs[i].Err, oneOut.Status, oneOut.Err)
			continue
		}
		if wantHeld[i] {
			if atts[i].Number != 2 || one.Number != 2 {
				t.Errorf("%s: attempt %d in the batch, %d alone; want 2 (the takeover)", what, atts[i].Number, one.Number)
			}
			held = append(held, atts[i])
			continue
		}
		if outs[i].Status != oneOut.Status || errors.Is(outs[i].Err, idem.ErrFingerprintMismatch) != errors.Is(oneOut.Err, idem.ErrFingerprintMismatch) ||
			outs[i].Ack() != oneOut.Ack() || outs[i].DeadLetter() != oneOut.DeadLetter() {
			t.Errorf("%s: the batch settled %v (%v, ack %v), Acquire alone %v (%v, ack %v)", what, outs[i].Status, outs[i].Err, outs[i].Ack(), oneOut.Status, oneOut.Err, oneOut.Ack())
		}
		if bytes.Equal(m.Payload, ms["completed"].Payload) {
			b.wantOutcome(what, m.ID, outs[i], outs[i].Err, idem.Duplicate, nil)
			b.wantResult(what, outs[i].Result, outs[i].ContentType, idem.Result{Body: []byte("R1")})
			continue
		}
		b.wantOutcome(what, m.ID, outs[i], outs[i].Err, idem.FingerprintMismatch, idem.ErrFingerprintMismatch)
		if !outs[i].DeadLetter() || !idem.IsPermanent(outs[i].Err) {
			t.Errorf("%s: DeadLetter %v, IsPermanent %v; want both", what, outs[i].DeadLetter(), idem.IsPermanent(outs[i].Err))
		}
	}
	results := make([]idem.Result, len(held))
	for i, a := range held {
		results[i] = idem.Result{Body: []byte("r-" + a.Message.ID)}
	}
	couts, err := batched.CompleteBatch(b.ctx, held, results)
	if err != nil {
		t.Fatalf("CompleteBatch: %v", err)
	}
	for i, out := range couts {
		b.wantOutcome("completing "+held[i].Message.ID, held[i].Message.ID, out, out.Err, idem.Processed, nil)
	}
	var calls atomic.Int64
	for _, name := range slices.Sorted(maps.Keys(ms)) {
		if name == "live" || name == "poison" {
			continue
		}
		out := b.process(name+" redelivered with its own payload", batched, ms[name], result(&calls, idem.Result{}), idem.Duplicate, nil)
		want := "r-" + ms[name].ID
		if name == "completed" {
			want = "R1"
		}
		b.wantResult(name+" redelivered", out.Result, out.ContentType, idem.Result{Body: []byte(want)})
	}
	b.wantCalls("the redeliveries", &calls, 0)
	b.wantRecords("at the end", batched.Name(), len(ms))
}
