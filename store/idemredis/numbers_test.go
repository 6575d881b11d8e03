package idemredis_test

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idemredis"
)

// TestStoredNumbers checks the fields the acquire and complete scripts
// write as they write them (strings built in Lua, not numbers Redis
// formats): a new record's state, token, attempt and layout, its
// created_ms, lease_until_ms and finished_ms as the decimal milliseconds
// of the server's clock between the calls, the run point, and the
// retention index's score equal to finished_ms.
func TestStoredNumbers(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	before := b.serverMillis(t)
	res, err := b.store.Acquire(b.ctx, &idemdriver.AcquireParams{Consumer: "c", MessageID: "m", Fingerprint: fp("p"), Lease: longLease, StepPrefix: "run:"})
	if err != nil || !res.Acquired {
		t.Fatalf("Acquire: %+v, %v", res, err)
	}
	if err := b.store.Complete(b.ctx, &idemdriver.CompleteParams{Consumer: "c", MessageID: "m", Token: res.Token, Result: []byte("ok"), ContentType: "text/plain"}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	after := b.serverMillis(t)
	h, err := b.client.HGetAll(b.ctx, b.store.RecordKey("c", "m")).Result()
	if err != nil {
		t.Fatal(err)
	}
	for f, want := range map[string]string{"state": "2", "token": "1", "attempt": "1", "v": "2", "s:run:1": "", "result": "ok", "content_type": "text/plain"} {
		if got, ok := h[f]; !ok || got != want {
			t.Errorf("field %s = %q (present %v), want %q", f, got, ok, want)
		}
	}
	ms := func(f string) int64 {
		t.Helper()
		v, err := strconv.ParseInt(h[f], 10, 64)
		if err != nil || strconv.FormatInt(v, 10) != h[f] {
			t.Fatalf("field %s = %q, want decimal milliseconds", f, h[f])
		}
		return v
	}
	created, finished, until := ms("created_ms"), ms("finished_ms"), ms("lease_until_ms")
	if created < before || created > finished || finished > after {
		t.Errorf("created_ms %d, finished_ms %d: want within the server's %d..%d, in order", created, finished, before, after)
	}
	if until != created+longLease.Milliseconds() {
		t.Errorf("lease_until_ms %d, want created_ms + lease = %d", until, created+longLease.Milliseconds())
	}
	score, err := b.client.ZScore(b.ctx, b.store.ConsumerKey("c", idemredis.DoneSuffix), "m").Result()
	if err != nil || int64(score) != finished {
		t.Errorf("retention index score %v (%v), want finished_ms %d", score, err, finished)
	}
}

// TestMillisDigits runs the complete scripts' milliseconds of a TIME reply
// (millisDigitsLua) on the server for microseconds across their range and
// compares them with the three digits of the whole milliseconds.
func TestMillisDigits(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	script := "local t = {ARGV[1], ARGV[2]}\nreturn " + idemredis.MillisDigitsLua
	for _, us := range []int64{0, 5, 999, 1000, 5023, 12345, 99999, 100000, 123456, 999000, 999999} {
		got, err := b.client.Eval(b.ctx, script, nil, "1765000000", us).Text()
		if want := fmt.Sprintf("%03d", us/1000); err != nil || got != want {
			t.Errorf("milliseconds of %d µs: %q, %v; want %q", us, got, err, want)
		}
	}
}
