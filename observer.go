package idem

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"
)

// Hook is a value that observes a consumer: anything that implements one or
// more of the Hook* interfaces of this package ([HookProcessStart],
// [HookProcessEnd], [HookClaim], [HookOutcome], [HookLeaseRenewed],
// [HookLeaseTakenOver], [HookLeaseLost], [HookPurge], [HookStoreError],
// [HookEmit]; a [Relay] takes [HookRelay]).
// Hooks are given in [Config.Hooks]; a consumer finds the interfaces each
// implements once, at construction, the way franz-go's kgo.WithHooks does,
// so a hook that implements only what it needs costs nothing elsewhere.
//
// Rules for implementers:
//   - Hooks are called synchronously, on the goroutine that processes the
//     message (and, for lease renewals, on the renewal goroutine), so they
//     must be fast and must not block; hand slow work to a goroutine you own.
//   - Hooks are called concurrently for different messages and must be safe
//     for concurrent use.
//   - A hook never changes processing: what it returns is ignored (except
//     the context of [HookProcessStart]), and a panic in a hook is recovered,
//     logged at error level on [Config.Logger] with its stack, and
//     processing goes on as if the hook had returned.
//   - The byte slices inside events (Outcome.Result) are shared with the
//     caller and must not be modified.
//
// A consumer with no hooks builds no events and reads no clocks for them.
// Package idemotel turns these events into OpenTelemetry metrics and spans;
// [LogHook] turns them into log/slog records.
type Hook any

// HookProcessStart is called when a consumer starts processing one delivery
// (Consumer.Process, Consumer.ProcessTx, LeaseConsumer.Process) or one batch
// (Consumer.ProcessBatch), before the message is validated or claimed. The
// context it returns replaces ctx for the rest of that call: the claim, the
// handler, the completion and the later hooks of the delivery all get it,
// so a tracer can start a span here that the handler's own spans nest in
// (as pgx's QueryTracer does). Returning nil keeps ctx. Every call is
// paired with one [HookProcessEnd] call, even when the call panics (a
// store or a Config.Retryable that panics): the hooks then get a Failed
// outcome and an end whose error says so, and the panic goes on to the
// caller.
type HookProcessStart interface {
	OnProcessStart(ctx context.Context, e ProcessStartEvent) context.Context
}

// HookProcessEnd is called when the call announced by [HookProcessStart]
// returns, after the [HookOutcome] calls of its messages, with the context
// the start hooks returned.
type HookProcessEnd interface {
	OnProcessEnd(ctx context.Context, e ProcessEndEvent)
}

// HookClaim is called when a delivery claims its message: the claim was
// new (transactional mode: the row was inserted in the transaction;
// lease mode: the lease was acquired), so the handler is about to run.
// Every claim is followed by exactly one [HookOutcome] call for the message
// with OutcomeEvent.Claimed set, so claims minus claimed outcomes is the
// number of claims in progress.
type HookClaim interface {
	OnClaim(ctx context.Context, e ClaimEvent)
}

// HookOutcome is called once per message when its delivery is settled,
// with the [Outcome] the caller gets: every message of a batch gets its own
// call. Duplicates carry their [DuplicateReason].
type HookOutcome interface {
	OnOutcome(ctx context.Context, e OutcomeEvent)
}

// HookLeaseRenewed is called after each successful renewal of a lease-mode
// attempt's lease (every Lease/3 while the handler runs), with the renewal's
// round trip as Latency.
type HookLeaseRenewed interface {
	OnLeaseRenewed(ctx context.Context, e LeaseEvent)
}

// HookLeaseTakenOver is called when a lease-mode delivery acquires a message
// on an attempt after the first (Attempt > 1): an earlier attempt released
// it after a retryable error, or its lease expired (the consumer crashed or
// stalled) and this attempt took over with a new fencing token. The stores
// do not tell the two apart; released attempts are also counted by
// [HookOutcome] (OutcomeEvent.Released), so takeovers of expired leases are
// the difference.
type HookLeaseTakenOver interface {
	OnLeaseTakenOver(ctx context.Context, e LeaseEvent)
}

// HookLeaseLost is called when the store rejects a lease-mode attempt's
// write with [ErrLeaseLost] because another attempt owns the record now.
// LeaseEvent.Op says which write: "complete" is a stale completion (the
// handler finished after another attempt took over; its result was not
// stored), "renew" a renewal that found the lease gone while the handler
// ran, "release" and "step" the release of a failed attempt and the save
// of a recovery point.
type HookLeaseLost interface {
	OnLeaseLost(ctx context.Context, e LeaseEvent)
}

// HookPurge is called after every purge of the consumer's records, by the
// background loop or by Purge, successful or not (a purge that found
// another cleaner running has Err matching [ErrPurgeInProgress]).
type HookPurge interface {
	OnPurge(ctx context.Context, e PurgeEvent)
}

// HookStoreError is called when a store call fails for a reason other than
// the pattern's own outcomes (a duplicate, a lost lease, a purge already
// running): connection loss, a timeout, a constraint. The error also
// reaches the caller (wrapped with [ErrStore]) unless the call was a lease
// renewal, which is retried at the next tick. It is not called when the
// context of the call has ended: the failure is then the caller's
// cancellation or deadline, not the store's.
type HookStoreError interface {
	OnStoreError(ctx context.Context, e StoreErrorEvent)
}

// Mode is a consumer's claim mode, as reported in hook events.
type Mode uint8

const (
	// ModeTransactional is a [Consumer]: the claim is in the handler's transaction.
	ModeTransactional Mode = iota + 1
	// ModeLease is a [LeaseConsumer]: a lease and a fencing token.
	ModeLease
)

// String returns "transactional" or "lease".
func (m Mode) String() string {
	switch m {
	case ModeTransactional:
		return "transactional"
	case ModeLease:
		return "lease"
	}
	return "invalid"
}

// DuplicateReason says why a delivery found its message already known: the
// a completed record, one in progress, one with another fingerprint, plus
// a poison record.
type DuplicateReason uint8

const (
	// NotDuplicate (zero) is the reason of every delivery that did not find
	// an existing record: it claimed the message, or was rejected or failed
	// before its claim.
	NotDuplicate DuplicateReason = iota
	// DuplicateCompleted: the message was processed before (Status
	// Duplicate), or is repeated within its batch.
	DuplicateCompleted
	// DuplicateInProgress: another lease-mode attempt holds a live lease
	// (Status InProgress).
	DuplicateInProgress
	// DuplicateFingerprintMismatch: the ID was processed with another
	// payload (Status FingerprintMismatch, or Duplicate with
	// Outcome.MismatchAccepted under [AcceptMismatchAsDuplicate]).
	DuplicateFingerprintMismatch
	// DuplicatePoison: the record is poison, failed for good by earlier
	// lease-mode attempts (Status Failed, Outcome.Poison).
	DuplicatePoison
)

// String returns "", "completed", "in_progress", "fingerprint_mismatch" or
// "poison": the values of the reason label in package idemotel.
func (r DuplicateReason) String() string {
	switch r {
	case NotDuplicate:
		return ""
	case DuplicateCompleted:
		return "completed"
	case DuplicateInProgress:
		return "in_progress"
	case DuplicateFingerprintMismatch:
		return "fingerprint_mismatch"
	case DuplicatePoison:
		return "poison"
	}
	return "invalid"
}

// ProcessStartEvent announces a Process, ProcessTx or ProcessBatch call.
type ProcessStartEvent struct {
	// Consumer is the consumer name.
	Consumer string
	// Mode is the consumer's claim mode.
	Mode Mode
	// MessageID is the delivery's message ID as given (possibly invalid);
	// empty for a batch.
	MessageID string
	// BatchSize is len(msgs) for ProcessBatch, 0 for a single delivery.
	BatchSize int
}

// ProcessEndEvent reports the end of the call a [ProcessStartEvent] announced.
type ProcessEndEvent struct {
	// Consumer, Mode, MessageID and BatchSize are those of the start event.
	Consumer  string
	Mode      Mode
	MessageID string
	BatchSize int
	// Latency is the time from the start event to the end.
	Latency time.Duration
	// Err is the error the call returns: nil when every outcome can be
	// acknowledged.
	Err error
}

// ClaimEvent reports a new claim; see [HookClaim].
type ClaimEvent struct {
	// Consumer is the consumer name; MessageID the claimed message.
	Consumer, MessageID string
	// Mode is the consumer's claim mode.
	Mode Mode
	// Attempt and Token are the lease-mode attempt number (1 for the first)
	// and fencing token; zero in transactional mode.
	Attempt int
	Token   int64
	// Latency is the claim's round trip to the store: Begin and ClaimTx (or
	// BeginClaim), ClaimBatchTx for the whole batch, or Acquire.
	Latency time.Duration
}

// OutcomeEvent reports how one message's delivery was settled; see
// [HookOutcome].
type OutcomeEvent struct {
	// Outcome is what the caller gets for the message: Status, MessageID,
	// Err, Attempt, Poison and the rest.
	Outcome Outcome
	// Consumer is the consumer name.
	Consumer string
	// Mode is the consumer's claim mode.
	Mode Mode
	// Reason says why the message was found already known; NotDuplicate
	// when it was not.
	Reason DuplicateReason
	// Claimed is true when this delivery claimed the message (a
	// [HookClaim] call preceded this one), whatever the outcome.
	Claimed bool
	// Released is true when this delivery claimed the message and gave the
	// claim up after an error so that a redelivery runs it again: the
	// transaction was rolled back (transactional mode; with ProcessTx the
	// caller must roll back), or the lease was released (lease mode). False
	// for a poison outcome and for a lease lost to another attempt.
	Released bool
	// BatchSize is the size of the batch the message came in (0 for a
	// single delivery).
	BatchSize int
	// Latency is the time from the start of the call to this outcome (for
	// a batch, the whole batch's).
	Latency time.Duration
}

// LeaseEvent reports a lease-mode event of one attempt; see
// [HookLeaseRenewed], [HookLeaseTakenOver] and [HookLeaseLost].
type LeaseEvent struct {
	// Consumer is the consumer name; MessageID the message.
	Consumer, MessageID string
	// Attempt is the attempt number and Token its fencing token.
	Attempt int
	Token   int64
	// Op is the store write that was rejected ("renew", "complete",
	// "release" or "step") for HookLeaseLost; empty otherwise.
	Op string
	// Latency is the round trip of the store call: Renew, Acquire, or the
	// rejected write.
	Latency time.Duration
	// Err is the error matching ErrLeaseLost, for HookLeaseLost; nil otherwise.
	Err error
}

// PurgeEvent reports one purge; see [HookPurge].
type PurgeEvent struct {
	// Consumer is the consumer name.
	Consumer string
	// Result is what the store reported: rows deleted, batches, horizon.
	Result PurgeResult
	// RetentionWindow is the window the purge applied.
	RetentionWindow time.Duration
	// Lag is how far the purge horizon trails the application clock's
	// now minus the retention window: the time within that span in which
	// the consumer was not running (downtime, stalls), by which records
	// outlive the window in wall-clock time. Retention counts running time
	// only (see [Purge]), so after a downtime Lag jumps and then stays; a
	// consumer that never stopped has Lag near zero. Zero when nothing may
	// be purged yet or the purge failed.
	Lag time.Duration
	// Latency is how long the purge took, its pauses between batches
	// included (Result.Paused).
	Latency time.Duration
	// Span is how far this purge moved the horizon since the previous
	// purge of this process that had one: the records written in that
	// span of the store's clock were this purge's work. Zero on the
	// process's first purge, when nothing may be purged yet, or when the
	// purge failed. A purge whose Latency reaches its Span deletes more
	// slowly than records become purgeable (Latency/Span is the inflow
	// over the purge's paced rate): the next purge has more to do, and the
	// table grows. The background loop logs it at warn; raise
	// Config.PurgeDutyCycle or PurgeBatchSize. Several processes purging
	// one consumer share the work, so each one's Span also covers the
	// others' purges in between.
	Span time.Duration
	// Err is nil, an error matching ErrPurgeInProgress (another cleaner
	// runs; nothing was done), or the store's error wrapped with ErrStore.
	Err error
}

// StoreErrorEvent reports a failed store call; see [HookStoreError].
type StoreErrorEvent struct {
	// Consumer is the consumer name; MessageID the message being processed,
	// empty for a batch-wide call or a purge.
	Consumer, MessageID string
	// Mode is the consumer's claim mode.
	Mode Mode
	// Op names the call: "begin", "claim", "begin and claim", "claim
	// batch", "commit", "rollback", "acquire", "renew", "complete",
	// "release", "save step" or "purge".
	Op string
	// Err is the error, wrapped with ErrStore.
	Err error
}

// hooks is the set of hooks of one consumer, sorted by interface at
// construction. A consumer without hooks has a nil *hooks.
type hooks struct {
	consumer string
	mode     Mode
	log      *slog.Logger

	start    []HookProcessStart
	end      []HookProcessEnd
	claim    []HookClaim
	outcome  []HookOutcome
	renewed  []HookLeaseRenewed
	takeover []HookLeaseTakenOver
	lost     []HookLeaseLost
	purge    []HookPurge
	storeErr []HookStoreError
	emit     []HookEmit
	relay    []HookRelay
}

// newHooks sorts hs by interface; it returns nil for no hooks and an error
// matching ErrInvalidConfig for a hook that implements none of them.
func newHooks(hs []Hook, cfg Config, mode Mode) (*hooks, error) {
	if len(hs) == 0 {
		return nil, nil
	}
	h := &hooks{consumer: cfg.Name, mode: mode, log: cfg.Logger}
	for i, x := range hs {
		n := 0
		if v, ok := x.(HookProcessStart); ok {
			h.start, n = append(h.start, v), n+1
		}
		if v, ok := x.(HookProcessEnd); ok {
			h.end, n = append(h.end, v), n+1
		}
		if v, ok := x.(HookClaim); ok {
			h.claim, n = append(h.claim, v), n+1
		}
		if v, ok := x.(HookOutcome); ok {
			h.outcome, n = append(h.outcome, v), n+1
		}
		if v, ok := x.(HookLeaseRenewed); ok {
			h.renewed, n = append(h.renewed, v), n+1
		}
		if v, ok := x.(HookLeaseTakenOver); ok {
			h.takeover, n = append(h.takeover, v), n+1
		}
		if v, ok := x.(HookLeaseLost); ok {
			h.lost, n = append(h.lost, v), n+1
		}
		if v, ok := x.(HookPurge); ok {
			h.purge, n = append(h.purge, v), n+1
		}
		if v, ok := x.(HookStoreError); ok {
			h.storeErr, n = append(h.storeErr, v), n+1
		}
		if v, ok := x.(HookEmit); ok {
			h.emit, n = append(h.emit, v), n+1
		}
		if n == 0 {
			return nil, fmt.Errorf("%w: Hooks[%d] (%T) implements none of the idem.Hook* interfaces", ErrInvalidConfig, i, x)
		}
	}
	return h, nil
}

// safe calls fn, recovering and logging a panic of hook h.
func (h *hooks) safe(hook any, fn func()) {
	defer func() {
		if r := recover(); r != nil {
			h.log.Error("idem: hook panicked; processing goes on", "consumer", h.consumer,
				"hook", fmt.Sprintf("%T", hook), "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
		}
	}()
	fn()
}

func (h *hooks) onLease(ctx context.Context, list any, e LeaseEvent) {
	e.Consumer = h.consumer
	switch l := list.(type) {
	case []HookLeaseRenewed:
		for _, x := range l {
			h.safe(x, func() { x.OnLeaseRenewed(ctx, e) })
		}
	case []HookLeaseTakenOver:
		for _, x := range l {
			h.safe(x, func() { x.OnLeaseTakenOver(ctx, e) })
		}
	case []HookLeaseLost:
		for _, x := range l {
			h.safe(x, func() { x.OnLeaseLost(ctx, e) })
		}
	}
}

// storeErr wraps err with ErrStore (see storeError) and reports it to the
// store error hooks, unless ctx has ended: the failure is then the
// caller's cancellation, not the store's.
func (c *core) storeErr(ctx context.Context, op, id string, err error) error {
	err = storeError(op, err)
	if h := c.hooks; h != nil && err != nil && ctx.Err() == nil {
		for _, x := range h.storeErr {
			h.safe(x, func() {
				x.OnStoreError(ctx, StoreErrorEvent{Consumer: h.consumer, MessageID: id, Mode: h.mode, Op: op, Err: err})
			})
		}
	}
	return err
}

// now returns the time for a latency measurement, or the zero time when
// the consumer has no hooks to report it to.
func (c *core) now() time.Time {
	if c.hooks == nil {
		return time.Time{}
	}
	return time.Now()
}

// leaseLost reports a write rejected with ErrLeaseLost.
func (c *core) leaseLost(ctx context.Context, a *Attempt, op string, since time.Time, err error) {
	if h := c.hooks; h != nil && len(h.lost) > 0 {
		h.onLease(ctx, h.lost, LeaseEvent{MessageID: a.Message.ID, Attempt: a.Number, Token: a.Token, Op: op, Latency: time.Since(since), Err: err})
	}
}

// track follows one Process, ProcessTx or ProcessBatch call for the hooks.
// It is nil when the consumer has no hooks of the process, claim or
// outcome kinds, and every method of a nil
// *track does nothing, so the processing code calls them unconditionally.
type track struct {
	h        *hooks
	id       string
	batch    int
	start    time.Time
	claimed  bool   // single delivery: the message was claimed
	released bool   // lease mode: the claim was released for a retry
	ended    bool   // single delivery: its outcome and end were reported (end)
	claims   []bool // batch: claims[i] when msgs[i] was claimed
}

// begin starts tracking a call and runs the start hooks, returning the
// context for the rest of the call.
func (c *core) begin(ctx context.Context, id string, batch int) (context.Context, *track) {
	h := c.hooks
	if h == nil || len(h.start)+len(h.end)+len(h.claim)+len(h.outcome) == 0 {
		return ctx, nil
	}
	t := &track{h: h, id: id, batch: batch, start: time.Now()}
	if batch > 0 {
		t.claims = make([]bool, batch)
	}
	for _, x := range h.start {
		h.safe(x, func() {
			if nctx := x.OnProcessStart(ctx, ProcessStartEvent{Consumer: h.consumer, Mode: h.mode, MessageID: id, BatchSize: batch}); nctx != nil {
				ctx = nctx
			}
		})
	}
	return ctx, t
}

// now returns the time for a latency measurement, or the zero time when
// nothing is tracked.
func (t *track) now() time.Time {
	if t == nil {
		return time.Time{}
	}
	return time.Now()
}

// claim reports the claim of message i of a batch (i < 0 for a single
// delivery), made in the store call that started at since.
func (t *track) claim(ctx context.Context, i int, id string, attempt int, token int64, since time.Time) {
	if t == nil {
		return
	}
	if i < 0 {
		t.claimed = true
	} else {
		t.claims[i] = true
	}
	h := t.h
	for _, x := range h.claim {
		h.safe(x, func() {
			x.OnClaim(ctx, ClaimEvent{Consumer: h.consumer, MessageID: id, Mode: h.mode, Attempt: attempt, Token: token, Latency: time.Since(since)})
		})
	}
}

// outcome reports the outcome of one message.
func (t *track) outcome(ctx context.Context, out Outcome, claimed bool, lat time.Duration) {
	h := t.h
	e := OutcomeEvent{Outcome: out, Consumer: h.consumer, Mode: h.mode, Claimed: claimed, BatchSize: t.batch, Latency: lat}
	switch {
	case claimed:
		e.Released = out.Status == Failed && !out.Poison && (h.mode == ModeTransactional || t.released)
	case out.Status == Duplicate && out.MismatchAccepted, out.Status == FingerprintMismatch:
		e.Reason = DuplicateFingerprintMismatch
	case out.Status == Duplicate:
		e.Reason = DuplicateCompleted
	case out.Status == InProgress:
		e.Reason = DuplicateInProgress
	case out.Status == Failed && out.Poison:
		e.Reason = DuplicatePoison
	}
	for _, x := range h.outcome {
		h.safe(x, func() { x.OnOutcome(ctx, e) })
	}
}

// end reports the outcome of a single delivery and the end of its call,
// once: a lease-mode delivery whose attempt ended while it was being
// acquired (the crash-loop check of held, a recovery point that could not
// be saved) was reported by the attempt's end, and Acquire's own report
// that follows is dropped.
func (t *track) end(ctx context.Context, out Outcome, err error) {
	if t == nil || t.ended {
		return
	}
	t.ended = true
	lat := time.Since(t.start)
	t.outcome(ctx, out, t.claimed, lat)
	t.finish(ctx, err, lat)
}

// endBatch reports the outcome of each message of a batch and the end of
// its call.
func (t *track) endBatch(ctx context.Context, outs []Outcome, err error) {
	if t == nil {
		return
	}
	lat := time.Since(t.start)
	for i, o := range outs {
		t.outcome(ctx, o, t.claims[i], lat)
	}
	t.finish(ctx, err, lat)
}

// endPanic is deferred by a tracked call: when the call panics (a store
// or a Retryable that panics; a handler's panic is recovered before), it
// reports a Failed outcome for the message (or every message of the
// batch msgs) and the end of the call, so that the start is paired with an
// end and every claim with an outcome, then panics again with the same
// value. Without a panic it does nothing.
func (t *track) endPanic(ctx context.Context, id string, msgs []Message) {
	r := recover()
	if r == nil {
		return
	}
	if t.batch == 0 && t.ended {
		// The attempt's end reported it (a store that panicked in the
		// write that ended it): once.
		panic(r)
	}
	err := fmt.Errorf("idem: panic while processing: %v", r)
	lat := time.Since(t.start)
	if t.batch > 0 {
		for i, m := range msgs {
			t.outcome(ctx, Outcome{Status: Failed, MessageID: m.ID, Err: err}, t.claims[i], lat)
		}
	} else {
		t.outcome(ctx, Outcome{Status: Failed, MessageID: id, Err: err}, t.claimed, lat)
	}
	t.finish(ctx, err, lat)
	panic(r)
}

func (t *track) finish(ctx context.Context, err error, lat time.Duration) {
	h := t.h
	for _, x := range h.end {
		h.safe(x, func() {
			x.OnProcessEnd(ctx, ProcessEndEvent{Consumer: h.consumer, Mode: h.mode, MessageID: t.id, BatchSize: t.batch, Latency: lat, Err: err})
		})
	}
}

// LogHook returns a [Hook] that writes consumer events to logger (which
// defaults to slog.Default() when nil), at levels chosen so that a busy
// consumer's info log stays quiet:
//   - Debug: every outcome that is acknowledged or retried (processed,
//     duplicate, in progress, failed and released), with its duplicate
//     reason and latency. Duplicates are never logged above debug.
//   - Info: lease takeovers (an attempt after the first).
//   - Warn: outcomes that go to the dead letter (rejected, fingerprint
//     mismatch, poison), leases lost (stale completions), store errors.
//
// The consumer itself logs its purge loop (a summary at info, failures at
// warn) and failed lease renewals (warn) on [Config.Logger], so LogHook
// leaves purges and renewal errors out.
func LogHook(logger *slog.Logger) Hook {
	if logger == nil {
		logger = slog.Default()
	}
	return logHook{logger}
}

type logHook struct{ log *slog.Logger }

func (l logHook) OnOutcome(ctx context.Context, e OutcomeEvent) {
	lvl := slog.LevelDebug
	if e.Outcome.DeadLetter() {
		lvl = slog.LevelWarn
	}
	if !l.log.Enabled(ctx, lvl) {
		return
	}
	attrs := []slog.Attr{
		slog.String("consumer", e.Consumer), slog.String("message_id", e.Outcome.MessageID),
		slog.String("status", e.Outcome.Status.String()), slog.Duration("latency", e.Latency),
	}
	if e.Reason != NotDuplicate {
		attrs = append(attrs, slog.String("reason", e.Reason.String()))
	}
	if e.Outcome.Attempt > 0 {
		attrs = append(attrs, slog.Int("attempt", e.Outcome.Attempt))
	}
	if e.Outcome.Err != nil {
		attrs = append(attrs, slog.Any("err", e.Outcome.Err))
	}
	l.log.LogAttrs(ctx, lvl, "idem: message settled", attrs...)
}

func (l logHook) OnLeaseTakenOver(ctx context.Context, e LeaseEvent) {
	l.log.LogAttrs(ctx, slog.LevelInfo, "idem: message acquired by a later attempt",
		slog.String("consumer", e.Consumer), slog.String("message_id", e.MessageID),
		slog.Int("attempt", e.Attempt), slog.Int64("token", e.Token))
}

func (l logHook) OnLeaseLost(ctx context.Context, e LeaseEvent) {
	l.log.LogAttrs(ctx, slog.LevelWarn, "idem: lease lost to another attempt",
		slog.String("consumer", e.Consumer), slog.String("message_id", e.MessageID), slog.String("op", e.Op),
		slog.Int("attempt", e.Attempt), slog.Int64("token", e.Token))
}

func (l logHook) OnStoreError(ctx context.Context, e StoreErrorEvent) {
	if e.Op == "renew" || e.Op == "purge" {
		return
	}
	l.log.LogAttrs(ctx, slog.LevelWarn, "idem: store error",
		slog.String("consumer", e.Consumer), slog.String("message_id", e.MessageID), slog.String("op", e.Op), slog.Any("err", e.Err))
}
