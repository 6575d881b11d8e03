// Package idemtest is the conformance suite every idem store must pass.
//
// A store's own test module calls [Run] with a [Harness] that builds fresh,
// isolated [Setup]s:
//
//	func TestConformance(t *testing.T) {
//		idemtest.Run(t, idemtest.Harness[pgx.Tx]{New: newSetup})
//	}
//
// Run drives the store through [idem.Consumer] and, for the seam's own
// contract, directly through [idemdriver.TxStore]. It checks outcomes against the
// store's actual state (side-effect rows, processed records, handler calls),
// not just the absence of errors, on the paths that make idempotency hard:
// redelivery, handler failure and panic, concurrent copies of one message,
// byte-exact message IDs, payload fingerprints on every duplicate path,
// transactions held by the caller, injected store faults, batches, and
// downtime-safe retention. Every case is a parallel subtest with its own
// Setup; a violation is reported with t.Errorf giving what was expected and
// what happened, so one run lists them all.
//
// The suite uses no sleeps. Concurrency is driven by barriers and channels;
// a few waits are bounded by generous timeouts so that a store which blocks
// where it must not fails with a message instead of hanging the test binary,
// and Purge/ConcurrentPurges gives a second cleaner that waits for the purge
// lock (rather than returning ErrPurgeInProgress) 200ms to misbehave.
//
// What a store must do beyond the TxStore contract, as the cases check it:
// errors from an ended context match it (context.Canceled); a claim of a key
// the same transaction already claimed reports Claimed=false with that
// fingerprint; Purge validates its parameters with ValidatePurgeParams,
// calls OnBatch after each batch outside the batch's transaction, releases
// its lock even when its context ends, and reports a Horizon within an hour
// of the newest record (server clock) minus the window.
//
// A store that implements [idemdriver.LeaseStore] also calls [RunLease] with a
// [LeaseHarness]; its [LeaseSetup] ends leases on demand (ExpireLease), so
// the lease cases need no injected clock. RunLease's doc lists what a lease
// store must do beyond the LeaseStore contract.
//
// A store that implements the outbox (idemdriver.OutboxTx and
// idemdriver.OutboxStore) also calls [RunOutbox] with its Harness.
//
// A store change without a case here that covers it is incomplete.
package idemtest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
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

// caseTimeout bounds every case: a store that deadlocks fails the case with
// an error naming the deadline instead of hanging until the test binary's
// own timeout.
const caseTimeout = 2 * time.Minute

// blockTimeout bounds the waits for something that must happen without
// help, such as a Process call completing while a purge is paused between
// batches.
const blockTimeout = 30 * time.Second

// errBoom is the error the suite's failing handlers return.
var errBoom = errors.New("idemtest: handler failed on purpose")

// testCase is one named conformance case.
type testCase[TTx any] struct {
	name string
	run  func(t *testing.T, b *bundle[TTx])
}

// Run runs the conformance suite against the store that h builds. Each case
// is a parallel subtest that calls h.New for a fresh Setup.
func Run[TTx any](t *testing.T, h Harness[TTx]) {
	t.Helper()
	if h.New == nil {
		t.Fatal("idemtest: Harness.New is nil")
	}
	nonce := newNonce()
	groups := []struct {
		name  string
		cases []testCase[TTx]
	}{
		{"Process", processCases[TTx]()},
		{"IDs", idCases[TTx]()},
		{"Consumers", consumerCases[TTx]()},
		{"Fingerprint", fingerprintCases[TTx]()},
		{"Tx", txCases[TTx]()},
		{"Batch", batchCases[TTx]()},
		{"Fault", faultCases[TTx]()},
		{"Purge", purgeCases[TTx]()},
		{"Lifecycle", lifecycleCases[TTx]()},
		{"Store", storeCases[TTx]()},
		{"Mixed", mixedCases[TTx]()},
		{"Deadline", deadlineCases[TTx]()},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			for _, c := range g.cases {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					c.run(t, newBundle(t, h, nonce, g.name+"."+c.name))
				})
			}
		})
	}
}

func newNonce() string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// bundle is one case's state: its Setup, a context bounded by caseTimeout,
// and a prefix that makes its consumer names unique.
type bundle[TTx any] struct {
	t      *testing.T
	h      Harness[TTx]
	s      *Setup[TTx]
	ctx    context.Context
	nonce  string
	prefix string
}

func newBundle[TTx any](t *testing.T, h Harness[TTx], nonce, name string) *bundle[TTx] {
	t.Helper()
	s := h.New(t)
	switch {
	case s == nil:
		t.Fatal("idemtest: Harness.New returned nil")
	case s.Store == nil, s.WriteEffect == nil, s.CountEffects == nil, s.CountRecords == nil, s.Shift == nil:
		t.Fatal("idemtest: Setup has a nil field; Store, WriteEffect, CountEffects, CountRecords and Shift are all required")
	}
	ctx, cancel := context.WithTimeout(t.Context(), caseTimeout)
	t.Cleanup(cancel)
	return &bundle[TTx]{t: t, h: h, s: s, ctx: ctx, nonce: nonce, prefix: "idemtest-" + nonce + "-" + name}
}

// fresh returns a new bundle with its own Setup, for a nested subtest.
func (b *bundle[TTx]) fresh(t *testing.T, name string) *bundle[TTx] {
	t.Helper()
	return newBundle(t, b.h, b.nonce, strings.TrimPrefix(b.prefix, "idemtest-"+b.nonce+"-")+"."+name)
}

// name returns the unique consumer name for suffix.
func (b *bundle[TTx]) name(suffix string) string { return b.prefix + "." + suffix }

// consumer returns a Consumer named b.name(suffix) over the Setup's store,
// closed at the end of the test. The purge loop is off unless cfg sets
// PurgeInterval, and StoreTimeout is the case's timeout unless cfg sets it.
func (b *bundle[TTx]) consumer(suffix string, cfg idem.Config) *idem.Consumer[TTx] {
	b.t.Helper()
	return b.consumerOn(b.s.Store, suffix, cfg)
}

func (b *bundle[TTx]) consumerOn(store idemdriver.TxStore[TTx], suffix string, cfg idem.Config) *idem.Consumer[TTx] {
	b.t.Helper()
	cfg.Name = b.name(suffix)
	if cfg.PurgeInterval == 0 {
		cfg.PurgeInterval = -1
	}
	if cfg.StoreTimeout == 0 {
		// The cases about claims let concurrent copies queue on a record
		// for as long as a loaded machine makes them; the Deadline cases
		// set their own.
		cfg.StoreTimeout = caseTimeout
	}
	c, err := idem.NewConsumer(store, cfg)
	if err != nil {
		b.t.Fatalf("NewConsumer(%q): %v", cfg.Name, err)
	}
	b.t.Cleanup(func() { _ = c.Close() })
	return c
}

// key is the side-effect key of message id for consumer: printable ASCII of
// at most 100 bytes whatever the ID, so the effect table's own collation or
// column size plays no part in what is tested.
func key(consumer, id string) string {
	sum := sha256.Sum256([]byte(id))
	k := consumer
	if len(k) > 60 {
		ks := sha256.Sum256([]byte(k))
		k = hex.EncodeToString(ks[:8])
	}
	return k + "/" + hex.EncodeToString(sum[:12])
}

// handler returns a handler that counts its calls and writes one effect
// row keyed by (consumer, message ID) in the claim's transaction.
func (b *bundle[TTx]) handler(c *idem.Consumer[TTx], calls *atomic.Int64) idem.Handler[TTx] {
	name := c.Name()
	return func(ctx context.Context, tx TTx, msg idem.Message) error {
		calls.Add(1)
		return b.s.WriteEffect(ctx, tx, key(name, msg.ID))
	}
}

// batchHandler returns a batch handler that records the IDs of each call
// and writes one effect row per message.
func (b *bundle[TTx]) batchHandler(c *idem.Consumer[TTx], calls *batchCalls) idem.BatchHandler[TTx] {
	name := c.Name()
	return func(ctx context.Context, tx TTx, msgs []idem.Message) error {
		calls.add(msgs)
		for _, m := range msgs {
			if err := b.s.WriteEffect(ctx, tx, key(name, m.ID)); err != nil {
				return err
			}
		}
		return nil
	}
}

// batchCalls records the messages of each call of a batch handler.
type batchCalls struct {
	mu    sync.Mutex
	calls [][]idem.Message
}

func (c *batchCalls) add(msgs []idem.Message) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, append([]idem.Message(nil), msgs...))
}

// ids returns the message IDs of each call.
func (c *batchCalls) ids() [][]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([][]string, len(c.calls))
	for i, msgs := range c.calls {
		out[i] = msgIDs(msgs)
	}
	return out
}

// wantOutcome checks one delivery's outcome (checkOutcome).
func (b *bundle[TTx]) wantOutcome(what, id string, out idem.Outcome, err error, want idem.Status, wantErr error) {
	b.t.Helper()
	checkOutcome(b.t, what, id, out, err, want, wantErr)
}

// checkOutcome checks one delivery's outcome, transactional or lease
// mode: its status, its MessageID, that the returned error is out.Err,
// that the error matches wantErr (nil: no error), and Ack.
func checkOutcome(t *testing.T, what, id string, out idem.Outcome, err error, want idem.Status, wantErr error) {
	t.Helper()
	if out.Status != want {
		t.Errorf("%s: status = %v, want %v (err: %v)", what, out.Status, want, err)
	}
	if out.MessageID != id {
		t.Errorf("%s: Outcome.MessageID = %q, want %q", what, out.MessageID, id)
	}
	if err != out.Err {
		t.Errorf("%s: returned error %v is not Outcome.Err %v", what, err, out.Err)
	}
	switch {
	case wantErr == nil && err != nil:
		t.Errorf("%s: err = %v, want nil", what, err)
	case wantErr != nil && !errors.Is(err, wantErr):
		t.Errorf("%s: err = %v, want an error matching %v", what, err, wantErr)
	}
	if got, want := out.Ack(), want == idem.Processed || want == idem.Duplicate; got != want {
		t.Errorf("%s: Outcome.Ack() = %v, want %v", what, got, want)
	}
}

// wantEffects checks the committed effect rows of (consumer, id).
func (b *bundle[TTx]) wantEffects(what, consumer, id string, want int) {
	b.t.Helper()
	got, err := b.s.CountEffects(b.ctx, key(consumer, id))
	if err != nil {
		b.t.Fatalf("%s: CountEffects: %v", what, err)
	}
	if got != want {
		b.t.Errorf("%s: effect rows for message %q = %d, want %d", what, id, got, want)
	}
}

// wantEffectKey checks the committed effect rows with a raw key.
func (b *bundle[TTx]) wantEffectKey(what, k string, want int) {
	b.t.Helper()
	got, err := b.s.CountEffects(b.ctx, k)
	if err != nil {
		b.t.Fatalf("%s: CountEffects: %v", what, err)
	}
	if got != want {
		b.t.Errorf("%s: effect rows with key %q = %d, want %d", what, k, got, want)
	}
}

// wantRecords checks the committed processed records of consumer.
func (b *bundle[TTx]) wantRecords(what, consumer string, want int) {
	b.t.Helper()
	got, err := b.s.CountRecords(b.ctx, consumer)
	if err != nil {
		b.t.Fatalf("%s: CountRecords: %v", what, err)
	}
	if got != want {
		b.t.Errorf("%s: processed records of consumer %q = %d, want %d", what, consumer, got, want)
	}
}

// wantCalls checks a handler call counter.
func (b *bundle[TTx]) wantCalls(what string, calls *atomic.Int64, want int64) {
	b.t.Helper()
	if got := calls.Load(); got != want {
		b.t.Errorf("%s: handler calls = %d, want %d", what, got, want)
	}
}

// begin starts a transaction on the Setup's store.
func (b *bundle[TTx]) begin() TTx {
	b.t.Helper()
	tx, err := b.s.Store.Begin(b.ctx)
	if err != nil {
		b.t.Fatalf("Store.Begin: %v", err)
	}
	return tx
}

func (b *bundle[TTx]) commit(tx TTx) {
	b.t.Helper()
	if err := b.s.Store.Commit(b.ctx, tx); err != nil {
		b.t.Fatalf("Store.Commit: %v", err)
	}
}

func (b *bundle[TTx]) rollback(tx TTx) {
	b.t.Helper()
	if err := b.s.Store.Rollback(b.ctx, tx); err != nil {
		b.t.Fatalf("Store.Rollback: %v", err)
	}
}

// process delivers msg and requires want.
func (b *bundle[TTx]) process(what string, c *idem.Consumer[TTx], msg idem.Message, h idem.Handler[TTx], want idem.Status, wantErr error) idem.Outcome {
	b.t.Helper()
	out, err := c.Process(b.ctx, msg, h)
	b.wantOutcome(what, msg.ID, out, err, want, wantErr)
	return out
}

// msgs returns n messages with IDs prefix0..prefixN-1 and distinct payloads.
func msgs(prefix string, n int) []idem.Message {
	out := make([]idem.Message, n)
	for i := range out {
		id := fmt.Sprintf("%s%d", prefix, i)
		out[i] = idem.Message{ID: id, Payload: []byte("payload of " + id)}
	}
	return out
}

func msgIDs(ms []idem.Message) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}

// waitFor waits for ch to close, failing the test after blockTimeout.
func waitFor(t *testing.T, ch <-chan struct{}, what string) bool {
	t.Helper()
	select {
	case <-ch:
		return true
	case <-time.After(blockTimeout):
		t.Errorf("%s: not done after %v", what, blockTimeout)
		return false
	}
}

// statusCounts counts outcomes by status.
func statusCounts(outs []idem.Outcome) map[idem.Status]int {
	m := map[idem.Status]int{}
	for _, o := range outs {
		m[o.Status]++
	}
	return m
}
