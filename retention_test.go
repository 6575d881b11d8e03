package idem_test

import (
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// RetentionHorizon sums the union of the runs backwards from the newest
// end: overlapping runs (two processes of one consumer) count once, gaps
// (downtime) not at all.
func TestRetentionHorizon(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	run := func(a, b int) idemdriver.Run { return idemdriver.Run{Start: at(a), End: at(b)} }
	for _, tt := range []struct {
		name   string
		runs   []idemdriver.Run
		window time.Duration
		want   time.Time // zero: nothing may go
	}{
		{"no runs", nil, time.Minute, time.Time{}},
		{"one run shorter than the window", []idemdriver.Run{run(0, 4)}, 5 * time.Minute, time.Time{}},
		{"one run as long as the window", []idemdriver.Run{run(0, 5)}, 5 * time.Minute, at(0)},
		{"one long run", []idemdriver.Run{run(0, 60)}, 5 * time.Minute, at(55)},
		{"a downtime does not count", []idemdriver.Run{run(0, 3), run(183, 185)}, 5 * time.Minute, at(0)},
		{"a downtime longer than the window", []idemdriver.Run{run(0, 2), run(180, 182)}, 5 * time.Minute, time.Time{}},
		{"overlapping runs count once", []idemdriver.Run{run(0, 10), run(5, 12), run(11, 13)}, 10 * time.Minute, at(3)},
		{"runs in any order", []idemdriver.Run{run(20, 30), run(0, 10)}, 15 * time.Minute, at(5)},
		{"a run that ends before it starts counts as empty", []idemdriver.Run{run(0, 10), run(20, 15)}, 10 * time.Minute, at(0)},
	} {
		if got := idem.RetentionHorizon(tt.runs, tt.window); !got.Equal(tt.want) {
			t.Errorf("%s: RetentionHorizon = %v, want %v", tt.name, got, tt.want)
		}
	}
}
