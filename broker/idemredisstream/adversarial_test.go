package idemredisstream_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemredisstream"
	"github.com/idem-go/idem/store/idemsql"
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
	waitFor(t, 20*time.Second, "a second attempt, or the entry acked", func() bool {
		return calls.Load() >= 2 || (calls.Load() == 1 && pendingCount(t, rdb, stream, "g") == 0)
	})
	if n := pendingCount(t, rdb, stream, "g"); n != 1 {
		t.Fatalf("%d pending entries after a failed dead letter, want 1 (the entry was acked without being dead-lettered)", n)
	}
	if err := rdb.Del(ctx, dead).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the entry dead-lettered and acked", func() bool {
		return pendingCount(t, rdb, stream, "g") == 0
	})
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
	waitFor(t, 20*time.Second, "both entries settled", func() bool {
		n, _ := rdb.XLen(ctx, dead).Result()
		// Both: the dead letter of m-1 and a settled m-2 (which may not
		// even have been read when m-1 was dead-lettered).
		return pendingCount(t, rdb, stream, "g") == 0 && n > 0 && len(e.snapshot()) > 0
	})
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
	if v["message-id"] != "m-1" || v["data"] != "the real payload" || v[idemredisstream.FieldDeadLetterStatus] != "Rejected" ||
		!strings.Contains(fmt.Sprint(v[idemredisstream.FieldDeadLetterReason]), idem.ErrInvalidPayload.Error()) {
		t.Fatalf("dead letter %v", v)
	}
}

// A Processor that panics (not a handler inside idem.Bind, whose panics the
// core recovers, but a Processor wrapper) does not crash the process: the
// entry is not acked, and the redelivery is processed once.
func TestProcessorPanicIsNotAck(t *testing.T) {
	t.Parallel()
	stream, dead := keys(t)
	rdb := client(t)
	e := newEffects()
	inner := txProcessor(t, idem.NewMemoryStore(nil), e, nil)
	var calls atomic.Int64
	p := idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
		if calls.Add(1) == 1 {
			panic("middleware bug")
		}
		return inner.Process(ctx, msg)
	})
	_, _, _ = start(t, idemredisstream.Config{Processor: p, Stream: stream, Group: "g", Consumer: "c1", DeadLetter: dead,
		MinIdle: 2 * time.Second, RetryDelay: 200 * time.Millisecond, ClaimInterval: 50 * time.Millisecond})
	prod := idemredisstream.NewProducer(rdb, idemredisstream.ProducerConfig{})
	if _, err := prod.Publish(context.Background(), stream, []byte("x"), idemredisstream.WithMessageID("m-1")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the entry processed after the panic", func() bool {
		return e.snapshot()["m-1"] == 1 && pendingCount(t, rdb, stream, "g") == 0
	})
	if calls.Load() != 2 {
		t.Fatalf("%d calls, want 2", calls.Load())
	}
}

// IDs that break idem's rules (control characters, over 255 bytes, not
// UTF-8) and IDs at the edge (255 bytes, non-ASCII) through the real
// consumer: the bad ones are dead-lettered byte for byte with the reason,
// the good ones processed once.
func TestBadMessageIDs(t *testing.T) {
	t.Parallel()
	stream, dead := keys(t)
	rdb := client(t)
	ctx := context.Background()
	e := newEffects()
	p := txProcessor(t, idem.NewMemoryStore(nil), e, nil)
	_, _, _ = start(t, idemredisstream.Config{Processor: p, Stream: stream, Group: "g", Consumer: "c1", DeadLetter: dead,
		Concurrency: 4, MinIdle: 2 * time.Second, RetryDelay: 200 * time.Millisecond})
	bad := []string{"a\nb", "nul\x00", "tab\t", strings.Repeat("x", 256), "\xff\xfe", "del\x7f", "c1\u0085"}
	good := []string{strings.Repeat("y", 255), "été-🙂", " spaced "}
	for _, id := range append(append([]string{}, bad...), good...) {
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"message-id", id, "payload", "p:" + id}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 30*time.Second, "every entry settled", func() bool {
		n, _ := rdb.XLen(ctx, dead).Result()
		return pendingCount(t, rdb, stream, "g") == 0 && int(n) == len(bad) && len(e.snapshot()) == len(good)
	})
	for _, id := range good {
		if n := e.snapshot()[id]; n != 1 {
			t.Errorf("good ID %q: %d effects, want 1", id, n)
		}
	}
	entries, err := rdb.XRange(ctx, dead, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, en := range entries {
		id, _ := en.Values["message-id"].(string)
		got[id] = true
		if en.Values["payload"] != "p:"+id || en.Values[idemredisstream.FieldDeadLetterStatus] != "Rejected" ||
			!strings.Contains(fmt.Sprint(en.Values[idemredisstream.FieldDeadLetterReason]), "invalid message ID") {
			t.Errorf("dead letter %q: %v", id, en.Values)
		}
	}
	for _, id := range bad {
		if !got[id] {
			t.Errorf("bad ID %q not dead-lettered byte for byte", id)
		}
	}
}

// openSQLite opens a SQLite database with idem's tables and an effects
// table.
func openSQLite(t *testing.T, path string) (*sql.DB, *idemsql.Store) {
	t.Helper()
	db, err := sql.Open("sqlite", idemsql.SQLiteDSN(path))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	st, err := idemsql.New(db, idemsql.SQLite, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS effects (id TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return db, st
}

func sqlProcessor(t *testing.T, st *idemsql.Store, started chan<- string) idem.Processor {
	t.Helper()
	c, err := idem.NewConsumer(st, idem.Config{Name: "redis-adv", PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return idem.Bind(c, func(ctx context.Context, tx *sql.Tx, msg idem.Message) error {
		if started != nil {
			select {
			case started <- msg.ID:
			default:
			}
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO effects (id) VALUES (?)`, msg.ID)
		return err
	})
}

// The store goes down under a running consumer (its *sql.DB is closed):
// nothing is acked, nothing is dead-lettered, the entries stay pending; a
// member with a working store then processes each exactly once.
func TestStoreDownIsNotAck(t *testing.T) {
	t.Parallel()
	stream, dead := keys(t)
	rdb := client(t)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	db1, st1 := openSQLite(t, path)
	_ = db1.Close() // the store is down before the first message
	c1, _, res1 := start(t, idemredisstream.Config{Processor: sqlProcessor(t, st1, nil), Stream: stream, Group: "g", Consumer: "c1",
		DeadLetter: dead, Concurrency: 2, MinIdle: 1 * time.Second, RetryDelay: 100 * time.Millisecond, ClaimInterval: 50 * time.Millisecond})
	prod := idemredisstream.NewProducer(rdb, idemredisstream.ProducerConfig{})
	const n = 5
	for i := range n {
		if _, err := prod.Publish(ctx, stream, []byte("x"), idemredisstream.WithMessageID(fmt.Sprintf("m-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	// Several reclaim cycles with the store down.
	waitFor(t, 20*time.Second, "entries redelivered while the store is down", func() bool {
		pe, err := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: stream, Group: "g", Start: "-", End: "+", Count: 100}).Result()
		if err != nil || len(pe) != n {
			return false
		}
		for _, e := range pe {
			if e.RetryCount < 3 {
				return false
			}
		}
		return true
	})
	if got := pendingCount(t, rdb, stream, "g"); got != n {
		t.Fatalf("%d pending, want %d: entries were acked while the store was down", got, n)
	}
	if dl, _ := rdb.XLen(ctx, dead).Result(); dl != 0 {
		t.Fatalf("%d dead letters while the store was down, want 0", dl)
	}
	if err := c1.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	<-res1.done

	db2, st2 := openSQLite(t, path)
	_, _, _ = start(t, idemredisstream.Config{Processor: sqlProcessor(t, st2, nil), Stream: stream, Group: "g", Consumer: "c2",
		DeadLetter: dead, Concurrency: 2, MinIdle: 1 * time.Second, RetryDelay: 100 * time.Millisecond, ClaimInterval: 50 * time.Millisecond})
	waitFor(t, 30*time.Second, "the entries processed by the healthy member", func() bool {
		return pendingCount(t, rdb, stream, "g") == 0
	})
	var rows, distinct int
	if err := db2.QueryRow(`SELECT COUNT(*), COUNT(DISTINCT id) FROM effects`).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	if rows != n || distinct != n {
		t.Fatalf("%d effect rows (%d distinct), want %d", rows, distinct, n)
	}
}

// Cancelling Run's context while a handler runs: the handler sees the
// cancellation, its transaction rolls back, the entry is not acked, and the
// next member processes it once.
func TestContextCancelMidHandler(t *testing.T) {
	t.Parallel()
	stream, dead := keys(t)
	rdb := newClient(t)
	defer rdb.Close()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	_, st := openSQLite(t, path)
	entered := make(chan struct{})
	var once sync.Once
	c, err := idem.NewConsumer(st, idem.Config{Name: "redis-adv", PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	blocking := idem.Bind(c, func(ctx context.Context, tx *sql.Tx, msg idem.Message) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO effects (id) VALUES (?)`, msg.ID); err != nil {
			return err
		}
		once.Do(func() { close(entered) })
		<-ctx.Done()
		return ctx.Err()
	})
	c1, err := idemredisstream.NewConsumer(rdb, idemredisstream.Config{Processor: blocking, Stream: stream, Group: "g", Consumer: "c1",
		DeadLetter: dead, MinIdle: time.Second, RetryDelay: 100 * time.Millisecond, Block: 200 * time.Millisecond, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c1.Run(runCtx) }()
	<-c1.Ready()
	prod := idemredisstream.NewProducer(client(t), idemredisstream.ProducerConfig{})
	if _, err := prod.Publish(ctx, stream, []byte("x"), idemredisstream.WithMessageID("m-1")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("handler not entered")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after cancel: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after its context was cancelled")
	}
	if got := pendingCount(t, rdb, stream, "g"); got != 1 {
		t.Fatalf("%d pending after a cancelled handler, want 1", got)
	}
	db2, st2 := openSQLite(t, path)
	_, _, _ = start(t, idemredisstream.Config{Processor: sqlProcessor(t, st2, nil), Stream: stream, Group: "g", Consumer: "c2",
		DeadLetter: dead, MinIdle: time.Second, RetryDelay: 100 * time.Millisecond, ClaimInterval: 50 * time.Millisecond})
	waitFor(t, 30*time.Second, "the entry processed by the next member", func() bool {
		return pendingCount(t, rdb, stream, "g") == 0
	})
	var rows int
	if err := db2.QueryRow(`SELECT COUNT(*) FROM effects`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 1 {
		t.Fatalf("%d effect rows, want 1", rows)
	}
}

// Stop before Run, Stop twice and concurrently, Run twice: no panic, no
// deadlock, the documented results, and no goroutine left behind.
func TestLifecycleAbuse(t *testing.T) {
	stream, dead := keys(t)
	ctx := context.Background()
	before := runtime.NumGoroutine()
	rdb := newClient(t)
	p := txProcessor(t, idem.NewMemoryStore(nil), newEffects(), nil)
	cfg := idemredisstream.Config{Processor: p, Stream: stream, Group: "g", Consumer: "c1", DeadLetter: dead,
		Block: 100 * time.Millisecond, Logger: quiet()}

	// Stop before Run: Run returns nil at once.
	c0, err := idemredisstream.NewConsumer(rdb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c0.Stop(ctx); err != nil {
		t.Fatalf("Stop before Run: %v", err)
	}
	if err := c0.Stop(ctx); err != nil {
		t.Fatalf("second Stop before Run: %v", err)
	}
	runDone := make(chan error, 1)
	go func() { runDone <- c0.Run(ctx) }()
	select {
	case err := <-runDone:
		if err != nil {
			t.Fatalf("Run after Stop: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run after Stop did not return")
	}

	// Run twice; many concurrent Stops while Run returns.
	c1, err := idemredisstream.NewConsumer(rdb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	go func() { runDone <- c1.Run(ctx) }()
	<-c1.Ready()
	if err := c1.Run(ctx); !errors.Is(err, idemredisstream.ErrAlreadyRunning) {
		t.Fatalf("second Run: %v, want ErrAlreadyRunning", err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			if err := c1.Stop(sctx); err != nil {
				t.Errorf("concurrent Stop: %v", err)
			}
		})
	}
	wg.Wait()
	if err := <-runDone; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := c1.Run(ctx); !errors.Is(err, idemredisstream.ErrAlreadyRunning) {
		t.Fatalf("Run after it returned: %v, want ErrAlreadyRunning", err)
	}
	_ = rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines after Stop and Close, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
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
	waitFor(t, 60*time.Second, "every copy settled", func() bool {
		info, err := rdb.XInfoGroups(ctx, stream).Result()
		return err == nil && len(info) == 1 && info[0].Pending == 0 && info[0].EntriesRead == copies
	})
	if n := effects.Load(); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
	if dl, _ := rdb.XLen(ctx, dead).Result(); dl != 0 {
		t.Fatalf("%d dead letters, want 0", dl)
	}
}

// A payload of several megabytes is processed once, and an ID-less one is
// dead-lettered byte for byte.
func TestHugePayload(t *testing.T) {
	t.Parallel()
	stream, dead := keys(t)
	rdb := client(t)
	ctx := context.Background()
	e := newEffects()
	var got atomic.Int64
	inner := txProcessor(t, idem.NewMemoryStore(nil), e, nil)
	p := idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
		got.Store(int64(len(msg.Payload)))
		return inner.Process(ctx, msg)
	})
	_, _, _ = start(t, idemredisstream.Config{Processor: p, Stream: stream, Group: "g", Consumer: "c1", DeadLetter: dead,
		MinIdle: 5 * time.Second, RetryDelay: 200 * time.Millisecond})
	big := []byte(strings.Repeat("0123456789abcdef", 8<<20/16)) // 8 MiB
	if _, err := idemredisstream.NewProducer(rdb, idemredisstream.ProducerConfig{}).Publish(ctx, stream, big, idemredisstream.WithMessageID("big")); err != nil {
		t.Fatal(err)
	}
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"payload", big}}).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "both entries settled", func() bool {
		n, _ := rdb.XLen(ctx, dead).Result()
		return pendingCount(t, rdb, stream, "g") == 0 && n == 1 && e.snapshot()["big"] == 1
	})
	if got.Load() != int64(len(big)) {
		t.Fatalf("handler saw %d bytes, want %d", got.Load(), len(big))
	}
	entries, err := rdb.XRange(ctx, dead, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := entries[0].Values["payload"].(string); s != string(big) {
		t.Fatalf("dead letter payload of %d bytes, want the %d original bytes", len(s), len(big))
	}
}

// In transactional mode a handler error marked idem.Permanent is not
// retried for ever: the entry is dead-lettered (its effects rolled back)
// and acked, as in the Kafka adapter.
func TestPermanentFailureTransactional(t *testing.T) {
	t.Parallel()
	stream, dead := keys(t)
	rdb := client(t)
	ctx := context.Background()
	e := newEffects()
	var poisonCalls atomic.Int64
	p := txProcessor(t, idem.NewMemoryStore(nil), e, func(ctx context.Context, msg idem.Message) error {
		if msg.ID == "poison" {
			poisonCalls.Add(1)
			return idem.Permanent(errors.New("amount is negative"))
		}
		return nil
	})
	_, _, _ = start(t, idemredisstream.Config{Processor: p, Stream: stream, Group: "g", Consumer: "c1", DeadLetter: dead,
		MinIdle: time.Second, RetryDelay: 50 * time.Millisecond, ClaimInterval: 20 * time.Millisecond})
	prod := idemredisstream.NewProducer(rdb, idemredisstream.ProducerConfig{})
	for _, id := range []string{"a", "poison", "b"} {
		if _, err := prod.Publish(ctx, stream, []byte(id), idemredisstream.WithMessageID(id)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 30*time.Second, "the poison entry dead-lettered, or retried", func() bool {
		n, _ := rdb.XLen(ctx, dead).Result()
		return n == 1 || poisonCalls.Load() > 5
	})
	if n := poisonCalls.Load(); n != 1 {
		t.Fatalf("the permanently failing handler ran %d times, want 1", n)
	}
	waitFor(t, 30*time.Second, "everything settled", func() bool {
		return pendingCount(t, rdb, stream, "g") == 0 && len(e.snapshot()) == 2
	})
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
