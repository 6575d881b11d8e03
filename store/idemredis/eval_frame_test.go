package idemredis

import "testing"

// TestEvalFrameKeepsBuffersAcrossCalls: Acquire and Complete take the
// same pooled frames and borrow different arguments of them (the
// fingerprint, the result); a frame reused by the other call keeps its
// buffers (no allocation once warm) and holds no caller's slice after
// reset.
func TestEvalFrameKeepsBuffersAcrossCalls(t *testing.T) {
	f := new(evalFrame)
	fp, result := []byte("fingerprint"), []byte(`{"ok":true}`)
	var got [2][]string
	acquire := func() {
		rk := f.buf()
		rk.b = append(rk.b, "idem:rec:consumer:message-1"...)
		sk := f.buf()
		sk.b = append(append(sk.b, rk.b...), ":steps"...)
		fa := f.bytes(fp)
		got[0] = []string{string(rk.b), string(sk.b), string(fa.b)}
		if &fa.b[0] != &fp[0] {
			t.Error("the fingerprint was copied, not borrowed")
		}
		f.reset()
	}
	complete := func() {
		rk := f.buf()
		rk.b = append(rk.b, "idem:rec:consumer:message-1"...)
		ra := f.bytes(result)
		ct, id := f.str("application/json"), f.str("message-1")
		got[1] = []string{string(rk.b), string(ra.b), string(ct.b), string(id.b)}
		f.reset()
	}
	// One Acquire and one Complete on a warm frame, alternately.
	allocs := testing.AllocsPerRun(100, func() {
		rk := f.buf()
		rk.b = append(rk.b, "idem:rec:consumer:message-1"...)
		sk := f.buf()
		sk.b = append(append(sk.b, rk.b...), ":steps"...)
		f.bytes(fp)
		f.reset()
		rk = f.buf()
		rk.b = append(rk.b, "idem:rec:consumer:message-1"...)
		f.bytes(result)
		f.str("application/json")
		f.str("message-1")
		f.reset()
	})
	if allocs != 0 {
		t.Errorf("an Acquire and a Complete on one warm frame allocate %v times, want 0", allocs)
	}
	acquire()
	complete()
	want := [2][]string{
		{"idem:rec:consumer:message-1", "idem:rec:consumer:message-1:steps", "fingerprint"},
		{"idem:rec:consumer:message-1", `{"ok":true}`, "application/json", "message-1"},
	}
	for i := range want {
		if len(got[i]) != len(want[i]) {
			t.Fatalf("call %d: arguments %q, want %q", i, got[i], want[i])
		}
		for j := range want[i] {
			if got[i][j] != want[i][j] {
				t.Errorf("call %d, argument %d: %q, want %q", i, j, got[i][j], want[i][j])
			}
		}
	}
	for i, a := range f.args {
		if a.b != nil || a.borrowed {
			t.Errorf("argument %d after reset: %q (borrowed %v), want none", i, a.b, a.borrowed)
		}
		if cap(a.own) > 0 && (&a.own[:1][0] == &fp[0] || &a.own[:1][0] == &result[0]) {
			t.Errorf("argument %d keeps a caller's slice as its buffer", i)
		}
	}
}
