package deadletter

import (
	"context"
	"fmt"

	"github.com/idem-go/idem/cmd/idem/internal/console"
)

// Unbrowsable is the dead letters of a broker whose queues cannot be read
// without taking the messages off them (RabbitMQ, the Go CDK's queues):
// every call fails with an error matching console.ErrNoDeadLetters that
// says so.
type Unbrowsable struct{ Broker string }

func (u Unbrowsable) err() error {
	return fmt.Errorf("%w: %s: a queue cannot be read without taking its messages (a get and a requeue moves a message to the back and marks it redelivered); read the dead-letter queue with the broker's own tools",
		console.ErrNoDeadLetters, u.Broker)
}

// Where names the broker.
func (u Unbrowsable) Where() string { return u.Broker }

// Newest refuses.
func (u Unbrowsable) Newest(context.Context, string, string, int) ([]console.DeadLetter, string, error) {
	return nil, "", u.err()
}

// Get refuses.
func (u Unbrowsable) Get(context.Context, string, string) (console.DeadLetter, error) {
	return console.DeadLetter{}, u.err()
}

// Replayable refuses.
func (u Unbrowsable) Replayable(context.Context, console.DeadLetter) error { return u.err() }

// Republish refuses.
func (u Unbrowsable) Republish(context.Context, console.DeadLetter) (string, error) {
	return "", u.err()
}
