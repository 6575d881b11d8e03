package sqlstore

import (
	"math"
	"testing"
	"time"
)

// TestDurationMicros: rounded up, so a positive duration is never 0, and
// never past the largest Duration into a negative number (a retry delay
// that large would have made the row available at once).
func TestDurationMicros(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int64
	}{
		{0, 0},
		{time.Nanosecond, 1},
		{time.Microsecond, 1},
		{time.Microsecond + 1, 2},
		{time.Hour, 3_600_000_000},
		{math.MaxInt64 - time.Microsecond, math.MaxInt64 / 1000},
		{math.MaxInt64, math.MaxInt64 / 1000},
	} {
		if got := DurationMicros(c.d); got != c.want {
			t.Errorf("DurationMicros(%d) = %d, want %d", int64(c.d), got, c.want)
		}
	}
}
