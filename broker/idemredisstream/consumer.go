package idemredisstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/lifecycle"
	"github.com/redis/go-redis/v9"
)

// Fields of a dead letter that locate the original, besides the fields
// every idem adapter writes (idem.HeaderDeadLetterReason,
// idem.HeaderDeadLetterError, idem.HeaderDeadLetterStatus,
// idem.HeaderOriginalMessageID) and the original entry's own fields.
const (
	// FieldOriginalStream is the stream the entry was read from.
	FieldOriginalStream = "Idem-Original-Stream"
	// FieldOriginalEntry is the original entry's stream ID.
	FieldOriginalEntry = "Idem-Original-Entry"
)

// Defaults applied by NewConsumer to zero Config fields.
const (
	// DefaultIDField is the field holding the message ID.
	DefaultIDField = "message-id"
	// DefaultPayloadField is the field holding the payload.
	DefaultPayloadField = "payload"
	// DefaultMinIdle is how long an entry stays pending, unacknowledged
	// and not kept alive, before XAUTOCLAIM hands it to a member again.
	DefaultMinIdle = 30 * time.Second
	// DefaultRetryDelay is the delay before a Failed entry is redelivered.
	DefaultRetryDelay = time.Second
	// DefaultBlock is how long one XREADGROUP waits for new entries.
	DefaultBlock = 2 * time.Second
	// DefaultSettleTimeout bounds the settling of one entry (its XACK,
	// dead letter or delayed redelivery), in batch mode of one batch's
	// entries together.
	DefaultSettleTimeout = 30 * time.Second
	// DefaultHandlerTimeout is Config.HandlerTimeout's default.
	DefaultHandlerTimeout = 5 * time.Minute
	// DefaultBatchSize is Config.BatchSize's default: the most entries in
	// one batch (batch mode).
	DefaultBatchSize = 32
)

// Config configures a Consumer. Zero values take the documented defaults.
type Config struct {
	// Processor runs each entry through an Idempotent Consumer (idem.Bind,
	// idem.BindLease, or an idem.ProcessorFunc). One of Processor and
	// BatchProcessor is required, and it must be safe for concurrent use
	// when Concurrency > 1.
	Processor idem.Processor
	// BatchProcessor selects batch mode: the entries one XREADGROUP
	// returns, and those one XAUTOCLAIM reclaims, at most BatchSize of
	// them, are handed to it in one call (idem.GuardBatch), and each is
	// then settled by its own Outcome, as in the default mode (the acks
	// of a batch go in one XACK). Concurrency is then how many batches
	// are processed at once. An idemhttp.Deliverer is one (a batch's
	// claims and completions in one store call each), as is
	// idem.BindBatch (one transaction per batch). Exclusive with
	// Processor. An entry without the payload field is dead-lettered
	// without being handed over, as in the default mode.
	BatchProcessor idem.BatchProcessor
	// BatchSize is, in batch mode, the most entries one XREADGROUP or
	// XAUTOCLAIM asks for (COUNT): the most in one batch. Defaults to
	// DefaultBatchSize (32); ignored without BatchProcessor. An
	// idemhttp.Deliverer takes at most idemdriver.MaxLeaseBatch (1000)
	// messages in a batch.
	BatchSize int
	// Stream is the stream to consume. Required.
	Stream string
	// Group is the consumer group. Required. Run creates it (and the
	// stream) at GroupStart if it does not exist.
	Group string
	// Consumer is this member's name in the group. Required; unique among
	// the members running at once (a host name and process ID, a pod name).
	Consumer string
	// DeadLetter is the stream that receives dead letters. Required (no
	// silent drops), and not Stream.
	DeadLetter string
	// IDField is the field holding the message ID. Defaults to
	// DefaultIDField ("message-id").
	IDField string
	// PayloadField is the field holding the payload. Defaults to
	// DefaultPayloadField ("payload"). An entry without it is Rejected
	// with idem.ErrInvalidPayload and dead-lettered without calling the
	// Processor (an empty value is an empty payload).
	PayloadField string
	// GroupStart is the ID the group starts from when Run creates it:
	// "0" (the default) for the whole stream, "$" for new entries only.
	GroupStart string
	// Concurrency is how many entries are processed at once; XREADGROUP
	// and XAUTOCLAIM fetch no more than the free workers. In batch mode
	// it is how many batches are processed at once, each fetched by one
	// XREADGROUP or XAUTOCLAIM when a worker is free. Defaults to 1.
	Concurrency int
	// MinIdle is the XAUTOCLAIM min-idle time: an entry pending that long,
	// not acknowledged and not kept alive by a running member, is claimed
	// by another. Defaults to DefaultMinIdle (30s); at least 10ms.
	MinIdle time.Duration
	// ClaimInterval is the period of the XAUTOCLAIM loop. Defaults to the
	// smaller of RetryDelay and MinIdle/4, and at least 10ms.
	ClaimInterval time.Duration
	// RetryDelay is how long a Failed (retryable) entry waits before it is
	// reclaimed, and the delay of an InProgress entry whose Outcome has no
	// RetryAfter; capped at MinIdle. Defaults to DefaultRetryDelay (1s).
	RetryDelay time.Duration
	// Block is how long one XREADGROUP waits for new entries; Stop waits
	// for the read in progress, so it bounds Stop's latency. Defaults to
	// DefaultBlock (2s).
	Block time.Duration
	// HandlerTimeout bounds one entry's processing (in batch mode one
	// batch's: the whole BatchProcessor call): the context the
	// Processor gets ends HandlerTimeout after the entry was read (or
	// reclaimed), so a handler blocked on a stalled connection (a
	// database call with no deadline of its own) gives up, its
	// transaction rolls back, and the entry is left pending for
	// redelivery (after RetryDelay). Its keep-alive ends at that same
	// instant, never before it, so the entry stays this member's while
	// its handler may run, and even a handler that ignores its context
	// no longer holds the entry past MinIdle after it: XAUTOCLAIM gives
	// it to a member again. Defaults to DefaultHandlerTimeout (5 minutes);
	// negative disables it (a stuck handler then holds its entry for
	// ever).
	HandlerTimeout time.Duration
	// MaxDeliveries, when positive, dead-letters an entry reclaimed after
	// more than MaxDeliveries deliveries, with idem.ErrTooManyDeliveries (see
	// the package doc). Defaults to 0: no limit.
	MaxDeliveries int
	// Logger receives every settlement at the level idem.Settlement.Level
	// gives it (duplicates at debug, dead letters at warn, store failures
	// and panics at error), and read, claim and ack problems at warn.
	// Defaults to slog.Default().
	Logger *slog.Logger
}

// Consumer is one member of a Redis Streams consumer group that runs each
// entry through an idem.Processor; see the package doc. Create it with
// NewConsumer, run it with Run, stop it with Stop.
type Consumer struct {
	rdb redis.UniversalClient
	cfg Config
	log *slog.Logger

	life *lifecycle.Lifecycle

	readyOnce sync.Once
	ready     chan struct{} // closed once the group exists and reading starts

	flightMu sync.Mutex
	// inFlight holds the entries being processed, by entry ID: each
	// delivery's own record, kept alive until its deadline (zero: none).
	inFlight map[string]*flight
}

// flight is one delivery of an entry in processing.
type flight struct{ until time.Time }

// NewConsumer returns a Consumer of cfg.Stream on the caller's client. It
// does no I/O. Errors match idem.ErrInvalidConfig.
func NewConsumer(rdb redis.UniversalClient, cfg Config) (*Consumer, error) {
	if rdb == nil {
		return nil, fmt.Errorf("%w: idemredisstream: nil client", idem.ErrInvalidConfig)
	}
	if err := cfg.withDefaults(); err != nil {
		return nil, err
	}
	return &Consumer{
		rdb:      rdb,
		cfg:      cfg,
		log:      cfg.Logger.With("stream", cfg.Stream, "group", cfg.Group, "consumer", cfg.Consumer),
		life:     lifecycle.New(),
		ready:    make(chan struct{}),
		inFlight: map[string]*flight{},
	}, nil
}

func (cfg *Config) withDefaults() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: idemredisstream: "+format, append([]any{idem.ErrInvalidConfig}, args...)...)
	}
	switch {
	case cfg.Processor == nil && cfg.BatchProcessor == nil:
		return bad("Processor (or BatchProcessor) is required")
	case cfg.Processor != nil && cfg.BatchProcessor != nil:
		return bad("Processor and BatchProcessor are exclusive; set one")
	case cfg.BatchSize < 0:
		return bad("BatchSize %d is negative", cfg.BatchSize)
	case cfg.Stream == "":
		return bad("Stream is required")
	case cfg.Group == "":
		return bad("Group is required")
	case cfg.Consumer == "":
		return bad("Consumer is required")
	case cfg.DeadLetter == "":
		return bad("DeadLetter is required: a message that cannot be processed is never dropped")
	case cfg.DeadLetter == cfg.Stream:
		return bad("DeadLetter %q is the consumed stream", cfg.DeadLetter)
	case cfg.Concurrency < 0:
		return bad("Concurrency %d is negative", cfg.Concurrency)
	case cfg.MinIdle < 0 || (cfg.MinIdle > 0 && cfg.MinIdle < 10*time.Millisecond):
		return bad("MinIdle %v is below 10ms", cfg.MinIdle)
	case cfg.ClaimInterval < 0:
		return bad("ClaimInterval %v is negative", cfg.ClaimInterval)
	case cfg.RetryDelay < 0:
		return bad("RetryDelay %v is negative", cfg.RetryDelay)
	case cfg.Block < 0:
		return bad("Block %v is negative", cfg.Block)
	case cfg.MaxDeliveries < 0:
		return bad("MaxDeliveries %d is negative", cfg.MaxDeliveries)
	}
	if cfg.IDField == "" {
		cfg.IDField = DefaultIDField
	}
	if cfg.PayloadField == "" {
		cfg.PayloadField = DefaultPayloadField
	}
	if cfg.IDField == cfg.PayloadField {
		return bad("IDField and PayloadField are both %q", cfg.IDField)
	}
	if cfg.GroupStart == "" {
		cfg.GroupStart = "0"
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 1
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	if cfg.MinIdle == 0 {
		cfg.MinIdle = DefaultMinIdle
	}
	if cfg.RetryDelay == 0 {
		cfg.RetryDelay = DefaultRetryDelay
	}
	if cfg.ClaimInterval == 0 {
		cfg.ClaimInterval = min(cfg.RetryDelay, cfg.MinIdle/4)
	}
	cfg.ClaimInterval = max(cfg.ClaimInterval, 10*time.Millisecond)
	if cfg.Block == 0 {
		cfg.Block = DefaultBlock
	}
	if cfg.HandlerTimeout == 0 {
		cfg.HandlerTimeout = DefaultHandlerTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return nil
}

// Run consumes until Stop is called or ctx ends. It returns nil after Stop
// (also when Stop came before Run), and ctx.Err() when ctx ended first.
// It first creates the group (XGROUP CREATE ... MKSTREAM at GroupStart) if
// it does not exist, and returns that error if it fails for another reason;
// it returns redis.ErrClosed wrapped if the client is closed. Failed reads
// and claims are retried after RetryDelay. A Consumer runs once: a second
// Run returns an error matching idem.ErrAlreadyRunning.
//
// ctx is the parent of every handler's context: cancelling it stops the
// Consumer at once, without waiting for handlers (use Stop to finish them).
func (c *Consumer) Run(ctx context.Context) error {
	return c.life.Run(ctx, fmt.Errorf("idemredisstream: stream %s, consumer %s: %w", c.cfg.Stream, c.cfg.Consumer, idem.ErrAlreadyRunning), c.run)
}

// run is Run's body; it returns nil when runCtx ends or Stop is called.
func (c *Consumer) run(runCtx context.Context) error {
	if err := c.createGroup(runCtx); err != nil {
		if runCtx.Err() != nil {
			return nil
		}
		return err
	}
	c.readyOnce.Do(func() { close(c.ready) })

	var workers sync.WaitGroup
	in := &intake{slots: make(chan struct{}, c.cfg.Concurrency)} // one token per busy worker
	if c.cfg.BatchProcessor != nil {
		in.batch = c.cfg.BatchSize
		in.dispatch = func(msgs []redis.XMessage) {
			fs := make([]*flight, len(msgs))
			until := c.handlerDeadline()
			for i, m := range msgs {
				fs[i] = c.track(m.ID, until)
			}
			workers.Go(func() {
				defer func() { <-in.slots }()
				c.handleBatch(runCtx, msgs, fs)
			})
		}
	} else {
		in.dispatch = func(msgs []redis.XMessage) {
			for _, m := range msgs {
				f := c.track(m.ID, c.handlerDeadline())
				workers.Go(func() {
					defer func() { <-in.slots }()
					c.handle(runCtx, m, f)
				})
			}
		}
	}
	var loops sync.WaitGroup
	var fatal error
	var fatalOnce sync.Once
	loopCtx, stopLoops := context.WithCancel(runCtx)
	defer stopLoops()
	go func() {
		select {
		case <-c.life.Stopped():
			stopLoops()
		case <-loopCtx.Done():
		}
	}()
	fail := func(err error) {
		fatalOnce.Do(func() { fatal = err })
		stopLoops()
	}
	loops.Go(func() { c.readLoop(loopCtx, in, fail) })
	loops.Go(func() { c.claimLoop(loopCtx, in, fail) })
	// The keep-alive outlives the loops: entries still in flight during a
	// graceful Stop stay this member's until their handlers finish.
	aliveCtx, stopAlive := context.WithCancel(runCtx)
	defer stopAlive()
	var alive sync.WaitGroup
	alive.Go(func() { c.keepAlive(aliveCtx) })
	loops.Wait()
	workers.Wait()
	stopAlive()
	alive.Wait()
	if runCtx.Err() != nil || c.life.Stopping() {
		return nil
	}
	return fatal
}

func (c *Consumer) createGroup(ctx context.Context) error {
	err := c.rdb.XGroupCreateMkStream(ctx, c.cfg.Stream, c.cfg.Group, c.cfg.GroupStart).Err()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("idemredisstream: create group %s on %s: %w", c.cfg.Group, c.cfg.Stream, err)
	}
	return nil
}

// intake is how the read and claim loops take free workers and hand them
// the entries they fetched.
type intake struct {
	slots chan struct{} // one token per busy worker
	// batch is 0 in the default mode (a worker per entry), else the most
	// entries of a batch (batch mode: a worker per batch).
	batch int
	// dispatch starts the workers of msgs (at least one entry), whose
	// slots are taken; each worker frees its slot when it is done.
	dispatch func(msgs []redis.XMessage)
}

// take waits for one free worker and returns how many entries to fetch:
// in the default mode one per free worker (it takes them all), in batch
// mode the batch size (for that one worker); 0 when ctx ended.
func (in *intake) take(ctx context.Context) int {
	select {
	case in.slots <- struct{}{}:
	case <-ctx.Done():
		return 0
	}
	if in.batch > 0 {
		return in.batch
	}
	n := 1
	for n < cap(in.slots) {
		select {
		case in.slots <- struct{}{}:
			n++
		default:
			return n
		}
	}
	return n
}

// hand dispatches msgs, fetched for a take that returned n, and frees the
// workers taken that they do not use (all of them when msgs is empty).
func (in *intake) hand(msgs []redis.XMessage, n int) {
	free := n - len(msgs)
	if in.batch > 0 {
		free = 0
		if len(msgs) == 0 {
			free = 1
		}
	}
	for range free {
		<-in.slots
	}
	if len(msgs) > 0 {
		in.dispatch(msgs)
	}
}

// readLoop reads new entries with XREADGROUP, no more than the free
// workers at a time (in batch mode, one batch when a worker is free).
func (c *Consumer) readLoop(ctx context.Context, in *intake, fail func(error)) {
	for {
		n := in.take(ctx)
		if n == 0 {
			return
		}
		streams, err := c.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: c.cfg.Group, Consumer: c.cfg.Consumer,
			Streams: []string{c.cfg.Stream, ">"}, Count: int64(n), Block: c.cfg.Block,
		}).Result()
		var msgs []redis.XMessage
		for _, s := range streams {
			msgs = append(msgs, s.Messages...)
		}
		in.hand(msgs, n)
		if err == nil || errors.Is(err, redis.Nil) {
			continue
		}
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, redis.ErrClosed) {
			fail(fmt.Errorf("idemredisstream: XREADGROUP: %w", err))
			return
		}
		if strings.HasPrefix(err.Error(), "NOGROUP") {
			// The stream or group was deleted: create it again.
			err = c.createGroup(ctx)
		}
		if err != nil {
			c.log.Warn("idemredisstream: read failed; retrying", "err", err)
		}
		if !sleep(ctx, c.cfg.RetryDelay) {
			return
		}
	}
}

// claimLoop reclaims entries idle longer than MinIdle with XAUTOCLAIM,
// walking the pending entries list with its cursor; an XAUTOCLAIM asks
// for no more than the free workers (in batch mode, one batch when a
// worker is free).
func (c *Consumer) claimLoop(ctx context.Context, in *intake, fail func(error)) {
	cursor := "0-0"
	for {
		if !sleep(ctx, c.cfg.ClaimInterval) {
			return
		}
		for {
			n := in.take(ctx)
			if n == 0 {
				return
			}
			msgs, next, err := c.rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{
				Stream: c.cfg.Stream, Group: c.cfg.Group, Consumer: c.cfg.Consumer,
				MinIdle: c.cfg.MinIdle, Start: cursor, Count: int64(n),
			}).Result()
			if err != nil {
				in.hand(nil, n)
				if ctx.Err() != nil {
					return
				}
				if errors.Is(err, redis.ErrClosed) {
					fail(fmt.Errorf("idemredisstream: XAUTOCLAIM: %w", err))
					return
				}
				if !strings.HasPrefix(err.Error(), "NOGROUP") {
					c.log.Warn("idemredisstream: XAUTOCLAIM failed; retrying", "err", err)
				}
				cursor = "0-0"
				break
			}
			msgs = c.overLimit(ctx, msgs)
			in.hand(msgs, n)
			cursor = next
			if cursor == "0-0" || cursor == "" || len(msgs) == 0 {
				cursor = "0-0"
				break
			}
		}
	}
}

// overLimit dead-letters the reclaimed entries delivered more than
// MaxDeliveries times, and returns the others.
func (c *Consumer) overLimit(ctx context.Context, msgs []redis.XMessage) []redis.XMessage {
	if c.cfg.MaxDeliveries <= 0 || len(msgs) == 0 {
		return msgs
	}
	pending, err := c.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{
		Stream: c.cfg.Stream, Group: c.cfg.Group, Consumer: c.cfg.Consumer,
		Start: msgs[0].ID, End: msgs[len(msgs)-1].ID, Count: int64(len(msgs) + 4*c.cfg.Concurrency + 16),
	}).Result()
	if err != nil {
		c.log.Warn("idemredisstream: XPENDING failed; delivery limit not checked", "err", err)
		return msgs
	}
	counts := make(map[string]int64, len(pending))
	for _, p := range pending {
		counts[p.ID] = p.RetryCount
	}
	keep := msgs[:0]
	for _, m := range msgs {
		if n := counts[m.ID]; n > int64(c.cfg.MaxDeliveries) {
			id := c.field(m, c.cfg.IDField)
			st := idem.Outcome{Status: idem.Failed, MessageID: id, Poison: true,
				Err: fmt.Errorf("%w: delivered %d times, more than %d", idem.ErrTooManyDeliveries, n, c.cfg.MaxDeliveries)}.Settle(c.cfg.RetryDelay)
			if c.settleDeadLetter(ctx, m, st) {
				st.Log(ctx, c.log, "idemredisstream", "entry", m.ID, "dead_letter", c.cfg.DeadLetter)
			}
			continue
		}
		keep = append(keep, m)
	}
	return keep
}

// keepAlive resets the idle time of the entries in flight every MinIdle/3,
// so no other member claims an entry whose handler is still running.
func (c *Consumer) keepAlive(ctx context.Context) {
	for {
		if !sleep(ctx, c.cfg.MinIdle/3) {
			return
		}
		now := time.Now()
		c.flightMu.Lock()
		ids := make([]string, 0, len(c.inFlight))
		for id, f := range c.inFlight {
			if f.until.IsZero() || now.Before(f.until) {
				ids = append(ids, id)
			}
		}
		c.flightMu.Unlock()
		if len(ids) == 0 {
			continue
		}
		// XCLAIM with min-idle 0 and JUSTID: owner stays this member, idle
		// time goes back to 0, the delivery count is not incremented.
		err := c.rdb.XClaimJustID(ctx, &redis.XClaimArgs{
			Stream: c.cfg.Stream, Group: c.cfg.Group, Consumer: c.cfg.Consumer, MinIdle: 0, Messages: ids,
		}).Err()
		if err != nil && ctx.Err() == nil {
			c.log.Warn("idemredisstream: keep-alive of entries in flight failed", "err", err)
		}
	}
}

// handlerDeadline is the deadline of a handler of entries read now:
// HandlerTimeout from now, or zero when HandlerTimeout is off. It is also
// when the entries' keep-alive ends (track): one instant for both, so an
// entry's claim does not lapse while its handler may still run on its
// context, however late the handler starts.
func (c *Consumer) handlerDeadline() time.Time {
	if c.cfg.HandlerTimeout <= 0 {
		return time.Time{}
	}
	return time.Now().Add(c.cfg.HandlerTimeout)
}

// track records a delivery of entry id as in flight, kept alive until
// until (its handler's deadline; zero: while it runs), and returns its
// record for untrack.
func (c *Consumer) track(id string, until time.Time) *flight {
	f := &flight{until: until}
	c.flightMu.Lock()
	defer c.flightMu.Unlock()
	c.inFlight[id] = f
	return f
}

// untrack ends f, the delivery of entry id, unless a later delivery of the
// same entry (reclaimed while f's handler ran past its deadline) replaced
// it.
func (c *Consumer) untrack(id string, f *flight) {
	c.flightMu.Lock()
	defer c.flightMu.Unlock()
	if c.inFlight[id] == f {
		delete(c.inFlight, id)
	}
}

// sleep waits d unless ctx ends first; it reports whether to go on.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Stop stops the Consumer gracefully: no new reads or claims, the entries
// already read are processed and settled. It returns nil once Run has
// returned, or ctx's error if ctx ends first, in which case the handlers
// still running have their contexts cancelled and what they had not
// settled stays pending. Stop before Run makes Run return nil at once.
// Stop is idempotent.
func (c *Consumer) Stop(ctx context.Context) error { return c.life.Stop(ctx) }

func (c *Consumer) field(m redis.XMessage, name string) string {
	switch v := m.Values[name].(type) {
	case string:
		return v
	case nil:
		return ""
	default:
		return fmt.Sprint(v)
	}
}

// headers returns the entry's fields other than the payload field
// (idem.Message.Headers); nil when there are none.
func (c *Consumer) headers(m redis.XMessage) idem.Headers {
	if len(m.Values) <= 1 {
		return nil
	}
	h := make(idem.Headers, len(m.Values)-1)
	for k := range m.Values {
		if k != c.cfg.PayloadField {
			h[k] = []string{c.field(m, k)}
		}
	}
	return h
}

// message is entry m as an idem.Message (its ID, payload and other fields
// as headers); ok is false, with the Rejected outcome to settle it with,
// when m has no payload field: not an empty payload but a producer that
// writes it under another field, and processing it would run the handler
// on nothing.
func (c *Consumer) message(m redis.XMessage) (msg idem.Message, out idem.Outcome, ok bool) {
	msg.ID = c.field(m, c.cfg.IDField)
	if _, ok := m.Values[c.cfg.PayloadField]; !ok {
		err := fmt.Errorf("%w: idemredisstream: the entry has no %q field", idem.ErrInvalidPayload, c.cfg.PayloadField)
		return msg, idem.Outcome{Status: idem.Rejected, MessageID: msg.ID, Err: err}, false
	}
	msg.Payload = []byte(c.field(m, c.cfg.PayloadField))
	msg.Headers = c.headers(m)
	return msg, idem.Outcome{}, true
}

// handlerContext is the context of one Processor (or BatchProcessor)
// call of the entries delivered as f: ctx, ended at f's keep-alive end
// (handlerDeadline: HandlerTimeout after the entries were read) when
// HandlerTimeout is on.
func (c *Consumer) handlerContext(ctx context.Context, f *flight) (context.Context, context.CancelFunc) {
	if !f.until.IsZero() {
		return context.WithDeadline(ctx, f.until)
	}
	return ctx, func() {}
}

// handle processes entry m, delivered as f, with the Processor and settles
// it.
func (c *Consumer) handle(ctx context.Context, m redis.XMessage, f *flight) {
	msg, out, ok := c.message(m)
	if ok {
		pctx, cancel := c.handlerContext(ctx, f)
		out = idem.Guard(c.withDelivery(pctx, msg.Headers), c.cfg.Processor, msg)
		cancel()
	}
	c.settle(ctx, []redis.XMessage{m}, []*flight{f}, []idem.Outcome{out})
}

// handleBatch processes the entries ms, delivered as fs, with the
// BatchProcessor in one call and settles each by its own Outcome. An
// entry without the payload field is dead-lettered without being handed
// over (as handle does); HandlerTimeout bounds the whole call.
func (c *Consumer) handleBatch(ctx context.Context, ms []redis.XMessage, fs []*flight) {
	outs := make([]idem.Outcome, len(ms))
	msgs := make([]idem.Message, 0, len(ms))
	idx := make([]int, 0, len(ms)) // msgs[j] is the entry ms[idx[j]]
	for i, m := range ms {
		msg, out, ok := c.message(m)
		if !ok {
			outs[i] = out
			continue
		}
		msgs = append(msgs, msg)
		idx = append(idx, i)
	}
	if len(msgs) > 0 {
		pctx, cancel := c.handlerContext(ctx, fs[0])
		got := idem.GuardBatch(c.withBatchDelivery(pctx, msgs), c.cfg.BatchProcessor, msgs)
		cancel()
		for j, i := range idx {
			outs[i] = got[j]
		}
	}
	c.settle(ctx, ms, fs, outs)
}

// settle settles each entry ms[i], delivered as fs[i], as outs[i].Settle
// decides (see the package doc): the entries to ack in one XACK, each dead
// letter with its own script, each redelivery with its own XCLAIM; each
// settlement is logged once done. It settles even when ctx has ended (the
// handlers' effects may have committed), all of its commands within
// DefaultSettleTimeout. What fails to settle stays pending, reclaimed
// later, and is logged at warn.
func (c *Consumer) settle(ctx context.Context, ms []redis.XMessage, fs []*flight, outs []idem.Outcome) {
	// No more keep-alive: a retry delay set below must not be undone.
	for i, m := range ms {
		c.untrack(m.ID, fs[i])
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultSettleTimeout)
	defer cancel()
	var one [1]idem.Settlement // a single entry's, not allocated
	sts := one[:]
	if len(ms) > 1 {
		sts = make([]idem.Settlement, len(ms))
	}
	var acks []string
	for i, out := range outs {
		sts[i] = out.Settle(c.cfg.RetryDelay)
		if sts[i].Action == idem.Ack {
			acks = append(acks, ms[i].ID)
		}
	}
	var ackErr error
	if len(acks) > 0 {
		ackErr = c.rdb.XAck(sctx, c.cfg.Stream, c.cfg.Group, acks...).Err()
	}
	for i, m := range ms {
		st := sts[i]
		switch st.Action {
		case idem.Ack:
			if ackErr != nil {
				c.log.Warn("idemredisstream: XACK failed; the entry stays pending and will be reclaimed", "entry", m.ID, "message_id", st.MessageID, "err", ackErr)
				continue
			}
		case idem.DeadLetter:
			if !c.settleDeadLetter(sctx, m, st) {
				continue
			}
		default: // Redeliver: left pending, reclaimable after the delay
			c.retryAfter(sctx, m, st.Delay)
		}
		st.Log(sctx, c.log, "idemredisstream", "entry", m.ID, "dead_letter", c.cfg.DeadLetter)
	}
}

// retryAfter leaves m pending and makes it claimable by XAUTOCLAIM after
// delay (at most MinIdle), by setting its idle time to MinIdle-delay.
func (c *Consumer) retryAfter(ctx context.Context, m redis.XMessage, delay time.Duration) {
	idle := c.cfg.MinIdle - delay
	if idle <= 0 {
		return // reclaimed after MinIdle from its last delivery
	}
	err := c.rdb.Do(ctx, "XCLAIM", c.cfg.Stream, c.cfg.Group, c.cfg.Consumer, 0, m.ID,
		"IDLE", strconv.FormatInt(idle.Milliseconds(), 10), "JUSTID").Err()
	if err != nil {
		c.log.Warn("idemredisstream: cannot shorten the redelivery delay; the entry will be reclaimed after MinIdle", "entry", m.ID, "err", err)
	}
}

// deadLetterScript adds an entry to the dead-letter stream (KEYS[2]) and
// only then XACKs the original (KEYS[1]; ARGV[1] the group, ARGV[2] the
// entry ID; ARGV[3...] the dead letter's fields and values). Not MULTI/EXEC:
// EXEC runs the XACK even when the XADD before it fails at run time (a
// dead-letter key of another type: WRONGTYPE), which would ack an entry that
// was never dead-lettered. A script stops at the first failing redis.call,
// and runs atomically like a transaction.
var deadLetterScript = redis.NewScript(`
redis.call('XADD', KEYS[2], '*', unpack(ARGV, 3))
return redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
`)

// settleDeadLetter adds m to the dead-letter stream with the settlement's
// fields and acks it, atomically, the ack only if the dead letter was
// written. It reports whether it was; on failure m stays pending.
func (c *Consumer) settleDeadLetter(ctx context.Context, m redis.XMessage, st idem.Settlement) bool {
	add := st.DeadLetterHeaders()
	add[FieldOriginalStream] = c.cfg.Stream
	add[FieldOriginalEntry] = m.ID
	args := make([]any, 0, 2+2*(len(m.Values)+len(add)))
	args = append(args, c.cfg.Group, m.ID)
	for k, v := range m.Values {
		if _, replaced := add[k]; !replaced {
			args = append(args, k, v)
		}
	}
	for k, v := range add {
		args = append(args, k, v)
	}
	err := deadLetterScript.Run(ctx, c.rdb, []string{c.cfg.Stream, c.cfg.DeadLetter}, args...).Err()
	if err != nil {
		c.log.Warn("idemredisstream: dead letter not written; the entry stays pending", "entry", m.ID, "message_id", st.MessageID, "dead_letter", c.cfg.DeadLetter, "err", err)
		c.retryAfter(ctx, m, c.cfg.RetryDelay)
		return false
	}
	return true
}
