package idemtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/testenv"
)

// RunOutbox runs the outbox conformance suite against the store that h
// builds, whose Store must implement idemdriver.OutboxTx[TTx] and
// idemdriver.OutboxStore on the same tables. Each case is a parallel
// subtest with a fresh Setup, an in-memory recording Publisher and Relays
// driven by RunOnce (or Run where the case is about waking it).
//
// The cases: emitted messages commit with the claim and are sent once,
// with their derived IDs, payload, key and headers; a handler error or
// panic leaves no outgoing rows, and the reprocessing emits the same IDs;
// a crash after commit and before sending (the relay sends, once); a
// crash after sending and before marking (sent again with the same ID
// once the lease ends); a relay whose lease ran out marks nothing another
// relay claimed since (the mark is fenced by the attempt); a duplicate
// delivery with unsent outgoing
// messages wakes the relay, which sends them, and never runs the handler
// or emits anew; two relays side by side never send one row twice; order
// per destination and key, with a failed message holding back only its
// key; one failing destination among good ones (retried with backoff, and
// a permanent failure unblocking its key); invalid emissions; batches
// (EmitFor); MarkSent ending exactly the rows it names (none, thousands,
// named twice, absent or already sent), deleting them (their IDs free
// again) or, with Keep, marking them sent (their IDs held until purged);
// a sent row deleted at once by default and kept until its retention by
// RelayConfig.KeepSent, a failed row kept until its retention either way;
// a Run with the default batch size and workers over a publisher that
// fails every other message once (two rounds in flight on disjoint rows,
// each message confirmed once); purging kept sent rows, by relays side by
// side too; the emit and relay hooks; and, for a store that implements
// idemdriver.OutboxNotifier, an idle relay woken by the store's
// notification alone.
//
// The cases that depend on real time (a 1s lease running out, a 1ms retry
// backoff, a 1ms retention) wait up to 30s by the store's clock.
func RunOutbox[TTx any](t *testing.T, h Harness[TTx]) {
	t.Helper()
	if h.New == nil {
		t.Fatal("idemtest: Harness.New is nil")
	}
	nonce := newNonce()
	for _, c := range slices.Concat(outboxCases[TTx](), emitFaultCases[TTx](), lockedRoundCases[TTx]()) {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := newBundle(t, h, nonce, "Outbox."+c.name)
			if _, ok := b.s.Store.(idemdriver.OutboxTx[TTx]); !ok {
				t.Fatalf("idemtest: store %T does not implement idemdriver.OutboxTx", b.s.Store)
			}
			if _, ok := b.s.Store.(idemdriver.OutboxStore); !ok {
				t.Fatalf("idemtest: store %T does not implement idemdriver.OutboxStore", b.s.Store)
			}
			c.run(t, b)
		})
	}
}

// realTimeout bounds the waits on the store's clock (leases, backoff). It
// only ends a test that failed, so it is generous: on a loaded 2-core
// machine SQLite's relay of RelayDefaultsHalfFailing's rows took longer
// than 30 s.
const realTimeout = 90 * time.Second

// recorder is an in-memory Publisher: it records every call and every
// confirmed message, and fails the messages its fail function says.
type recorder struct {
	mu      sync.Mutex
	calls   [][]idem.Outgoing
	sent    []idem.Outgoing
	tries   map[string]int
	fail    func(m idem.Outgoing, try int) error
	publish func(batch []idem.Outgoing) // called first, outside the lock
}

func newRecorder() *recorder {
	return &recorder{tries: map[string]int{}}
}

func (r *recorder) Publish(ctx context.Context, msgs []idem.Outgoing) []error {
	if r.publish != nil {
		r.publish(msgs)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, slices.Clone(msgs))
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		r.tries[m.ID]++
		if r.fail != nil {
			errs[i] = r.fail(m, r.tries[m.ID])
		}
		if errs[i] == nil {
			r.sent = append(r.sent, m)
		}
	}
	return errs
}

// sentIDs returns the IDs confirmed, in order.
func (r *recorder) sentIDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := make([]string, len(r.sent))
	for i, m := range r.sent {
		ids[i] = m.ID
	}
	return ids
}

func (r *recorder) triesOf(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.tries[id]
}

// outboxOf returns the Setup's store as an OutboxStore.
func (b *bundle[TTx]) outboxOf() idemdriver.OutboxStore {
	return b.s.Store.(idemdriver.OutboxStore)
}

// relay returns a Relay over store publishing to pub, with short retries.
func (b *bundle[TTx]) relay(store idemdriver.OutboxStore, pub idem.Publisher, cfg idem.RelayConfig) *idem.Relay {
	b.t.Helper()
	cfg.Store, cfg.Publisher = store, pub
	if cfg.MinRetry == 0 {
		cfg.MinRetry, cfg.MaxRetry = time.Millisecond, 5*time.Millisecond
	}
	r, err := idem.NewRelay(cfg)
	if err != nil {
		b.t.Fatalf("NewRelay: %v", err)
	}
	return r
}

// runOnce runs one relay round and fails the test on an error.
func (b *bundle[TTx]) runOnce(what string, r *idem.Relay) idem.RelayResult {
	b.t.Helper()
	res, err := r.RunOnce(b.ctx)
	if err != nil {
		b.t.Fatalf("%s: RunOnce: %v", what, err)
	}
	return res
}

// drain runs r until nothing is pending, waiting on the store's clock for
// backoffs to end, or until done says so.
func (b *bundle[TTx]) drain(what string, r *idem.Relay, done func() bool) {
	b.t.Helper()
	if done == nil {
		done = func() bool { return b.stats().Pending == 0 }
	}
	testenv.Eventually(b.t, realTimeout, what, func() bool {
		// Rounds until done, or until nothing is claimable (rows wait for
		// a lease or a backoff to end on the store's clock); bounded,
		// since a row that always fails may always be claimable again.
		for range 20 {
			res := b.runOnce(what, r)
			if done() {
				return true
			}
			if res.Claimed == 0 {
				return false
			}
		}
		return false
	}, func() string { return fmt.Sprintf("%+v", b.stats()) })
}

// purgeUntil purges with r until want rows in all were deleted, waiting
// on the store's clock for their retention to pass, and returns how many
// were.
func (b *bundle[TTx]) purgeUntil(what string, r *idem.Relay, want int64) int64 {
	b.t.Helper()
	var purged int64
	testenv.Eventually(b.t, realTimeout, what, func() bool {
		n, err := r.Purge(b.ctx)
		if err != nil {
			b.t.Fatalf("%s: Purge: %v", what, err)
		}
		purged += n
		return purged >= want
	}, func() string { return fmt.Sprintf("%d purged", purged) })
	return purged
}

func (b *bundle[TTx]) stats() idemdriver.OutboxStats {
	b.t.Helper()
	s, err := b.outboxOf().OutboxStats(b.ctx)
	if err != nil {
		b.t.Fatalf("OutboxStats: %v", err)
	}
	return s
}

func (b *bundle[TTx]) wantPending(what string, want int64) {
	b.t.Helper()
	if got := b.stats().Pending; got != want {
		b.t.Errorf("%s: pending outgoing rows = %d, want %d", what, got, want)
	}
}

// emitting returns a handler that counts its calls, writes its effect and
// emits what out returns for the message.
func (b *bundle[TTx]) emitting(c *idem.Consumer[TTx], calls *atomic.Int64, out func(idem.Message) []idem.OutgoingMessage) idem.Handler[TTx] {
	effect := b.handler(c, calls)
	return func(ctx context.Context, tx TTx, msg idem.Message) error {
		if err := effect(ctx, tx, msg); err != nil {
			return err
		}
		for _, m := range out(msg) {
			if _, err := idem.Emit(ctx, m); err != nil {
				return err
			}
		}
		return nil
	}
}

// emitNamed commits n outbox rows named r-0000, r-0001, ... and then
// rows whose IDs array or list syntax could misread, each with its ID as
// its payload, and returns their IDs in that order.
func (b *bundle[TTx]) emitNamed(n int) []string {
	b.t.Helper()
	var all []string
	for i := range n {
		all = append(all, fmt.Sprintf("r-%04d", i))
	}
	all = append(all, "NULL", "null", "a,b", "{x}", "{}", `"q"`, `back\slash`, " lead", "trail ", "pad", "pad ",
		"'quote", "%", "_", "é-ü", "日本", "(1)", "$1", "?", "a b", ";--")
	tx := b.begin()
	msgs := make([]idemdriver.OutgoingRecord, len(all))
	for i, id := range all {
		msgs[i] = idemdriver.OutgoingRecord{ID: id, Destination: "d", Payload: []byte(id)}
	}
	if err := b.s.Store.(idemdriver.OutboxTx[TTx]).EmitTx(b.ctx, tx, &idemdriver.EmitParams{Consumer: "c", Messages: msgs}); err != nil {
		b.rollback(tx)
		b.t.Fatalf("EmitTx: %v", err)
	}
	b.commit(tx)
	return all
}

// emitOne writes one pending row with ID id, to destination d.
func (b *bundle[TTx]) emitOne(id string) {
	b.t.Helper()
	tx := b.begin()
	if err := b.s.Store.(idemdriver.OutboxTx[TTx]).EmitTx(b.ctx, tx, &idemdriver.EmitParams{Consumer: "c", Messages: []idemdriver.OutgoingRecord{{ID: id, Destination: "d", Payload: []byte("p")}}}); err != nil {
		b.rollback(tx)
		b.t.Fatalf("EmitTx: %v", err)
	}
	b.commit(tx)
}

// overtaken starts relay A (cfg with a 10 ms lease) on store's one
// pending row, with a publisher that blocks; once A's lease has ended it
// claims the row as relay B would, for an hour. It returns B's claim (one
// row), and finish, which lets A's publish end with the error fail (nil:
// confirmed) and returns A's RunOnce error.
func (b *bundle[TTx]) overtaken(store idemdriver.OutboxStore, fail error, cfg idem.RelayConfig) ([]idemdriver.OutgoingRecord, func() error) {
	b.t.Helper()
	publishing, release := make(chan struct{}), make(chan struct{})
	pub := idem.PublisherFunc(func(_ context.Context, msgs []idem.Outgoing) []error {
		close(publishing)
		<-release
		return slices.Repeat([]error{fail}, len(msgs))
	})
	cfg.Lease = 10 * time.Millisecond
	a := b.relay(store, pub, cfg)
	aDone := make(chan error, 1)
	go func() { _, err := a.RunOnce(b.ctx); aDone <- err }()
	<-publishing
	var held []idemdriver.OutgoingRecord
	testenv.Eventually(b.t, realTimeout, "A's lease to end and B to claim the row", func() bool {
		recs, err := store.ClaimOutgoing(b.ctx, &idemdriver.ClaimOutgoingParams{Limit: 10, Lease: time.Hour})
		if err != nil {
			b.t.Fatalf("ClaimOutgoing: %v", err)
		}
		held = recs
		return len(recs) == 1
	}, nil)
	return held, func() error { close(release); return <-aDone }
}

func one(dest, key string) func(idem.Message) []idem.OutgoingMessage {
	return func(m idem.Message) []idem.OutgoingMessage {
		return []idem.OutgoingMessage{{Destination: dest, Key: key, Payload: []byte("out:" + m.ID)}}
	}
}

// hiddenNotifier is an OutboxStore without its OutboxNotifier, so that a
// running Relay wakes only when woken (or polls).
type hiddenNotifier struct{ idemdriver.OutboxStore }

// claimSignal signals after each ClaimOutgoing.
type claimSignal struct {
	idemdriver.OutboxStore
	claimed chan struct{}
}

func (s claimSignal) ClaimOutgoing(ctx context.Context, p *idemdriver.ClaimOutgoingParams) ([]idemdriver.OutgoingRecord, error) {
	recs, err := s.OutboxStore.ClaimOutgoing(ctx, p)
	select {
	case s.claimed <- struct{}{}:
	default:
	}
	return recs, err
}

type emitHook func(idem.EmitEvent)

func (f emitHook) OnEmit(_ context.Context, e idem.EmitEvent) { f(e) }

type relayHook func(idem.RelayEvent)

func (f relayHook) OnRelay(_ context.Context, e idem.RelayEvent) { f(e) }

// notifying is an OutboxStore with a given OutboxNotifier.
type notifying struct {
	idemdriver.OutboxStore
	idemdriver.OutboxNotifier
}

// lostMarks fails every MarkSent: the relay dies between the broker's
// confirmation and the mark.
type lostMarks struct{ idemdriver.OutboxStore }

func (lostMarks) MarkSent(context.Context, *idemdriver.MarkSentParams) error {
	return errors.New("idemtest: the relay crashed before marking")
}

func outboxCases[TTx any]() []testCase[TTx] {
	return []testCase[TTx]{
		{"EmitCommitSendsOnce", func(t *testing.T, b *bundle[TTx]) {
			c := b.consumer("c", idem.Config{})
			var calls atomic.Int64
			payload := []byte{0, 1, 2, 0xff, 'x'}
			headers := map[string]string{"trace": "t-1", "content-type": "application/octet-stream"}
			var ids []string
			h := func(ctx context.Context, tx TTx, msg idem.Message) error {
				calls.Add(1)
				id1, err := idem.Emit(ctx, idem.OutgoingMessage{Name: "charged", Destination: "payments", Key: "acct-1", Payload: payload, Headers: headers})
				if err != nil {
					return err
				}
				id2, err := idem.Emit(ctx, idem.OutgoingMessage{Destination: "audit", Payload: []byte("a")})
				ids = []string{id1, id2}
				return err
			}
			b.process("first delivery", c, idem.Message{ID: "m1", Payload: []byte("p")}, h, idem.Processed, nil)
			want := []string{idem.OutgoingID(c.Name(), "m1", "charged", 1), idem.OutgoingID(c.Name(), "m1", "", 2)}
			if !slices.Equal(ids, want) {
				t.Errorf("Emit IDs = %q, want %q (OutgoingID)", ids, want)
			}
			b.wantPending("after commit", 2)
			rec := newRecorder()
			r := b.relay(b.outboxOf(), rec, idem.RelayConfig{})
			if res := b.runOnce("relay", r); res.Claimed != 2 || res.Sent != 2 {
				t.Errorf("RunOnce = %+v, want 2 claimed and sent", res)
			}
			if res := b.runOnce("relay again", r); res.Claimed != 0 {
				t.Errorf("second RunOnce claimed %d rows, want 0", res.Claimed)
			}
			b.wantPending("after send", 0)
			got := rec.sentIDs()
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Fatalf("sent %q, want %q once each", got, want)
			}
			for _, m := range rec.sent {
				if m.ID != ids[0] {
					continue
				}
				if m.Destination != "payments" || m.Key != "acct-1" || !bytes.Equal(m.Payload, payload) ||
					!maps.Equal(m.Headers, headers) || m.Consumer != c.Name() || m.SourceID != "m1" || m.Attempts != 1 || m.Seq == 0 || m.CreatedAt.IsZero() {
					t.Errorf("sent %+v, want destination payments, key acct-1, payload %v, headers %v, consumer %q, source m1, attempt 1, a seq and a time",
						m, payload, headers, c.Name())
				}
			}
			b.process("redelivery", c, idem.Message{ID: "m1", Payload: []byte("p")}, h, idem.Duplicate, nil)
			b.wantCalls("after redelivery", &calls, 1)
			b.wantPending("after redelivery", 0)
			if n := len(rec.sentIDs()); n != 2 {
				t.Errorf("messages sent after the redelivery = %d, want 2", n)
			}
		}},
		{"HandlerErrorLeavesNoRows", func(t *testing.T, b *bundle[TTx]) {
			c := b.consumer("c", idem.Config{})
			var failedIDs []string
			fail := func(mode string) idem.Handler[TTx] {
				return func(ctx context.Context, tx TTx, msg idem.Message) error {
					id, err := idem.Emit(ctx, idem.OutgoingMessage{Name: "n", Destination: "d", Payload: []byte("x")})
					if err != nil {
						return err
					}
					failedIDs = append(failedIDs, id)
					if mode == "panic" {
						panic("idemtest: handler panics after emitting")
					}
					return errBoom
				}
			}
			b.process("handler error", c, idem.Message{ID: "m", Payload: []byte("p")}, fail("error"), idem.Failed, errBoom)
			b.process("handler panic", c, idem.Message{ID: "m", Payload: []byte("p")}, fail("panic"), idem.Failed, idem.ErrHandlerPanic)
			b.wantPending("after the failures", 0)
			rec := newRecorder()
			r := b.relay(b.outboxOf(), rec, idem.RelayConfig{})
			if res := b.runOnce("relay", r); res.Claimed != 0 {
				t.Errorf("relay claimed %d rows after rolled-back emissions, want 0", res.Claimed)
			}
			var okID string
			b.process("retry", c, idem.Message{ID: "m", Payload: []byte("p")}, func(ctx context.Context, tx TTx, msg idem.Message) error {
				var err error
				okID, err = idem.Emit(ctx, idem.OutgoingMessage{Name: "n", Destination: "d", Payload: []byte("x")})
				return err
			}, idem.Processed, nil)
			for _, id := range failedIDs {
				if id != okID {
					t.Errorf("a rolled-back processing emitted ID %q, the committed one %q: want the same", id, okID)
				}
			}
			b.drain("send", r, nil)
			if got := rec.sentIDs(); !slices.Equal(got, []string{okID}) {
				t.Errorf("sent %q, want [%q]", got, okID)
			}
		}},
		{"CrashAfterCommitBeforeSend", func(t *testing.T, b *bundle[TTx]) {
			// The consumer's process dies after commit: its relay never ran.
			dead := b.relay(b.outboxOf(), newRecorder(), idem.RelayConfig{})
			c := b.consumer("c", idem.Config{Relay: dead})
			var calls atomic.Int64
			h := b.emitting(c, &calls, one("d", ""))
			for _, id := range []string{"m1", "m2", "m3"} {
				b.process("deliver "+id, c, idem.Message{ID: id, Payload: []byte("p")}, h, idem.Processed, nil)
			}
			rec := newRecorder()
			r := b.relay(b.outboxOf(), rec, idem.RelayConfig{})
			b.drain("another relay sends", r, nil)
			other := b.relay(b.outboxOf(), rec, idem.RelayConfig{})
			if res := b.runOnce("a third relay", other); res.Claimed != 0 {
				t.Errorf("a third relay claimed %d sent rows, want 0", res.Claimed)
			}
			got := rec.sentIDs()
			if len(got) != 3 || len(slices.Compact(slices.Sorted(slices.Values(got)))) != 3 {
				t.Errorf("sent %q, want 3 distinct messages once each", got)
			}
		}},
		{"CrashAfterSendBeforeMark", func(t *testing.T, b *bundle[TTx]) {
			c := b.consumer("c", idem.Config{})
			var calls atomic.Int64
			b.process("deliver", c, idem.Message{ID: "m", Payload: []byte("p")}, b.emitting(c, &calls, one("d", "k")), idem.Processed, nil)
			rec := newRecorder()
			const lease = time.Second
			crashing := b.relay(lostMarks{b.outboxOf()}, rec, idem.RelayConfig{Lease: lease})
			before := time.Now()
			res, err := crashing.RunOnce(b.ctx)
			if res.Claimed != 1 || !errors.Is(err, idem.ErrStore) {
				t.Fatalf("RunOnce with a lost mark = %+v, %v; want 1 claimed and an error matching ErrStore", res, err)
			}
			r := b.relay(b.outboxOf(), rec, idem.RelayConfig{})
			// The lease began after before; a claim that ended within the
			// lease of before ran while it lasted (on a loaded machine the
			// check has no proof to make, and is left out).
			res = b.runOnce("while the lease lasts", r)
			if time.Since(before) < lease && res.Claimed != 0 {
				t.Errorf("a relay claimed %d rows under another's live lease, want 0", res.Claimed)
			}
			b.drain("the lease ends and another relay sends again", r, nil)
			got := rec.sentIDs()
			want := idem.OutgoingID(c.Name(), "m", "", 1)
			if len(got) != 2 || got[0] != want || got[1] != want {
				t.Errorf("sent %q, want %q twice (once before the crash, once after the lease)", got, want)
			}
			if res := b.runOnce("after the mark", r); res.Claimed != 0 {
				t.Errorf("claimed %d rows after they were marked sent, want 0", res.Claimed)
			}
		}},
		{"StaleMarkIsFenced", func(t *testing.T, b *bundle[TTx]) {
			// Relay A's lease runs out while it publishes; B claims the row
			// and is sending it when A's publish fails. A's mark must change
			// nothing: not fail the row B is sending, not end B's lease (a
			// third relay would send the row again, with B still at it).
			c := b.consumer("c", idem.Config{})
			var calls atomic.Int64
			b.process("deliver", c, idem.Message{ID: "m", Payload: []byte("p")}, b.emitting(c, &calls, one("d", "k")), idem.Processed, nil)
			store := b.outboxOf()
			held, finishA := b.overtaken(store, idem.Permanent(errors.New("idemtest: A's publish failed")), idem.RelayConfig{})
			if held[0].Attempts != 2 {
				t.Errorf("B's claim has attempt %d, want 2", held[0].Attempts)
			}
			if err := finishA(); err != nil {
				t.Errorf("A's RunOnce: %v; a fenced mark is not an error", err)
			}
			if st := b.stats(); st.Pending != 1 || st.Failed != 0 {
				t.Errorf("after A's stale permanent failure: %+v, want the row pending (B is sending it), none failed", st)
			}
			// A stale retryable mark (A's attempt, 1) must not end B's lease.
			err := store.MarkFailed(b.ctx, &idemdriver.MarkFailedParams{Rows: []idemdriver.FailedRow{{ID: held[0].ID, Attempt: 1, Error: "stale"}}})
			if err != nil {
				t.Fatalf("stale MarkFailed: %v", err)
			}
			rec := newRecorder()
			if res := b.runOnce("a third relay under B's lease", b.relay(store, rec, idem.RelayConfig{})); res.Claimed != 0 {
				t.Errorf("a third relay claimed %d rows B holds, want 0 (the stale mark ended B's lease)", res.Claimed)
			}
			if err := store.MarkSent(b.ctx, &idemdriver.MarkSentParams{IDs: []string{held[0].ID}}); err != nil {
				t.Fatalf("B's MarkSent: %v", err)
			}
			if st := b.stats(); st.Pending != 0 || st.Failed != 0 {
				t.Errorf("after B's mark: %+v, want nothing pending or failed", st)
			}
			// B's own mark (its attempt) still applies: a fence, not a lock-out.
			b.process("deliver 2", c, idem.Message{ID: "m2", Payload: []byte("p")}, b.emitting(c, &calls, one("d", "k2")), idem.Processed, nil)
			recs, err := store.ClaimOutgoing(b.ctx, &idemdriver.ClaimOutgoingParams{Limit: 10, Lease: time.Hour})
			if err != nil || len(recs) != 1 {
				t.Fatalf("claim m2: %v, %d rows", err, len(recs))
			}
			if err := store.MarkFailed(b.ctx, &idemdriver.MarkFailedParams{Rows: []idemdriver.FailedRow{{ID: recs[0].ID, Attempt: recs[0].Attempts, Permanent: true, Error: "x"}}}); err != nil {
				t.Fatal(err)
			}
			if st := b.stats(); st.Failed != 1 {
				t.Errorf("after the holder's permanent mark: %+v, want 1 failed", st)
			}
		}},
		{"LateSentMarkSparesRowWrittenAgain", lateSentMark[TTx](false)},
		{"LateKeepSentMarkSparesRowWrittenAgain", lateSentMark[TTx](true)},
		{"LateFailedMarkSparesRowWrittenAgain", lateFailedMark[TTx]},
		{"DuplicateFinishesTheJob", func(t *testing.T, b *bundle[TTx]) {
			rec := newRecorder()
			sig := claimSignal{hiddenNotifier{b.outboxOf()}, make(chan struct{}, 16)}
			r := b.relay(sig, rec, idem.RelayConfig{MinPoll: time.Hour, MaxPoll: time.Hour, Retention: -1})
			ctx, cancel := context.WithCancel(b.ctx)
			done := make(chan struct{})
			go func() { defer close(done); _ = r.Run(ctx) }()
			defer func() { cancel(); <-done }()
			if !waitFor(t, sig.claimed, "the relay's first claim") {
				return
			}
			// First processing: its process dies before its relay sends.
			first := b.consumer("c", idem.Config{})
			var calls atomic.Int64
			h := b.emitting(first, &calls, func(m idem.Message) []idem.OutgoingMessage {
				return []idem.OutgoingMessage{{Name: "a", Destination: "d", Payload: []byte("1")}, {Name: "b", Destination: "d", Payload: []byte("2")}}
			})
			b.process("first processing", first, idem.Message{ID: "m", Payload: []byte("p")}, h, idem.Processed, nil)
			// The redelivery reaches a replica whose relay is idle.
			replica := b.consumerOn(b.s.Store, "c", idem.Config{Relay: r})
			b.process("redelivery", replica, idem.Message{ID: "m", Payload: []byte("p")}, h, idem.Duplicate, nil)
			b.wantCalls("after the redelivery", &calls, 1)
			testenv.Eventually(t, realTimeout, "the relay woken by the duplicate sends", func() bool {
				return len(rec.sentIDs()) == 2 && b.stats().Pending == 0
			}, func() string { return fmt.Sprintf("sent %q, %+v", rec.sentIDs(), b.stats()) })
			got := rec.sentIDs()
			slices.Sort(got)
			want := []string{idem.OutgoingID(first.Name(), "m", "a", 1), idem.OutgoingID(first.Name(), "m", "b", 2)}
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("sent %q, want the first processing's %q", got, want)
			}
			b.process("another redelivery", replica, idem.Message{ID: "m", Payload: []byte("p")}, h, idem.Duplicate, nil)
			b.wantPending("after another redelivery", 0)
		}},
		{"Notified", func(t *testing.T, b *bundle[TTx]) {
			if _, ok := b.outboxOf().(idemdriver.OutboxNotifier); !ok {
				t.Log("the store does not notify (idemdriver.OutboxNotifier): relays poll")
				return
			}
			// An idle relay that never polls again and is never woken by a
			// consumer sends what another process commits, once notified.
			rec := newRecorder()
			sig := claimSignal{b.outboxOf(), make(chan struct{}, 16)}
			r := b.relay(notifying{sig, b.outboxOf().(idemdriver.OutboxNotifier)}, rec, idem.RelayConfig{MinPoll: time.Hour, MaxPoll: time.Hour, Retention: -1})
			ctx, cancel := context.WithCancel(b.ctx)
			done := make(chan struct{})
			go func() { defer close(done); _ = r.Run(ctx) }()
			defer func() { cancel(); <-done }()
			// Run claims once at start, and once when its watch begins.
			if !waitFor(t, sig.claimed, "the relay's first claim") || !waitFor(t, sig.claimed, "the claim after the watch began") {
				return
			}
			c := b.consumer("c", idem.Config{})
			var calls atomic.Int64
			b.process("deliver", c, idem.Message{ID: "m", Payload: []byte("p")}, b.emitting(c, &calls, one("d", "")), idem.Processed, nil)
			testenv.Eventually(t, realTimeout, "the notified relay sends", func() bool { return len(rec.sentIDs()) == 1 }, nil)
		}},
		{"TwoRelaysSideBySide", func(t *testing.T, b *bundle[TTx]) {
			c := b.consumer("c", idem.Config{})
			var calls atomic.Int64
			h := b.emitting(c, &calls, one("d", ""))
			const n = 30
			for i := range n {
				b.process("deliver", c, idem.Message{ID: fmt.Sprintf("m%02d", i), Payload: []byte("p")}, h, idem.Processed, nil)
			}
			// Each relay's first Publish waits until the other's has begun,
			// so both hold claimed rows at once.
			var started sync.WaitGroup
			started.Add(2)
			both := make(chan struct{})
			go func() { started.Wait(); close(both) }()
			recs := [2]*recorder{newRecorder(), newRecorder()}
			for _, rec := range recs {
				var once sync.Once
				rec.publish = func([]idem.Outgoing) {
					once.Do(func() {
						started.Done()
						select {
						case <-both:
						case <-time.After(blockTimeout):
						}
					})
				}
			}
			var wg sync.WaitGroup
			errs := make(chan error, 2)
			for i, rec := range recs {
				// The second keeps the rows it sent; the first deletes them.
				r := b.relay(b.outboxOf(), rec, idem.RelayConfig{BatchSize: 5, KeepSent: i == 1})
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						res, err := r.RunOnce(b.ctx)
						if err != nil {
							errs <- err
							return
						}
						if res.Claimed == 0 {
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Errorf("RunOnce: %v", err)
			}
			select {
			case <-both:
			default:
				t.Errorf("the two relays never held claimed rows at once")
			}
			count := map[string]int{}
			for _, rec := range recs {
				for _, id := range rec.sentIDs() {
					count[id]++
				}
			}
			for id, k := range count {
				if k != 1 {
					t.Errorf("message %q sent %d times by two relays side by side, want 1", id, k)
				}
			}
			if len(count) != n {
				t.Errorf("%d distinct messages sent, want %d", len(count), n)
			}
			// Left in the table: the rows the second relay sent and kept,
			// which a purge finds once their retention passed.
			b.wantPending("after both relays", 0)
			kept := int64(len(recs[1].sentIDs()))
			purger := b.relay(b.outboxOf(), newRecorder(), idem.RelayConfig{Retention: time.Millisecond})
			if purged := b.purgeUntil("the kept rows purged", purger, kept); purged != kept {
				t.Errorf("purged %d rows, want the %d the keeping relay sent", purged, kept)
			}
		}},
		{"OrderPerKey", func(t *testing.T, b *bundle[TTx]) {
			c := b.consumer("c", idem.Config{})
			var calls atomic.Int64
			h := b.emitting(c, &calls, func(m idem.Message) []idem.OutgoingMessage {
				return []idem.OutgoingMessage{
					{Name: "k", Destination: "d", Key: "k", Payload: []byte(m.ID)},
					{Name: "j", Destination: "d", Key: "j", Payload: []byte(m.ID)},
					{Name: "other", Destination: "e", Key: "k", Payload: []byte(m.ID)},
				}
			})
			const n = 6
			var order []string // emission order of key (d, k)
			for i := range n {
				id := fmt.Sprintf("m%d", i)
				b.process("deliver "+id, c, idem.Message{ID: id, Payload: []byte("p")}, h, idem.Processed, nil)
				order = append(order, idem.OutgoingID(c.Name(), id, "k", 1))
			}
			rec := newRecorder()
			rec.fail = func(m idem.Outgoing, try int) error {
				if m.ID == order[1] && try < 3 {
					return errors.New("idemtest: broker unavailable")
				}
				return nil
			}
			r := b.relay(b.outboxOf(), rec, idem.RelayConfig{BatchSize: 10})
			b.drain("send everything", r, nil)
			var got []string
			rec.mu.Lock()
			for _, m := range rec.sent {
				if m.Destination == "d" && m.Key == "k" {
					got = append(got, m.ID)
				}
			}
			for _, call := range rec.calls {
				seen := map[[2]string]bool{}
				for _, m := range call {
					k := [2]string{m.Destination, m.Key}
					if seen[k] {
						t.Errorf("one Publish call holds two messages of destination %q, key %q", m.Destination, m.Key)
					}
					seen[k] = true
				}
			}
			// No later message of key (d, k) was tried before order[1] was
			// confirmed (its third try).
			tries, confirmed := map[string]int{}, false
			for _, call := range rec.calls {
				for _, m := range call {
					tries[m.ID]++
					if m.ID == order[2] && !confirmed {
						t.Errorf("message 3 of key k was tried before message 2 was confirmed")
					}
				}
				confirmed = confirmed || tries[order[1]] >= 3
			}
			rec.mu.Unlock()
			if !slices.Equal(got, order) {
				t.Errorf("key k sent in the order %q, want the emission order %q", got, order)
			}
			if tries := rec.triesOf(order[1]); tries != 3 {
				t.Errorf("message 2 of key k tried %d times, want 3 (two failures, then sent)", tries)
			}
		}},
		{"LargeRoundsMarkedSent", func(t *testing.T, b *bundle[TTx]) {
			// More rows than one claim of the default size: each round's
			// rows are all marked sent (more than some stores' statements
			// can name at once), and none is sent twice.
			c := b.consumer("c", idem.Config{})
			const msgs, each = 4, 300
			h := b.emitting(c, new(atomic.Int64), func(m idem.Message) []idem.OutgoingMessage {
				out := make([]idem.OutgoingMessage, each)
				for i := range out {
					out[i] = idem.OutgoingMessage{Destination: "d", Payload: []byte(m.ID)}
				}
				return out
			})
			for i := range msgs {
				b.process("deliver", c, idem.Message{ID: fmt.Sprintf("m%d", i), Payload: []byte("p")}, h, idem.Processed, nil)
			}
			b.wantPending("after commit", msgs*each)
			rec := newRecorder()
			r := b.relay(b.outboxOf(), rec, idem.RelayConfig{})
			if res := b.runOnce("first round", r); res.Claimed != idem.DefaultRelayBatchSize || res.Sent != res.Claimed {
				t.Errorf("first RunOnce = %+v, want %d claimed and sent", res, idem.DefaultRelayBatchSize)
			}
			b.wantPending("after the first round", msgs*each-idem.DefaultRelayBatchSize)
			b.drain("send the rest", r, nil)
			if res := b.runOnce("after the drain", r); res.Claimed != 0 {
				t.Errorf("RunOnce after the drain claimed %d rows, want 0", res.Claimed)
			}
			got := rec.sentIDs()
			slices.Sort(got)
			if len(got) != msgs*each || len(slices.Compact(got)) != msgs*each {
				t.Errorf("sent %d messages, %d distinct, want %d once each", len(rec.sentIDs()), len(got), msgs*each)
			}
		}},
		{"MarkSentMarksExactlyItsIDs", markSentExactly[TTx](false)},
		{"MarkSentKeepMarksExactlyItsIDs", markSentExactly[TTx](true)},
		{"MarkSentClaim", markSentClaim[TTx](false)},
		{"MarkSentKeepClaim", markSentClaim[TTx](true)},
		{"SentRowsDeleted", sentRows[TTx](false)},
		{"SentRowsKept", sentRows[TTx](true)},
		{"MarkFailedMarksExactlyItsRows", func(t *testing.T, b *bundle[TTx]) {
			// One MarkFailed of more rows than one statement of a
			// dialect without arrays names, with IDs that list syntax
			// could misread: each row is marked as asked (failed for
			// good, or pending again after its delay), a row already
			// sent stays sent, a row whose attempt is not the one given
			// is left alone, and no other row changes.
			store := b.outboxOf()
			all := b.emitNamed(250)
			recs, err := store.ClaimOutgoing(b.ctx, &idemdriver.ClaimOutgoingParams{Limit: 2 * len(all), Lease: time.Hour})
			if err != nil || len(recs) != len(all) {
				t.Fatalf("ClaimOutgoing: %v, %d rows, want %d", err, len(recs), len(all))
			}
			sent := all[:10]
			if err := store.MarkSent(b.ctx, &idemdriver.MarkSentParams{IDs: sent}); err != nil {
				t.Fatalf("MarkSent: %v", err)
			}
			for _, bad := range []*idemdriver.MarkFailedParams{
				{},
				{Rows: []idemdriver.FailedRow{{ID: "r-0011", Attempt: 1}, {ID: "r-0011", Attempt: 1}}},
				{Rows: []idemdriver.FailedRow{{ID: "r-0011", Attempt: 0}}},
				{Rows: []idemdriver.FailedRow{{ID: "r-0011", Attempt: 1, RetryAfter: -time.Second}}},
			} {
				if err := store.MarkFailed(b.ctx, bad); !errors.Is(err, idemdriver.ErrInvalidConfig) {
					t.Errorf("MarkFailed(%+v) = %v, want an error matching ErrInvalidConfig", bad.Rows, err)
				}
			}
			var (
				rows                   []idemdriver.FailedRow
				failed, again, waiting = map[string]bool{}, map[string]bool{}, map[string]bool{}
			)
			for i, id := range all {
				f := idemdriver.FailedRow{ID: id, Attempt: 1, Error: "failed: " + id}
				switch {
				case i < 5: // sent: stays sent
					f.Permanent = true
				case i < 10:
					continue // sent, not named
				case i >= 250 || i%4 == 1:
					f.Permanent = true
					failed[id] = true
				case i%4 == 2:
					again[id] = true
				case i%4 == 3:
					f.RetryAfter = time.Hour
					waiting[id] = true
				default: // another attempt's mark: the row stays leased
					f.Attempt = 2
				}
				rows = append(rows, f)
			}
			if err := store.MarkFailed(b.ctx, &idemdriver.MarkFailedParams{Rows: rows}); err != nil {
				t.Fatalf("MarkFailed of %d rows: %v", len(rows), err)
			}
			st := b.stats()
			if st.Failed != int64(len(failed)) || st.Pending != int64(len(all)-len(sent)-len(failed)) {
				t.Errorf("after MarkFailed: %+v, want %d failed and %d pending", st, len(failed), len(all)-len(sent)-len(failed))
			}
			recs, err = store.ClaimOutgoing(b.ctx, &idemdriver.ClaimOutgoingParams{Limit: 2 * len(all), Lease: time.Hour})
			if err != nil {
				t.Fatalf("ClaimOutgoing: %v", err)
			}
			claimed := map[string]bool{}
			for _, r := range recs {
				claimed[r.ID] = true
				if !again[r.ID] {
					t.Errorf("row %q claimed again; only rows marked for a retry without delay may be", r.ID)
				}
				if r.Attempts != 2 {
					t.Errorf("row %q claimed with attempt %d, want 2", r.ID, r.Attempts)
				}
			}
			for id := range again {
				if !claimed[id] {
					t.Errorf("row %q, marked for a retry without delay, not claimed again", id)
				}
			}
		}},
		{"RelayDefaultsHalfFailing", func(t *testing.T, b *bundle[TTx]) {
			// A Run with the default batch size and workers, over more
			// rows than two claims take, whose publisher fails every
			// other message on its first try: the first publish waits
			// until a second round, on other rows, is publishing too;
			// each failed message is retried and confirmed once, every
			// row ends sent, and none is sent twice once confirmed.
			const n = 2*idem.DefaultRelayBatchSize + 500
			store := b.outboxOf()
			all := make([]string, n)
			msgs := make([]idemdriver.OutgoingRecord, n)
			failFirst := map[string]bool{}
			for i := range all {
				all[i] = fmt.Sprintf("h-%05d", i)
				msgs[i] = idemdriver.OutgoingRecord{ID: all[i], Destination: "d", Payload: []byte(all[i])}
				failFirst[all[i]] = i%2 == 1
			}
			tx := b.begin()
			if err := b.s.Store.(idemdriver.OutboxTx[TTx]).EmitTx(b.ctx, tx, &idemdriver.EmitParams{Consumer: "c", Messages: msgs}); err != nil {
				b.rollback(tx)
				t.Fatalf("EmitTx: %v", err)
			}
			b.commit(tx)
			rec := newRecorder()
			rec.fail = func(m idem.Outgoing, try int) error {
				if failFirst[m.ID] && try == 1 {
					return errors.New("idemtest: broker refused")
				}
				return nil
			}
			var calls atomic.Int64
			second := make(chan struct{})
			rec.publish = func([]idem.Outgoing) {
				switch calls.Add(1) {
				case 1:
					select {
					case <-second:
					case <-time.After(realTimeout):
						t.Errorf("the first publish never saw a second round in flight")
					}
				case 2:
					close(second)
				}
			}
			r := b.relay(store, rec, idem.RelayConfig{})
			ctx, cancel := context.WithCancel(b.ctx)
			done := make(chan struct{})
			go func() { defer close(done); _ = r.Run(ctx) }()
			testenv.Eventually(t, realTimeout, "every row sent", func() bool {
				return b.stats().Pending == 0
			}, func() string { return fmt.Sprintf("%+v, %d confirmed", b.stats(), len(rec.sentIDs())) })
			cancel()
			<-done
			sent := rec.sentIDs()
			slices.Sort(sent)
			if !slices.Equal(sent, all) {
				t.Errorf("confirmed %d messages, %d distinct, want each of %d once", len(rec.sentIDs()), len(slices.Compact(sent)), n)
			}
			for _, id := range all {
				want := 1
				if failFirst[id] {
					want = 2
				}
				if got := rec.triesOf(id); got != want {
					t.Errorf("%s tried %d times, want %d", id, got, want)
				}
			}
			rec.mu.Lock()
			for i, c := range rec.calls {
				if len(c) > idem.DefaultRelayBatchSize {
					t.Errorf("publish %d got %d messages, more than a claim of the default size", i, len(c))
				}
			}
			rec.mu.Unlock()
			if recs, err := store.ClaimOutgoing(b.ctx, &idemdriver.ClaimOutgoingParams{Limit: n, Lease: time.Hour}); err != nil || len(recs) != 0 {
				t.Errorf("ClaimOutgoing after the relay: %d rows, %v; want none", len(recs), err)
			}
		}},
		{"OneFailingDestination", func(t *testing.T, b *bundle[TTx]) {
			c := b.consumer("c", idem.Config{})
			var calls atomic.Int64
			h := b.emitting(c, &calls, func(m idem.Message) []idem.OutgoingMessage {
				return []idem.OutgoingMessage{
					{Name: "good", Destination: "good", Key: "k", Payload: []byte("g")},
					{Name: "missing", Destination: "missing", Key: "k", Payload: []byte("m")},
					{Name: "poison", Destination: "poison", Key: "k", Payload: []byte("p")},
				}
			})
			for _, id := range []string{"m1", "m2"} {
				b.process("deliver "+id, c, idem.Message{ID: id, Payload: []byte("p")}, h, idem.Processed, nil)
			}
			rec := newRecorder()
			rec.fail = func(m idem.Outgoing, try int) error {
				switch m.Destination {
				case "missing":
					return errors.New("idemtest: no such destination")
				case "poison":
					if m.SourceID == "m1" {
						return idem.Permanent(errors.New("idemtest: message too large"))
					}
				}
				return nil
			}
			r := b.relay(b.outboxOf(), rec, idem.RelayConfig{})
			missing := idem.OutgoingID(c.Name(), "m1", "missing", 2)
			poison2 := idem.OutgoingID(c.Name(), "m2", "poison", 3)
			b.drain("the good messages go out, the failing one is retried", r, func() bool {
				got := rec.sentIDs()
				return len(got) == 3 && slices.Contains(got, poison2) && rec.triesOf(missing) >= 3
			})
			for _, id := range rec.sentIDs() {
				if m := idem.OutgoingID(c.Name(), "m2", "missing", 2); id == m || id == missing {
					t.Errorf("a message to the failing destination was reported sent")
				}
			}
			if tries := rec.triesOf(idem.OutgoingID(c.Name(), "m2", "missing", 2)); tries != 0 {
				t.Errorf("the second message of the failing destination's key was tried %d times before the first went out, want 0", tries)
			}
			s := b.stats()
			if s.Pending != 2 || s.Failed != 1 {
				t.Errorf("stats = %+v, want 2 pending (the failing destination's) and 1 failed for good (the poison message)", s)
			}
			if s.OldestPending <= 0 {
				t.Errorf("OldestPending = %v with rows pending, want > 0", s.OldestPending)
			}
		}},
		{"Hooks", func(t *testing.T, b *bundle[TTx]) {
			var emits []idem.EmitEvent
			var rounds []idem.RelayEvent
			var mu sync.Mutex
			c := b.consumer("c", idem.Config{Hooks: []idem.Hook{emitHook(func(e idem.EmitEvent) { mu.Lock(); emits = append(emits, e); mu.Unlock() })}})
			var calls atomic.Int64
			h := b.emitting(c, &calls, func(m idem.Message) []idem.OutgoingMessage {
				return []idem.OutgoingMessage{{Name: "a", Destination: "d"}, {Name: "b", Destination: "e"}}
			})
			b.process("deliver", c, idem.Message{ID: "m", Payload: []byte("p")}, h, idem.Processed, nil)
			b.process("redeliver", c, idem.Message{ID: "m", Payload: []byte("p")}, h, idem.Duplicate, nil)
			rec := newRecorder()
			rec.fail = func(m idem.Outgoing, try int) error {
				if m.Destination == "e" {
					return errors.New("idemtest: down")
				}
				return nil
			}
			r := b.relay(b.outboxOf(), rec, idem.RelayConfig{Hooks: []idem.Hook{relayHook(func(e idem.RelayEvent) { rounds = append(rounds, e) })}})
			b.runOnce("relay", r)
			b.runOnce("relay, nothing claimable", r)
			mu.Lock()
			defer mu.Unlock()
			if len(emits) != 1 || emits[0] != (idem.EmitEvent{Consumer: c.Name(), MessageID: "m", Count: 2}) {
				t.Errorf("emit events %+v, want one with 2 messages of message m", emits)
			}
			if len(rounds) < 1 || rounds[0].Result != (idem.RelayResult{Claimed: 2, Sent: 1, Retried: 1}) || rounds[0].Err != nil || rounds[0].OldestAge < 0 {
				t.Errorf("relay events %+v, want first 2 claimed, 1 sent, 1 retried", rounds)
			}
		}},
		{"InvalidEmissions", func(t *testing.T, b *bundle[TTx]) {
			if _, err := idem.Emit(b.ctx, idem.OutgoingMessage{Destination: "d"}); !errors.Is(err, idem.ErrNoOutbox) {
				t.Errorf("Emit outside a handler: %v, want ErrNoOutbox", err)
			}
			c := b.consumer("c", idem.Config{})
			cases := []struct {
				name string
				ms   []idem.OutgoingMessage
			}{
				{"no destination", []idem.OutgoingMessage{{Payload: []byte("x")}}},
				{"control character", []idem.OutgoingMessage{{Destination: "d\n"}}},
				{"name twice", []idem.OutgoingMessage{{Name: "n", Destination: "d"}, {Name: "n", Destination: "e"}}},
			}
			for i, tc := range cases {
				var emitErr error
				h := func(ctx context.Context, tx TTx, msg idem.Message) error {
					for _, m := range tc.ms {
						if _, emitErr = idem.Emit(ctx, m); emitErr != nil {
							return emitErr
						}
					}
					return nil
				}
				b.process(tc.name, c, idem.Message{ID: fmt.Sprintf("m%d", i), Payload: []byte("p")}, h, idem.Failed, idem.ErrInvalidOutgoing)
			}
			var late context.Context
			b.process("valid", c, idem.Message{ID: "ok", Payload: []byte("p")}, func(ctx context.Context, tx TTx, msg idem.Message) error {
				late = ctx
				_, err := idem.Emit(ctx, idem.OutgoingMessage{Destination: "d"})
				return err
			}, idem.Processed, nil)
			if _, err := idem.Emit(late, idem.OutgoingMessage{Destination: "d"}); !errors.Is(err, idem.ErrNoOutbox) {
				t.Errorf("Emit after the handler returned: %v, want ErrNoOutbox", err)
			}
			b.wantPending("after the invalid emissions", 1)
		}},
		{"Batch", func(t *testing.T, b *bundle[TTx]) {
			c := b.consumer("c", idem.Config{})
			batch := msgs("b", 3)
			outs, err := c.ProcessBatch(b.ctx, batch, func(ctx context.Context, tx TTx, ms []idem.Message) error {
				if _, err := idem.Emit(ctx, idem.OutgoingMessage{Destination: "d"}); !errors.Is(err, idem.ErrNoOutbox) {
					return fmt.Errorf("Emit in a batch handler: %v, want ErrNoOutbox", err)
				}
				for _, m := range ms {
					if _, err := idem.EmitFor(ctx, m.ID, idem.OutgoingMessage{Name: "n", Destination: "d", Payload: m.Payload}); err != nil {
						return err
					}
				}
				_, err := idem.EmitFor(ctx, "not-in-batch", idem.OutgoingMessage{Destination: "d"})
				if !errors.Is(err, idem.ErrNoOutbox) {
					return fmt.Errorf("EmitFor another message: %v, want ErrNoOutbox", err)
				}
				return nil
			})
			if err != nil {
				t.Fatalf("ProcessBatch: %v (%v)", err, outs)
			}
			rec := newRecorder()
			b.drain("send", b.relay(b.outboxOf(), rec, idem.RelayConfig{}), nil)
			var want []string
			for _, m := range batch {
				want = append(want, idem.OutgoingID(c.Name(), m.ID, "n", 1))
			}
			got := rec.sentIDs()
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("sent %q, want %q", got, want)
			}
		}},
		{"Purge", func(t *testing.T, b *bundle[TTx]) {
			c := b.consumer("c", idem.Config{})
			var calls atomic.Int64
			b.process("deliver", c, idem.Message{ID: "m", Payload: []byte("p")}, b.emitting(c, &calls, one("d", "")), idem.Processed, nil)
			b.process("deliver", c, idem.Message{ID: "n", Payload: []byte("p")}, b.emitting(c, &calls, one("d", "")), idem.Processed, nil)
			r := b.relay(b.outboxOf(), newRecorder(), idem.RelayConfig{KeepSent: true, Retention: time.Millisecond, PurgeBatchSize: 1})
			if n, err := r.Purge(b.ctx); err != nil || n != 0 {
				t.Errorf("Purge before sending = %d, %v; want 0 (pending rows are never purged)", n, err)
			}
			b.drain("send", r, nil)
			if purged := b.purgeUntil("sent rows purged after their retention", r, 2); purged != 2 {
				t.Errorf("purged %d rows, want 2", purged)
			}
			if res := b.runOnce("after purge", r); res.Claimed != 0 {
				t.Errorf("claimed %d rows after purge, want 0", res.Claimed)
			}
		}},
		// Every relay purges on its own interval, so relays side by side
		// purge at once. Their batches must not wait for each other's row
		// locks, nor deadlock (as two DELETEs that lock overlapping rows
		// in different orders do), and together they must delete every
		// sent row exactly once.
		{"ConcurrentPurges", func(t *testing.T, b *bundle[TTx]) {
			const rows, purgers = 400, 4
			c := b.consumer("c", idem.Config{})
			var calls atomic.Int64
			b.process("deliver", c, idem.Message{ID: "m", Payload: []byte("p")}, b.emitting(c, &calls, func(idem.Message) []idem.OutgoingMessage {
				out := make([]idem.OutgoingMessage, rows)
				for i := range out {
					out[i] = idem.OutgoingMessage{Name: "n" + strconv.Itoa(i), Destination: "d"}
				}
				return out
			}), idem.Processed, nil)
			b.drain("send", b.relay(b.outboxOf(), newRecorder(), idem.RelayConfig{BatchSize: rows, KeepSent: true}), nil)
			relays := make([]*idem.Relay, purgers)
			for i := range relays {
				relays[i] = b.relay(b.outboxOf(), newRecorder(), idem.RelayConfig{Retention: time.Millisecond, PurgeBatchSize: 10})
			}
			var purged atomic.Int64
			testenv.Eventually(t, realTimeout, "sent rows purged by relays side by side", func() bool {
				start := make(chan struct{})
				errs := make(chan error, purgers)
				for _, r := range relays {
					go func() {
						<-start
						n, err := r.Purge(b.ctx)
						purged.Add(n)
						errs <- err
					}()
				}
				close(start)
				for range purgers {
					if err := <-errs; err != nil {
						t.Fatalf("Purge beside %d other relays: %v", purgers-1, err)
					}
				}
				return purged.Load() >= rows
			}, func() string { return fmt.Sprintf("%d purged", purged.Load()) })
			if n := purged.Load(); n != rows {
				t.Errorf("purged %d rows in all, want %d", n, rows)
			}
			if s := b.stats(); s.Pending != 0 || s.Failed != 0 {
				t.Errorf("after the purges: %+v, want nothing pending or failed", s)
			}
		}},
	}
}

// markSentExactly is the case MarkSentMarksExactlyItsIDs, with keep as
// MarkSentParams.Keep: MarkSent with no IDs changes nothing; with
// thousands of IDs (more than one IN list holds), listed twice, mixed
// with IDs of no row and of rows already sent, and with IDs that array or
// list syntax could misread, it ends exactly the rows named (deleted, or
// marked sent and kept): the others are the next claim's, whole. A row it
// deleted leaves its ID free (emitted again, it is a new pending row); a
// row it kept holds its ID.
func markSentExactly[TTx any](keep bool) func(t *testing.T, b *bundle[TTx]) {
	return func(t *testing.T, b *bundle[TTx]) {
		store := b.outboxOf()
		all := b.emitNamed(1201)
		total := int64(len(all))
		b.wantPending("after the emit", total)
		mark := func(what string, ids []string) {
			t.Helper()
			if err := store.MarkSent(b.ctx, &idemdriver.MarkSentParams{IDs: ids, Keep: keep}); err != nil {
				t.Fatalf("%s: MarkSent of %d IDs: %v", what, len(ids), err)
			}
		}
		mark("no IDs (nil)", nil)
		mark("no IDs (empty)", []string{})
		b.wantPending("after marking no IDs", total)

		// Every other numbered row and every odd one, each named
		// twice: half of them before 3,000 IDs of no row, half after.
		want := map[string]bool{} // marked sent
		var ids []string
		for i, id := range all {
			if i%2 == 0 || i >= 1201 {
				want[id] = true
				ids = append(ids, id)
			}
		}
		var names []string
		for _, id := range ids[:len(ids)/2] {
			names = append(names, id, id)
		}
		for i := range 3000 {
			names = append(names, fmt.Sprintf("absent-%d", i))
		}
		for _, id := range ids[len(ids)/2:] {
			names = append(names, id, id)
		}
		mark("thousands of IDs", names)
		b.wantPending("after the big mark", total-int64(len(want)))

		// Marking the sent rows again, with one more, marks that one.
		mark("sent rows again", append(slices.Clone(ids), "r-0001"))
		want["r-0001"] = true
		b.wantPending("after marking sent rows again", total-int64(len(want)))
		mark("one ID", []string{"r-0003"})
		want["r-0003"] = true
		b.wantPending("after marking one ID", total-int64(len(want)))

		recs, err := store.ClaimOutgoing(b.ctx, &idemdriver.ClaimOutgoingParams{Limit: 2 * len(all), Lease: time.Hour})
		if err != nil {
			t.Fatalf("ClaimOutgoing: %v", err)
		}
		claimed := map[string]bool{}
		for _, r := range recs {
			if want[r.ID] {
				t.Errorf("row %q claimed after it was marked sent", r.ID)
			}
			if !bytes.Equal(r.Payload, []byte(r.ID)) {
				t.Errorf("row %q claimed with payload %q, want its ID", r.ID, r.Payload)
			}
			claimed[r.ID] = true
		}
		for _, id := range all {
			if !want[id] && !claimed[id] {
				t.Errorf("row %q neither marked sent nor claimed", id)
			}
		}
		if len(recs) != len(all)-len(want) {
			t.Errorf("claimed %d rows, want %d", len(recs), len(all)-len(want))
		}
		// Emitted again, a deleted row's ID is a new pending row; a
		// kept row's is left as it is.
		again := []string{"r-0000", "r-0001", "NULL", "a,b"}
		tx := b.begin()
		msgs := make([]idemdriver.OutgoingRecord, len(again))
		for i, id := range again {
			msgs[i] = idemdriver.OutgoingRecord{ID: id, Destination: "d", Payload: []byte("again")}
		}
		if err := b.s.Store.(idemdriver.OutboxTx[TTx]).EmitTx(b.ctx, tx, &idemdriver.EmitParams{Consumer: "c", Messages: msgs}); err != nil {
			b.rollback(tx)
			t.Fatalf("EmitTx: %v", err)
		}
		b.commit(tx)
		recs, err = store.ClaimOutgoing(b.ctx, &idemdriver.ClaimOutgoingParams{Limit: 2 * len(all), Lease: time.Hour})
		if err != nil {
			t.Fatalf("ClaimOutgoing: %v", err)
		}
		wantAgain := len(again)
		if keep {
			wantAgain = 0
		}
		if len(recs) != wantAgain {
			t.Errorf("keep %v: %d of %d ended rows emitted again were claimed, want %d", keep, len(recs), len(again), wantAgain)
		}
		for _, r := range recs {
			if !slices.Contains(again, r.ID) || string(r.Payload) != "again" || r.Attempts != 1 {
				t.Errorf("claimed %q (payload %q, attempt %d), want a new row of one of %q", r.ID, r.Payload, r.Attempts, again)
			}
		}

	}
}

// lateFailedMark: relay A's lease runs out while it publishes; B claims
// the row, sends it and deletes it; the same ID is written again and
// relay C claims the new row, its first attempt, as A's was; then A's
// publish fails for good. A's mark must leave the new row alone: not
// fail it, not end C's lease.
func lateFailedMark[TTx any](t *testing.T, b *bundle[TTx]) {
	store := b.outboxOf()
	emit := func() { b.emitOne("again") }
	emit()
	held, finishA := b.overtaken(store, idem.Permanent(errors.New("idemtest: A's publish failed")), idem.RelayConfig{})
	if err := store.MarkSent(b.ctx, &idemdriver.MarkSentParams{IDs: []string{held[0].ID}, Seqs: []int64{held[0].Seq}}); err != nil {
		t.Fatalf("B's MarkSent: %v", err)
	}
	emit()
	c, err := store.ClaimOutgoing(b.ctx, &idemdriver.ClaimOutgoingParams{Limit: 10, Lease: time.Hour})
	if err != nil || len(c) != 1 || c[0].Attempts != 1 {
		t.Fatalf("C's claim of the row written again: %+v, %v; want it, attempt 1", c, err)
	}
	if err := finishA(); err != nil {
		t.Fatalf("A's RunOnce: %v", err)
	}
	if st := b.stats(); st.Pending != 1 || st.Failed != 0 {
		t.Errorf("after A's late failure: %+v, want the new row pending (C sends it), none failed", st)
	}
	if res := b.runOnce("a fourth relay under C's lease", b.relay(store, newRecorder(), idem.RelayConfig{})); res.Claimed != 0 {
		t.Errorf("a fourth relay claimed %d rows C holds, want 0 (A's mark ended C's lease)", res.Claimed)
	}
	if err := store.MarkSent(b.ctx, &idemdriver.MarkSentParams{IDs: []string{c[0].ID}, Seqs: []int64{c[0].Seq}}); err != nil {
		t.Fatalf("C's MarkSent: %v", err)
	}
	b.wantPending("at the end", 0)
}

// lateSentMark: relay A's lease runs out while it publishes; B claims the
// row, sends it and deletes it; the same ID is written again (a new row,
// to be sent again); then A's publish is confirmed. A's mark (a delete,
// or with keep an update to sent) must end the row it claimed, which is
// gone, and leave the new row pending, to be sent.
func lateSentMark[TTx any](keep bool) func(t *testing.T, b *bundle[TTx]) {
	return func(t *testing.T, b *bundle[TTx]) {
		store := b.outboxOf()
		emit := func() { b.emitOne("again") }
		emit()
		held, finishA := b.overtaken(store, nil, idem.RelayConfig{KeepSent: keep})
		if err := store.MarkSent(b.ctx, &idemdriver.MarkSentParams{IDs: []string{held[0].ID}, Seqs: []int64{held[0].Seq}}); err != nil {
			t.Fatalf("B's MarkSent: %v", err)
		}
		b.wantPending("after B's send", 0)
		emit()
		b.wantPending("the ID written again", 1)
		if err := finishA(); err != nil {
			t.Fatalf("A's RunOnce: %v", err)
		}
		b.wantPending("after A's late mark", 1)
		rec := newRecorder()
		if res := b.runOnce("a third relay", b.relay(store, rec, idem.RelayConfig{})); res.Sent != 1 {
			t.Errorf("a third relay sent %+v, want the row written again", res)
		}
		b.wantPending("at the end", 0)
		err := store.MarkSent(b.ctx, &idemdriver.MarkSentParams{IDs: []string{"again"}, Seqs: []int64{1, 2}})
		if !errors.Is(err, idemdriver.ErrInvalidConfig) {
			t.Errorf("MarkSent of 1 ID with 2 seqs: %v, want ErrInvalidConfig", err)
		}

	}
}

// sentRows runs a relay with KeepSent set to keep over a message sent at
// once and one that fails for good: without keep the sent row is gone at
// once (emitted again, its ID makes a new row; the purge finds only the
// failed row); with keep it stays, holding its ID, until the purge
// deletes it with the failed row once their retention passed.
func sentRows[TTx any](keep bool) func(t *testing.T, b *bundle[TTx]) {
	return func(t *testing.T, b *bundle[TTx]) {
		c := b.consumer("c", idem.Config{})
		var calls atomic.Int64
		h := b.emitting(c, &calls, func(m idem.Message) []idem.OutgoingMessage {
			return []idem.OutgoingMessage{{Name: "ok", Destination: "d", Key: "k", Payload: []byte("1")}, {Name: "bad", Destination: "poison", Payload: []byte("2")}}
		})
		b.process("deliver", c, idem.Message{ID: "m", Payload: []byte("p")}, h, idem.Processed, nil)
		rec := newRecorder()
		rec.fail = func(m idem.Outgoing, try int) error {
			if m.Destination == "poison" {
				return idem.Permanent(errors.New("idemtest: message too large"))
			}
			return nil
		}
		r := b.relay(b.outboxOf(), rec, idem.RelayConfig{KeepSent: keep, Retention: time.Millisecond})
		if res := b.runOnce("relay", r); res.Claimed != 2 || res.Sent != 1 || res.Failed != 1 {
			t.Fatalf("RunOnce = %+v, want 2 claimed, 1 sent, 1 failed", res)
		}
		if st := b.stats(); st.Pending != 0 || st.Failed != 1 {
			t.Errorf("after the round: %+v, want nothing pending and 1 failed", st)
		}
		ok := idem.OutgoingID(c.Name(), "m", "ok", 1)
		wantPurged := int64(1) // the failed row
		if keep {
			wantPurged = 2 // and the kept one
		}
		if purged := b.purgeUntil("done rows purged after their retention", r, wantPurged); purged != wantPurged {
			t.Errorf("keep %v: purged %d rows, want %d", keep, purged, wantPurged)
		}
		if st := b.stats(); st.Pending != 0 || st.Failed != 0 {
			t.Errorf("after the purge: %+v, want nothing pending or failed", st)
		}
		// The sent row is gone either way now: its ID makes a new row.
		tx := b.begin()
		if err := b.s.Store.(idemdriver.OutboxTx[TTx]).EmitTx(b.ctx, tx, &idemdriver.EmitParams{Consumer: "c", Messages: []idemdriver.OutgoingRecord{{ID: ok, Destination: "d", Key: "k", Payload: []byte("1")}}}); err != nil {
			b.rollback(tx)
			t.Fatalf("EmitTx: %v", err)
		}
		b.commit(tx)
		b.wantPending("the sent row's ID emitted again", 1)
		if got := rec.sentIDs(); len(got) != 1 || got[0] != ok {
			t.Errorf("sent %q, want [%q]", got, ok)
		}
	}
}
