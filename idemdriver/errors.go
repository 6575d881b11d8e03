package idemdriver

import "errors"

// The errors a store returns, or wraps, for the conditions the core and
// callers branch on. Package idem re-exports each under the same name
// (idem.ErrLeaseLost is ErrLeaseLost), so errors.Is works whichever package
// a caller names.
var (
	// ErrMissingMessageID means a message has no ID. The producer must set
	// one; the consumer never makes one up, since a made-up ID is new on
	// every redelivery. Permanent: dead-letter the message.
	ErrMissingMessageID = errors.New("idem: missing message ID")

	// ErrInvalidMessageID means a message ID breaks the rules of
	// [ValidateMessageID] (length, UTF-8, control characters). Permanent.
	ErrInvalidMessageID = errors.New("idem: invalid message ID")

	// ErrInvalidConsumerName means a consumer name breaks the rules of
	// [ValidateConsumerName]. A configuration error.
	ErrInvalidConsumerName = errors.New("idem: invalid consumer name")

	// ErrInvalidConfig means a configuration value or a parameter (a lease,
	// a retention window, a batch size, a step name) is out of range.
	ErrInvalidConfig = errors.New("idem: invalid config")

	// ErrInvalidPayload means a payload's fingerprint could not be computed
	// or is out of range (see [MaxFingerprintLength]). Permanent.
	ErrInvalidPayload = errors.New("idem: invalid payload")

	// ErrLeaseLost means the fencing token no longer owns the record: the
	// lease ran out and another attempt took over (with a higher token), or
	// the record was completed or released. A stale owner's Renew,
	// Complete, Release or SaveStep is rejected with it, so two attempts
	// never both record a result. Retryable: redeliver, and the redelivery
	// sees what the new owner did.
	ErrLeaseLost = errors.New("idem: lease lost")

	// ErrPurgeInProgress means another cleaner holds the purge lock of the
	// consumer; BeginPurge returns it at once instead of waiting.
	ErrPurgeInProgress = errors.New("idem: purge already running")

	// ErrLockTimeout means a claim waited longer than its LockTimeout for
	// another transaction that holds the same record (a concurrent copy
	// still running, or a session that stalled with the record locked),
	// and the database ended the wait (PostgreSQL SQLSTATE 55P03, MySQL
	// error 1205). Nothing was claimed; the transaction must be rolled
	// back. Retryable: redeliver later. Stores wrap the driver's error
	// with it, so both stay reachable. A Migrate whose context ended
	// while a statement of a migration kept giving way after its own
	// bound on a table lock (the SQL stores' online migrations) returns
	// an error matching it and the context's error.
	ErrLockTimeout = errors.New("idem: lock timeout")

	// ErrStoreTimeout means a store call ran past its bound (idem's
	// Config.StoreTimeout) and was cancelled: the connection stalled or
	// the database was too slow. A CallTimer store wraps the driver's
	// error with it when it ends a call itself (ClaimParams.CallTimeout).
	// Retryable. The root package exports it as idem.ErrStoreTimeout.
	ErrStoreTimeout = errors.New("idem: store call timed out")
)
