package idemnats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Defaults applied by NewConsumer to zero Config fields.
const (
	// DefaultIDHeader is the header that carries the message ID: JetStream's
	// own Nats-Msg-Id, which the server also uses for publish deduplication.
	DefaultIDHeader = jetstream.MsgIDHeader
	// DefaultRetryDelay is the delay before a Failed (retryable) delivery
	// is redelivered.
	DefaultRetryDelay = time.Second
	// DefaultAckWait is the ack wait assumed for the progress interval
	// when the consumer's info does not give one (JetStream's default).
	DefaultAckWait = 30 * time.Second
	// DefaultHandlerTimeout is Config.HandlerTimeout's default.
	DefaultHandlerTimeout = 5 * time.Minute
)

// Dead-letter headers that locate the original, set on every message
// published to Config.DeadLetter besides the headers every idem adapter
// writes (idem.HeaderDeadLetterReason, idem.HeaderDeadLetterError,
// idem.HeaderDeadLetterStatus, idem.HeaderOriginalMessageID). The dead
// letter also keeps the original message's own headers, except JetStream's
// Nats-* control headers.
const (
	// HeaderOriginalSubject is the subject the message was published to.
	HeaderOriginalSubject = "Idem-Original-Subject"
	// HeaderOriginalStream and HeaderOriginalSequence locate the original
	// in its stream (stream name, stream sequence).
	HeaderOriginalStream   = "Idem-Original-Stream"
	HeaderOriginalSequence = "Idem-Original-Sequence"
)

// Config configures a Consumer. Zero values take the documented defaults.
type Config struct {
	// Processor runs each delivery through an Idempotent Consumer:
	// idem.Bind (transactional mode), idem.BindLease (lease mode) or any
	// idem.Processor. One of Processor and BatchProcessor is required,
	// and it is safe for concurrent use when Concurrency > 1.
	Processor idem.Processor
	// BatchProcessor selects batch mode: the messages that reach the
	// Consumer together (every one the client has received when the
	// Consumer takes one, those of the same pull request still on their
	// way while the stream has more pending for it, waited for at most
	// 2ms, and the batches still waiting for a handler) are handed to it
	// in one call (idem.GuardBatch), at most
	// MaxMessages/Concurrency of them, and each is then settled by its
	// own Outcome, as in the default mode. Concurrency is then how many
	// batches are processed at once. An idemhttp.Deliverer is one
	// (claims and completions of a batch in one store call each), as is
	// idem.BindBatch (one transaction per batch). Exclusive with
	// Processor. A message with two different IDs is dead-lettered
	// without being handed over, as in the default mode.
	BatchProcessor idem.BatchProcessor
	// IDHeader is the header holding the message ID. Defaults to
	// DefaultIDHeader (Nats-Msg-Id, JetStream's own place for it). Header names
	// are case-sensitive in NATS. A message without the header is passed
	// to the Processor with an empty ID, which idem rejects
	// (idem.ErrMissingMessageID), and is dead-lettered.
	IDHeader string
	// Concurrency is how many deliveries are processed at once. Defaults
	// to 1.
	Concurrency int
	// DeadLetter is the subject dead letters are published to, through
	// JetStream: a stream must capture it (a publish nobody stores fails,
	// and the original is then redelivered, never dropped). Required: no
	// silent drops.
	DeadLetter string
	// RetryDelay is how long JetStream waits before redelivering a Failed
	// (retryable) delivery (NakWithDelay). Defaults to DefaultRetryDelay
	// (1s). An InProgress delivery is redelivered after the Outcome's
	// RetryAfter instead.
	RetryDelay time.Duration
	// ProgressInterval is how often a delivery whose handler is still
	// running is reported in progress to JetStream (AckProgress, which
	// restarts its ack wait), so a long handler is not redelivered to
	// another member meanwhile. Defaults to a third of the JetStream
	// consumer's AckWait; negative disables it, letting the ack wait
	// expire (a redelivery of a message still in flight is then a
	// Duplicate or InProgress outcome, as idem guarantees). Messages
	// waiting for a handler are reported whatever its sign (see
	// MaxMessages).
	ProgressInterval time.Duration
	// HandlerTimeout bounds one delivery's processing: its context ends
	// after HandlerTimeout, and the in-progress reports stop then, so even
	// a handler that ignores its context no longer holds the message past
	// the next ack wait: JetStream redelivers it (and MaxDeliver counts
	// it). Defaults to DefaultHandlerTimeout (5 minutes); negative
	// disables it (a stuck handler then holds its message for ever).
	HandlerTimeout time.Duration
	// MaxMessages is how many messages the Consumer holds at once,
	// running or waiting for a free handler: Run asks JetStream for more
	// only when it holds fewer, and for as many as it has room for.
	// Defaults to twice Concurrency, so that a handler that finishes finds
	// the next message waiting rather than waits for a pull request's
	// round trip. Messages above Concurrency wait in the Consumer, reported
	// in progress (AckProgress) every ProgressInterval, or a third of
	// AckWait when ProgressInterval is not positive, so that their ack
	// wait does not run out while they wait their turn; a member that dies
	// stops reporting, and they come back after AckWait, as does a message
	// that has waited longer than HandlerTimeout. The JetStream consumer's
	// MaxRequestBatch, when set, caps one pull request, not MaxMessages.
	MaxMessages int
	// Logger receives every settlement at the level idem.Settlement.Level
	// gives it (duplicates at debug, dead letters at warn, store failures
	// and panics at error), and failed acks at warn. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

// Consumer consumes a JetStream pull consumer through an idem.Processor and
// maps each Outcome to JetStream: Ack for Processed and Duplicate,
// NakWithDelay for InProgress (after RetryAfter) and Failed (after
// RetryDelay), and for a message that can never be processed a publish to
// the dead-letter subject followed by Term.
//
// A Consumer is started by Run and stopped by Stop or by Run's context.
type Consumer struct {
	js       jetstream.JetStream
	cons     jetstream.Consumer
	cfg      Config
	progress time.Duration // 0: off
	// waitProgress is the period of the in-progress reports (progressSet):
	// progress when that is on, a third of AckWait otherwise (then only
	// the messages waiting for a handler are reported).
	waitProgress time.Duration
	timeout      time.Duration // HandlerTimeout; 0: none
	log          *slog.Logger
	// maxDeliver is the JetStream consumer's MaxDeliver when it is
	// positive (from its cached info at NewConsumer), 0 when unlimited.
	maxDeliver int
	// joinWait is batchJoinWait (a test's own when it sets one).
	joinWait time.Duration

	ran      atomic.Bool
	stopping atomic.Bool
	stopOnce sync.Once
	stopCh   chan struct{} // closed by Stop
	done     chan struct{} // closed when Run returns
	cancel   atomic.Pointer[context.CancelCauseFunc]
	// names is the consumer group and destination template of the last
	// ConsumerInfo seen (withDelivery).
	names atomic.Pointer[consumerNames]
}

// errStopTimeout is the cause given to handlers cancelled because Stop's
// context ended before they finished.
var errStopTimeout = errors.New("idemnats: Stop's context ended before the handler finished")

// NewConsumer returns a Consumer that reads cons (a pull consumer, for
// example from Stream.CreateOrUpdateConsumer or JetStream.Consumer) and
// publishes dead letters with js. The JetStream consumer should use
// AckExplicitPolicy (the default of jetstream.ConsumerConfig); its AckWait is
// the redelivery timeout of a member that dies, and its MaxDeliver, if
// set, must leave room for InProgress and Failed redeliveries (a message
// past MaxDeliver is dropped by JetStream, which idem cannot prevent).
//
// It returns an error matching idem.ErrInvalidConfig when js or cons is nil,
// Processor or DeadLetter is missing, DeadLetter is not a valid subject or
// is matched by the consumer's filter subjects (the consumer would receive
// its own dead letters), or a numeric field is negative where that has no
// meaning.
func NewConsumer(js jetstream.JetStream, cons jetstream.Consumer, cfg Config) (*Consumer, error) {
	switch {
	case js == nil:
		return nil, fmt.Errorf("%w: idemnats: nil JetStream", idem.ErrInvalidConfig)
	case cons == nil:
		return nil, fmt.Errorf("%w: idemnats: nil jetstream.Consumer", idem.ErrInvalidConfig)
	case cfg.Processor == nil && cfg.BatchProcessor == nil:
		return nil, fmt.Errorf("%w: idemnats: Config.Processor (or BatchProcessor) is required", idem.ErrInvalidConfig)
	case cfg.Processor != nil && cfg.BatchProcessor != nil:
		return nil, fmt.Errorf("%w: idemnats: Config.Processor and BatchProcessor are exclusive; set one", idem.ErrInvalidConfig)
	case cfg.DeadLetter == "":
		return nil, fmt.Errorf("%w: idemnats: Config.DeadLetter is required (a subject a stream captures)", idem.ErrInvalidConfig)
	case !validSubject(cfg.DeadLetter):
		return nil, fmt.Errorf("%w: idemnats: Config.DeadLetter %q is not a valid subject to publish to", idem.ErrInvalidConfig, cfg.DeadLetter)
	case cfg.Concurrency < 0:
		return nil, fmt.Errorf("%w: idemnats: Config.Concurrency %d is negative", idem.ErrInvalidConfig, cfg.Concurrency)
	case cfg.RetryDelay < 0:
		return nil, fmt.Errorf("%w: idemnats: Config.RetryDelay %v is negative", idem.ErrInvalidConfig, cfg.RetryDelay)
	case cfg.MaxMessages < 0:
		return nil, fmt.Errorf("%w: idemnats: Config.MaxMessages %d is negative", idem.ErrInvalidConfig, cfg.MaxMessages)
	case cfg.IDHeader != "" && !validHeaderName(cfg.IDHeader):
		return nil, fmt.Errorf("%w: idemnats: Config.IDHeader %q is not a valid header name", idem.ErrInvalidConfig, cfg.IDHeader)
	}
	if cfg.IDHeader == "" {
		cfg.IDHeader = DefaultIDHeader
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 1
	}
	if cfg.RetryDelay == 0 {
		cfg.RetryDelay = DefaultRetryDelay
	}
	if cfg.MaxMessages == 0 {
		cfg.MaxMessages = 2 * cfg.Concurrency
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &Consumer{
		js: js, cons: cons, cfg: cfg, log: cfg.Logger,
		stopCh: make(chan struct{}), done: make(chan struct{}), joinWait: batchJoinWait,
	}
	info := cons.CachedInfo()
	if info != nil {
		if f := receivesSubject(consumerFilters(info), cfg.DeadLetter); f != "" {
			return nil, fmt.Errorf("%w: idemnats: Config.DeadLetter %q matches the consumer's filter %q: the consumer would receive its own dead letters", idem.ErrInvalidConfig, cfg.DeadLetter, f)
		}
		if info.Config.MaxDeliver > 0 {
			c.maxDeliver = info.Config.MaxDeliver
		}
	}
	switch {
	case cfg.HandlerTimeout > 0:
		c.timeout = cfg.HandlerTimeout
	case cfg.HandlerTimeout == 0:
		c.timeout = DefaultHandlerTimeout
	}
	ackWait := DefaultAckWait
	if info != nil && info.Config.AckWait > 0 {
		ackWait = info.Config.AckWait
	}
	c.waitProgress = ackWait / 3
	switch {
	case cfg.ProgressInterval > 0:
		c.progress = cfg.ProgressInterval
		c.waitProgress = cfg.ProgressInterval
	case cfg.ProgressInterval == 0:
		c.progress = ackWait / 3
	}
	return c, nil
}

// consumerFilters returns the filter subjects of a JetStream consumer;
// none means every subject of its stream.
func consumerFilters(info *jetstream.ConsumerInfo) []string {
	f := append([]string(nil), info.Config.FilterSubjects...)
	if info.Config.FilterSubject != "" {
		f = append(f, info.Config.FilterSubject)
	}
	return f
}

// checkDeadLetterLoop returns an error matching idem.ErrInvalidConfig when
// the JetStream consumer receives the dead-letter subject: every dead
// letter would come back to the Consumer (carrying a new Nats-Msg-Id, so
// that a message refused as poison would then be processed). A consumer
// with filter subjects was checked by NewConsumer; one without gets every
// subject of its stream, which this looks up. A failed lookup (missing
// permission) is logged and consuming goes on.
func (c *Consumer) checkDeadLetterLoop(ctx context.Context) error {
	info := c.cons.CachedInfo()
	if info == nil || len(consumerFilters(info)) > 0 {
		return nil
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := c.js.Stream(sctx, info.Stream)
	if err != nil {
		c.log.Warn("idemnats: cannot read the stream's subjects to check the dead-letter subject", "stream", info.Stream, "err", err)
		return nil
	}
	if si := st.CachedInfo(); si != nil {
		if s := receivesSubject(si.Config.Subjects, c.cfg.DeadLetter); s != "" {
			return fmt.Errorf("%w: idemnats: Config.DeadLetter %q is captured by stream %s (subject %q) and the consumer has no filter: it would receive its own dead letters", idem.ErrInvalidConfig, c.cfg.DeadLetter, info.Stream, s)
		}
	}
	return nil
}

// receivesSubject returns the first of patterns that matches subject, or "".
func receivesSubject(patterns []string, subject string) string {
	for _, p := range patterns {
		if subjectMatches(p, subject) {
			return p
		}
	}
	return ""
}

// subjectMatches reports whether the literal subject matches pattern, a
// NATS subject in which "*" stands for one token and a final ">" for one
// or more.
func subjectMatches(pattern, subject string) bool {
	pt, st := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, p := range pt {
		if p == ">" {
			return i == len(pt)-1 && len(st) > i
		}
		if i >= len(st) || (p != "*" && p != st[i]) {
			return false
		}
	}
	return len(pt) == len(st)
}

// Run consumes until ctx ends or Stop is called, processing up to
// Config.Concurrency deliveries at once. It returns nil after Stop, ctx's
// error when ctx ended (the handlers in flight see their context cancelled,
// and their deliveries are settled as their outcomes say), and an error
// when JetStream ends the consumption: matching jetstream.ErrConsumerDeleted
// when the consumer was deleted, nats.ErrConnectionClosed when the
// connection closed, jetstream.ErrBadRequest when the server refused a
// pull request as malformed. It returns an error matching
// idem.ErrAlreadyRunning if Run was called before, and one matching
// idem.ErrInvalidConfig, before consuming anything, when the consumer has
// no filter subject and its stream captures the dead-letter subject. Other
// failed pull requests (no JetStream responding, a server shutting down)
// are logged at warn and retried after a pause of 100ms doubling to 5s.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.ran.CompareAndSwap(false, true) {
		return fmt.Errorf("idemnats: %w", idem.ErrAlreadyRunning)
	}
	defer close(c.done)
	if c.stopping.Load() {
		return nil // stopped before it ran
	}
	// Handlers get a context cancelled only when ctx ends or Stop gives up
	// waiting: a graceful Stop lets them finish.
	work, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	c.cancel.Store(&cancel)

	if err := c.checkDeadLetterLoop(ctx); err != nil {
		return err
	}
	// held has one place per message the Consumer holds (fetched and not
	// yet settled); queue holds the ones waiting for a handler.
	hold := max(c.cfg.MaxMessages, c.cfg.Concurrency)
	held := make(chan struct{}, hold)
	queue := make(chan jetstream.Msg, hold)
	// In batch mode (BatchProcessor) the messages go to the handlers in
	// batches (batches), not one by one (queue): those the fetch loop
	// took together (take, then flush).
	batchMode := c.cfg.BatchProcessor != nil
	var batches, rests chan []jetstream.Msg
	// batchCap is the most messages of one batch: the messages held
	// shared by the batches processed at once, so that while one batch's
	// results are written the next one is claimed and called.
	batchCap := max(1, hold/c.cfg.Concurrency)
	if batchMode {
		batches = make(chan []jetstream.Msg, hold) // a batch holds one message or more
		rests = make(chan []jetstream.Msg, hold)   // the rests of batches past batchCap (nextBatch)
	}
	// progress holds the messages reported in progress: those waiting
	// for a handler, and those whose handler runs (when c.progress > 0).
	progress := newProgressSet()
	// ended is set when consuming ended with an error (the connection
	// closed, the consumer deleted): messages still queued are not started.
	var ended atomic.Bool
	var wg sync.WaitGroup
	for range c.cfg.Concurrency {
		if batchMode {
			wg.Go(func() {
				for {
					batch := nextBatch(batches, rests, batchCap)
					if batch == nil {
						return
					}
					if hold > c.cfg.Concurrency {
						for _, m := range batch {
							progress.remove(m) // reported while it waited (take)
						}
					}
					c.handleBatch(work, batch, progress, c.stopping.Load() || ended.Load())
					for range batch {
						<-held
					}
				}
			})
			continue
		}
		wg.Go(func() {
			for msg := range queue {
				if hold > c.cfg.Concurrency {
					progress.remove(msg) // reported while it waited (take)
				}
				if (c.stopping.Load() || ended.Load()) && !c.lastDelivery(msg) {
					c.nakBuffered(msg)
				} else {
					c.handle(work, msg, progress)
				}
				<-held
			}
		})
	}
	if hold > c.cfg.Concurrency || c.progress > 0 {
		// One reporter for every message held, waiting or running:
		// c.waitProgress is c.progress when that is on.
		reportDone := make(chan struct{})
		var reporter sync.WaitGroup
		reporter.Go(func() { progress.report(reportDone, c.waitProgress, c.log) })
		defer reporter.Wait()
		defer close(reportDone)
	}

	// consuming ends with Stop, ctx or an error: the fetch loop asks for
	// no more, and what it still receives is Nak'ed, unless on its last
	// delivery.
	consuming, endConsuming := context.WithCancel(work)
	defer endConsuming()
	quit := consuming.Done()
	// failed receives the error that ends consuming; the first one counts.
	failed := make(chan error, 1)
	fail := func(err error) {
		select {
		case failed <- fmt.Errorf("idemnats: consuming stopped: %w", err):
		default:
		}
	}
	var pending []jetstream.Msg // batch mode: taken, not yet flushed (the fetch loop's own)
	take := func(msg jetstream.Msg) {
		select {
		case <-quit:
			if !c.lastDelivery(msg) {
				c.nakBuffered(msg)
				<-held
				return
			}
		default:
		}
		if hold > c.cfg.Concurrency {
			progress.add(msg, c.timeout)
		}
		if batchMode {
			pending = append(pending, msg)
			return
		}
		queue <- msg // never blocks: queue has a place for every held one
	}
	// flush hands the messages taken since the last flush to the batch
	// handlers as one batch (batch mode; called by the fetch loop when it
	// has no more received messages at hand).
	var flush func()
	if batchMode {
		flush = func() {
			if len(pending) > 0 {
				batches <- pending // never blocks: a place for every held message
				pending = nil
			}
		}
	}
	waiting := func() bool { return len(queue) > 0 || len(batches) > 0 || len(rests) > 0 }
	fetching := make(chan struct{})
	go func() {
		defer close(fetching)
		c.fetchLoop(work, consuming, held, waiting, take, flush, fail)
	}()
	var runErr error
	select {
	case <-ctx.Done():
		c.stopping.Store(true)
	case <-c.stopCh:
	case runErr = <-failed:
		ended.Store(true)
	}
	endConsuming()
	<-fetching
	close(queue)
	if batchMode {
		close(batches)
	}
	wg.Wait()
	// The acks are written to the connection's buffer; flush them so that
	// the server has them when Run returns.
	if nc := c.js.Conn(); nc != nil && !nc.IsClosed() {
		fctx, fcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		if err := nc.FlushWithContext(fctx); err != nil {
			c.log.Warn("idemnats: flush acks", "err", err)
		}
		fcancel()
	}
	if runErr == nil && ctx.Err() != nil && !c.stopRequested() {
		return ctx.Err()
	}
	return runErr
}

// nextBatch returns the next batch a batch handler processes, nil when
// batches is closed and nothing is left: the rest of a batch taken before
// (rests: what was past the limit of a batch, its own or another
// handler's), else the next batch of batches, joined with the batches and
// rests already waiting, up to limit messages. What is past limit goes to
// rests, for the next handler that asks: with every held message fetched
// at once, the handlers share them rather than one handler taking its
// limit and keeping the rest until its batch ends. rests is never closed
// and has a place for every held message (a batch holds one or more), so
// the put never blocks; a rest put after another handler found nothing
// left is taken by the handler that put it, which asks again.
func nextBatch(batches <-chan []jetstream.Msg, rests chan []jetstream.Msg, limit int) []jetstream.Msg {
	var batch []jetstream.Msg
	select {
	case batch = <-rests:
	default:
		select {
		case batch = <-rests:
		case b, ok := <-batches:
			if ok {
				batch = b
				break
			}
			select {
			case batch = <-rests:
			default:
				return nil
			}
		}
	}
join:
	for len(batch) < limit {
		select {
		case b := <-rests:
			batch = append(batch, b...)
		case b, ok := <-batches:
			if !ok {
				break join
			}
			batch = append(batch, b...)
		default:
			break join
		}
	}
	if len(batch) > limit {
		rests <- batch[limit:]
		batch = batch[:limit:limit]
	}
	return batch
}

// batchJoinWait is the longest the messages a pull request delivered so
// far wait, in batch mode, for more of its messages that the stream has
// pending (morePending) before they go to a batch handler as they are:
// the server sends a request's messages one after the other, and a batch
// handed over at the first pause in them would be a fraction of the
// request (a claim and a completion, two store round trips, for a few
// messages). The wait only runs out when the pending messages do not come
// (the consumer's MaxAckPending reached, another client's request served
// first).
const batchJoinWait = 2 * time.Millisecond

// morePending reports whether the stream had messages pending for the
// consumer after m (its metadata's NumPending): the pull request that
// delivered m, not yet fulfilled, is then being sent more of them.
func morePending(m jetstream.Msg) bool {
	md, err := m.Metadata()
	return err == nil && md.NumPending > 0
}

// quitting reports whether q, the fetch loop's quit channel (nil once
// seen closed), is closed or nil.
func quitting(q <-chan struct{}) bool {
	if q == nil {
		return true
	}
	select {
	case <-q:
		return true
	default:
		return false
	}
}

// fetchExpiry is how long one pull request waits at the server for
// messages (less when the consumer's MaxRequestExpires is lower).
const fetchExpiry = 30 * time.Second

// fetchHeartbeat is the idle heartbeat every pull request asks of the
// server (when it waits at least 4 of them; nats.go's default for a 30s
// request is 5s). A request waits at the consumer's leader, and nothing
// but the heartbeats that stop tells the client when that node dies: its
// followers may know the request and the new leader serve it (nats-server
// 2.9.10 did in some of the failover tests' rounds, not in others), and a
// request sent while the consumer has no leader is dropped without an
// answer. Two missed heartbeats end the request (jetstream.ErrNoHeartbeat)
// and the next one goes out, so that consuming resumes within about 2s of
// the new leader's election; with 5s heartbeats each lost request cost
// 10s, and one sent during an election that outlasted it, 10s more. The
// cost is one small message a second while a request waits.
const fetchHeartbeat = time.Second

// askTimeout bounds the consumer info request that follows a failed pull
// request. While the consumer has no leader (an election after its leader
// died) nothing may answer it; the next pull request is not held up longer
// than this.
const askTimeout = 2 * time.Second

// quitGrace is how long, once consuming ends, the pull request still out
// is read after its last message before it is cancelled: messages the
// server sent before it reach the Consumer, which Naks them, instead of
// being dropped by the client and waiting out AckWait.
const quitGrace = 100 * time.Millisecond

// fetchLoop pulls messages for the free places in held, one pull request
// (jetstream.Consumer.Fetch) at a time, and hands each message, its place
// taken, to take. Its requests run under ctx; it returns when consuming
// ends, or after passing to fail
// an error that ends consuming. In batch mode flush (nil otherwise) is
// called whenever no received message is at hand after take, and when
// the request ends: the messages taken since then go as one batch: the consumer deleted, the connection
// closed, a pull request the server refused as bad.
//
// A pull request asks for every place free when it is sent, and the next
// one goes out as soon as it ends: while a place is free a request waits
// at the server (except in the pause after a failed one, or while the
// connection is down), and messages stream to the handlers as they come.
// While messages wait for a handler (waiting reports whether any do), the
// next request waits until a quarter of the places are free, or none
// waits any more: a message settled then costs no pull request of its own.
// (Not jetstream.Consumer.Consume or Messages: they renew their pull from
// a count of pending messages, and a message that arrives while the
// previous request is still being sent leaves that count at zero with no
// request out, so consuming stalled until a missing heartbeat, 30s later;
// Messages' channel, sized to the pull, also dropped deliveries after a
// reconnect.)
func (c *Consumer) fetchLoop(ctx, consuming context.Context, held chan struct{}, waiting func() bool, take func(jetstream.Msg), flush func(), fail func(error)) {
	quit := consuming.Done()
	nc := c.js.Conn()
	status := nc.StatusChanged(nats.CONNECTED, nats.CLOSED)
	defer nc.RemoveStatusListener(status)
	maxBatch, expiry := c.requestLimits(cap(held), c.cons.CachedInfo())
	// lowWater is how many free places a pull request waits for while
	// messages wait for a handler (none wait: it goes at once).
	lowWater := max(cap(held)/4, 1)
	// ask refreshes the consumer's limits from the server, and reports
	// false after failing consuming when the consumer no longer exists.
	ask := func() bool {
		ictx, icancel := context.WithTimeout(consuming, askTimeout)
		info, err := c.cons.Info(ictx)
		icancel()
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			fail(jetstream.ErrConsumerDeleted)
			return false
		}
		if err == nil {
			maxBatch, expiry = c.requestLimits(cap(held), info)
		}
		return true
	}
	release := func(k int) {
		for range k {
			<-held
		}
	}
	pause := newPause()
	// join bounds how long the messages taken in batch mode wait for the
	// rest of their pull request's (see morePending).
	join := time.NewTimer(time.Hour)
	join.Stop()
	defer join.Stop()
	for {
		// Wait for a free place, then take every other free one.
		select {
		case held <- struct{}{}:
		case <-quit:
			return
		}
		n := 1
	more:
		for n < maxBatch {
			select {
			case held <- struct{}{}:
				n++
				continue
			default:
			}
			if n >= lowWater || !waiting() {
				break
			}
			// Messages wait for a handler, so every handler is busy:
			// wait for more places to free before asking, rather than
			// send a pull request (a round trip, and work for the
			// server) per settled message.
			select {
			case held <- struct{}{}:
				n++
			case <-quit:
				break more
			}
		}
		// No request while the connection is down (nats.go keeps the
		// subscription of a request it could not send), nor after
		// consuming ended (the select above may take a place although
		// quit is closed).
		for !nc.IsConnected() && !nc.IsClosed() && consuming.Err() == nil {
			select {
			case <-status:
			case <-quit:
			}
		}
		if consuming.Err() != nil {
			release(n)
			return
		}
		// A reconnect before this request needs no second one.
		for len(status) > 0 {
			<-status
		}
		if nc.IsClosed() {
			release(n)
			fail(nats.ErrConnectionClosed)
			return
		}
		sent := time.Now()
		fctx, fcancel := context.WithTimeout(ctx, expiry)
		opts := []jetstream.FetchOpt{jetstream.FetchContext(fctx)}
		if expiry >= 4*fetchHeartbeat {
			opts = append(opts, jetstream.FetchHeartbeat(fetchHeartbeat))
		}
		batch, err := c.cons.Fetch(n, opts...)
		if err != nil {
			fcancel()
			release(n)
			if errors.Is(err, nats.ErrConnectionClosed) {
				fail(nats.ErrConnectionClosed)
				return
			}
			c.log.Warn("idemnats: pull request", "err", err)
			if !pause.wait(quit) {
				return
			}
			continue
		}
		got, reconnected := 0, false
		msgs, q := batch.Messages(), quit
		var grace *time.Timer
		var graceC <-chan time.Time
		var joinC <-chan time.Time // set while taken messages wait for the rest of the request's
		for msgs != nil {
			select {
			case m, ok := <-msgs:
				if !ok {
					msgs = nil
					if flush != nil {
						flush()
						joinC = nil
					}
					continue
				}
				got++
				take(m)
				if flush != nil && len(msgs) == 0 {
					if got < n && morePending(m) && !quitting(q) {
						// More of this request's messages are on their
						// way: they join the batch, unless they take
						// longer than batchJoinWait.
						if joinC == nil {
							join.Reset(c.joinWait)
							joinC = join.C
						}
					} else {
						flush()
						joinC = nil
					}
				}
				if grace != nil {
					grace.Reset(quitGrace)
				}
			case <-joinC:
				joinC = nil
				flush()
			case st := <-status:
				if st == nats.CLOSED {
					fail(nats.ErrConnectionClosed)
				}
				// A reconnect: the request went with the old connection
				// (a server that restarted has forgotten it); send another.
				reconnected = true
				fcancel()
			case <-q:
				q = nil
				grace = time.NewTimer(quitGrace)
				graceC = grace.C
			case <-graceC:
				graceC = nil
				fcancel()
			}
		}
		if grace != nil {
			grace.Stop()
		}
		fcancel()
		release(n - got)
		err = batch.Error()
		switch {
		case errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrBadRequest):
			fail(err)
			return
		case q == nil || ctx.Err() != nil:
			return // quit, or Run's context ended
		case got > 0 || reconnected:
			pause.reset()
			continue
		case err == nil || errors.Is(err, context.DeadlineExceeded):
			// The request expired with nothing to deliver; one that
			// ended well before its expiry is not renewed at once.
			if time.Since(sent) < expiry/2 && !pause.wait(quit) {
				return
			}
			continue
		}
		// The request was lost (no heartbeat), nothing answers for the
		// consumer, or the server refused the request (its limits may
		// have changed): the consumer may be gone, its "consumer
		// deleted" status lost.
		if !ask() {
			return
		}
		c.log.Warn("idemnats: pull request ended", "err", err)
		if errors.Is(err, jetstream.ErrNoHeartbeat) || errors.Is(err, jetstream.ErrConsumerLeadershipChanged) {
			// The request went with the consumer's old leader: the next
			// one goes to the new leader, or, while none is elected yet,
			// is lost in turn (see fetchHeartbeat); not after a pause
			// that earlier failures lengthened.
			pause.reset()
		}
		if !pause.wait(quit) {
			return
		}
	}
}

// requestLimits returns how many messages one pull request may ask for
// (places, capped by the consumer's MaxRequestBatch) and how long it waits
// (fetchExpiry, capped by its MaxRequestExpires): the server refuses a
// request above either.
func (c *Consumer) requestLimits(places int, info *jetstream.ConsumerInfo) (int, time.Duration) {
	batch, expiry := places, fetchExpiry
	if info != nil {
		if m := info.Config.MaxRequestBatch; m > 0 {
			batch = min(batch, m)
		}
		if m := info.Config.MaxRequestExpires; m > 0 {
			expiry = min(expiry, m)
		}
	}
	return batch, expiry
}

// pause spaces the pull requests that follow a failed one: 100ms, doubling
// to 5s, back to 100ms after a request that delivered.
type pause struct{ d time.Duration }

func newPause() *pause { return &pause{d: 100 * time.Millisecond} }

func (p *pause) reset() { p.d = 100 * time.Millisecond }

// wait waits out the pause and doubles it; false if quit closed first.
func (p *pause) wait(quit <-chan struct{}) bool {
	t := time.NewTimer(p.d)
	defer t.Stop()
	p.d = min(2*p.d, 5*time.Second)
	select {
	case <-t.C:
		return true
	case <-quit:
		return false
	}
}

func (c *Consumer) stopRequested() bool {
	select {
	case <-c.stopCh:
		return true
	default:
		return false
	}
}

// Stop stops the Consumer gracefully: Run sends no new pull requests
// (messages held but not started, and those that reach the request still
// out, are Nak'ed for redelivery at once; see the package doc), the handlers
// in flight finish with their context intact, their deliveries are
// acknowledged (or otherwise settled) and flushed to the server, and Run
// returns nil. Stop returns when that is done, or with ctx's error when ctx
// ends first, after cancelling the handlers still running. Stop before Run
// makes Run return at once; Stop is safe to call more than once.
func (c *Consumer) Stop(ctx context.Context) error {
	c.stopOnce.Do(func() {
		c.stopping.Store(true)
		close(c.stopCh)
	})
	if !c.ran.Load() {
		return nil
	}
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		if cancel := c.cancel.Load(); cancel != nil {
			(*cancel)(errStopTimeout)
		}
		return ctx.Err()
	}
}

// nakBuffered Naks a message held and not started (in the queue, or just
// received by the pull request still out) when Stop came or Run's context
// ended: it is not taken, and another member gets it now rather than after
// the ack wait. (A message on its last delivery is processed instead:
// JetStream would drop it after a Nak.)
func (c *Consumer) nakBuffered(m jetstream.Msg) {
	if err := m.Nak(); err != nil {
		c.log.Debug("idemnats: nak of a message buffered at stop", "err", err)
	}
}

// progressSet holds the messages the Consumer has taken from the client
// and not yet settled that are to be reported in progress, each until its
// own deadline: a message waiting for a handler for at most
// HandlerTimeout (none when HandlerTimeout is off), so that a member whose handlers hang does
// not keep its queue from the other members for longer than it may keep a
// message it runs; a message whose handler runs until the handler's
// timeout. One goroutine and one ticker report them all (report), however
// many are held: a message costs a map entry, not a timer or a goroutine.
type progressSet struct {
	mu   sync.Mutex
	msgs map[jetstream.Msg]time.Time // reported until then; zero: no limit
}

func newProgressSet() *progressSet {
	return &progressSet{msgs: map[jetstream.Msg]time.Time{}}
}

// add reports m in progress from the next tick on, for at most limit
// (0: no limit).
func (p *progressSet) add(m jetstream.Msg, limit time.Duration) {
	var until time.Time
	if limit > 0 {
		until = time.Now().Add(limit)
	}
	p.mu.Lock()
	p.msgs[m] = until
	p.mu.Unlock()
}

func (p *progressSet) remove(m jetstream.Msg) {
	p.mu.Lock()
	delete(p.msgs, m)
	p.mu.Unlock()
}

// report sends AckProgress for every message in the set each period,
// until done is closed. A message past its deadline stays in the set,
// unreported, until it is removed.
func (p *progressSet) report(done <-chan struct{}, period time.Duration, log *slog.Logger) {
	t := time.NewTicker(period)
	defer t.Stop()
	var ms []jetstream.Msg
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		now := time.Now()
		ms = ms[:0]
		p.mu.Lock()
		for m, until := range p.msgs {
			if until.IsZero() || now.Before(until) {
				ms = append(ms, m)
			}
		}
		p.mu.Unlock()
		for _, m := range ms {
			if err := m.InProgress(); err != nil {
				log.Debug("idemnats: in-progress report", "err", err)
			}
		}
		clear(ms) // no reference kept to a settled message
	}
}

// message is m as an idem.Message, its ID from the IDHeader; ok is false,
// with the Rejected outcome to settle it with, when the header has two
// different values: no single identity to deduplicate by, so it is
// refused without calling the Processor, and dead-lettered.
func (c *Consumer) message(m jetstream.Msg) (msg idem.Message, out idem.Outcome, ok bool) {
	ids := m.Headers().Values(c.cfg.IDHeader)
	msg = idem.Message{Payload: m.Data(), Headers: idem.Headers(m.Headers())}
	if len(ids) > 0 {
		msg.ID = ids[0]
	}
	for _, id := range ids[min(1, len(ids)):] {
		if id != msg.ID {
			err := fmt.Errorf("%w: header %s has %d different values", idem.ErrInvalidMessageID, c.cfg.IDHeader, len(ids))
			return msg, idem.Outcome{Status: idem.Rejected, MessageID: msg.ID, Err: err}, false
		}
	}
	return msg, idem.Outcome{}, true
}

// handlerContext is the context of one Processor (or BatchProcessor)
// call: ctx, ended after HandlerTimeout when that is on.
func (c *Consumer) handlerContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if c.timeout > 0 {
		return context.WithTimeout(ctx, c.timeout)
	}
	return ctx, func() {}
}

// handle processes one delivery and settles it.
func (c *Consumer) handle(ctx context.Context, m jetstream.Msg, progress *progressSet) {
	msg, out, ok := c.message(m)
	if !ok {
		c.settle(ctx, m, msg, out)
		return
	}
	pctx, cancel := c.handlerContext(ctx)
	defer cancel()
	if c.progress > 0 {
		// Reported in progress while the handler runs, for at most
		// HandlerTimeout (pctx's deadline), by the Consumer's one
		// reporter.
		progress.add(m, c.timeout)
	}
	out = idem.Guard(c.withDelivery(pctx, m), c.cfg.Processor, msg)
	progress.remove(m)
	c.settle(ctx, m, msg, out)
}

// handleBatch processes a batch of deliveries with the BatchProcessor and
// settles each. A message with two different IDs is dead-lettered without
// being handed over (as handle does). With nak (Stop came, or consuming
// ended, before the batch started) the messages are Nak'ed for
// redelivery, those on their last delivery processed anyway. The batch is
// reported in progress while it runs (ProgressInterval), for at most
// HandlerTimeout, which bounds the whole call.
func (c *Consumer) handleBatch(ctx context.Context, batch []jetstream.Msg, progress *progressSet, nak bool) {
	ms := make([]jetstream.Msg, 0, len(batch))
	msgs := make([]idem.Message, 0, len(batch))
	for _, m := range batch {
		if nak && !c.lastDelivery(m) {
			c.nakBuffered(m)
			continue
		}
		msg, out, ok := c.message(m)
		if !ok {
			c.settle(ctx, m, msg, out)
			continue
		}
		ms = append(ms, m)
		msgs = append(msgs, msg)
	}
	if len(msgs) == 0 {
		return
	}
	pctx, cancel := c.handlerContext(ctx)
	defer cancel()
	if c.progress > 0 {
		for _, m := range ms {
			progress.add(m, c.timeout)
		}
	}
	outs := idem.GuardBatch(c.withBatchDelivery(pctx, ms, msgs), c.cfg.BatchProcessor, msgs)
	for i, m := range ms {
		progress.remove(m)
		c.settle(ctx, m, msgs[i], outs[i])
	}
}

// lastDelivery reports whether m is on its last delivery: the JetStream
// consumer has a MaxDeliver and m has reached it, so that JetStream drops
// it, unseen by anyone, if it is not acknowledged.
func (c *Consumer) lastDelivery(m jetstream.Msg) bool {
	if c.maxDeliver <= 0 {
		return false
	}
	md, err := m.Metadata()
	return err == nil && md.NumDelivered >= uint64(c.maxDeliver)
}

// settle tells JetStream what became of m, as out.Settle decides: Ack,
// NakWithDelay, or a publish to the dead letter followed by Term. A dead
// letter whose publish failed is logged as that error, and m is Nak'ed
// (redelivered, not dropped), never logged as dead-lettered.
func (c *Consumer) settle(ctx context.Context, m jetstream.Msg, msg idem.Message, out idem.Outcome) {
	st := out.Settle(c.cfg.RetryDelay)
	if st.Action == idem.Redeliver && c.lastDelivery(m) {
		// JetStream would drop it after this Nak (MaxDeliver): dead-letter
		// it instead, so that it is not lost unseen.
		st = idem.Outcome{Status: idem.Failed, MessageID: msg.ID, Poison: true,
			Err: fmt.Errorf("%w: JetStream MaxDeliver (%d) reached, last outcome %s: %w", idem.ErrTooManyDeliveries, c.maxDeliver, out.Status, st.Err),
		}.Settle(c.cfg.RetryDelay)
	}
	var err error
	logged := false // the settlement was logged as it happened, not as decided
	switch st.Action {
	case idem.Ack:
		err = m.Ack()
	case idem.DeadLetter:
		// The publish waits for the server's ack: report the original in
		// progress first, so that a slow publish does not let its ack
		// wait run out and a redelivery be dead-lettered a second time.
		if err := m.InProgress(); err != nil {
			c.log.Debug("idemnats: in-progress report before the dead letter", "err", err)
		}
		// Detached from ctx: a handler that ended because Run's
		// context ended or Stop gave up waiting has its outcome
		// recorded, and its dead letter goes out (bounded by
		// JetStream's publish timeout) rather than failing at once
		// and leaving the message to a redelivery.
		if dlErr := c.deadLetter(context.WithoutCancel(ctx), m, msg, st); dlErr != nil {
			what := "idemnats: dead letter publish failed; the message will be redelivered"
			if c.lastDelivery(m) {
				what = "idemnats: dead letter publish failed on the last delivery (MaxDeliver): JetStream will not redeliver the message; it stays in its stream"
			}
			c.log.Error(what, "message_id", msg.ID, "subject", c.cfg.DeadLetter, "reason", st.Reason, "err", dlErr)
			err = m.NakWithDelay(c.cfg.RetryDelay)
			logged = true
			break
		}
		// Plain Term, not TermWithReason: nats-server before 2.10 takes
		// only the exact "+TERM" and ignores "+TERM <reason>", so the
		// message would come back after AckWait and be dead-lettered
		// again, for ever. The reason is in the dead letter's headers.
		err = m.Term()
	default:
		err = m.NakWithDelay(st.Delay)
	}
	if err != nil {
		c.log.Warn("idemnats: settle delivery", "message_id", msg.ID, "status", out.Status.String(), "err", err)
		return
	}
	if !logged && c.log.Enabled(ctx, st.Level()) { // the attributes cost allocations even when nothing is logged
		st.Log(ctx, c.log, "idemnats", "subject", m.Subject(), "dead_letter", c.cfg.DeadLetter)
	}
}

// deadLetter publishes m's payload and headers to the dead-letter subject,
// with the reason headers, and waits for JetStream's ack. Its Nats-Msg-Id is
// derived from the original's stream and sequence, so the dead letter of a
// delivery redelivered after a crash between this publish and the Term is
// dropped by the server's duplicate window rather than stored twice. (The
// original's Nats-Msg-Id is not reused: a dead-letter subject captured by
// the original's stream would drop the dead letter as a duplicate of it.)
func (c *Consumer) deadLetter(ctx context.Context, m jetstream.Msg, msg idem.Message, st idem.Settlement) error {
	dl := nats.NewMsg(c.cfg.DeadLetter)
	dl.Data = msg.Payload
	for k, vs := range m.Headers() {
		if strings.HasPrefix(k, "Nats-") {
			continue // JetStream control headers would be applied to this publish
		}
		dl.Header[k] = append([]string(nil), vs...)
	}
	for k, v := range st.DeadLetterHeaders() {
		dl.Header.Set(k, headerValue(v))
	}
	dl.Header.Set(HeaderOriginalSubject, m.Subject())
	var opts []jetstream.PublishOpt
	if md, err := m.Metadata(); err == nil {
		dl.Header.Set(HeaderOriginalStream, md.Stream)
		dl.Header.Set(HeaderOriginalSequence, strconv.FormatUint(md.Sequence.Stream, 10))
		opts = append(opts, jetstream.WithMsgID("idem-dead-letter:"+md.Stream+":"+md.Consumer+":"+strconv.FormatUint(md.Sequence.Stream, 10)))
	}
	_, err := c.js.PublishMsg(ctx, dl, opts...)
	return err
}

// headerValue makes s safe as a NATS header value: one line.
func headerValue(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\r' || r == '\n' {
			return ' '
		}
		return r
	}, s)
}

// validSubject reports whether s is a subject one can publish to: non-empty
// tokens separated by dots, no wildcards, no whitespace.
func validSubject(s string) bool {
	if s == "" {
		return false
	}
	for tok := range strings.SplitSeq(s, ".") {
		if tok == "" || tok == "*" || tok == ">" {
			return false
		}
		if strings.ContainsAny(tok, " \t\r\n") {
			return false
		}
	}
	return true
}

// validHeaderName reports whether s can be a NATS header name: printable
// ASCII without spaces or colons.
func validHeaderName(s string) bool {
	for i := 0; i < len(s); i++ {
		if b := s[i]; b <= ' ' || b >= 0x7f || b == ':' {
			return false
		}
	}
	return s != ""
}
