package leasebatch

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// TestCounts: calls made one after another go alone, one store call
// each; Counts reports the claims and completions and the store calls.
func TestCounts(t *testing.T) {
	s := New(idem.NewMemoryStore(nil), 64)
	ctx := context.Background()
	for i := range 3 {
		id := fmt.Sprint("m", i)
		res, err := s.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "c", MessageID: id, Fingerprint: []byte("f"), Lease: time.Minute})
		if err != nil || !res.Acquired {
			t.Fatalf("acquire %s: %+v %v", id, res, err)
		}
		if err := s.Complete(ctx, &idemdriver.CompleteParams{Consumer: "c", MessageID: id, Token: res.Token}); err != nil {
			t.Fatalf("complete %s: %v", id, err)
		}
	}
	if calls, trips := s.Counts(); calls != 6 || trips != 6 {
		t.Fatalf("Counts() = %d calls, %d store calls; want 6, 6", calls, trips)
	}
}
