package riverexample

import (
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/riverqueue/river/rivertype"
)

func TestRiverError(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	permanent := idem.Permanent(boom)
	for _, tt := range []struct {
		name   string
		out    idem.Outcome
		err    error
		want   string // "nil", "snooze", "cancel" or "error"
		snooze time.Duration
	}{
		{name: "processed", out: idem.Outcome{Status: idem.Processed}, want: "nil"},
		{name: "duplicate", out: idem.Outcome{Status: idem.Duplicate}, want: "nil"},
		{name: "in progress", out: idem.Outcome{Status: idem.InProgress, RetryAfter: 2 * time.Second, Err: idem.ErrInProgress}, err: idem.ErrInProgress, want: "snooze", snooze: 2 * time.Second},
		{name: "in progress, no delay", out: idem.Outcome{Status: idem.InProgress, Err: idem.ErrInProgress}, err: idem.ErrInProgress, want: "snooze", snooze: 100 * time.Millisecond},
		{name: "mismatch", out: idem.Outcome{Status: idem.FingerprintMismatch, Err: idem.ErrFingerprintMismatch}, err: idem.ErrFingerprintMismatch, want: "cancel"},
		{name: "poison", out: idem.Outcome{Status: idem.Failed, Poison: true, Err: idem.ErrPoison}, err: idem.ErrPoison, want: "cancel"},
		{name: "permanent", out: idem.Outcome{Status: idem.Failed, Err: permanent}, err: permanent, want: "cancel"},
		{name: "failed", out: idem.Outcome{Status: idem.Failed, Err: boom}, err: boom, want: "error"},
		{name: "failed, error only returned", out: idem.Outcome{Status: idem.Failed}, err: boom, want: "error"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := riverError(tt.out, tt.err)
			var snooze *rivertype.JobSnoozeError
			var cancel *rivertype.JobCancelError
			switch {
			case tt.want == "nil":
				if got != nil {
					t.Fatalf("got %v, want nil", got)
				}
			case tt.want == "snooze":
				if !errors.As(got, &snooze) || snooze.Duration != tt.snooze {
					t.Fatalf("got %v, want a snooze of %v", got, tt.snooze)
				}
			case tt.want == "cancel":
				if !errors.As(got, &cancel) || !errors.Is(got, tt.err) {
					t.Fatalf("got %v, want a cancel wrapping %v", got, tt.err)
				}
			default:
				if errors.As(got, &cancel) || errors.As(got, &snooze) || !errors.Is(got, tt.err) {
					t.Fatalf("got %v, want %v for River's retry policy", got, tt.err)
				}
			}
		})
	}
}
