package idemredis_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idemredis"
	"github.com/redis/go-redis/v9"
)

// steps returns the record's recovery points as a map, through Store.Steps.
func (b *testBundle) steps(t *testing.T, consumer, id string) map[string]string {
	t.Helper()
	st, err := b.store.Steps(b.ctx, consumer, id)
	if err != nil {
		t.Fatalf("Steps(%q, %q): %v", consumer, id, err)
	}
	m := make(map[string]string, len(st))
	for _, s := range st {
		m[s.Name] = string(s.Result)
	}
	return m
}

// writeLayout1 writes a record as the versions before layout 2 did: a
// record hash without v and its recovery points in the steps hash.
func (b *testBundle) writeLayout1(t *testing.T, consumer, id string, fields map[string]any, steps map[string]any) {
	t.Helper()
	rk := b.store.RecordKey(consumer, id)
	if err := b.client.HSet(b.ctx, rk, fields).Err(); err != nil {
		t.Fatal(err)
	}
	if len(steps) > 0 {
		if err := b.client.HSet(b.ctx, rk+idemredis.StepsSuffix, steps).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLayout1RecordsStillRead writes records in the layout of the versions
// before layout 2 (recovery points in a steps hash of their own) and
// checks that every operation of this version reads and updates them as
// those versions did: a takeover returns their points and saves its own
// beside them, a saved step keeps its first result, Complete, Inspect,
// the duplicate report, ReopenRecord and the purge.
func TestLayout1RecordsStillRead(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	now := b.serverMillis(t)
	f := fp("p")
	b.writeLayout1(t, "c", "inflight", map[string]any{
		"state": 1, "fingerprint": string(f), "token": 3, "attempt": 3,
		"lease_until_ms": now - 1000, "created_ms": now - 5000, "updated_ms": now - 2000,
	}, map[string]any{"run:1": "", "charge": "ch_1"})

	if got := b.steps(t, "c", "inflight"); len(got) != 2 || got["charge"] != "ch_1" || got["run:1"] != "" {
		t.Errorf("Steps of a layout-1 record: %q, want run:1 and charge=ch_1", got)
	}
	res, err := b.store.Acquire(b.ctx, &idemdriver.AcquireParams{Consumer: "c", MessageID: "inflight", Fingerprint: f, Lease: longLease, StepPrefix: "run:"})
	if err != nil || !res.Acquired || res.Token != 4 || res.Attempt != 4 {
		t.Fatalf("takeover of a layout-1 record: %+v, %v; want token 4, attempt 4", res, err)
	}
	if len(res.Steps) != 2 || string(res.Steps["charge"]) != "ch_1" {
		t.Errorf("takeover returned steps %q, want the layout-1 steps run:1 and charge", res.Steps)
	}
	for _, s := range []struct{ name, result string }{{"charge", "other"}, {"refund", "r_1"}} {
		if err := b.store.SaveStep(b.ctx, &idemdriver.StepParams{Consumer: "c", MessageID: "inflight", Token: 4, Step: s.name, Result: []byte(s.result)}); err != nil {
			t.Fatalf("SaveStep %s: %v", s.name, err)
		}
	}
	want := map[string]string{"run:1": "", "run:4": "", "charge": "ch_1", "refund": "r_1"}
	if got := b.steps(t, "c", "inflight"); !equalSteps(got, want) {
		t.Errorf("steps after the takeover and SaveStep: %q, want %q", got, want)
	}
	if raw := b.client.HGetAll(b.ctx, b.store.RecordKey("c", "inflight")+idemredis.StepsSuffix).Val(); !equalSteps(raw, want) {
		t.Errorf("a layout-1 record's steps hash: %q, want %q (its steps stay where they were)", raw, want)
	}
	if v := b.record(t, "c", "inflight")["v"]; v != "" {
		t.Errorf("a layout-1 record got v=%q", v)
	}
	b.complete(t, "c", "inflight", 4, []byte("done"), "text/plain")
	rec, err := b.store.Inspect(b.ctx, "c", "inflight")
	if err != nil || rec.State != idemdriver.StateCompleted || string(rec.Result) != "done" || rec.Token != 4 || rec.Attempt != 4 {
		t.Errorf("Inspect after Complete: %+v, %v", rec, err)
	}
	dup := b.acquire(t, "c", "inflight", f, longLease)
	if dup.Acquired || dup.State != idemdriver.StateCompleted || string(dup.Result) != "done" || dup.ContentType != "text/plain" {
		t.Errorf("duplicate of a completed layout-1 record: %+v", dup)
	}
	if _, err := b.store.ReopenRecord(b.ctx, &idemdriver.ReopenRecordParams{Consumer: "c", MessageID: "inflight", Token: 4}); err != nil {
		t.Fatalf("ReopenRecord: %v", err)
	}
	if got := b.steps(t, "c", "inflight"); len(got) != 0 {
		t.Errorf("steps after ReopenRecord: %q, want none", got)
	}

	// A completed layout-1 record, as an earlier version completed it.
	b.writeLayout1(t, "c", "done", map[string]any{
		"state": 2, "fingerprint": string(f), "token": 1, "attempt": 1, "result": "r", "content_type": "application/json",
		"lease_until_ms": now - 3000, "created_ms": now - 4000, "updated_ms": now - 3000, "finished_ms": now - 3000,
	}, map[string]any{"run:1": ""})
	if got := b.acquire(t, "c", "done", f, longLease); got.Acquired || got.State != idemdriver.StateCompleted || string(got.Result) != "r" || !bytes.Equal(got.Fingerprint, f) {
		t.Errorf("duplicate of a completed layout-1 record: %+v", got)
	}
	if err := b.store.Complete(b.ctx, &idemdriver.CompleteParams{Consumer: "c", MessageID: "done", Token: 1, Result: []byte("r"), ContentType: "application/json"}); err != nil {
		t.Errorf("the same Complete repeated on a completed layout-1 record: %v", err)
	}
	if err := b.store.Complete(b.ctx, &idemdriver.CompleteParams{Consumer: "c", MessageID: "done", Token: 1, Result: []byte("other")}); !errors.Is(err, idemdriver.ErrLeaseLost) {
		t.Errorf("another Complete of a completed layout-1 record: %v, want ErrLeaseLost", err)
	}
	// The earlier version indexed it when it completed it.
	if err := b.client.ZAdd(b.ctx, b.store.ConsumerKey("c", idemredis.DoneSuffix), redis.Z{Score: float64(now - 3000), Member: "done"}).Err(); err != nil {
		t.Fatal(err)
	}
	ps, err := b.store.BeginPurge(b.ctx, &idemdriver.BeginPurgeParams{Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	defer ps.Close(b.ctx)
	if n, err := ps.DeleteBatch(b.ctx, &idemdriver.PurgeBatchParams{Horizon: time.UnixMilli(now), Limit: 10}); err != nil || n != 1 {
		t.Fatalf("purge before now: %d, %v; want the completed layout-1 record deleted", n, err)
	}
	rk := b.store.RecordKey("c", "done")
	if left := b.client.Exists(b.ctx, rk, rk+idemredis.StepsSuffix).Val(); left != 0 {
		t.Errorf("%d keys of the purged layout-1 record left", left)
	}
}

// TestLayout2IgnoresStaleStepsHash checks that a record created by this
// version keeps its points in its own hash, and that a steps hash left
// beside it (an earlier record of the same key deleted by hand) is never
// read as its steps: not by a takeover, not by Steps, not by SaveStep.
func TestLayout2IgnoresStaleStepsHash(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	rk := b.store.RecordKey("c", "m")
	if err := b.client.HSet(b.ctx, rk+idemredis.StepsSuffix, "charge", "stale", "run:1", "stale").Err(); err != nil {
		t.Fatal(err)
	}
	p := &idemdriver.AcquireParams{Consumer: "c", MessageID: "m", Fingerprint: fp("p"), Lease: longLease, StepPrefix: "run:"}
	if res, err := b.store.Acquire(b.ctx, p); err != nil || !res.Acquired || res.Token != 1 || len(res.Steps) != 0 {
		t.Fatalf("Acquire: %+v, %v", res, err)
	}
	rec := b.record(t, "c", "m")
	if rec["v"] != "2" || rec["s:run:1"] != "" || len(rec) != 8 {
		t.Errorf("new record %q: want v=2 and its point s:run:1 in the record", rec)
	}
	if err := b.store.SaveStep(b.ctx, &idemdriver.StepParams{Consumer: "c", MessageID: "m", Token: 1, Step: "charge", Result: []byte("ch_1")}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"run:1": "", "charge": "ch_1"}
	if got := b.steps(t, "c", "m"); !equalSteps(got, want) {
		t.Errorf("Steps: %q, want %q (the stale steps hash ignored)", got, want)
	}
	if err := b.store.ExpireLease(b.ctx, "c", "m"); err != nil {
		t.Fatal(err)
	}
	res, err := b.store.Acquire(b.ctx, p)
	if err != nil || !res.Acquired || res.Token != 2 {
		t.Fatalf("takeover: %+v, %v", res, err)
	}
	if got := stringSteps(res.Steps); !equalSteps(got, want) {
		t.Errorf("takeover returned steps %q, want %q", got, want)
	}
	want["run:2"] = ""
	if got := b.steps(t, "c", "m"); !equalSteps(got, want) {
		t.Errorf("Steps after the takeover: %q, want %q", got, want)
	}
	if err := b.store.Release(b.ctx, &idemdriver.ReleaseParams{Consumer: "c", MessageID: "m", Token: 2, Error: "e", Step: "charge"}); err != nil {
		t.Fatal(err)
	}
	if got := b.steps(t, "c", "m"); got["charge"] != "ch_1" || len(got) != 3 {
		t.Errorf("Release with an existing step changed it: %q", got)
	}
}

func equalSteps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func stringSteps(m map[string][]byte) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = string(v)
	}
	return out
}

// TestCompleteOwnershipByNumber checks that Complete's ownership test,
// which compares the stored state and token with the caller's as strings
// first, still compares them as numbers when the strings differ: a record
// whose state and token were written as "1.0" and "2.0" (numerically the
// caller's, textually not) is completed by token 2, and the one whose
// token is 3 is not (ErrLeaseLost), whatever the text.
func TestCompleteOwnershipByNumber(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	now := b.serverMillis(t)
	f := fp("p")
	for _, id := range []string{"same", "other"} {
		tok := "2.0"
		if id == "other" {
			tok = "3"
		}
		if err := b.client.HSet(b.ctx, b.store.RecordKey("c", id), map[string]any{
			"state": "1.0", "fingerprint": string(f), "token": tok, "attempt": 2, "v": 2,
			"lease_until_ms": now + 60000, "created_ms": now,
		}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.store.Complete(b.ctx, &idemdriver.CompleteParams{Consumer: "c", MessageID: "same", Token: 2, Result: []byte("ok")}); err != nil {
		t.Fatalf("Complete of a record whose token is 2.0 by token 2: %v", err)
	}
	h := b.client.HGetAll(b.ctx, b.store.RecordKey("c", "same")).Val()
	if h["state"] != "2" || h["result"] != "ok" || h["finished_ms"] == "" {
		t.Errorf("record after Complete: %q, want state 2, result ok and finished_ms", h)
	}
	err := b.store.Complete(b.ctx, &idemdriver.CompleteParams{Consumer: "c", MessageID: "other", Token: 2, Result: []byte("ok")})
	if !errors.Is(err, idemdriver.ErrLeaseLost) || !strings.Contains(err.Error(), "token 3 took over") {
		t.Errorf("Complete by token 2 of a record held by token 3: %v, want ErrLeaseLost (token 3 took over)", err)
	}
	if got := b.client.HGet(b.ctx, b.store.RecordKey("c", "other"), "state").Val(); got != "1.0" {
		t.Errorf("state of the record not owned after the refused Complete: %q, want 1.0 (unchanged)", got)
	}
}
