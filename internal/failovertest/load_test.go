package failovertest

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// knob returns the positive integer in the environment variable env, or def.
func knob(t *testing.T, env string, def int) int {
	t.Helper()
	v := os.Getenv(env)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive integer", env, v)
	}
	return n
}

// rounds is the number of failovers per configuration; messages the
// messages of each.
func rounds(t *testing.T) int   { return knob(t, "IDEM_FAILOVER_ROUNDS", 5) }
func messages(t *testing.T) int { return knob(t, "IDEM_FAILOVER_MESSAGES", 300) }

// workers is the number of concurrent deliveries of the simulated broker.
const workers = 4

// retryDelay is the simulated broker's redelivery delay after a delivery
// that was not acknowledged.
const retryDelay = 50 * time.Millisecond

// round is one failover under load: the deliveries, in order; how each is
// processed (nil: acknowledge it); and the failover, started once killAt
// deliveries have been acknowledged, which kills the primary, makes the
// standby take over (calling killed once the primary is gone) and returns
// a function that brings the old primary back as the new standby.
type round struct {
	deliveries []string
	process    func(ctx context.Context, id string) error
	killAt     int
	failover   func(killed func()) (rejoin func() error, err error)
}

// roundResult is what a round observed: the IDs acknowledged, and the
// time from the kill to the first acknowledgement of a delivery that
// started after it.
type roundResult struct {
	acked   map[string]bool
	recover time.Duration
}

// run delivers every delivery of r until each is acknowledged, through
// workers goroutines, with the failover in the middle, and waits for the
// old primary's return before it returns.
func (r round) run(ctx context.Context, t *testing.T) roundResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	// The last few deliveries wait for the kill, so that some delivery
	// always starts after it, however long the failover takes to kill:
	// without them a quick round could acknowledge everything before the
	// kill and have no recovery to measure.
	tail := min(workers, max(len(r.deliveries)-r.killAt, 0))
	head := r.deliveries[:len(r.deliveries)-tail]
	queue := make(chan string, len(r.deliveries))
	for _, id := range head {
		queue <- id
	}
	killedCh := make(chan struct{})
	var (
		mu        sync.Mutex
		acked     = map[string]bool{}
		nAcked    int
		killed    atomic.Int64 // the kill's time, in ns since start; 0 before
		recovered atomic.Int64 // the first ack after it, same unit
		remaining = int64(len(r.deliveries))
		done      = make(chan struct{})
		failErr   = make(chan error, 1)
		rejoined  = make(chan error, 1)
		fired     sync.Once
	)
	start := time.Now()
	since := func() int64 { return int64(time.Since(start)) + 1 }
	startFailover := func() {
		go func() {
			var once sync.Once
			rejoin, err := r.failover(func() {
				once.Do(func() {
					killed.Store(since())
					close(killedCh)
				})
			})
			if err != nil {
				failErr <- err
				cancel()
				return
			}
			rejoined <- rejoin()
		}()
	}
	go func() {
		select {
		case <-killedCh:
			for _, id := range r.deliveries[len(head):] {
				queue <- id
			}
		case <-ctx.Done():
		}
	}()
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				var id string
				select {
				case <-done:
					return
				case <-ctx.Done():
					return
				case id = <-queue:
				}
				began := since()
				if err := r.process(ctx, id); err != nil {
					select {
					case <-time.After(retryDelay):
					case <-ctx.Done():
						return
					}
					queue <- id
					continue
				}
				if k := killed.Load(); k != 0 && began > k {
					recovered.CompareAndSwap(0, since())
				}
				mu.Lock()
				acked[id] = true
				nAcked++
				if nAcked == r.killAt {
					fired.Do(startFailover)
				}
				mu.Unlock()
				if atomic.AddInt64(&remaining, -1) == 0 {
					close(done)
				}
			}
		})
	}
	wg.Wait()
	select {
	case err := <-failErr:
		t.Fatalf("failover: %v", err)
	default:
	}
	if ctx.Err() != nil {
		t.Fatalf("round did not finish: %d of %d deliveries acknowledged: %v", len(r.deliveries)-int(atomic.LoadInt64(&remaining)), len(r.deliveries), ctx.Err())
	}
	select {
	case err := <-rejoined:
		if err != nil {
			t.Fatalf("bringing the old primary back: %v", err)
		}
	case <-time.After(5 * time.Minute):
		t.Fatal("the old primary did not come back within 5 minutes")
	}
	res := roundResult{acked: acked}
	if k, rec := killed.Load(), recovered.Load(); k != 0 && rec != 0 {
		res.recover = time.Duration(rec - k)
	} else {
		t.Fatalf("no delivery was acknowledged after the kill (killed at %v)", time.Duration(k))
	}
	return res
}

// ids returns n stable message IDs of round r.
func ids(r, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("r%d-%05d", r, i)
	}
	return out
}

// matrix collects one configuration's counts over its rounds.
type matrix struct {
	doubles, lost []int
	reissued      []int // lease mode: runs with a fencing token issued again
	recover       []time.Duration
	messages      int
}

// add records one round: effects counts each ID's effects.
func (m *matrix) add(res roundResult, all []string, effects map[string]int) (doubles, lost int) {
	for _, id := range all {
		n := effects[id]
		if n > 1 {
			doubles += n - 1
		}
		if res.acked[id] && n == 0 {
			lost++
		}
	}
	m.doubles = append(m.doubles, doubles)
	m.lost = append(m.lost, lost)
	m.recover = append(m.recover, res.recover)
	m.messages = len(all)
	return doubles, lost
}

func medianInts(v []int) string {
	s := slices.Clone(v)
	slices.Sort(s)
	return fmt.Sprintf("%d (%d–%d)", s[len(s)/2], s[0], s[len(s)-1])
}

func medianDurations(v []time.Duration) string {
	s := slices.Clone(v)
	slices.Sort(s)
	r := func(d time.Duration) string { return d.Round(10 * time.Millisecond).String() }
	return fmt.Sprintf("%s (%s–%s)", r(s[len(s)/2]), r(s[0]), r(s[len(s)-1]))
}

// String is the configuration's row: each count as median (min–max) over
// the rounds, and the machine's load average.
func (m *matrix) String() string {
	load, _ := os.ReadFile("/proc/loadavg")
	tokens := ""
	if m.reissued != nil {
		tokens = fmt.Sprintf(" (with a fencing token issued again %s)", medianInts(m.reissued))
	}
	return fmt.Sprintf("doubles %s%s, lost %s, recovery %s; %d runs of %d messages, %d workers; loadavg %s",
		medianInts(m.doubles), tokens, medianInts(m.lost), medianDurations(m.recover), len(m.lost), m.messages, workers,
		strings.TrimSpace(string(load)))
}
