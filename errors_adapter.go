package idem

import "errors"

// Errors shared by the broker adapters (broker/idemnats, broker/idemkafka,
// broker/idemamqp, broker/idemredisstream), so that code driving any of them
// branches on one sentinel with [errors.Is]. Each adapter wraps them with
// its own prefix.
var (
	// ErrAlreadyRunning is returned by an adapter Consumer's Run when Run
	// was called before on the same Consumer (it is running, or it ran): a
	// Consumer runs once; make a new one to consume again.
	ErrAlreadyRunning = errors.New("idem: consumer already running")

	// ErrTooManyDeliveries is the cause given to a message dead-lettered
	// because the broker delivered it more often than the adapter's
	// delivery limit allows (JetStream MaxDeliver, Redis Streams
	// MaxDeliveries). Not retryable: the dead letter's reason is
	// [ReasonTooManyDeliveries].
	ErrTooManyDeliveries = errors.New("idem: too many deliveries")
)
