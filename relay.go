package idem

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/idem-go/idem/idemdriver"
)

// Defaults applied by [NewRelay] to zero RelayConfig fields.
const (
	// DefaultRelayBatchSize is the most outbox rows one relay claim takes.
	// Under a steady flow a claim finds a few rows; after downtime or a
	// burst, large claims drain the backlog with fewer durable
	// transactions (a claim and a mark each) per message sent.
	DefaultRelayBatchSize = 1000
	// DefaultRelayWorkers is how many rounds a relay keeps in flight: two,
	// so that one batch's publish overlaps the other's claim and mark.
	DefaultRelayWorkers = 2
	// MaxRelayWorkers bounds RelayConfig.Workers: each round in flight is
	// a goroutine holding a store connection while it claims and marks.
	MaxRelayWorkers = 1024
	// DefaultRelayLease is how long claimed rows stay leased to a relay.
	DefaultRelayLease = 30 * time.Second
	// DefaultRelayMinPoll and DefaultRelayMaxPoll bound the relay's idle
	// polling: it polls again after MinPoll when it found work, and
	// doubles the wait up to MaxPoll while the outbox stays empty.
	DefaultRelayMinPoll = 50 * time.Millisecond
	DefaultRelayMaxPoll = 5 * time.Second
	// DefaultRelayMinRetry and DefaultRelayMaxRetry bound the backoff of a
	// message whose publish failed: MinRetry after the first failure,
	// doubling per attempt up to MaxRetry.
	DefaultRelayMinRetry = time.Second
	DefaultRelayMaxRetry = 5 * time.Minute
	// DefaultOutboxRetention is how long failed outbox rows (and sent
	// ones, with RelayConfig.KeepSent) are kept before the relay purges
	// them.
	DefaultOutboxRetention = 24 * time.Hour
)

// RelayConfig configures a [Relay]. Zero values take the documented defaults.
type RelayConfig struct {
	// Store is the outbox to relay from: a store implementing
	// idemdriver.OutboxStore (store/idempgxv5, store/idemsql, the memory
	// store). Mandatory.
	Store idemdriver.OutboxStore
	// Publisher sends the messages. Mandatory.
	Publisher Publisher
	// BatchSize is the most rows one claim takes and one Publish call
	// gets. Defaults to DefaultRelayBatchSize (1000). A relay holds up to
	// BatchSize × Workers rows, payloads included, in memory at once, and
	// a batch must be published within half the Lease: lower it for
	// payloads of hundreds of kilobytes or for a publisher that sends one
	// message at a time over a slow link.
	BatchSize int
	// Workers is how many rounds (claim, publish, mark) Run keeps in
	// flight at once, on disjoint rows, so that one batch's publish
	// overlaps the next one's claim and marks. Order per key is kept
	// whatever the number: a key's next row is claimable only once the
	// previous one is marked. Defaults to DefaultRelayWorkers (2); at
	// most MaxRelayWorkers.
	Workers int
	// Lease is how long claimed rows are reserved for this relay: another
	// relay sends a row again only after its lease ends unmarked (this
	// relay crashed, or took longer). Publish is cancelled at half the
	// lease. Defaults to DefaultRelayLease (30s); at least 10ms.
	Lease time.Duration
	// MinPoll and MaxPoll bound the wait between polls of an idle outbox
	// (see DefaultRelayMinPoll). With a store that notifies
	// (idemdriver.OutboxNotifier, PostgreSQL on pgx) and after Wake, the
	// relay runs at once; MaxPoll then only bounds how late it sees rows
	// whose retry time came. Defaults to 50ms and 5s.
	MinPoll, MaxPoll time.Duration
	// MinRetry and MaxRetry bound the per-message backoff after a failed
	// publish. Defaults to 1s and 5 minutes.
	MinRetry, MaxRetry time.Duration
	// KeepSent keeps each sent row in the outbox table, marked sent, until
	// Retention has passed (the purge then deletes it): for audit, or to
	// replay what was sent. False, the default, deletes a row as soon as
	// the publisher confirmed it, in the statement that would have marked
	// it: the processed-messages record is what stops a redelivered
	// incoming message from emitting again, so a sent row guards nothing,
	// and deleting it at once spares the table a write per message (the
	// mark, then the purge's delete) and the sent rows' space.
	KeepSent bool
	// LockedRounds makes each round (claim, publish, end) one
	// transaction that holds the claimed rows' locks through the publish
	// instead of leasing them, on a store that can
	// (idemdriver.OutboxLockedRounder: store/idempgxv5); other stores
	// ignore it. A sent row is then written once, its delete, not also
	// leased: about 100 bytes of WAL less per message on PostgreSQL, at
	// the same CPU. The costs: a round holds a store connection while it
	// publishes, and the rows' locks until it commits; the server ends a
	// round whose transaction stays idle for Lease (a stalled relay), and
	// its rows are claimed again at once; a relay that dies mid-round
	// (a message whose publish crashes the process) counts no attempt
	// for its rows, so they are neither backed off nor dead-lettered
	// however often that happens. Off by default: rounds lease their
	// rows (an UPDATE per row) and publish with no transaction open.
	LockedRounds bool
	// Retention is how long failed rows, and sent ones with KeepSent, are
	// kept. Defaults to DefaultOutboxRetention (24 hours); negative
	// disables purging.
	Retention time.Duration
	// PurgeInterval is how often Run purges. Defaults to a tenth of
	// Retention, between 1 second and 1 hour.
	PurgeInterval time.Duration
	// PurgeBatchSize is the most rows one purge statement deletes.
	// Defaults to DefaultPurgeBatchSize (1000).
	PurgeBatchSize int
	// Logger receives failed claims, marks and purges (warn), and panics
	// of Hooks (error). Defaults to slog.Default().
	Logger *slog.Logger
	// Hooks observe the relay's rounds; each must implement [HookRelay],
	// or NewRelay returns an error matching ErrInvalidConfig.
	Hooks []Hook
}

func (c RelayConfig) withDefaults() RelayConfig {
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultRelayBatchSize
	}
	if c.Workers == 0 {
		c.Workers = DefaultRelayWorkers
	}
	def(&c.Lease, DefaultRelayLease)
	def(&c.MinPoll, DefaultRelayMinPoll)
	def(&c.MaxPoll, max(DefaultRelayMaxPoll, c.MinPoll))
	def(&c.MinRetry, DefaultRelayMinRetry)
	def(&c.MaxRetry, max(DefaultRelayMaxRetry, c.MinRetry))
	def(&c.Retention, DefaultOutboxRetention)
	def(&c.PurgeInterval, min(max(c.Retention/10, time.Second), time.Hour))
	if c.PurgeBatchSize == 0 {
		c.PurgeBatchSize = DefaultPurgeBatchSize
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c RelayConfig) validate() error {
	switch {
	case c.Store == nil:
		return fmt.Errorf("%w: RelayConfig.Store is nil", ErrInvalidConfig)
	case c.Publisher == nil:
		return fmt.Errorf("%w: RelayConfig.Publisher is nil", ErrInvalidConfig)
	case c.BatchSize < 1:
		return fmt.Errorf("%w: relay BatchSize %d", ErrInvalidConfig, c.BatchSize)
	case c.Workers < 1 || c.Workers > MaxRelayWorkers:
		return fmt.Errorf("%w: relay Workers %d is not in 1..%d", ErrInvalidConfig, c.Workers, MaxRelayWorkers)
	case c.Lease < 10*time.Millisecond:
		return fmt.Errorf("%w: relay Lease %v is under 10ms", ErrInvalidConfig, c.Lease)
	case c.MinPoll <= 0 || c.MaxPoll < c.MinPoll:
		return fmt.Errorf("%w: relay poll %v..%v", ErrInvalidConfig, c.MinPoll, c.MaxPoll)
	case c.MinRetry <= 0 || c.MaxRetry < c.MinRetry:
		return fmt.Errorf("%w: relay retry %v..%v", ErrInvalidConfig, c.MinRetry, c.MaxRetry)
	case c.PurgeInterval <= 0 || c.PurgeBatchSize < 1:
		return fmt.Errorf("%w: relay purge every %v by %d", ErrInvalidConfig, c.PurgeInterval, c.PurgeBatchSize)
	}
	for i, h := range c.Hooks {
		if _, ok := h.(HookRelay); !ok {
			return fmt.Errorf("%w: RelayConfig.Hooks[%d] (%T) does not implement idem.HookRelay", ErrInvalidConfig, i, h)
		}
	}
	return nil
}

// Relay sends the outbox's pending messages through a [Publisher]: the
// rows a [Consumer] wrote in its handlers' transactions, rows left behind
// by a crash, and rows other programs wrote into the table.
//
// Delivery is at least once, and each message carries its outbox ID, so
// a downstream idem consumer applies it once: a row is deleted (or, with
// RelayConfig.KeepSent, marked sent and kept until its retention ends)
// only after the publisher confirmed it, and a relay that dies between the
// confirmation and that delete leaves the row to be sent again, with the
// same ID, when its lease ends. Relays side by side (in one process or many)
// claim disjoint rows (FOR UPDATE SKIP LOCKED, or SQLite's single writer)
// and never send one row at once while its lease lasts. Per destination
// and non-empty ordering key, messages go out in sequence order, each
// after the previous one was confirmed; a message whose publish fails is
// retried with backoff (MinRetry doubling to MaxRetry) and holds back only
// the later messages of its own key.
//
// Run it with [Relay.Run] in a goroutine the caller owns, or drive it
// with [Relay.RunOnce]. A Consumer whose Config.Relay is set wakes it
// after every commit that emitted and on every duplicate whose first
// processing left messages unsent, so messages go out at once rather than
// at the next poll.
type Relay struct {
	cfg   RelayConfig
	wake  chan struct{}
	hooks *hooks // nil without cfg.Hooks

	runMu sync.Mutex // one Run at a time
}

// NewRelay returns a Relay. It returns an error matching ErrInvalidConfig
// when cfg is invalid. It starts nothing: call Run.
func NewRelay(cfg RelayConfig) (*Relay, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &Relay{cfg: cfg, wake: make(chan struct{}, 1)}
	if len(cfg.Hooks) > 0 {
		r.hooks = &hooks{consumer: "relay", log: cfg.Logger}
		for _, h := range cfg.Hooks {
			r.hooks.relay = append(r.hooks.relay, h.(HookRelay))
		}
	}
	return r, nil
}

// Wake makes a running Run claim at once instead of at its next poll. It
// never blocks; wakes that come while one is pending are merged.
func (r *Relay) Wake() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// RelayResult counts what one [Relay.RunOnce] did.
type RelayResult struct {
	// Claimed counts the rows claimed; Sent those confirmed and deleted
	// (or marked sent, with RelayConfig.KeepSent);
	// Retried those that failed and wait for their backoff; Failed those
	// that failed for good (each counted once its mark was written).
	Claimed, Sent, Retried, Failed int
}

// RunOnce claims one batch of pending rows, publishes it, and deletes
// each confirmed row (marks it sent, with KeepSent) and marks each other
// row for retry, or failed. On a store that implements
// idemdriver.OutboxLockedRounder, with LockedRounds, that is one
// transaction holding the rows' locks, and a failed end or commit leaves
// every row of the round to be claimed again at once. The error matches
// ErrStore when the claim or a mark failed (a row whose mark failed is
// sent again after its lease), also ErrStoreTimeout when the claim did not
// answer within 10s (a stalled connection), and is ctx's error when ctx
// ended.
func (r *Relay) RunOnce(ctx context.Context) (RelayResult, error) {
	if r.hooks == nil {
		res, _, err := r.runOnce(ctx)
		return res, err
	}
	start := time.Now()
	res, oldest, err := r.runOnce(ctx)
	r.report(ctx, res, oldest, start, err)
	return res, err
}

// report calls the relay hooks for a round that started at start, if it
// claimed rows or failed.
func (r *Relay) report(ctx context.Context, res RelayResult, oldest, start time.Time, err error) {
	if r.hooks == nil || (res.Claimed == 0 && err == nil) {
		return
	}
	e := RelayEvent{Result: res, Err: err, Latency: time.Since(start)}
	if !oldest.IsZero() {
		e.OldestAge = max(time.Since(oldest), 0)
	}
	for _, x := range r.hooks.relay {
		r.hooks.safe(x, func() { x.OnRelay(ctx, e) })
	}
}

// runOnce is RunOnce, also returning the oldest CreatedAt it claimed.
// The claim is bounded by finishTimeout, as the marks are: on a
// connection that never answers (a black hole, a hung server) it would
// otherwise hold its worker for good. The bound is for liveness only, not
// tied to the lease: a claim answered late leaves less of the lease for
// the publish, which the marks' fencing already covers.
func (r *Relay) runOnce(ctx context.Context) (res RelayResult, oldest time.Time, err error) {
	if lr := r.lockedRounder(); lr != nil {
		return r.runLocked(ctx, lr)
	}
	cctx, cancel := callCtx(ctx, finishTimeout)
	recs, err := r.cfg.Store.ClaimOutgoing(cctx, r.claimParams())
	err = timedOut(cctx, err)
	cancel()
	if err != nil {
		return res, oldest, storeError("claim outgoing", err)
	}
	res.Claimed = len(recs)
	if len(recs) == 0 {
		return res, oldest, nil
	}
	oldest = sortClaimed(recs)
	errs := r.publish(ctx, recs)
	return res, oldest, r.mark(ctx, recs, errs, &res)
}

// lockedRounder is the store as an idemdriver.OutboxLockedRounder, nil
// unless RelayConfig.LockedRounds is set and the store is one.
func (r *Relay) lockedRounder() idemdriver.OutboxLockedRounder {
	if !r.cfg.LockedRounds {
		return nil
	}
	lr, _ := r.cfg.Store.(idemdriver.OutboxLockedRounder)
	return lr
}

// runLocked is runOnce on a store that holds the claimed rows' locks
// through the publish: one store call, one transaction.
func (r *Relay) runLocked(ctx context.Context, lr idemdriver.OutboxLockedRounder) (res RelayResult, oldest time.Time, err error) {
	lk := &lockedRound{r: r}
	lk.p = idemdriver.LockedRoundParams{Limit: r.cfg.BatchSize, Lease: r.cfg.Lease, CallTimeout: finishTimeout, Publish: lk.publish}
	res.Claimed, err = lr.LockedRound(ctx, &lk.p)
	if err != nil {
		if res.Claimed > 0 {
			return res, lk.oldest, fmt.Errorf("%w (%d rows claimed: they are claimed again)", storeError("relay round", err), res.Claimed)
		}
		return res, lk.oldest, storeError("relay round", err)
	}
	res.Sent = len(lk.sent.IDs)
	for _, f := range lk.failed {
		if f.Permanent {
			res.Failed++
		} else {
			res.Retried++
		}
	}
	return res, lk.oldest, nil
}

// lockedRound is one round of runLocked: its parameters, and what its
// publish found.
type lockedRound struct {
	r      *Relay
	p      idemdriver.LockedRoundParams
	oldest time.Time
	sent   idemdriver.MarkSentParams
	failed []idemdriver.FailedRow
}

// publish is the round's LockedRoundParams.Publish.
func (lk *lockedRound) publish(ctx context.Context, recs []Outgoing) (idemdriver.MarkSentParams, []idemdriver.FailedRow) {
	lk.oldest = sortClaimed(recs)
	lk.sent, lk.failed = lk.r.outcomes(recs, lk.r.publish(ctx, recs))
	return lk.sent, lk.failed
}

func (r *Relay) claimParams() *idemdriver.ClaimOutgoingParams {
	return &idemdriver.ClaimOutgoingParams{Limit: r.cfg.BatchSize, Lease: r.cfg.Lease}
}

// sortClaimed sorts claimed rows by seq, for the publish, and returns the
// oldest CreatedAt among them.
func sortClaimed(recs []Outgoing) time.Time {
	oldest := recs[0].CreatedAt
	for _, rec := range recs {
		if rec.CreatedAt.Before(oldest) {
			oldest = rec.CreatedAt
		}
	}
	slices.SortFunc(recs, func(a, b Outgoing) int { return cmp.Compare(a.Seq, b.Seq) })
	return oldest
}

// heldRound is a round of Run whose publish is over, whose failed rows
// are marked and whose confirmed rows are still to be ended: with a store
// that ends them together with its next claim
// (idemdriver.OutboxSentClaimer), a worker of Run holds them until that
// claim, which it makes at once, without waiting for a wake or a poll.
// Its hook event comes once its rows are ended, its Latency counting
// that call too.
type heldRound struct {
	res    RelayResult // Claimed, Retried and Failed; Sent once ended
	oldest time.Time
	start  time.Time
	sent   idemdriver.MarkSentParams
}

// runHeld is one round of a worker of Run on a store that implements
// idemdriver.OutboxSentClaimer: it ends the confirmed rows of *held (the
// worker's previous round) with the claim, in one call, reporting that
// round to the hooks; publishes what it claimed; marks the failed rows;
// and holds the confirmed ones in *held for the next round. Its result is
// this round's (Sent not yet counted); its error, that of the call that
// ended *held's rows and claimed, or of the failed rows' mark.
func (r *Relay) runHeld(ctx context.Context, sc idemdriver.OutboxSentClaimer, held **heldRound) (res RelayResult, err error) {
	start := time.Now()
	var recs []Outgoing
	if h := *held; h != nil {
		*held = nil
		// Not cancelled with ctx, as marks are not: a confirmed row left
		// in place is published again after its lease.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
		recs, err = sc.MarkSentClaim(cctx, &h.sent, r.claimParams())
		err = timedOut(cctx, err)
		cancel()
		if err != nil {
			err = storeError("mark outgoing sent and claim", err)
			// The call's transaction rolled back (a deadlock between
			// two workers' calls on MariaDB, a timeout): the held rows
			// were still confirmed by the broker. They are ended alone
			// now, not dropped: dropped, they would be published again
			// once their lease ended. Ending them twice, if the call
			// committed after all, finds no row to end.
			r.endHeld(ctx, h)
			return res, err
		}
		h.res.Sent = len(h.sent.IDs)
		r.report(ctx, h.res, h.oldest, h.start, nil)
	} else {
		cctx, cancel := callCtx(ctx, finishTimeout)
		recs, err = r.cfg.Store.ClaimOutgoing(cctx, r.claimParams())
		err = timedOut(cctx, err)
		cancel()
		if err != nil {
			err = storeError("claim outgoing", err)
			r.report(ctx, res, time.Time{}, start, err)
			return res, err
		}
	}
	res.Claimed = len(recs)
	if len(recs) == 0 {
		return res, nil
	}
	oldest := sortClaimed(recs)
	errs := r.publish(ctx, recs)
	sent, failed := r.outcomes(recs, errs)
	err = r.markFailed(ctx, failed, &res)
	if len(sent.IDs) == 0 || err != nil {
		// Nothing to hold, or a failed mark to report now: the
		// confirmed rows are ended at once, as RunOnce does.
		if len(sent.IDs) > 0 {
			err = errors.Join(r.markSent(ctx, sent, &res), err)
		}
		r.report(ctx, res, oldest, start, err)
		return res, err
	}
	*held = &heldRound{res: res, oldest: oldest, start: start, sent: sent}
	return res, nil
}

// endHeld ends the confirmed rows of a held round with MarkSent and
// reports the round: when Run stops, or before a worker waits.
func (r *Relay) endHeld(ctx context.Context, h *heldRound) {
	err := r.markSent(ctx, h.sent, &h.res)
	r.report(ctx, h.res, h.oldest, h.start, err)
	if err != nil { // logged even once Run's ctx ended: the rows go out again
		r.cfg.Logger.Warn("idem: relay", "error", err)
	}
}

// mark writes the outcome of a published batch in two calls: the
// confirmed rows deleted (or marked sent, with KeepSent) first (a
// confirmed row left in place is published again after its lease), then
// the failed rows, each for retry
// or as failed. Each call has its own finishTimeout on a context detached
// from ctx, so that a slow store (a SQLite writer waiting its turn) makes
// a round long rather than failing the second mark because the first used
// up a shared deadline. A failed mark's error says how many rows it may
// have left unmarked: they are claimed again once their lease ends.
func (r *Relay) mark(ctx context.Context, recs []Outgoing, errs []error, res *RelayResult) error {
	sent, failed := r.outcomes(recs, errs)
	return errors.Join(r.markSent(ctx, sent, res), r.markFailed(ctx, failed, res))
}

// outcomes splits published rows by their publish errors: the confirmed
// ones to end, the others to mark for retry or as failed.
func (r *Relay) outcomes(recs []Outgoing, errs []error) (sent idemdriver.MarkSentParams, failed []idemdriver.FailedRow) {
	sent.Keep = r.cfg.KeepSent
	for i, rec := range recs {
		if errs[i] == nil {
			sent.IDs, sent.Seqs = append(sent.IDs, rec.ID), append(sent.Seqs, rec.Seq)
			continue
		}
		f := idemdriver.FailedRow{ID: rec.ID, Attempt: rec.Attempts, Seq: rec.Seq, Permanent: errors.Is(errs[i], ErrPermanent), Error: errs[i].Error()}
		if !f.Permanent {
			f.RetryAfter = r.backoff(rec.Attempts)
		}
		failed = append(failed, f)
	}
	return sent, failed
}

// markSent ends the confirmed rows of sent, if any, counting them in res.
func (r *Relay) markSent(ctx context.Context, sent idemdriver.MarkSentParams, res *RelayResult) error {
	if len(sent.IDs) == 0 {
		return nil
	}
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	err := r.cfg.Store.MarkSent(mctx, &sent)
	cancel()
	if err != nil {
		return storeError("mark outgoing sent", err)
	}
	res.Sent = len(sent.IDs)
	return nil
}

// markFailed marks the failed rows, if any, counting them in res.
func (r *Relay) markFailed(ctx context.Context, failed []idemdriver.FailedRow, res *RelayResult) error {
	if len(failed) == 0 {
		return nil
	}
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	err := r.cfg.Store.MarkFailed(mctx, &idemdriver.MarkFailedParams{Rows: failed})
	cancel()
	if err != nil {
		return fmt.Errorf("%w (%d failed rows not known to be marked: those left unmarked are claimed again once their lease ends)", storeError("mark outgoing failed", err), len(failed))
	}
	for _, f := range failed {
		if f.Permanent {
			res.Failed++
		} else {
			res.Retried++
		}
	}
	return nil
}

// publish calls the publisher with half the lease as its deadline, turning
// a panic or a result of the wrong length into retryable errors.
func (r *Relay) publish(ctx context.Context, recs []Outgoing) (errs []error) {
	pctx, cancel := context.WithTimeout(ctx, r.cfg.Lease/2)
	defer cancel()
	defer func() {
		if v := recover(); v != nil {
			errs = fill(len(recs), fmt.Errorf("idem: publisher panicked: %v", v))
		}
	}()
	errs = r.cfg.Publisher.Publish(pctx, recs)
	if len(errs) != len(recs) {
		return fill(len(recs), fmt.Errorf("idem: publisher returned %d results for %d messages", len(errs), len(recs)))
	}
	return errs
}

func fill(n int, err error) []error {
	errs := make([]error, n)
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// backoff is the wait after the attempts-th failed publish of a row.
func (r *Relay) backoff(attempts int) time.Duration {
	d := r.cfg.MinRetry
	for i := 1; i < attempts && d < r.cfg.MaxRetry; i++ {
		d *= 2
	}
	return min(d, r.cfg.MaxRetry)
}

// Run relays until ctx ends, then returns nil: each of its Workers claims
// and publishes batch after batch while there is work (a worker that
// claimed a full batch wakes another), then waits for a Wake, a
// notification from the store (idemdriver.OutboxNotifier), or its poll
// interval; the first worker purges failed (and kept sent) rows every
// PurgeInterval. With LockedRounds, on a store that implements
// idemdriver.OutboxLockedRounder (store/idempgxv5), each round is one
// transaction that holds its rows' locks through the publish. Otherwise,
// with a store that implements idemdriver.OutboxSentClaimer
// (store/idempgxv5, store/idemsql), a worker ends a round's
// confirmed rows in the same call (one round trip, one transaction) as
// its next claim, which it makes at once, before any wait; when Run stops
// it ends those it still holds.
// Failures are logged and retried with backoff; they never stop Run. One
// Run at a time per Relay: a second call waits for the first to return.
func (r *Relay) Run(ctx context.Context) error {
	r.runMu.Lock()
	defer r.runMu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	if n, ok := r.cfg.Store.(idemdriver.OutboxNotifier); ok {
		wg.Add(1)
		go func() { defer wg.Done(); r.listen(ctx, n) }()
	}
	for i := 1; i < r.cfg.Workers && ctx.Err() == nil; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); r.work(ctx, false) }()
	}
	r.work(ctx, r.cfg.Retention > 0)
	return nil
}

// work is one worker of Run; purge says whether it purges.
func (r *Relay) work(ctx context.Context, purge bool) {
	poll := r.cfg.MinPoll
	var nextPurge time.Time
	if purge {
		nextPurge = time.Now()
	}
	// With a store that ends a round's confirmed rows together with the
	// next claim, each round holds them (held) until the next round's
	// claim, made at once: one store call per round instead of two.
	sc, _ := r.cfg.Store.(idemdriver.OutboxSentClaimer)
	if r.lockedRounder() != nil {
		sc = nil // a locked round ends its rows itself
	}
	var held *heldRound
	defer func() {
		if held != nil {
			r.endHeld(ctx, held)
		}
	}()
	for ctx.Err() == nil {
		var (
			res RelayResult
			err error
		)
		ended := held != nil // this round ends the last one's rows
		if sc != nil {
			res, err = r.runHeld(ctx, sc, &held)
		} else {
			res, err = r.RunOnce(ctx)
		}
		if ctx.Err() != nil {
			return
		}
		full := false
		switch {
		case err != nil:
			r.cfg.Logger.Warn("idem: relay", "error", err)
			poll = min(poll*2, r.cfg.MaxPoll)
		case res.Claimed == r.cfg.BatchSize:
			full = true
			poll = r.cfg.MinPoll
			r.Wake() // more waiting: another worker may take it
		case res.Claimed > 0 || ended:
			poll = r.cfg.MinPoll
		default:
			poll = min(poll*2, r.cfg.MaxPoll)
		}
		if purge && !time.Now().Before(nextPurge) {
			if held != nil {
				// A purge may outlast the lease (a backlog of rows past
				// their retention): the held rows are ended first, not
				// left in place to hold back their keys and, once their
				// lease ends, to be sent again by another relay.
				r.endHeld(ctx, held)
				held = nil
			}
			r.purge(ctx)
			nextPurge = time.Now().Add(r.cfg.PurgeInterval)
		}
		if full || held != nil {
			continue // held: its rows are ended with the next claim, now
		}
		t := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-r.wake:
			poll = r.cfg.MinPoll
		case <-t.C:
		}
		t.Stop()
	}
}

// listen turns the store's notifications into wakes until ctx ends,
// watching again after MinPoll doubling to MaxPoll when a watch fails.
func (r *Relay) listen(ctx context.Context, n idemdriver.OutboxNotifier) {
	backoff := r.cfg.MinPoll
	for {
		start := time.Now()
		err := n.WatchOutgoing(ctx, r.Wake)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > r.cfg.MaxPoll {
			backoff = r.cfg.MinPoll // it had been working
		}
		r.cfg.Logger.Warn("idem: relay: watching for outbox notifications", "error", err)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(backoff*2, r.cfg.MaxPoll)
	}
}

// Purge deletes failed rows, and sent rows kept by KeepSent, older than
// the retention, in batches
// of PurgeBatchSize, and returns how many it deleted. Errors match
// ErrStore.
func (r *Relay) Purge(ctx context.Context) (int64, error) {
	if r.cfg.Retention < 0 {
		return 0, nil
	}
	var total int64
	for {
		n, err := r.cfg.Store.PurgeOutbox(ctx, &idemdriver.PurgeOutboxParams{Retention: r.cfg.Retention, Limit: r.cfg.PurgeBatchSize})
		total += n
		if err != nil {
			return total, storeError("purge outbox", err)
		}
		if n < int64(r.cfg.PurgeBatchSize) {
			return total, nil
		}
	}
}

func (r *Relay) purge(ctx context.Context) {
	if _, err := r.Purge(ctx); err != nil && ctx.Err() == nil {
		r.cfg.Logger.Warn("idem: relay: purge", "error", err)
	}
}
