package idemtest

import (
	"context"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// Setup is one isolated store under test, with a side-effect table beside
// it that the suite writes through the store's own transactions.
//
// The suite calls CountEffects, CountRecords and AgeRecords, and begins a
// transaction, only when the calling goroutine holds no open transaction,
// so a single-writer database (SQLite) never waits on itself. Other
// goroutines may hold transactions at the time.
type Setup[TTx any] struct {
	// Store is a migrated store whose tables no other Setup shares.
	Store idem.TxStore[TTx]
	// WriteEffect inserts one row with key into the side-effect table,
	// inside tx. Keys need not be unique. They are printable ASCII of at
	// most 100 bytes (the suite hashes message IDs into them), so the
	// table's own collation and column size play no part in the tests.
	WriteEffect func(ctx context.Context, tx TTx, key string) error
	// CountEffects counts the committed side-effect rows with key.
	CountEffects func(ctx context.Context, key string) (int, error)
	// CountRecords counts the committed processed-message records of consumer.
	CountRecords func(ctx context.Context, consumer string) (int, error)
	// AgeRecords moves the recorded time of consumer's records with the
	// given message IDs back by d, as if they had been written d earlier.
	// It lets the retention tests run without waiting.
	AgeRecords func(ctx context.Context, consumer string, ids []string, d time.Duration) error
}

// Harness tells the suite how to build Setups for one store.
type Harness[TTx any] struct {
	// New returns a fresh Setup, registering its cleanup with t.Cleanup.
	// Every case calls it from its own parallel subtest, so it must be
	// safe for concurrent use.
	New func(t *testing.T) *Setup[TTx]
}
