package idemtest

import (
	"context"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
)

// Setup is one isolated store under test, with a side-effect table beside
// it that the suite writes through the store's own transactions.
//
// The suite calls CountEffects, CountRecords and Shift, and begins a
// transaction, only when the calling goroutine holds no open transaction,
// so a single-writer database (SQLite) never waits on itself. Other
// goroutines may hold transactions at the time.
type Setup[TTx any] struct {
	// Store is a migrated store whose tables no other Setup shares.
	Store idemdriver.TxStore[TTx]
	// WriteEffect inserts one row with key into the side-effect table,
	// inside tx. Keys need not be unique. They are printable ASCII of at
	// most 100 bytes (the suite hashes message IDs into them), so the
	// table's own collation and column size play no part in the tests.
	WriteEffect func(ctx context.Context, tx TTx, key string) error
	// CountEffects counts the committed side-effect rows with key.
	CountEffects func(ctx context.Context, key string) (int, error)
	// CountRecords counts the committed processed-message records of consumer.
	CountRecords func(ctx context.Context, consumer string) (int, error)
	// Shift moves every time the store recorded for consumer back by d:
	// its records' times, their lease expiries, and its runs (see
	// idemdriver.Retainer.MarkRunning), as if all of it had happened d
	// earlier and the consumer had not run since. It lets the retention
	// cases simulate a downtime without waiting. SQL stores subtract d in
	// an UPDATE of each table; the memory store moves its own times.
	Shift func(ctx context.Context, consumer string, d time.Duration) error
}

// Harness tells the suite how to build Setups for one store.
type Harness[TTx any] struct {
	// New returns a fresh Setup, registering its cleanup with t.Cleanup.
	// Every case calls it from its own parallel subtest, so it must be
	// safe for concurrent use.
	New func(t *testing.T) *Setup[TTx]
}

// LeaseSetup is one isolated lease-mode store under test, for [RunLease].
//
// The lease cases need no injected clock: a store whose lease clock is the
// database or Redis server's ends a lease on demand with ExpireLease, by
// rewriting the record's expiry, so expiry and takeover are deterministic.
// The renewal cases (Expiry/RenewalKeepsClaim, RenewBatch/ConsumerTakenOver,
// Locked/RenewalsBesideIt) run the LeaseConsumer in a testing/synctest
// bubble and send its store calls from outside it; in the first two, Shift
// moves the store's times back before each call by the bubble's time since
// the previous one, so the store's clock follows the bubble's. The cases
// that still depend on real time (a 1ms lease running out, the units of a
// 1.5s lease) use margins of hundreds of milliseconds and bounded waits.
type LeaseSetup struct {
	// Store is a migrated lease store whose records no other Setup shares.
	Store idemdriver.LeaseStore
	// ExpireLease ends the live lease of consumer's in_progress record
	// messageID now, by the store's own clock, as if it had run out: the
	// next Acquire with the same fingerprint takes over. It must not
	// change anything else (token, attempt count, recovery points, error
	// text), so the attempt that held the lease still owns the record until
	// another takes over. SQL stores set the expiry column to the server's
	// now() (expiry is inclusive: a lease ending at now has run out); the
	// memory store uses MemoryStore.ExpireLease. It returns an error if
	// there is no in_progress record.
	ExpireLease func(ctx context.Context, consumer, messageID string) error
	// CountRecords counts consumer's records in every state: in_progress
	// (live, expired or released), completed and failed.
	CountRecords func(ctx context.Context, consumer string) (int, error)
	// Shift is Setup.Shift, for the lease store.
	Shift func(ctx context.Context, consumer string, d time.Duration) error
	// LockRecord, optional, locks consumer's record messageID from
	// another session, as an operator's open transaction does (SQL stores:
	// SELECT ... FOR UPDATE in a transaction of their own), until unlock
	// is called (SQL stores roll the transaction back). The RenewBatch
	// case OneLockedRecord, which checks that a renewal batch does not
	// wait for such a lock, runs only when it is set.
	LockRecord func(ctx context.Context, consumer, messageID string) (unlock func() error, err error)
}

// LeaseHarness tells [RunLease] how to build LeaseSetups for one store.
type LeaseHarness struct {
	// New returns a fresh LeaseSetup, registering its cleanup with
	// t.Cleanup. Every case calls it from its own parallel subtest, so it
	// must be safe for concurrent use.
	New func(t *testing.T) *LeaseSetup
}
