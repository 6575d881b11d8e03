package idemcli

import "testing"

// TestBatchesAtOnce: --batch-claim runs one batch at a time on SQLite
// (one writing transaction at a time) and two on every other store.
func TestBatchesAtOnce(t *testing.T) {
	t.Parallel()
	for store, want := range map[string]int{
		"sqlite:/var/lib/idem/orders.db":                 1,
		"SQLite:orders.db":                               1,
		"postgres://idem@127.0.0.1:5432/idem":            2,
		"redis://127.0.0.1:6379/0":                       2,
		"mysql://idem@127.0.0.1:3306/idem":               2,
		"redis-sentinel://127.0.0.1:26379/mymaster?db=0": 2,
	} {
		if got := batchesAtOnce(store); got != want {
			t.Errorf("batchesAtOnce(%q) = %d, want %d", store, got, want)
		}
	}
}
