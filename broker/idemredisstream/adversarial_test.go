package idemredisstream_test

import (
	"context"
	"fmt"
	"github.com/idem-go/idem/internal/testenv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemredisstream"
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite"
)

// Adversarial tests: bad input, failing dependencies and lifecycle abuse.
// The invariant checked everywhere: an entry that cannot be processed is
// never XACKed as done, and effects happen exactly once.

// A dead-letter stream key that holds another type makes XADD fail (and a
// MULTI/EXEC would still run the XACK queued after it): the entry
// must not be acked (it stays pending), and once the key is fixed it is
// dead-lettered.
func TestDeadLetterWrongTypeIsNotAck(t *testing.T) {
	t.Parallel()
	stream, dead := keys(t)
	rdb := client(t)
	ctx := context.Background()
	if err := rdb.Set(ctx, dead, "not a stream", 0).Err(); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	p := idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
		calls.Add(1)
		return idem.Outcome{Status: idem.Rejected, MessageID: msg.ID, Err: idem.ErrMissingMessageID}, idem.ErrMissingMessageID
	})
	_, _, _ = start(t, idemredisstream.Config{Processor: p, Stream: stream, Group: "g", Consumer: "c1", DeadLetter: dead,
		MinIdle: 2 * time.Second, RetryDelay: 200 * time.Millisecond, ClaimInterval: 50 * time.Millisecond})
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"payload", "no-id"}}).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "a second attempt, or the entry acked", func() bool {
		return calls.Load() >= 2 || (calls.Load() == 1 && pendingCount(t, rdb, stream, "g") == 0)
	}, nil)
	if n := pendingCount(t, rdb, stream, "g"); n != 1 {
		t.Fatalf("%d pending entries after a failed dead letter, want 1 (the entry was acked without being dead-lettered)", n)
	}
	if err := rdb.Del(ctx, dead).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "the entry dead-lettered and acked", func() bool {
		return pendingCount(t, rdb, stream, "g") == 0
	}, nil)
	if n, _ := rdb.XLen(ctx, dead).Result(); n != 1 {
		t.Fatalf("%d dead letters, want 1", n)
	}
}

// An entry without the payload field is not processed with an empty
// payload: it is dead-lettered (Rejected, idem.ErrInvalidPayload) with its
// fields intact, and the handler never runs.
func TestMissingPayloadFieldIsDeadLettered(t *testing.T) {
	t.Parallel()
	stream, dead := keys(t)
	rdb := client(t)
	ctx := context.Background()
	e := newEffects()
	p := txProcessor(t, idem.NewMemoryStore(nil), e, nil)
	_, _, _ = start(t, idemredisstream.Config{Processor: p, Stream: stream, Group: "g", Consumer: "c1", DeadLetter: dead,
		MinIdle: 2 * time.Second, RetryDelay: 200 * time.Millisecond})
	// A producer that writes the payload under another field name.
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"message-id", "m-1", "data", "the real payload"}}).Err(); err != nil {
		t.Fatal(err)
	}
	// An explicitly empty payload is a payload.
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"message-id", "m-2", "payload", ""}}).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "both entries settled", func() bool {
		n, _ := rdb.XLen(ctx, dead).Result()
		// Both: the dead letter of m-1 and a settled m-2 (which may not
		// even have been read when m-1 was dead-lettered).
		return pendingCount(t, rdb, stream, "g") == 0 && n > 0 && len(e.snapshot()) > 0
	}, nil)
	if got := e.snapshot(); got["m-1"] != 0 || got["m-2"] != 1 {
		t.Fatalf("effects %v, want none for m-1 (no payload field) and one for m-2", got)
	}
	entries, err := rdb.XRange(ctx, dead, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Fatalf("%d dead letters, want 1: %v", len(entries), entries)
	}
	v := entries[0].Values
	if v["message-id"] != "m-1" || v["data"] != "the real payload" || v[idem.HeaderDeadLetterStatus] != "Rejected" ||
		v[idem.HeaderDeadLetterReason] != idem.ReasonInvalidPayload ||
		!strings.Contains(fmt.Sprint(v[idem.HeaderDeadLetterError]), idem.ErrInvalidPayload.Error()) {
		t.Fatalf("dead letter %v", v)
	}
}

// Many copies of one message ID (distinct entries) in lease mode, on two
// members with concurrency: one effect, every copy settled (acked as a
// duplicate or after InProgress retries), nothing dead-lettered.
func TestInProgressStorm(t *testing.T) {
	t.Parallel()
	stream, dead := keys(t)
	rdb := client(t)
	ctx := context.Background()
	store := idem.NewMemoryStore(nil)
	var effects atomic.Int64
	lc, err := idem.NewLeaseConsumer(store, idem.Config{Name: "storm", PurgeInterval: -1, Lease: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lc.Close() })
	p := idem.BindLease(lc, func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
		time.Sleep(300 * time.Millisecond)
		effects.Add(1)
		return idem.Result{Body: []byte("done")}, nil
	})
	cfg := idemredisstream.Config{Processor: p, Stream: stream, Group: "g", DeadLetter: dead, Concurrency: 6,
		MinIdle: 3 * time.Second, RetryDelay: 100 * time.Millisecond, ClaimInterval: 50 * time.Millisecond}
	cfg.Consumer = "m1"
	_, _, _ = start(t, cfg)
	cfg.Consumer = "m2"
	_, _, _ = start(t, cfg)
	prod := idemredisstream.NewProducer(rdb, idemredisstream.ProducerConfig{})
	const copies = 40
	for range copies {
		if _, err := prod.Publish(ctx, stream, []byte("same"), idemredisstream.WithMessageID("storm-1")); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 60*time.Second, "every copy settled", func() bool {
		info, err := rdb.XInfoGroups(ctx, stream).Result()
		return err == nil && len(info) == 1 && info[0].Pending == 0 && info[0].EntriesRead == copies
	}, nil)
	if n := effects.Load(); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
	if dl, _ := rdb.XLen(ctx, dead).Result(); dl != 0 {
		t.Fatalf("%d dead letters, want 0", dl)
	}
}

// During a graceful Stop, the entries still in flight stay kept alive: a
// handler that outlives MinIdle while its member stops is not handed to
// another member meanwhile (the package doc: a member stops keeping its
// entries alive only when it crashes).
func TestStopKeepsInFlightAlive(t *testing.T) {
	t.Parallel()
	stream, dead := keys(t)
	rdb := client(t)
	ctx := context.Background()
	const minIdle = 600 * time.Millisecond
	var calls atomic.Int64
	entered := make(chan struct{})
	var once sync.Once
	p := idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
		if calls.Add(1) == 1 {
			once.Do(func() { close(entered) })
			time.Sleep(4 * minIdle) // a long handler, still running when Stop is called
		}
		return idem.Outcome{Status: idem.Processed, MessageID: msg.ID}, nil
	})
	c1, _, res1 := start(t, idemredisstream.Config{Processor: p, Stream: stream, Group: "g", Consumer: "m1", DeadLetter: dead,
		MinIdle: minIdle, ClaimInterval: 20 * time.Millisecond})
	if _, err := idemredisstream.NewProducer(rdb, idemredisstream.ProducerConfig{}).Publish(ctx, stream, []byte("x"), idemredisstream.WithMessageID("long")); err != nil {
		t.Fatal(err)
	}
	<-entered
	_, _, _ = start(t, idemredisstream.Config{Processor: p, Stream: stream, Group: "g", Consumer: "m2", DeadLetter: dead,
		MinIdle: minIdle, ClaimInterval: 20 * time.Millisecond})
	if err := c1.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	<-res1.done
	if n := calls.Load(); n != 1 {
		t.Fatalf("the entry was handed to another member while its handler ran during Stop: %d calls, want 1", n)
	}
	if n := pendingCount(t, rdb, stream, "g"); n != 0 {
		t.Fatalf("%d pending after a graceful Stop, want 0", n)
	}
}
