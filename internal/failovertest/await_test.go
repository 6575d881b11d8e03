package failovertest

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testenv"
)

// awaitEffects polls effects (the effect runs per message ID) until every
// ID of all has run at least once, or until no more arrive for quiet, and
// returns the last answer: a broker-side test's way to let every
// acknowledged publish reach its effect before counting the lost ones.
func awaitEffects(all []string, effects func() map[string]int, quiet time.Duration) map[string]int {
	last, lastCount := time.Now(), -1
	for {
		got := effects()
		done := 0
		for _, id := range all {
			if got[id] > 0 {
				done++
			}
		}
		if done == len(all) {
			return got
		}
		if done != lastCount {
			last, lastCount = time.Now(), done
		}
		if time.Since(last) > quiet {
			return got
		}
		time.Sleep(testenv.Poll)
	}
}

// background runs run (a consumer's Run) on a goroutine with a context
// derived from ctx and returns the function that cancels it and waits for
// run to return.
func background(ctx context.Context, run func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	return func() {
		cancel()
		<-done
	}
}

// reducedRounds is the number of failovers of the rows added after the
// first matrix (Kafka, the current nats-server, RabbitMQ): 2, to keep
// scripts/test short, unless IDEM_FAILOVER_ROUNDS asks for more (the
// figures of docs/failover.md use 5 or more).
func reducedRounds(t *testing.T) int {
	if os.Getenv("IDEM_FAILOVER_ROUNDS") != "" {
		return rounds(t)
	}
	return 2
}
