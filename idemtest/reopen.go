package idemtest

import (
	"context"
	"errors"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// reopener returns the store's [idemdriver.Reopener], skipping the test
// on a store that does not implement it.
func (b *leaseBundle) reopener() idemdriver.Reopener {
	b.t.Helper()
	r, ok := b.s.Store.(idemdriver.Reopener)
	if !ok {
		b.t.Skipf("store %T does not implement idemdriver.Reopener", b.s.Store)
	}
	return r
}

// inspect reads the record through the store's Inspector.
func (b *leaseBundle) inspect(what, consumer, id string) idemdriver.Record {
	b.t.Helper()
	in, ok := b.s.Store.(idemdriver.Inspector)
	if !ok {
		b.t.Skipf("store %T does not implement idemdriver.Inspector", b.s.Store)
	}
	rec, err := in.Inspect(b.ctx, consumer, id)
	if err != nil {
		b.t.Fatalf("Inspect(%q) %s: %v", id, what, err)
	}
	return rec
}

// A record completed with an outcome to undo (a refusal) is reopened by
// the token that completed it: Inspect shows that result first; after
// the reopen the record is in progress, attempt 0, its result and
// recovery points gone, and the next delivery runs as attempt 1 of a
// consumer whose MaxAttempts is 1, without the old steps, and completes
// it with the new result. A repeated reopen reports Changed false; a
// reopen by the old token of the record completed again is refused with
// ErrTokenMoved; a reopen of a failed record, of one held by an attempt,
// of a wrong token, of a missing record and with a token below 1 are
// refused with their errors, changing nothing.
func testOperateReopen(t *testing.T, b *leaseBundle) {
	ro := b.reopener()
	c := b.consumer("c", idem.Config{MaxAttempts: 1})
	msg := idem.Message{ID: "order-1", Payload: []byte(`{"order":1}`)}
	var runs int
	refused := idem.Result{Body: []byte("422 refused"), ContentType: "application/x-test-answer"}
	accepted := idem.Result{Body: []byte("200 accepted"), ContentType: "application/x-test-answer"}
	answer := refused
	h := func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
		runs++
		if a.Number != 1 {
			t.Errorf("run %d is attempt %d, want 1 (a fresh round)", runs, a.Number)
		}
		if a.Completed("call") {
			t.Errorf("run %d found the step of an earlier run: a reopened record must start afresh", runs)
		}
		if err := a.SaveStep(ctx, "call", []byte("sent")); err != nil {
			return idem.Result{}, err
		}
		return answer, nil
	}
	b.process("first delivery", c, msg, h, idem.Processed, nil)
	first := b.inspect("after the refusal", c.Name(), msg.ID)
	if first.State != idemdriver.StateCompleted || string(first.Result) != string(refused.Body) || first.ContentType != refused.ContentType || first.Token < 1 {
		t.Fatalf("record after the refusal: state %v, result %q (%q), token %d; want completed with the refusal and a token",
			first.State, first.Result, first.ContentType, first.Token)
	}
	p := &idemdriver.ReopenRecordParams{Consumer: c.Name(), MessageID: msg.ID, Token: first.Token}
	wrong := *p
	wrong.Token++
	if _, err := ro.ReopenRecord(b.ctx, &wrong); !errors.Is(err, idemdriver.ErrWrongState) || errors.Is(err, idemdriver.ErrTokenMoved) {
		t.Errorf("ReopenRecord of a token that did not complete the record: %v, want ErrWrongState (not ErrTokenMoved)", err)
	}
	res, err := ro.ReopenRecord(b.ctx, p)
	if err != nil || !res.Changed {
		t.Fatalf("ReopenRecord: %+v, %v; want Changed", res, err)
	}
	if r := res.Record; r.State != idemdriver.StateInProgress || r.Attempt != 0 || r.Token <= first.Token || len(r.Result) != 0 {
		t.Errorf("reopened record: state %v, attempt %d, token %d, result %q; want in progress, attempt 0, a token after %d, no result",
			r.State, r.Attempt, r.Token, r.Result, first.Token)
	}
	if r := b.inspect("after the reopen", c.Name(), msg.ID); r.State != idemdriver.StateInProgress || len(r.Result) != 0 || r.ContentType != "" ||
		string(r.Fingerprint) != string(first.Fingerprint) {
		t.Errorf("inspected after the reopen: state %v, result %q (%q), fingerprint %x; want in progress, no result, fingerprint %x kept",
			r.State, r.Result, r.ContentType, r.Fingerprint, first.Fingerprint)
	}
	if sr, ok := b.s.Store.(idemdriver.StepReader); ok {
		if steps, err := sr.Steps(b.ctx, c.Name(), msg.ID); err != nil || len(steps) != 0 {
			t.Errorf("recovery points after the reopen: %v, %v; want none", steps, err)
		}
	}
	again, err := ro.ReopenRecord(b.ctx, p)
	if err != nil || again.Changed || again.Record.State != idemdriver.StateInProgress {
		t.Errorf("second ReopenRecord: %+v, %v; want Changed false, no error, the record in progress", again, err)
	}
	answer = accepted
	b.process("delivery after the reopen", c, msg, h, idem.Processed, nil)
	out := b.process("duplicate after the reopen", c, msg, h, idem.Duplicate, nil)
	b.wantResult("duplicate after the reopen", out.Result, out.ContentType, accepted)
	if runs != 2 {
		t.Errorf("handler ran %d times, want 2: once before the reopen, once after", runs)
	}
	done := b.inspect("after the redelivery", c.Name(), msg.ID)
	if done.State != idemdriver.StateCompleted || string(done.Result) != string(accepted.Body) || done.Token <= res.Record.Token {
		t.Errorf("record after the redelivery: state %v, result %q, token %d; want completed with the new result under a later token than %d",
			done.State, done.Result, done.Token, res.Record.Token)
	}
	if _, err := ro.ReopenRecord(b.ctx, p); !errors.Is(err, idemdriver.ErrTokenMoved) || !errors.Is(err, idemdriver.ErrWrongState) {
		t.Errorf("ReopenRecord by the old token of the record completed again: %v, want ErrTokenMoved (and ErrWrongState)", err)
	}
	if r := b.inspect("after the refused reopen", c.Name(), msg.ID); r.State != idemdriver.StateCompleted || string(r.Result) != string(accepted.Body) {
		t.Errorf("record after the refused reopen: state %v, result %q; want it unchanged", r.State, r.Result)
	}

	cn := b.name("other")
	b.poison(cn, "failed", "boom")
	failed := b.inspect("failed", cn, "failed")
	if _, err := ro.ReopenRecord(b.ctx, &idemdriver.ReopenRecordParams{Consumer: cn, MessageID: "failed", Token: failed.Token}); !errors.Is(err, idemdriver.ErrWrongState) ||
		errors.Is(err, idemdriver.ErrTokenMoved) {
		t.Errorf("ReopenRecord of a failed record: %v, want ErrWrongState", err)
	}
	held := b.mustAcquire("held", cn, idem.Message{ID: "held", Payload: []byte("p")}, longLease, 1)
	if _, err := ro.ReopenRecord(b.ctx, &idemdriver.ReopenRecordParams{Consumer: cn, MessageID: "held", Token: held.Token}); !errors.Is(err, idemdriver.ErrWrongState) {
		t.Errorf("ReopenRecord of a record held by an attempt: %v, want ErrWrongState", err)
	}
	if err := b.s.Store.Complete(b.ctx, &idemdriver.CompleteParams{Consumer: cn, MessageID: "held", Token: held.Token}); err != nil {
		t.Errorf("the holder's Complete after a refused reopen: %v, want its lease intact", err)
	}
	if _, err := ro.ReopenRecord(b.ctx, &idemdriver.ReopenRecordParams{Consumer: cn, MessageID: "missing", Token: 1}); !errors.Is(err, idemdriver.ErrNotFound) {
		t.Errorf("ReopenRecord of a missing record: %v, want ErrNotFound", err)
	}
	if _, err := ro.ReopenRecord(b.ctx, &idemdriver.ReopenRecordParams{Consumer: cn, MessageID: "held", Token: 0}); !errors.Is(err, idemdriver.ErrInvalidConfig) {
		t.Errorf("ReopenRecord of token 0: %v, want ErrInvalidConfig", err)
	}
	if _, err := ro.ReopenRecord(b.ctx, &idemdriver.ReopenRecordParams{Consumer: "", MessageID: "held", Token: 1}); !errors.Is(err, idemdriver.ErrInvalidConsumerName) {
		t.Errorf("ReopenRecord without a consumer: %v, want ErrInvalidConsumerName", err)
	}
	b.wantRecords("after the reopens", c.Name(), 1)
}

// completedWithStep acquires id (payload "p"), saves a recovery point and
// completes it, returning the completing token.
func (b *leaseBundle) completedWithStep(consumer, id string) int64 {
	b.t.Helper()
	held := b.mustAcquire(id, consumer, idem.Message{ID: id, Payload: []byte("p")}, longLease, 1)
	if err := b.s.Store.SaveStep(b.ctx, &idemdriver.StepParams{Consumer: consumer, MessageID: id, Token: held.Token, Step: "call", Result: []byte("x")}); err != nil {
		b.t.Fatalf("SaveStep(%q): %v", id, err)
	}
	if err := b.s.Store.Complete(b.ctx, &idemdriver.CompleteParams{Consumer: consumer, MessageID: id, Token: held.Token, Result: []byte("r")}); err != nil {
		b.t.Fatalf("Complete(%q): %v", id, err)
	}
	return held.Token
}
