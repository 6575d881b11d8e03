package idemhttp

import (
	"testing"
	"time"
)

// TestRetryAfterParse: Retry-After in seconds and in the three HTTP date
// formats, clamped to a year; anything else is not a delay.
func TestRetryAfterParse(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"0", 0, true},
		{"7", 7 * time.Second, true},
		{" 2 ", 2 * time.Second, true},
		{"Sat, 01 Mar 2025 12:00:30 GMT", 30 * time.Second, true},
		{"Saturday, 01-Mar-25 12:01:00 GMT", time.Minute, true}, // RFC 850
		{"Sat Mar  1 12:00:05 2025", 5 * time.Second, true},     // asctime
		{"Sat, 01 Mar 2025 11:00:00 GMT", 0, true},              // past
		{"99999999999999", 365 * 24 * time.Hour, true},          // clamped
		{"", 0, false},
		{"-1", 0, false},
		{"1.5", 0, false},
		{"soon", 0, false},
	}
	for _, tt := range tests {
		got, ok := retryAfter(tt.in, now)
		if got != tt.want || ok != tt.ok {
			t.Errorf("retryAfter(%q) = %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

// TestFullJitter: each wait is drawn uniformly from [0, ceiling], the
// ceiling growing by Multiplier from InitialInterval up to MaxInterval.
func TestFullJitter(t *testing.T) {
	t.Parallel()
	tr, err := NewTransport(&TransportOptions{InitialInterval: 100 * time.Millisecond, Multiplier: 2, MaxInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ceilings := []time.Duration{100, 200, 400, 800, 1000, 1000}
	lo := make([]time.Duration, len(ceilings))
	hi := make([]time.Duration, len(ceilings))
	for i := range lo {
		lo[i] = time.Hour
	}
	for range 2000 {
		j := tr.newBackOff()
		j.Reset()
		for i, c := range ceilings {
			d := j.NextBackOff()
			if d < 0 || d > c*time.Millisecond {
				t.Fatalf("wait %d = %v outside [0, %v]", i+1, d, c*time.Millisecond)
			}
			lo[i], hi[i] = min(lo[i], d), max(hi[i], d)
		}
	}
	for i, c := range ceilings {
		// Uniform on [0, c]: 2000 draws reach below 5% and above 95%.
		if lo[i] > c*time.Millisecond/20 || hi[i] < c*time.Millisecond*19/20 {
			t.Errorf("wait %d ranged over [%v, %v], want nearly all of [0, %v]", i+1, lo[i], hi[i], c*time.Millisecond)
		}
	}
}
