package kafkatest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemkafka"
	"github.com/idem-go/idem/broker/idemkafka/internal/testhook"
	"github.com/idem-go/idem/internal/testenv"
)

// keyedRecord is a record produced to partition 0 of a test topic.
type keyedRecord struct{ id, key string }

// produceToPartition0 produces recs, in order, to partition 0 of topic with
// their key and the message ID header: offsets 0, 1, ... in a fresh topic.
func produceToPartition0(t *testing.T, seeds []string, topic string, recs []keyedRecord) {
	t.Helper()
	cl := newClient(t, seeds, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	for _, r := range recs {
		rec := &kgo.Record{Topic: topic, Partition: 0, Key: []byte(r.key), Value: []byte("payload of " + r.id),
			Headers: []kgo.RecordHeader{{Key: idemkafka.DefaultIDHeader, Value: []byte(r.id)}}}
		if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

// withOwnKeys appends to recs records PREFIXi, each keyed by its ID, for i
// from len(recs) to end-1 (so i is the record's offset), and returns recs
// and the IDs appended.
func withOwnKeys(recs []keyedRecord, prefix string, end int) ([]keyedRecord, []string) {
	var ids []string
	for i := len(recs); i < end; i++ {
		id := fmt.Sprintf("%s%d", prefix, i)
		recs = append(recs, keyedRecord{id, id})
		ids = append(ids, id)
	}
	return recs, ids
}

// dedupLog is an in-memory Idempotent Consumer shared by the members of a
// test: the first success of an ID is Processed (its effect), later ones are
// Duplicates. before, if set, runs first on every attempt; an error from it
// is a Failed (retryable) outcome, nothing recorded.
type dedupLog struct {
	mu         sync.Mutex
	attempts   map[string]int
	processed  map[string]string // ID -> member that processed it
	order      []string          // IDs in the order they were Processed
	duplicates map[string]int    // member -> Duplicates
	before     func(ctx context.Context, member, id string, attempt int) error
}

func newDedupLog() *dedupLog {
	return &dedupLog{attempts: map[string]int{}, processed: map[string]string{}, duplicates: map[string]int{}}
}

func (d *dedupLog) processor(member string) idem.Processor {
	return idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
		d.mu.Lock()
		d.attempts[msg.ID]++
		attempt := d.attempts[msg.ID]
		d.mu.Unlock()
		if d.before != nil {
			if err := d.before(ctx, member, msg.ID, attempt); err != nil {
				return idem.Outcome{Status: idem.Failed, MessageID: msg.ID, Err: err}, err
			}
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		if _, ok := d.processed[msg.ID]; ok {
			d.duplicates[member]++
			return idem.Outcome{Status: idem.Duplicate, MessageID: msg.ID}, nil
		}
		d.processed[msg.ID] = member
		d.order = append(d.order, msg.ID)
		return idem.Outcome{Status: idem.Processed, MessageID: msg.ID}, nil
	})
}

// tries returns how many times id was attempted.
func (d *dedupLog) tries(id string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.attempts[id]
}

// has reports whether every one of ids was Processed.
func (d *dedupLog) has(ids ...string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, id := range ids {
		if _, ok := d.processed[id]; !ok {
			return false
		}
	}
	return true
}

// processedBefore reports whether a was Processed before b (both Processed).
func (d *dedupLog) processedBefore(a, b string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	i, j := slices.Index(d.order, a), slices.Index(d.order, b)
	return i >= 0 && j >= 0 && i < j
}

func (d *dedupLog) String() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return fmt.Sprintf("processed %v, attempts %v", d.order, d.attempts)
}

// committedOffset returns the group's committed offset of partition 0 of
// topic, -1 if none.
func committedOffset(t *testing.T, seeds []string, group, topic string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	committed, err := kadm.NewClient(newClient(t, seeds)).FetchOffsets(ctx, group)
	if err == nil {
		err = committed.Error()
	}
	if err != nil {
		t.Fatalf("fetch offsets: %v", err)
	}
	if c, ok := committed.Lookup(topic, 0); ok {
		return c.At
	}
	return -1
}

var errHeld = errors.New("held by the test")

// TestKeyOrderOvertakesAndHoldsCommit: under OrderKey, in one partition, a
// record whose handler is slow holds only the later records of its key, a
// record retried in place (Failed) holds only its key, and the records of
// other keys, later in the partition, are processed meanwhile. The
// committed offset never passes the first record not done: it stops at
// the slow record, then at the retried one, and reaches the end only when
// both are done. Records of each key are processed in offset order.
func TestKeyOrderOvertakesAndHoldsCommit(t *testing.T) {
	t.Parallel()
	topic, dead, group := uniqueName("keyorder"), uniqueName("keyorder-dead"), uniqueName("keyorder-group")
	seeds := newCluster(t, topic, dead).ListenAddrs()
	recs := []keyedRecord{{"a0", "a"}, {"s0", "s"}, {"s1", "s"}, {"r0", "r"}, {"r1", "r"}, {"a1", "a"}}
	recs, others := withOwnKeys(recs, "x", 12)
	produceToPartition0(t, seeds, topic, recs)

	releaseS := make(chan struct{})
	sEntered := make(chan struct{})
	var rFixed atomic.Bool
	d := newDedupLog()
	d.before = func(ctx context.Context, _, id string, attempt int) error {
		switch {
		case id == "s0":
			close(sEntered)
			select {
			case <-releaseS:
			case <-ctx.Done():
				return ctx.Err()
			}
		case id == "r0" && !rFixed.Load():
			return fmt.Errorf("%w: attempt %d", errHeld, attempt)
		}
		return nil
	}
	m := startMember(t, seeds, group, topic, idemkafka.Config{Processor: d.processor("A"), DeadLetter: dead,
		Concurrency: 4, RetryDelay: 20 * time.Millisecond, Order: idemkafka.OrderKey})
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()

	// The slow s0 and the failing r0 hold their keys; the rest goes by.
	<-sEntered
	testenv.Eventually(t, waitFor, "the other keys processed past s0 and r0", func() bool {
		return d.has(append([]string{"a0", "a1"}, others...)...) && d.tries("r0") >= 2
	}, d.String)
	testenv.Eventually(t, waitFor, "a0 committed", func() bool { return committedOffset(t, seeds, group, topic) >= 1 }, d.String)
	if got := committedOffset(t, seeds, group, topic); got != 1 {
		t.Errorf("committed offset %d while s0 (offset 1) runs, want 1: a commit passed a record not done", got)
	}
	if n, k := d.tries("s1"), d.tries("r1"); n != 0 || k != 0 {
		t.Errorf("s1 tried %d times, r1 %d, while s0 and r0 were not done: want 0, same-key records wait", n, k)
	}

	// s0 finishes, then s1; the commit moves up to r0, still failing.
	close(releaseS)
	testenv.Eventually(t, waitFor, "s0 and s1 processed", func() bool { return d.has("s0", "s1") }, d.String)
	testenv.Eventually(t, waitFor, "offsets committed up to r0", func() bool { return committedOffset(t, seeds, group, topic) >= 3 }, d.String)
	if got := committedOffset(t, seeds, group, topic); got != 3 {
		t.Errorf("committed offset %d while r0 (offset 3) is retried, want 3", got)
	}
	if n := d.tries("r1"); n != 0 {
		t.Errorf("r1 tried %d times while r0 was retried: want 0", n)
	}

	rFixed.Store(true)
	testenv.Eventually(t, waitFor, "r0 and r1 processed", func() bool { return d.has("r0", "r1") }, d.String)
	if err := m.stop(ctx); err != nil {
		t.Fatal(err)
	}
	for _, pair := range [][2]string{{"a0", "a1"}, {"s0", "s1"}, {"r0", "r1"}} {
		if !d.processedBefore(pair[0], pair[1]) {
			t.Errorf("%s not processed before %s (same key): %v", pair[0], pair[1], d)
		}
	}
	if !d.processedBefore("x11", "s0") || !d.processedBefore("x11", "r0") {
		t.Errorf("x11 not processed before s0 and r0: the other keys did not overtake: %v", d)
	}
	for _, r := range recs {
		if n := d.tries(r.id); n != 1 && r.id != "r0" {
			t.Errorf("%s attempted %d times, want 1", r.id, n)
		}
	}
	if lag := groupLag(t, seeds, group, topic); lag != 0 {
		t.Errorf("group lag %d after Stop, want 0", lag)
	}
}

// TestKeyOrderRevocationMidFlight: member A, under OrderKey, has records of
// two keys in flight (their handlers running), a third key's record failing
// and retried in place, and later records of other keys done, when it
// leaves the group. The revocation waits for the two in flight, cuts the
// retry short, and commits exactly up to the failing record: not past it,
// though later records are done. Member B then processes the failing
// record and the one behind it on its key, and sees the later records A
// did as Duplicates: nothing lost, nothing processed twice.
func TestKeyOrderRevocationMidFlight(t *testing.T) {
	t.Parallel()
	topic, dead, group := uniqueName("keyrevoke"), uniqueName("keyrevoke-dead"), uniqueName("keyrevoke-group")
	seeds := newCluster(t, topic, dead).ListenAddrs()
	recs := []keyedRecord{{"h1", "h1"}, {"h2", "h2"}, {"r0", "r"}, {"r1", "r"}}
	recs, others := withOwnKeys(recs, "o", 12)
	produceToPartition0(t, seeds, topic, recs)

	revoking := make(chan struct{})
	var entered sync.WaitGroup
	entered.Add(2)
	d := newDedupLog()
	d.before = func(ctx context.Context, member, id string, attempt int) error {
		switch {
		case member == "A" && (id == "h1" || id == "h2"):
			entered.Done()
			<-revoking // runs on through the revocation, which waits for it
		case member == "A" && id == "r0":
			return fmt.Errorf("%w: attempt %d", errHeld, attempt)
		}
		return nil
	}
	cfgA := idemkafka.Config{Processor: d.processor("A"), DeadLetter: dead, Concurrency: 4,
		RetryDelay: 20 * time.Millisecond, RevokeTimeout: waitFor, Order: idemkafka.OrderKey}
	var revokeOnce sync.Once
	testhook.SetOnRevoke(&cfgA, func(m map[string][]int32) {
		if len(m) > 0 {
			revokeOnce.Do(func() { close(revoking) })
		}
	})
	a := startMember(t, seeds, group, topic, cfgA)
	entered.Wait()
	testenv.Eventually(t, waitFor, "A processed the later keys, r0 retried", func() bool {
		return d.has(others...) && d.tries("r0") >= 2
	}, d.String)

	a.close() // leaves the group: the revocation runs within
	if got := committedOffset(t, seeds, group, topic); got != 2 {
		t.Errorf("committed offset %d after A's revocation, want 2 (h1 and h2 done, r0 not): %v", got, d)
	}
	if n := d.tries("r1"); n != 0 {
		t.Errorf("r1 tried %d times at A while r0 failed: want 0", n)
	}

	b := startMember(t, seeds, group, topic, idemkafka.Config{Processor: d.processor("B"), DeadLetter: dead,
		Concurrency: 4, RetryDelay: 20 * time.Millisecond, Order: idemkafka.OrderKey})
	// B gets every record from offset 2: r0 and r1 to process, and the
	// later keys A already did as duplicates. Stop finishes what B holds
	// but need not fetch the rest, so wait for all of them first.
	testenv.Eventually(t, waitFor, "B processed r0 and r1 and acknowledged A's later keys", func() bool {
		d.mu.Lock()
		dups := d.duplicates["B"]
		d.mu.Unlock()
		return d.has("r0", "r1") && dups >= len(others)
	}, d.String)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if err := b.stop(ctx); err != nil {
		t.Fatal(err)
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range recs {
		want := "A"
		if r.key == "r" {
			want = "B"
		}
		if got := d.processed[r.id]; got != want {
			t.Errorf("%s processed by %q, want %q", r.id, got, want)
		}
	}
	if d.duplicates["B"] != len(others) || d.duplicates["A"] != 0 {
		t.Errorf("duplicates %v, want B %d (the records A did past r0), A 0", d.duplicates, len(others))
	}
	if i, j := slices.Index(d.order, "r0"), slices.Index(d.order, "r1"); i < 0 || j < i {
		t.Errorf("r0 and r1 processed in order %v", d.order)
	}
	if lag := groupLag(t, seeds, group, topic); lag != 0 {
		t.Errorf("group lag %d after B's Stop, want 0", lag)
	}
}

// TestKeyOrderConfig: OrderKey with a BatchProcessor, and an Order out of
// range, are configuration errors; Order's String gives the flag's words.
func TestKeyOrderConfig(t *testing.T) {
	t.Parallel()
	topic := uniqueName("keycfg")
	seeds := newCluster(t, topic).ListenAddrs()
	cl, err := kgo.NewClient(groupOpts(seeds, uniqueName("keycfg-group"), topic)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	batch := batchFunc(func(context.Context, []idem.Message) ([]idem.Outcome, error) { return nil, nil })
	for _, cfg := range []idemkafka.Config{
		{BatchProcessor: batch, DeadLetter: "dead", Order: idemkafka.OrderKey},
		{Processor: newDedupLog().processor("A"), DeadLetter: "dead", Order: idemkafka.Order(7)},
	} {
		if _, err := idemkafka.NewConsumer(cl, cfg); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("NewConsumer with Order %v (batch %v): %v, want idem.ErrInvalidConfig", cfg.Order, cfg.BatchProcessor != nil, err)
		}
	}
	if s := idemkafka.OrderKey.String() + "," + idemkafka.OrderPartition.String() + "," + idemkafka.Order(7).String(); s != "key,partition,Order(7)" {
		t.Errorf("Order strings %q", s)
	}
}

// TestKeyOrderPausesBehindStuckKey: under OrderKey a record that keeps
// failing lets the records of other keys behind it run, but not without
// bound: once the partition holds max(64, 2×Concurrency) records not
// committed, its fetching pauses, so at most that many plus one poll
// (MaxPollRecords) are taken while the stuck record fails, however long
// the partition. Once it succeeds, the rest are processed and committed.
func TestKeyOrderPausesBehindStuckKey(t *testing.T) {
	t.Parallel()
	topic, dead, group := uniqueName("keypause"), uniqueName("keypause-dead"), uniqueName("keypause-group")
	seeds := newCluster(t, topic, dead).ListenAddrs()
	const n, highWater, maxPoll = 300, 64, 10
	recs, _ := withOwnKeys([]keyedRecord{{"stuck", "stuck"}}, "k", n)
	produceToPartition0(t, seeds, topic, recs)

	var fixed atomic.Bool
	d := newDedupLog()
	d.before = func(_ context.Context, _, id string, attempt int) error {
		if id == "stuck" && !fixed.Load() {
			return fmt.Errorf("%w: attempt %d", errHeld, attempt)
		}
		return nil
	}
	m := startMember(t, seeds, group, topic, idemkafka.Config{Processor: d.processor("A"), DeadLetter: dead,
		Concurrency: 4, MaxPollRecords: maxPoll, RetryDelay: 20 * time.Millisecond, Order: idemkafka.OrderKey})
	processed := func() int {
		d.mu.Lock()
		defer d.mu.Unlock()
		return len(d.processed)
	}
	testenv.Eventually(t, waitFor, "the records behind the stuck one up to the pause", func() bool {
		return processed() >= highWater-maxPoll
	}, d.String)
	// The assertion is that nothing more comes: several fetch waits
	// (groupOpts: 250ms) of a paused partition.
	time.Sleep(time.Second)
	if got := processed(); got > highWater+maxPoll {
		t.Errorf("%d records processed behind a stuck one, want at most %d: the partition was not paused", got, highWater+maxPoll)
	}
	if got := committedOffset(t, seeds, group, topic); got > 0 {
		t.Errorf("committed offset %d while the record at offset 0 fails, want none", got)
	}

	fixed.Store(true)
	testenv.Eventually(t, waitFor, "every record processed", func() bool { return processed() == n }, d.String)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if err := m.stop(ctx); err != nil {
		t.Fatal(err)
	}
	if lag := groupLag(t, seeds, group, topic); lag != 0 {
		t.Errorf("group lag %d after Stop, want 0", lag)
	}
}
