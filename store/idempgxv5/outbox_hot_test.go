package idempgxv5_test

import (
	"testing"
)

// TestOutboxClaimsUpdateInPlace checks that the relay's claims of rows a
// producer inserted are heap-only updates (no new index entries, the new
// version on the row's page), which the outbox table's fill factor of 50
// makes possible: on full pages nearly every claim wrote a new version
// elsewhere and an entry in each index. Each row is then deleted, once
// sent, by the relay's one statement. Every statement runs on the one
// connection of the pool, whose statistics are flushed before they are
// read.
func TestOutboxClaimsUpdateInPlace(t *testing.T) {
	const n = n2000
	// Leased rounds: the claims' writes are what is counted.
	st := relayProduced(t, n, true, nil)
	if st.left != 0 || st.del < n {
		t.Fatalf("%d rows left, %d deleted, want none left and %d deleted once sent", st.left, st.del, n)
	}
	if st.upd < n {
		t.Fatalf("%d updates counted, want at least %d (a claim per row)", st.upd, n)
	}
	if st.hot < n*9/10 {
		t.Errorf("%d of %d updates were heap-only, want at least %d (the claims)", st.hot, st.upd, n*9/10)
	}
	t.Logf("%d of %d updates heap-only", st.hot, st.upd)
}
