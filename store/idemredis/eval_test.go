package idemredis_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
)

// Acquire and Complete send their scripts with EVALSHA; a server that does
// not have them cached (restarted, failed over, SCRIPT FLUSH) answers
// NOSCRIPT, and the store sends the script's source instead, with the
// same keys and arguments.
func TestLeaseAfterScriptFlush(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	fp := bytes.Repeat([]byte{7}, 32)
	acquire := func() idemdriver.AcquireResult {
		t.Helper()
		if err := b.client.ScriptFlush(b.ctx).Err(); err != nil {
			t.Fatal(err)
		}
		acq, err := b.store.Acquire(b.ctx, &idemdriver.AcquireParams{
			Consumer: "c", MessageID: "m-1", Fingerprint: fp, Lease: time.Minute, StepPrefix: "run:",
		})
		if err != nil {
			t.Fatalf("Acquire after SCRIPT FLUSH: %v", err)
		}
		return acq
	}
	acq := acquire()
	if !acq.Acquired || acq.Token != 1 || acq.Attempt != 1 {
		t.Fatalf("first Acquire: %+v; want acquired, token 1, attempt 1", acq)
	}
	if err := b.client.ScriptFlush(b.ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := b.store.Complete(b.ctx, &idemdriver.CompleteParams{
		Consumer: "c", MessageID: "m-1", Token: 1, Result: []byte("done"), ContentType: "text/plain",
	}); err != nil {
		t.Fatalf("Complete after SCRIPT FLUSH: %v", err)
	}
	acq = acquire()
	if acq.Acquired || acq.State != idemdriver.StateCompleted || string(acq.Result) != "done" ||
		acq.ContentType != "text/plain" || !bytes.Equal(acq.Fingerprint, fp) {
		t.Errorf("Acquire of the completed record: %+v; want completed with result %q", acq, "done")
	}
	if acq.Steps != nil {
		t.Errorf("Acquire of the completed record returned steps %v", acq.Steps)
	}
}
