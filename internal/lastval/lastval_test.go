package lastval

import (
	"sync"
	"testing"
)

// Get makes a value once per run of equal keys, and returns what make
// returned for the key asked.
func TestGet(t *testing.T) {
	var (
		c     Cache[string, int]
		calls int
	)
	mk := func(k string) int { calls++; return len(k) }
	for i, step := range []struct {
		key        string
		want, made int
	}{{"ab", 2, 1}, {"ab", 2, 1}, {"abcd", 4, 2}, {"abcd", 4, 2}, {"ab", 2, 3}} {
		if got := c.Get(step.key, mk); got != step.want || calls != step.made {
			t.Errorf("step %d: Get(%q) = %d after %d makes; want %d after %d", i, step.key, got, calls, step.want, step.made)
		}
	}
}

// Concurrent callers with different keys each get their own key's value.
func TestGetConcurrent(t *testing.T) {
	var c Cache[int, int]
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for range 1000 {
				if got := c.Get(g, func(k int) int { return k * 10 }); got != g*10 {
					t.Errorf("Get(%d) = %d, want %d", g, got, g*10)
					return
				}
			}
		})
	}
	wg.Wait()
}
