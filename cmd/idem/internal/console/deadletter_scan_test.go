package console_test

import (
	"context"
	"errors"
	"testing"

	"github.com/idem-go/idem/cmd/idem/internal/console"
)

// askedDeadLetters is a DeadLetters with no dead letter that records the
// largest n asked of Newest.
type askedDeadLetters struct {
	console.DeadLetters
	asked int
}

func (d *askedDeadLetters) Where() string { return "test broker" }

func (d *askedDeadLetters) Newest(_ context.Context, _, _ string, n int) ([]console.DeadLetter, string, error) {
	d.asked = max(d.asked, n)
	return nil, "", nil
}

// The dead-letters page's scan is bounded like its limit: a scan above
// MaxDeadLetterScan is refused (a dead letter holds its payload, so an
// unbounded scan reads the destination's whole contents into memory),
// and nothing is read from the broker.
func TestDeadLetterScanBounded(t *testing.T) {
	dls := &askedDeadLetters{}
	if _, err := console.ReadDeadLetters(context.Background(), dls, "orders.dead", "c", "", 50, console.MaxDeadLetterScan, false); err != nil {
		t.Fatalf("scan %d: %v", console.MaxDeadLetterScan, err)
	}
	if dls.asked != console.MaxDeadLetterScan {
		t.Fatalf("asked %d, want %d", dls.asked, console.MaxDeadLetterScan)
	}
	dls.asked = 0
	_, err := console.ReadDeadLetters(context.Background(), dls, "orders.dead", "c", "", 50, 1_000_000_000, false)
	if !errors.Is(err, console.ErrBadAction) || dls.asked != 0 {
		t.Fatalf("scan 1e9: %v, asked the broker for %d; want ErrBadAction and nothing asked", err, dls.asked)
	}
}
