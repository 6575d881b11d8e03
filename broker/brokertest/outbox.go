package brokertest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// OutboxBroker is a Broker whose adapter has an outbox relay Publisher.
type OutboxBroker interface {
	Broker
	// OutboxPublisher returns the adapter's idem.Publisher and the
	// Destination (subject, topic, exchange or routing key, stream) that
	// reaches the queue the Broker's consumers read.
	OutboxPublisher() (pub idem.Publisher, destination string)
}

// OutboxUndeliverable is an OutboxBroker that also names a destination its
// Publisher can never reach, for RunOutbox's undeliverable case.
type OutboxUndeliverable interface {
	// UndeliverableDestination returns such a destination (an invalid
	// subject, a routing key no queue is bound to, a key of another type)
	// and whether the Publisher reports it as permanent (idem.ErrPermanent)
	// or retryable.
	UndeliverableDestination(t *testing.T) (destination string, permanent bool)
}

// RunOutbox runs the outbox case on a broker from h.New, which must
// implement OutboxBroker: messages emitted into an idem.MemoryStore outbox
// (committed, not yet sent: a crash after the commit) are sent by an
// idem.Relay through the adapter's Publisher, whose first call publishes
// and then fails every message (a crash after the send, before the mark),
// so the relay sends those messages twice. An idem consumer of the adapter
// downstream must apply every message exactly once, and the messages of
// one ordering key in emission order. A broker that also implements
// OutboxUndeliverable gets 3 more rows (one key) to its undeliverable
// destination among the good ones: none of them is sent, the first fails
// (for good, or for retry, as the broker says) and they hold back no other
// key.
//
// A second case ("outbox upstream", on a second broker) runs the producing
// side for real: an upstream transactional idem consumer emits two
// messages per incoming message (idem.Emit). A handler error leaves no
// outgoing rows; a duplicate of an incoming message whose outgoing ones
// are still unsent is acknowledged without running the handler or
// emitting anew; two relays side by side then send every row exactly once,
// and the downstream idem consumer applies each message once, in order
// per key.
func RunOutbox(t *testing.T, h Harness) {
	t.Run("outbox", func(t *testing.T) {
		b, ok := h.New(t).(OutboxBroker)
		if !ok {
			t.Fatal("brokertest: the broker does not implement OutboxBroker")
		}
		runOutboxSendTwice(t, b)
	})
	t.Run("outbox upstream", func(t *testing.T) {
		b, ok := h.New(t).(OutboxBroker)
		if !ok {
			t.Fatal("brokertest: the broker does not implement OutboxBroker")
		}
		runOutboxUpstream(t, b)
	})
}

const (
	outboxKeys   = 4
	outboxPerKey = 5
)

func runOutboxSendTwice(t *testing.T, b OutboxBroker) {
	ctx, cancel := context.WithTimeout(t.Context(), waitLong)
	defer cancel()
	pub, dest := b.OutboxPublisher()

	// Emit: committed rows, nothing sent yet.
	store := idem.NewMemoryStore(nil)
	run := fmt.Sprintf("ob%d", time.Now().UnixNano())
	var rows []idemdriver.OutgoingRecord
	for i := range outboxPerKey {
		for k := range outboxKeys {
			key := fmt.Sprintf("k%d", k)
			rows = append(rows, idemdriver.OutgoingRecord{
				ID: fmt.Sprintf("%s-%s-%d", run, key, i), Consumer: "upstream", SourceID: "src",
				Destination: dest, Key: key, Payload: []byte(fmt.Sprintf("%s/%d", key, i)),
				Headers: map[string]string{"x-outbox-test": run},
			})
		}
	}
	var bad []idemdriver.OutgoingRecord
	badDest, badPermanent := "", false
	if u, ok := b.(OutboxUndeliverable); ok {
		badDest, badPermanent = u.UndeliverableDestination(t)
		for i := range 3 {
			bad = append(bad, idemdriver.OutgoingRecord{ID: fmt.Sprintf("%s-bad-%d", run, i), Consumer: "upstream",
				SourceID: "src-bad", Destination: badDest, Key: "bad", Payload: []byte("bad")})
		}
	}
	tx, err := store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.EmitTx(ctx, tx, &idemdriver.EmitParams{Consumer: "upstream", Messages: append(append([]idemdriver.OutgoingRecord(nil), rows...), bad...)}); err != nil {
		t.Fatalf("EmitTx: %v", err)
	}
	if err := store.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}

	// The first publish call sends, then "crashes" before the relay marks.
	var calls, resent atomic.Int64
	crashing := idem.PublisherFunc(func(ctx context.Context, msgs []idem.Outgoing) []error {
		errs := pub.Publish(ctx, msgs)
		if calls.Add(1) == 1 {
			for i := range errs {
				if errs[i] != nil {
					if msgs[i].Destination != badDest {
						t.Errorf("publish %s: %v", msgs[i].ID, errs[i])
					}
					continue
				}
				errs[i] = fmt.Errorf("brokertest: crash after send, before mark")
				resent.Add(1)
			}
		}
		return errs
	})
	relay, err := idem.NewRelay(idem.RelayConfig{Store: store, Publisher: crashing,
		MinRetry: time.Millisecond, MaxRetry: time.Millisecond, MinPoll: time.Millisecond})
	if err != nil {
		t.Fatalf("NewRelay: %v", err)
	}

	down := startDownstream(t, ctx, b)
	mu, order, deliveries := &down.mu, down.order, &down.deliveries

	var total idem.RelayResult
	for total.Sent < len(rows) {
		res, err := relay.RunOnce(ctx)
		if err != nil {
			t.Fatalf("RunOnce: %v (so far %+v)", err, total)
		}
		total.Claimed += res.Claimed
		total.Sent += res.Sent
		total.Retried += res.Retried
		total.Failed += res.Failed
		if ctx.Err() != nil {
			t.Fatalf("relay did not send every row: %+v", total)
		}
	}
	badPending := store.PendingOutgoing("upstream", "src-bad")
	switch {
	case total.Sent != len(rows) || resent.Load() == 0:
		t.Fatalf("relay totals %+v, %d crashed sends, want %d sent", total, resent.Load(), len(rows))
	case len(bad) == 0 && (total.Failed != 0 || int64(total.Retried) != resent.Load()):
		t.Fatalf("relay totals %+v, %d crashed sends", total, resent.Load())
	case len(bad) > 0 && badPermanent && (total.Failed < 1 || total.Failed+badPending != len(bad)):
		t.Fatalf("undeliverable %s (permanent): relay totals %+v, %d of %d rows pending", badDest, total, badPending, len(bad))
	case len(bad) > 0 && !badPermanent && (total.Failed != 0 || badPending != len(bad) || int64(total.Retried) <= resent.Load()):
		t.Fatalf("undeliverable %s (retryable): relay totals %+v, %d of %d rows pending", badDest, total, badPending, len(bad))
	}
	if pending := store.PendingOutgoing("upstream", "src"); pending != 0 {
		t.Fatalf("pending after the relay: %d rows", pending)
	}

	ids := make([]string, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
	}
	down.waitAppliedOnce(t, ctx, ids)
	mu.Lock()
	defer mu.Unlock()
	for k := range outboxKeys {
		key := fmt.Sprintf("k%d", k)
		for i, p := range order[key] {
			if want := fmt.Sprintf("%s/%d", key, i); p != want {
				t.Errorf("key %s: applied %v, want in emission order", key, order[key])
				break
			}
		}
	}
	t.Logf("outbox: %d rows (and %d undeliverable), %d sent twice, %d deliveries downstream, relay %+v", len(rows), len(bad), resent.Load(), deliveries.Load(), total)
}

// downstream is an idem consumer of the adapter that records what it
// applies: the times each message ID was applied, and per ordering key
// (the payload's text before "/") the payloads in applied order.
type downstream struct {
	mu         sync.Mutex
	applied    map[string]int
	order      map[string][]string
	deliveries atomic.Int64
	stop       func()
}

// startDownstream starts the downstream consumer on b, one message at a
// time so the applied order is the delivered order; it stops when the
// test ends, or at stop.
func startDownstream(t *testing.T, ctx context.Context, b OutboxBroker) *downstream {
	d := &downstream{applied: map[string]int{}, order: map[string][]string{}}
	c, err := idem.NewConsumer[*idem.MemoryTx](idem.NewMemoryStore(nil), idem.Config{Name: consumerName, PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	proc := idem.Bind(c, func(ctx context.Context, tx *idem.MemoryTx, msg idem.Message) error {
		tx.OnCommit(func() {
			d.mu.Lock()
			d.applied[msg.ID]++
			key, _, _ := strings.Cut(string(msg.Payload), "/")
			d.order[key] = append(d.order[key], string(msg.Payload))
			d.mu.Unlock()
		})
		return nil
	})
	counting := idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
		d.deliveries.Add(1)
		return proc.Process(ctx, msg)
	})
	m, err := b.Start(ctx, counting, StartOptions{Concurrency: 1})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	var once sync.Once
	d.stop = func() {
		once.Do(func() {
			if err := m.Stop(context.WithoutCancel(ctx)); err != nil {
				t.Errorf("Stop: %v", err)
			}
		})
	}
	t.Cleanup(d.stop)
	return d
}

// waitAppliedOnce waits until as many messages were applied as ids
// holds, then checks that each of ids was applied exactly once.
func (d *downstream) waitAppliedOnce(t *testing.T, ctx context.Context, ids []string) {
	t.Helper()
	waitUntil(t, ctx, waitLong, func() (bool, string) {
		d.mu.Lock()
		defer d.mu.Unlock()
		return len(d.applied) >= len(ids), fmt.Sprintf("%d of %d messages applied, %d deliveries", len(d.applied), len(ids), d.deliveries.Load())
	})
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, id := range ids {
		if n := d.applied[id]; n != 1 {
			t.Errorf("%s applied %d times, want once", id, n)
		}
	}
}

// runOutboxUpstream: an upstream transactional idem consumer emits two
// messages per incoming message through the outbox. A handler error
// leaves no outgoing rows; the incoming messages are processed before any
// relay runs (committed, unsent: a crash after commit), and a duplicate of
// one of them is acknowledged without running the handler or emitting
// anew; then two relays side by side send everything, each row once, and
// the downstream idem consumer of the adapter applies each message once.
func runOutboxUpstream(t *testing.T, b OutboxBroker) {
	ctx, cancel := context.WithTimeout(t.Context(), waitLong)
	defer cancel()
	pub, dest := b.OutboxPublisher()
	run := fmt.Sprintf("up%d", time.Now().UnixNano())
	store := idem.NewMemoryStore(nil)
	var mu sync.Mutex
	published := map[string]int{}
	counting := idem.PublisherFunc(func(ctx context.Context, msgs []idem.Outgoing) []error {
		errs := pub.Publish(ctx, msgs)
		mu.Lock()
		defer mu.Unlock()
		for i, m := range msgs {
			if errs[i] == nil {
				published[m.ID]++
			}
		}
		return errs
	})
	relays := make([]*idem.Relay, 2)
	for i := range relays {
		r, err := idem.NewRelay(idem.RelayConfig{Store: store, Publisher: counting, BatchSize: 3,
			MinPoll: time.Millisecond, MaxPoll: 10 * time.Millisecond, MinRetry: time.Millisecond, MaxRetry: 10 * time.Millisecond})
		if err != nil {
			t.Fatalf("NewRelay: %v", err)
		}
		relays[i] = r
	}
	up, err := idem.NewConsumer[*idem.MemoryTx](store, idem.Config{Name: "upstream", PurgeInterval: -1, Relay: relays[0]})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	var calls atomic.Int64
	errHandler := errors.New("brokertest: the handler failed after emitting")
	handler := func(fail bool) idem.Handler[*idem.MemoryTx] {
		return func(ctx context.Context, _ *idem.MemoryTx, msg idem.Message) error {
			calls.Add(1)
			for _, name := range []string{"a", "b"} {
				if _, err := idem.Emit(ctx, idem.OutgoingMessage{Name: name, Destination: dest, Key: msg.ID,
					Payload: []byte(msg.ID + "/" + name)}); err != nil {
					return err
				}
			}
			if fail {
				return errHandler
			}
			return nil
		}
	}
	pendingOf := func(id string) int { return store.PendingOutgoing("upstream", id) }

	failed := run + "-fails"
	if out, err := up.Process(ctx, idem.Message{ID: failed, Payload: []byte("x")}, handler(true)); out.Status != idem.Failed || !errors.Is(err, errHandler) {
		t.Fatalf("failing handler: %v, %v; want Failed", out.Status, err)
	}
	if n := pendingOf(failed); n != 0 {
		t.Fatalf("a handler error left %d outgoing rows, want 0", n)
	}
	const incoming = 6
	var want []string
	for i := range incoming {
		id := fmt.Sprintf("%s-in-%d", run, i)
		if out, err := up.Process(ctx, idem.Message{ID: id, Payload: []byte("x")}, handler(false)); out.Status != idem.Processed {
			t.Fatalf("process %s: %v, %v", id, out.Status, err)
		}
		want = append(want, idem.OutgoingID("upstream", id, "a", 0), idem.OutgoingID("upstream", id, "b", 0))
	}
	dup := fmt.Sprintf("%s-in-0", run)
	before := calls.Load()
	if out, err := up.Process(ctx, idem.Message{ID: dup, Payload: []byte("x")}, handler(false)); out.Status != idem.Duplicate || err != nil {
		t.Fatalf("duplicate %s: %v, %v; want Duplicate", dup, out.Status, err)
	}
	if calls.Load() != before || pendingOf(dup) != 2 {
		t.Fatalf("the duplicate ran the handler (%d calls, want %d) or emitted anew (%d rows pending, want 2)", calls.Load(), before, pendingOf(dup))
	}

	down := startDownstream(t, ctx, b)
	rctx, stopRelays := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, r := range relays {
		wg.Add(1)
		go func() { defer wg.Done(); _ = r.Run(rctx) }()
	}
	waitUntil(t, ctx, waitLong, func() (bool, string) {
		st, err := store.OutboxStats(ctx)
		return err == nil && st.Pending == 0, fmt.Sprintf("outbox %+v, %v", st, err)
	})
	stopRelays()
	wg.Wait()
	mu.Lock()
	if len(published) != len(want) {
		t.Errorf("published %d distinct messages, want %d: %v", len(published), len(want), published)
	}
	for _, id := range want {
		if published[id] != 1 {
			t.Errorf("%s published %d times by the two relays, want once", id, published[id])
		}
	}
	mu.Unlock()
	down.waitAppliedOnce(t, ctx, want)
	down.mu.Lock()
	defer down.mu.Unlock()
	for i := range incoming {
		key := fmt.Sprintf("%s-in-%d", run, i)
		if got := down.order[key]; len(got) != 2 || got[0] != key+"/a" || got[1] != key+"/b" {
			t.Errorf("key %s: applied %v, want a then b", key, got)
		}
	}
}
