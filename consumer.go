package idem

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"github.com/idem-go/idem/idemdriver"
	"log/slog"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"time"
)

// Defaults applied by [NewConsumer] to zero Config fields.
const (
	// DefaultRetentionWindow is how long processed message IDs are kept.
	DefaultRetentionWindow = 7 * 24 * time.Hour
	// DefaultPurgeInterval is the period of the background purge loop.
	DefaultPurgeInterval = time.Hour
	// DefaultPurgeBatchSize is the most rows one purge DELETE removes.
	DefaultPurgeBatchSize = 1000
	// DefaultPurgeDutyCycle is the share of its elapsed time a purge's
	// batches take by default (see PurgeParams.DutyCycle): a purge keeps
	// at most a fifth of one connection busy, so that a purge of a large
	// backlog does not take the server from the processing for its whole
	// duration. Measured (BenchmarkPurgeCost in store/idempgxv5:
	// PostgreSQL 15 on 2 cores, 1,000-row batches of a 1M-record backlog,
	// 8 workers processing beside it): on a quiet machine it deleted
	// 3,299 records/s (2,299–3,367, 5 rounds) and cost the processing
	// 9.4 % of its rate; on a loaded one (load 10–21) 1,200 records/s
	// (566–2,132), against 6,410 (5,461–8,076) flat out in the same run:
	// 0.21 of the flat-out rate there (0.09–0.26 per round). No flat-out
	// rate was measured on the quiet machine; the quiet paced rate is
	// about half the loaded flat-out one. That is enough for a steady
	// inflow of hundreds to thousands of messages a second, depending on
	// the server; a purge that does not keep up says so (PurgeEvent.Span,
	// and a warning in the consumer's log), and a larger
	// Config.PurgeDutyCycle or the partitioned layout is then the fix.
	DefaultPurgeDutyCycle = 0.2
	// DefaultLease is the lease of a lease-mode attempt.
	DefaultLease = 30 * time.Second
	// MinLease is the shortest lease a LeaseConsumer accepts: renewed every
	// Lease/3, a shorter one cannot be held across a store round trip and a
	// scheduler pause, and a second attempt would take over a live handler.
	MinLease = 100 * time.Millisecond
	// MaxRetentionWindow is the longest retention window accepted (100
	// years), so that time arithmetic in every store stays in range. To
	// keep records for ever, disable purging (PurgeInterval -1).
	MaxRetentionWindow = 100 * 365 * 24 * time.Hour
	// DefaultMaxAttempts is the number of lease-mode attempts a message gets.
	DefaultMaxAttempts = 5
	// DefaultCoalesce is Config.Coalesce's default: at most 64 Acquire
	// (or Complete) calls in one store call.
	DefaultCoalesce = 64
)

// MismatchPolicy says what to do with a message whose ID was processed with
// another payload fingerprint.
type MismatchPolicy uint8

const (
	// RejectMismatch (the default) gives the outcome FingerprintMismatch
	// with an error matching ErrFingerprintMismatch: not acked as done,
	// dead-lettered by the broker adapters.
	RejectMismatch MismatchPolicy = iota
	// AcceptMismatchAsDuplicate gives the outcome Duplicate with
	// Outcome.MismatchAccepted set: the message is acked and not processed.
	AcceptMismatchAsDuplicate
)

// Config configures a Consumer. Zero values take the documented defaults.
type Config struct {
	// Name identifies the consumer: a processed message is keyed by
	// (Name, message ID), so two consumers of one event each process it
	// once. Mandatory, 1 to 255 bytes, and never derived from code: renaming
	// a Go type must not reset deduplication.
	Name string
	// Fingerprinter computes payload fingerprints. Defaults to
	// SHA256Fingerprint (raw bytes); JSONFingerprint is the canonical-JSON option.
	Fingerprinter Fingerprinter
	// MaxIDLength is the longest message ID accepted, in bytes. Defaults to
	// DefaultMaxIDLength (255); it may be lower, never higher, since the
	// stores' columns hold 255 bytes.
	MaxIDLength int
	// MismatchPolicy is the fingerprint mismatch policy. Defaults to RejectMismatch.
	MismatchPolicy MismatchPolicy
	// RetentionWindow is how long processed IDs are kept, in running time of
	// the consumer (time it was not running does not count; see [Purge]).
	// Make it longer than the broker's longest redelivery horizon. Defaults to DefaultRetentionWindow (7 days).
	RetentionWindow time.Duration
	// PurgeInterval is the period of the background purge loop started by
	// NewConsumer and stopped by Close, with 10% jitter. Defaults to
	// DefaultPurgeInterval (1 hour); a negative value disables the loop.
	PurgeInterval time.Duration
	// PurgeBatchSize is the most rows one purge DELETE removes. Defaults to
	// DefaultPurgeBatchSize (1000).
	PurgeBatchSize int
	// PurgeDutyCycle is the most of a purge's elapsed time its batches may
	// take, in (0, 1] (see PurgeParams.DutyCycle); 1 purges flat out.
	// Defaults to DefaultPurgeDutyCycle (0.2).
	PurgeDutyCycle float64
	// Logger receives the background loop's messages (a purge summary at
	// info, failures at warn), failed lease renewals (warn), panics of
	// Hooks (error) and, once at start, the store's failover risk (warn;
	// see idemdriver.FailoverRiskReporter); nothing is logged per message. Defaults to
	// slog.Default(). See LogHook for per-message debug logs.
	Logger *slog.Logger
	// StoreTimeout bounds every store call the consumer makes: a
	// transaction's begin, claim, commit and rollback (the handler's own
	// work in between is bounded by the caller's context only), a lease
	// acquire, renewal, completion, release and recovery point, the
	// running mark and each step of a purge. A call past it is cancelled
	// and the delivery fails with an error matching ErrStore and
	// ErrStoreTimeout (never an ack), so a stalled connection holds a
	// delivery for StoreTimeout, not for the broker's handler timeout.
	// In lease mode the context of each call has that bound as its
	// deadline (StoreTimeout from the call's start, or the caller's
	// deadline when sooner), so a store, or a layer of its that batches
	// calls and keeps only their deadlines, ends the call by it too.
	// Claims also wait at most StoreTimeout/2 on another transaction
	// holding the same record (the database's lock timeout; see
	// ErrLockTimeout). Keep it well below the broker's ack deadline and,
	// in lease mode, near Lease/3 or below. Defaults to
	// DefaultStoreTimeout (10s); a negative value leaves the calls bounded
	// by the caller's context alone.
	StoreTimeout time.Duration
	// Hooks observe the consumer: process start and end, claims, outcomes
	// with their duplicate reason, lease renewals, takeovers and losses,
	// purges and store errors (see Hook). Each must implement at least one
	// Hook* interface, or NewConsumer returns an error matching
	// ErrInvalidConfig. Defaults to none, which costs nothing.
	Hooks []Hook

	// Lease is how long a lease-mode attempt owns a message before another
	// may take over; the LeaseConsumer renews it every Lease/3 while the
	// handler runs. Lease mode only. Defaults to DefaultLease (30s).
	Lease time.Duration
	// MaxAttempts is how many lease-mode attempts a message gets; the
	// failure of the last one (or a takeover beyond it) leaves a terminal
	// record and a poison outcome. Lease mode only. Defaults to
	// DefaultMaxAttempts (5).
	MaxAttempts int
	// Relay, in transactional mode, is woken after every commit whose
	// handler emitted outgoing messages (see Emit), and by every duplicate,
	// so that what its first processing left unsent goes out at once (a
	// duplicate does not look its outgoing rows up, which would walk the
	// pending rows: the relay's next round claims them). The caller runs
	// it (Relay.Run) and owns it, and it relays this Consumer's outbox:
	// a store that notifies relays after a commit (store/idempgxv5) does
	// not for rows this relay is woken for (idemdriver.EmitParams.
	// RelayWoken), so relays of other processes find them at their next
	// poll if this one has not sent them. Nil means the outbox rows wait
	// for a relay that polls or is notified (another process, `idem
	// relay`).
	Relay *Relay
	// OutboxHeaders, in transactional mode, adds headers to every message
	// the handler emits (Emit, EmitFor), from the context the handler
	// passed to Emit, before the message is written to the outbox: so they
	// are stored in its row and the relay publishes them, in whatever
	// process it runs. It is called once per emitted message, after the
	// message's own Headers are copied (it may replace them; the caller's
	// map is not modified); it must not write a message ID header.
	// idemotel.InjectTraceContext is the one to give for tracing: the row
	// then carries the W3C traceparent of the span processing the incoming
	// message, and the downstream consumer's process span continues that
	// trace although the relay sends the message later, from another
	// goroutine or process. Nil adds nothing.
	OutboxHeaders HeaderInjector

	// Retryable classifies a lease-mode handler error: false poisons the
	// message at once. Defaults to every error but those matching
	// ErrPermanent (see Permanent).
	Retryable func(error) bool

	// Coalesce, in lease mode over a store that is an
	// idemdriver.LeaseBatcher, is the most Acquire (or Complete) calls
	// of the LeaseConsumer that go to the store together, in one
	// AcquireBatch (or CompleteBatch) call: the calls made while one is
	// in flight are gathered and sent when it returns (a group commit);
	// a call made when none is in flight goes out at once, alone, so
	// an idle consumer waits for nothing more. Each call gets its own
	// outcome; a store error of a batch call fails only its calls,
	// typed as for a single call (ErrStore, ErrStoreTimeout); the batch
	// call's deadline is the earliest of its calls' (Config.StoreTimeout
	// from each call's start, or its caller's deadline). A call whose
	// context ends while it waits is not sent and fails with the
	// context's error (ErrStore); an Acquire whose context ends after
	// its call was sent in a batch gets the store's answer and, when the
	// message was acquired, releases it at once (Failed, with the
	// context's cause). One batch is in flight at a time: a call that
	// waits in the store (a lock wait, a stalled connection) delays the
	// calls queued behind it, each up to its own store timeout (then
	// ErrStoreTimeout, unsent). A store that batches concurrent calls
	// itself (a CoalescesCalls method that returns true) gets each call
	// alone. 1 sends every call alone, as a store without batches does
	// (no head-of-line wait behind a stalled call); 0 means
	// DefaultCoalesce (64). With many requests in flight on Redis it cuts
	// the store round trips of a new key 8-fold; one goroutine's calls
	// always go alone. At most idemdriver.MaxLeaseBatch; negative is an
	// error matching ErrInvalidConfig.
	Coalesce int
}

func (c Config) withDefaults() Config {
	if c.Fingerprinter == nil {
		c.Fingerprinter = SHA256Fingerprint
	}
	if c.MaxIDLength == 0 {
		c.MaxIDLength = DefaultMaxIDLength
	}
	if c.RetentionWindow == 0 {
		c.RetentionWindow = DefaultRetentionWindow
	}
	if c.PurgeInterval == 0 {
		c.PurgeInterval = DefaultPurgeInterval
	}
	if c.PurgeBatchSize == 0 {
		c.PurgeBatchSize = DefaultPurgeBatchSize
	}
	if c.PurgeDutyCycle == 0 {
		c.PurgeDutyCycle = DefaultPurgeDutyCycle
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.StoreTimeout == 0 {
		c.StoreTimeout = DefaultStoreTimeout
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.Retryable == nil {
		c.Retryable = func(err error) bool { return !errors.Is(err, ErrPermanent) }
	}
	if c.Coalesce == 0 {
		c.Coalesce = DefaultCoalesce
	}
	return c
}

func (c Config) validate() error {
	if err := ValidateConsumerName(c.Name); err != nil {
		return err
	}
	switch {
	case c.MaxIDLength < 0 || c.MaxIDLength > DefaultMaxIDLength:
		return fmt.Errorf("%w: MaxIDLength %d not in 1..%d", ErrInvalidConfig, c.MaxIDLength, DefaultMaxIDLength)
	case c.RetentionWindow < 0 || c.RetentionWindow > MaxRetentionWindow:
		return fmt.Errorf("%w: RetentionWindow %v not in 0..%v (to keep records for ever, set PurgeInterval to -1)", ErrInvalidConfig, c.RetentionWindow, MaxRetentionWindow)
	case c.PurgeInterval > 0 && c.PurgeInterval < time.Second:
		return fmt.Errorf("%w: PurgeInterval %v is under a second", ErrInvalidConfig, c.PurgeInterval)
	case c.PurgeBatchSize < 0:
		return fmt.Errorf("%w: negative PurgeBatchSize %d", ErrInvalidConfig, c.PurgeBatchSize)
	case c.Lease < 0 || (c.Lease > 0 && c.Lease < MinLease):
		return fmt.Errorf("%w: Lease %v is under MinLease (%v)", ErrInvalidConfig, c.Lease, MinLease)
	case c.MaxAttempts < 0:
		return fmt.Errorf("%w: negative MaxAttempts %d", ErrInvalidConfig, c.MaxAttempts)
	case c.MismatchPolicy > AcceptMismatchAsDuplicate:
		return fmt.Errorf("%w: unknown MismatchPolicy %d", ErrInvalidConfig, c.MismatchPolicy)
	case c.Coalesce < 0 || c.Coalesce > idemdriver.MaxLeaseBatch:
		return fmt.Errorf("%w: Coalesce %d not in 0..%d", ErrInvalidConfig, c.Coalesce, idemdriver.MaxLeaseBatch)
	}
	if c.PurgeDutyCycle != 0 {
		if err := validDutyCycle(c.PurgeDutyCycle); err != nil {
			return err
		}
	}
	_, err := newHooks(c.Hooks, c, 0)
	return err
}

// Handler runs the side effects of one message inside tx, the transaction
// that holds the message's claim. It must write every database effect with
// tx; returning an error (or panicking) rolls back the effects and the claim
// together, so the redelivery runs the handler again. It must never commit
// or roll back tx itself: the Consumer does, and a handler that does breaks
// the claim-with-effects guarantee (Process then fails at its Commit).
type Handler[TTx any] func(ctx context.Context, tx TTx, msg Message) error

// BatchHandler runs the side effects of the new messages of a batch inside
// tx. msgs holds only the messages this transaction claimed (duplicates are
// left out), in delivery order. An error rolls back the whole batch.
type BatchHandler[TTx any] func(ctx context.Context, tx TTx, msgs []Message) error

// Consumer is an Idempotent Consumer: it records each message ID in the
// processed-messages table in the same transaction as the handler's side
// effects, so a redelivered message has the effect of one delivery.
//
// A Consumer is safe for concurrent use. Close it to stop its purge loop.
type Consumer[TTx any] struct {
	core
	store idemdriver.TxStore[TTx]
	out   consumerOutbox[TTx]
	// timesCalls: the store begins and claims in one call and bounds the
	// calls of that transaction itself (idemdriver.CallTimer).
	timesCalls bool
}

// NewConsumer returns a Consumer over store. It returns an error matching
// ErrInvalidConsumerName or ErrInvalidConfig when cfg is invalid. Unless
// cfg.PurgeInterval is negative it starts the background purge loop, which
// Close stops.
func NewConsumer[TTx any](store idemdriver.TxStore[TTx], cfg Config) (*Consumer[TTx], error) {
	if store == nil {
		return nil, fmt.Errorf("%w: nil store", ErrInvalidConfig)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Consumer[TTx]{store: store}
	c.out = newConsumerOutbox(store)
	if _, ok := store.(idemdriver.BeginClaimer[TTx]); ok {
		ct, ok := store.(idemdriver.CallTimer)
		c.timesCalls = ok && ct.TimesCalls()
	}
	c.start(cfg.withDefaults(), ModeTransactional, store)
	return c, nil
}

// Name returns the consumer name.
func (c *Consumer[TTx]) Name() string { return c.cfg.Name }

// Close stops the background purge loop, cancelling a purge in flight, and
// waits for it to return. Later calls to Process return ErrClosed. Close is
// idempotent and always returns nil.
func (c *Consumer[TTx]) Close() error { return c.close() }

// Process processes one delivery of msg: it begins a transaction, claims
// (consumer, msg.ID) in it, runs handler with that transaction if the claim
// is new, and commits claim and effects together.
//
// The returned error is nil exactly when the outcome can be acknowledged
// (Processed or Duplicate). Otherwise it is the outcome's Err and matches:
// ErrMissingMessageID, ErrInvalidMessageID or ErrInvalidPayload (Rejected:
// dead-letter); ErrFingerprintMismatch (FingerprintMismatch: dead-letter);
// the handler's error, ErrHandlerPanic or ErrStore (Failed: redeliver;
// ErrStoreTimeout too when a store call ran past Config.StoreTimeout);
// ErrInProgress and ErrLockTimeout (InProgress: redeliver after
// RetryAfter). ErrClosed after Close.
//
// A concurrent copy of the same message waits for the first transaction and
// then sees a Duplicate: exactly one handler's effects ever commit. It
// waits at most the claim's lock timeout (Config.StoreTimeout/2), and is
// then InProgress.
func (c *Consumer[TTx]) Process(ctx context.Context, msg Message, handler Handler[TTx]) (Outcome, error) {
	ctx, t := c.begin(ctx, msg.ID, 0)
	if t != nil {
		defer t.endPanic(ctx, msg.ID, nil)
	}
	out, err := c.process(ctx, t, msg, handler)
	t.end(ctx, out, err)
	return out, err
}

func (c *Consumer[TTx]) process(ctx context.Context, t *track, msg Message, handler Handler[TTx]) (Outcome, error) {
	cp := &claimParams{}
	out, fp := c.prepareInto(msg, &cp.fp)
	if out.Status != 0 {
		return out, out.Err
	}
	cp.p = idemdriver.ClaimParams{Consumer: c.cfg.Name, MessageID: msg.ID, Fingerprint: fp, LockTimeout: lockTimeout(c.storeTimeout())}
	p := &cp.p
	var (
		tx  TTx
		res idemdriver.ClaimResult
		err error
	)
	since := t.now()
	b := &cp.b
	if c.timesCalls && c.storeTimeout() > 0 {
		p.CallTimeout = c.storeTimeout()
		initSelfTimed(b, ctx)
	} else {
		c.initTxBound(b, ctx)
	}
	defer b.end() // after a panic or a store error; release keeps b's contexts for reuse
	if bc, ok := c.store.(idemdriver.BeginClaimer[TTx]); ok {
		err = b.call(func(bctx context.Context) (err error) { tx, res, err = bc.BeginClaim(bctx, p); return err })
		if err != nil {
			return c.claimFailed(ctx, msg.ID, "begin and claim", err, nil)
		}
	} else {
		if err = b.call(func(bctx context.Context) (err error) { tx, err = c.store.Begin(bctx); return err }); err != nil {
			return c.failed(msg.ID, c.storeErr(ctx, "begin", msg.ID, err))
		}
		if err = b.call(func(bctx context.Context) (err error) { res, err = c.store.ClaimTx(bctx, tx, p); return err }); err != nil {
			return c.claimFailed(ctx, msg.ID, "claim", err, c.rollback(ctx, b, msg.ID, tx))
		}
	}
	if res.Ended && !res.Claimed {
		// The store ended the transaction itself (a BeginClaimer may, on a
		// duplicate): there is nothing left to roll back, and the outcome
		// stands even if the deadline passed just as it returned.
		b.release()
		return c.settleExisting(msg.ID, fp, res)
	}
	if err := b.usable(); err != nil {
		return c.failed(msg.ID, errors.Join(c.storeErr(ctx, "claim", msg.ID, err), c.rollback(ctx, b, msg.ID, tx)))
	}
	if !res.Claimed {
		if err := c.rollback(ctx, b, msg.ID, tx); err != nil {
			return c.failed(msg.ID, err)
		}
		return c.settleExisting(msg.ID, fp, res)
	}
	t.claim(ctx, -1, msg.ID, 0, 0, since)
	e, hctx := c.handlerCtx(ctx, cp, msg.ID)
	if err := runHandler(func() error { return handler(hctx, tx, msg) }); err != nil {
		e.take()
		return c.handlerFailed(msg.ID, err, c.rollback(ctx, b, msg.ID, tx))
	}
	emitted, err := c.emitCommit(ctx, b, tx, msg.ID, e)
	if err != nil {
		return c.failed(msg.ID, errors.Join(err, c.rollback(ctx, b, msg.ID, tx)))
	}
	b.release()
	c.committed(ctx, msg.ID, emitted)
	return Outcome{Status: Processed, MessageID: msg.ID}, nil
}

// claimParams is what Process and ProcessTx allocate for one message,
// together: the claim's parameters, the array its default fingerprint is
// summed into, the transaction's deadlines, the emitter and the handler's
// context that carries it.
type claimParams struct {
	p    idemdriver.ClaimParams
	fp   [sha256.Size]byte
	b    txBound
	e    emitter
	hctx emitterCtx
}

// handlerCtx readies cp's emitter for the message id and returns it with
// the handler's context, ctx carrying it.
func (c *Consumer[TTx]) handlerCtx(ctx context.Context, cp *claimParams, id string) (*emitter, context.Context) {
	e := c.out.initEmitter(&cp.e, c.cfg.Name, c.cfg.OutboxHeaders, id)
	cp.hctx = emitterCtx{Context: ctx, e: e}
	return e, &cp.hctx
}

// claimFailed is the outcome of a claim that failed with err (joined with
// the rollback's error, if any): InProgress when the claim waited past its
// lock timeout for another transaction holding the record, so the
// message is redelivered later; Failed otherwise.
func (c *core) claimFailed(ctx context.Context, id, op string, err, rollbackErr error) (Outcome, error) {
	if errors.Is(err, ErrLockTimeout) {
		err := errors.Join(fmt.Errorf("%w: message %q: another transaction holds its record: %w", ErrInProgress, id, err), rollbackErr)
		return Outcome{Status: InProgress, MessageID: id, Err: err, RetryAfter: txInProgressRetryAfter}, err
	}
	return c.failed(id, errors.Join(c.storeErr(ctx, op, id, err), rollbackErr))
}

// handlerFailed is the Failed outcome of a handler error (joined with the
// rollback's error, if any). A handler error matching ErrPermanent makes it
// poison: no redelivery can succeed, so Outcome.DeadLetter() says to
// dead-letter it, as in lease mode. Nothing is recorded in transactional
// mode, so a redelivery the broker makes anyway runs the handler again.
func (c *Consumer[TTx]) handlerFailed(id string, handlerErr, rollbackErr error) (Outcome, error) {
	out, err := c.failed(id, errors.Join(handlerErr, rollbackErr))
	out.Poison = IsPermanent(handlerErr)
	return out, err
}

// ProcessTx is Process inside a transaction the caller already holds: the
// claim is made in tx, and handler runs with tx when the claim is new. The
// caller commits or rolls back tx; ProcessTx never does.
//
// A duplicate does not abort tx (no error is raised inside the database), so
// the caller may go on using it. When ProcessTx returns a non-nil error the
// claim and the handler's effects are in tx and the caller must roll it back.
func (c *Consumer[TTx]) ProcessTx(ctx context.Context, tx TTx, msg Message, handler Handler[TTx]) (Outcome, error) {
	ctx, t := c.begin(ctx, msg.ID, 0)
	if t != nil {
		defer t.endPanic(ctx, msg.ID, nil)
	}
	out, err := c.processTx(ctx, t, tx, msg, handler)
	t.end(ctx, out, err)
	return out, err
}

func (c *Consumer[TTx]) processTx(ctx context.Context, t *track, tx TTx, msg Message, handler Handler[TTx]) (Outcome, error) {
	cp := &claimParams{}
	out, fp := c.prepareInto(msg, &cp.fp)
	if out.Status != 0 {
		return out, out.Err
	}
	since := t.now()
	cp.p = idemdriver.ClaimParams{Consumer: c.cfg.Name, MessageID: msg.ID, Fingerprint: fp, LockTimeout: lockTimeout(c.storeTimeout())}
	var res idemdriver.ClaimResult
	b := &cp.b
	c.initTxBound(b, ctx)
	defer b.end() // after a panic in the store
	err := b.call(func(bctx context.Context) (err error) { res, err = c.store.ClaimTx(bctx, tx, &cp.p); return err })
	// The claim's call has returned: nothing derived from b's context
	// outlives it, whatever its outcome.
	b.release()
	if err != nil {
		return c.claimFailed(ctx, msg.ID, "claim", err, nil)
	}
	if !res.Claimed {
		return c.settleExisting(msg.ID, fp, res)
	}
	t.claim(ctx, -1, msg.ID, 0, 0, since)
	e, hctx := c.handlerCtx(ctx, cp, msg.ID)
	if err := runHandler(func() error { return handler(hctx, tx, msg) }); err != nil {
		e.take()
		return c.handlerFailed(msg.ID, err, nil)
	}
	emitted, err := c.emitTx(ctx, tx, msg.ID, e)
	if err != nil {
		return c.failed(msg.ID, err)
	}
	c.committed(ctx, msg.ID, emitted)
	return Outcome{Status: Processed, MessageID: msg.ID}, nil
}

// ProcessBatch processes a batch of deliveries in one transaction: every
// message is claimed with one statement, handler runs once with the
// messages that are new, and the claims commit with the effects. It is the
// throughput path for Kafka and JetStream batch consumers.
//
// The outcomes have one entry per message of msgs, in order. Invalid
// messages are Rejected on their own without failing the batch; a message
// ID repeated within the batch is processed once and its repeats are
// Duplicate (or FingerprintMismatch). A handler error, a panic or a store
// error fails every new message of the batch (Failed) and is returned;
// duplicates keep their Duplicate outcome, since they were processed before.
// To isolate a poison message, process the failed messages one by one with
// Process. The returned error is nil when every outcome is acknowledgeable,
// and otherwise joins the errors of the outcomes that are not.
func (c *Consumer[TTx]) ProcessBatch(ctx context.Context, msgs []Message, handler BatchHandler[TTx]) ([]Outcome, error) {
	ctx, t := c.begin(ctx, "", len(msgs))
	if t != nil {
		defer t.endPanic(ctx, "", msgs)
	}
	outs, err := c.processBatch(ctx, t, msgs, handler)
	t.endBatch(ctx, outs, err)
	return outs, err
}

func (c *Consumer[TTx]) processBatch(ctx context.Context, t *track, msgs []Message, handler BatchHandler[TTx]) ([]Outcome, error) {
	outs := make([]Outcome, len(msgs))
	fps := make([][]byte, len(msgs))
	first := make(map[string]int, len(msgs)) // message ID -> index of its first valid occurrence
	claimIdx := make([]int, 0, len(msgs))    // the messages to claim: first valid occurrences
	for i, m := range msgs {
		out, fp := c.prepare(m)
		if out.Status != 0 {
			outs[i] = out
			continue
		}
		fps[i] = fp
		if _, seen := first[m.ID]; seen {
			continue // settled after the claim
		}
		first[m.ID] = i
		claimIdx = append(claimIdx, i)
	}
	if len(claimIdx) > 0 {
		// Claim in message ID byte order, so concurrent batches that share
		// IDs take the unique-index locks in one order and cannot deadlock.
		// The IDs are distinct, so the order is total.
		slices.SortFunc(claimIdx, func(a, b int) int { return strings.Compare(msgs[a].ID, msgs[b].ID) })
		claim := make([]idemdriver.ClaimMessage, len(claimIdx)) // claim[k] is msgs[claimIdx[k]]
		for k, i := range claimIdx {
			claim[k] = idemdriver.ClaimMessage{MessageID: msgs[i].ID, Fingerprint: fps[i]}
		}
		c.processClaims(ctx, t, msgs, outs, fps, claim, claimIdx, handler)
	}
	// Repeats within the batch follow their first occurrence.
	for i, m := range msgs {
		j, ok := first[m.ID]
		if !ok || j == i || fps[i] == nil {
			continue
		}
		switch outs[j].Status {
		case Failed:
			outs[i] = Outcome{Status: Failed, MessageID: m.ID, Err: outs[j].Err, Poison: outs[j].Poison}
		case InProgress:
			outs[i] = Outcome{Status: InProgress, MessageID: m.ID, Err: outs[j].Err, RetryAfter: outs[j].RetryAfter}
		default:
			stored := fps[j]
			outs[i], _ = c.duplicate(m.ID, fps[i], stored)
		}
	}
	var errs []error
	for _, o := range outs {
		if o.Err != nil {
			errs = append(errs, fmt.Errorf("message %q: %w", o.MessageID, o.Err))
		}
	}
	return outs, errors.Join(errs...)
}

func (c *Consumer[TTx]) processClaims(ctx context.Context, t *track, msgs []Message, outs []Outcome, fps [][]byte,
	claim []idemdriver.ClaimMessage, claimIdx []int, handler BatchHandler[TTx]) {
	fail := func(err error) {
		out := Outcome{Status: Failed, Err: err}
		if errors.Is(err, ErrLockTimeout) {
			out = Outcome{Status: InProgress, Err: fmt.Errorf("%w: another transaction holds a record of the batch: %w", ErrInProgress, err), RetryAfter: txInProgressRetryAfter}
		}
		for _, i := range claimIdx {
			if outs[i].Status == 0 {
				out.MessageID = msgs[i].ID
				outs[i] = out
			}
		}
	}
	since := t.now()
	var b txBound
	c.initTxBound(&b, ctx)
	defer b.end() // after a panic or a store error; release keeps b's contexts for reuse
	var (
		tx  TTx
		res []idemdriver.ClaimResult
		err error
	)
	p := &idemdriver.ClaimBatchParams{Consumer: c.cfg.Name, Messages: claim, LockTimeout: lockTimeout(c.storeTimeout())}
	if bc, ok := c.store.(idemdriver.BeginBatchClaimer[TTx]); ok {
		// BEGIN and the claim in one round trip; on error no transaction
		// is left open.
		if err = b.call(func(bctx context.Context) (err error) { tx, res, err = bc.BeginClaimBatch(bctx, p); return err }); err != nil {
			if !errors.Is(err, ErrLockTimeout) {
				err = c.storeErr(ctx, "begin and claim batch", "", err)
			}
			fail(err)
			return
		}
	} else {
		if err = b.call(func(bctx context.Context) (err error) { tx, err = c.store.Begin(bctx); return err }); err != nil {
			fail(c.storeErr(ctx, "begin", "", err))
			return
		}
		err = b.call(func(bctx context.Context) (err error) {
			res, err = idemdriver.ClaimBatch(bctx, c.store, tx, p)
			return err
		})
	}
	if err == nil && len(res) != len(claim) {
		err = fmt.Errorf("store returned %d claim results for %d messages", len(res), len(claim))
	}
	if err == nil {
		err = b.usable()
	}
	if err != nil {
		if !errors.Is(err, ErrLockTimeout) {
			err = c.storeErr(ctx, "claim batch", "", err)
		}
		fail(errors.Join(err, c.rollback(ctx, &b, "", tx)))
		return
	}
	freshIdx := make([]int, 0, len(res))
	for k, r := range res {
		i := claimIdx[k]
		if r.Claimed {
			freshIdx = append(freshIdx, i)
			t.claim(ctx, i, msgs[i].ID, 0, 0, since)
			continue
		}
		outs[i], _ = c.existingTx(msgs[i].ID, fps[i], r)
		fps[i] = r.Fingerprint // repeats compare with what is stored
	}
	sort.Ints(freshIdx) // the handler sees the new messages in delivery order
	fresh := make([]Message, len(freshIdx))
	for k, i := range freshIdx {
		fresh[k] = msgs[i]
	}
	if len(fresh) == 0 {
		if err := c.rollback(ctx, &b, "", tx); err != nil {
			fail(err)
		}
		return
	}
	e := noOutbox
	if c.out.tx != nil {
		e = c.out.emitter(c.cfg.Name, c.cfg.OutboxHeaders, freshIDs(fresh)...)
	}
	if err := runHandler(func() error { return handler(withEmitter(ctx, e), tx, fresh) }); err != nil {
		e.take()
		fail(errors.Join(err, c.rollback(ctx, &b, "", tx)))
		return
	}
	emitted, err := c.emitCommit(ctx, &b, tx, "", e)
	if err != nil {
		fail(errors.Join(err, c.rollback(ctx, &b, "", tx)))
		return
	}
	b.release()
	c.committed(ctx, "", emitted)
	for k, r := range res {
		if r.Claimed {
			i := claimIdx[k]
			outs[i] = Outcome{Status: Processed, MessageID: msgs[i].ID}
		}
	}
}

// Purge deletes this consumer's processed records older than the retention
// window (counted back from its newest record), in batches of
// Config.PurgeBatchSize rows. It returns ErrPurgeInProgress when another
// cleaner holds the purge lock, and errors matching ErrStore on failure.
func (c *Consumer[TTx]) Purge(ctx context.Context) (PurgeResult, error) {
	res, _, err := c.purgeNow(ctx)
	return res, err
}

// rollback rolls tx back even when ctx has ended, bounded by the store
// timeout (finishTimeout without one): the call gets a detached context,
// and b's deadline is armed too, since database/sql drivers roll back
// under the context the transaction began with. id is the message ID for
// the store error hook, empty for a batch. Once the rollback succeeded, b
// is released (the transaction has ended) and must not be used again.
func (c *Consumer[TTx]) rollback(ctx context.Context, b *txBound, id string, tx TTx) error {
	var err error
	switch {
	case b.selfTimed:
		// The store bounds the rollback itself.
		err = c.store.Rollback(withoutCancel(ctx), tx)
	case b.l != nil:
		// The transaction's reusable detached context: none allocated.
		err = b.detachedCall(func(rctx context.Context) error { return c.store.Rollback(rctx, tx) })
	default:
		rctx, cancel := detachedCallCtx(ctx, c.storeTimeout())
		err = timedOut(rctx, c.store.Rollback(rctx, tx))
		cancel()
	}
	if err != nil {
		return c.storeErr(ctx, "rollback", id, err)
	}
	b.release()
	return nil
}

// runHandler calls fn, turning a panic into a *PanicError.
func runHandler(fn func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	return fn()
}
