package idemdriver

import "context"

// FailoverRiskReporter is an optional capability of a store whose server
// can be configured so that a crash or a failover loses writes it has
// already acknowledged: a PostgreSQL with synchronous_commit off, or with
// standbys and no synchronous one; a Redis with replicas (it replicates
// asynchronously). A write lost that way is a message acknowledged
// without its effect (transactional mode) or processed twice (lease mode).
// The consumers (package idem) ask once, when they start, and log the
// answer as one warning; docs/failover.md says which settings avoid it.
type FailoverRiskReporter interface {
	// FailoverRisk returns one line saying which of the server's
	// settings, as seen from the store's connection, let a crash or a
	// failover lose acknowledged writes, or "" when it finds none. The
	// line names settings and counts only: never an address, a user or
	// a password. An error means the settings could not be read.
	FailoverRisk(ctx context.Context) (string, error)
}
