package failovertest

import (
	"context"
	"maps"
	"os"
	"sync"
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

// publishThrough publishes every ID of all, in order, with publish (each
// try given a context that ends after try), sending an ID again, the same
// ID, until it is acknowledged, as a producer does. Before the ID at index
// killAt it calls kill, which forces the failover. It returns the IDs
// acknowledged (all of them) and the time from kill's return to the first
// acknowledgement of a publish after it. It fails t when a publish is not
// acknowledged within limit after the kill.
func publishThrough(t *testing.T, all []string, killAt int, kill func(), try, limit time.Duration,
	publish func(ctx context.Context, id string) error) (acked map[string]bool, recovered time.Duration) {
	t.Helper()
	ctx := t.Context()
	acked = map[string]bool{}
	var killedAt time.Time
	for i, id := range all {
		if i == killAt {
			kill()
			killedAt = time.Now()
		}
		for {
			pctx, cancel := context.WithTimeout(ctx, try)
			err := publish(pctx, id)
			cancel()
			if err == nil {
				if !killedAt.IsZero() && recovered == 0 {
					recovered = time.Since(killedAt)
				}
				break
			}
			if ctx.Err() != nil {
				t.Fatal(ctx.Err())
			}
			if !killedAt.IsZero() && time.Since(killedAt) > limit {
				t.Fatalf("publish of %s: %v, %v after the kill", id, err, limit)
			}
		}
		acked[id] = true
	}
	return acked, recovered
}

// effectCounter counts a counting effect's runs per message ID; safe for
// concurrent use.
type effectCounter struct {
	mu    sync.Mutex
	runs  map[string]int
	first map[string]time.Time // when each ID's effect first ran
}

// add records one run of id's effect.
func (c *effectCounter) add(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.runs == nil {
		c.runs, c.first = map[string]int{}, map[string]time.Time{}
	}
	if c.runs[id] == 0 {
		c.first[id] = time.Now()
	}
	c.runs[id]++
}

// firstOf returns when the first effect of any of ids ran, and false if
// none has run.
func (c *effectCounter) firstOf(ids []string) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var first time.Time
	for _, id := range ids {
		if at, ok := c.first[id]; ok && (first.IsZero() || at.Before(first)) {
			first = at
		}
	}
	return first, !first.IsZero()
}

// snapshot returns a copy of the runs so far.
func (c *effectCounter) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.runs)
}
