package idemamqp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/lifecycle"
	amqp "github.com/rabbitmq/amqp091-go"
)

// HeaderOriginalQueue is the header of a dead letter that names the queue
// the message was consumed from. A dead letter also carries the headers
// every idem adapter writes (idem.HeaderDeadLetterReason,
// idem.HeaderDeadLetterError, idem.HeaderDeadLetterStatus,
// idem.HeaderOriginalMessageID) on top of the original's own.
const HeaderOriginalQueue = "Idem-Original-Queue"

// Defaults applied by NewConsumer to zero Config fields.
const (
	// DefaultRetryDelay is the delay before a Failed delivery is requeued.
	DefaultRetryDelay = time.Second
	// DefaultHandlerTimeout is Config.HandlerTimeout's default.
	DefaultHandlerTimeout = 5 * time.Minute
	// DefaultMaxReconnectInterval is the longest wait between two Redial
	// attempts.
	DefaultMaxReconnectInterval = 30 * time.Second
	// DefaultDeadLetterTimeout bounds the publish and confirm of one dead
	// letter.
	DefaultDeadLetterTimeout = 30 * time.Second
)

var (
	// ErrConnectionClosed means the Consumer's connection closed and no
	// Config.Redial was given to get another one; Run returns an error
	// matching it. RabbitMQ has requeued every unacknowledged delivery.
	ErrConnectionClosed = errors.New("idemamqp: connection closed")

	// ErrDeadLetterUnroutable means the broker returned a dead letter as
	// unroutable (the dead-letter queue is gone). The delivery was not
	// acked and is requeued.
	ErrDeadLetterUnroutable = errors.New("idemamqp: dead letter unroutable")
)

// Config configures a Consumer. Zero values take the documented defaults.
type Config struct {
	// Processor runs each delivery through an Idempotent Consumer
	// (idem.Bind, idem.BindLease, or an idem.ProcessorFunc). Required.
	// It must be safe for concurrent use when Concurrency > 1.
	Processor idem.Processor
	// Queue is the queue to consume. Required; it must exist.
	Queue string
	// DeadLetter is the queue that receives dead letters, published
	// through the default exchange with routing key DeadLetter. Required
	// (no silent drops); it must exist when Run starts, and a dead letter
	// that cannot be routed to it is not acked.
	DeadLetter string
	// IDHeader names the header that holds the message ID. Defaults to ""
	// meaning the message_id property, AMQP's own place for it. A header value
	// must be a string or bytes; any other type counts as missing.
	IDHeader string
	// Concurrency is how many deliveries are processed at once. Defaults
	// to 1.
	Concurrency int
	// Prefetch is the channel's basic.qos prefetch count: deliveries the
	// broker sends before they are settled. Defaults to Concurrency, and
	// may not be lower. A delivery held for a delayed requeue occupies a
	// slot (see the package doc).
	Prefetch int
	// RetryDelay is how long a Failed (retryable) delivery is held before
	// it is nacked with requeue, and the delay of an InProgress delivery
	// whose Outcome has no RetryAfter. Defaults to DefaultRetryDelay (1s).
	RetryDelay time.Duration
	// HandlerTimeout bounds one delivery's processing: the context the
	// Processor gets ends HandlerTimeout after the delivery started, so a
	// handler blocked on a stalled connection (a database call with no
	// deadline of its own, behind a black-holed network path) gives up,
	// its transaction rolls back, and the delivery is requeued instead of
	// being held until RabbitMQ's consumer_timeout (30 minutes by
	// default) closes the channel. A handler that ignores its context
	// still holds its delivery. Defaults to DefaultHandlerTimeout (5
	// minutes); negative disables it.
	HandlerTimeout time.Duration
	// ConsumerTag is the basic.consume tag. Defaults to "idem-" followed
	// by random hex; it must be unique on the channel's connection.
	ConsumerTag string
	// Redial returns a new connection after the current one closed. The
	// Consumer owns the connections Redial returns and closes them when
	// Run returns; it never closes the one given to NewConsumer. Failed
	// calls are retried with exponential backoff up to
	// MaxReconnectInterval, until Run's context ends or Stop. Nil means
	// a lost connection ends Run with ErrConnectionClosed. A connection
	// with amqp091's automatic Recovery is refused.
	Redial func(ctx context.Context) (*amqp.Connection, error)
	// MaxReconnectInterval is the longest wait between two attempts to
	// get a connection or open channels. Defaults to
	// DefaultMaxReconnectInterval (30s).
	MaxReconnectInterval time.Duration
	// Logger receives every settlement at the level idem.Settlement.Level
	// gives it (duplicates at debug, dead letters at warn, store failures
	// and panics at error), and connection problems at warn. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

// Consumer consumes a RabbitMQ queue through an idem.Processor; see the
// package doc for how each Outcome is settled. Create it with NewConsumer,
// run it with Run, stop it with Stop.
type Consumer struct {
	cfg  Config
	conn *amqp.Connection
	log  *slog.Logger

	life *lifecycle.Lifecycle

	readyOnce sync.Once
	ready     chan struct{} // closed at the first basic.consume-ok
}

// NewConsumer returns a Consumer of cfg.Queue on conn. It does no I/O.
// Errors match idem.ErrInvalidConfig: a nil or closed conn, a conn with
// amqp091 automatic Recovery, a missing Processor, Queue or DeadLetter,
// DeadLetter equal to Queue, or a negative or inconsistent number.
func NewConsumer(conn *amqp.Connection, cfg Config) (*Consumer, error) {
	if conn == nil {
		return nil, fmt.Errorf("%w: idemamqp: nil connection", idem.ErrInvalidConfig)
	}
	if conn.IsRecoveryEnabled() {
		return nil, fmt.Errorf("%w: idemamqp: the connection has amqp091 automatic Recovery, which could ack a stale delivery tag; use Config.Redial instead", idem.ErrInvalidConfig)
	}
	if conn.IsClosed() && cfg.Redial == nil {
		return nil, fmt.Errorf("%w: idemamqp: the connection is closed", idem.ErrInvalidConfig)
	}
	if err := cfg.withDefaults(); err != nil {
		return nil, err
	}
	return &Consumer{
		cfg:   cfg,
		conn:  conn,
		log:   cfg.Logger.With("queue", cfg.Queue),
		life:  lifecycle.New(),
		ready: make(chan struct{}),
	}, nil
}

func (cfg *Config) withDefaults() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: idemamqp: "+format, append([]any{idem.ErrInvalidConfig}, args...)...)
	}
	switch {
	case cfg.Processor == nil:
		return bad("Processor is required")
	case cfg.Queue == "":
		return bad("Queue is required")
	case cfg.DeadLetter == "":
		return bad("DeadLetter is required: a message that cannot be processed is never dropped")
	case cfg.DeadLetter == cfg.Queue:
		return bad("DeadLetter %q is the consumed queue", cfg.DeadLetter)
	case cfg.Concurrency < 0:
		return bad("Concurrency %d is negative", cfg.Concurrency)
	case cfg.Prefetch < 0:
		return bad("Prefetch %d is negative", cfg.Prefetch)
	case cfg.RetryDelay < 0:
		return bad("RetryDelay %v is negative", cfg.RetryDelay)
	case cfg.MaxReconnectInterval < 0:
		return bad("MaxReconnectInterval %v is negative", cfg.MaxReconnectInterval)
	case len(cfg.ConsumerTag) > 255:
		return bad("ConsumerTag is longer than 255 bytes")
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 1
	}
	if cfg.Prefetch == 0 {
		cfg.Prefetch = cfg.Concurrency
	}
	if cfg.Prefetch < cfg.Concurrency {
		return bad("Prefetch %d is lower than Concurrency %d", cfg.Prefetch, cfg.Concurrency)
	}
	if cfg.Prefetch > 65535 {
		return bad("Prefetch %d is above 65535", cfg.Prefetch)
	}
	if cfg.RetryDelay == 0 {
		cfg.RetryDelay = DefaultRetryDelay
	}
	if cfg.HandlerTimeout == 0 {
		cfg.HandlerTimeout = DefaultHandlerTimeout
	}
	if cfg.MaxReconnectInterval == 0 {
		cfg.MaxReconnectInterval = DefaultMaxReconnectInterval
	}
	if cfg.ConsumerTag == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		cfg.ConsumerTag = "idem-" + hex.EncodeToString(b[:])
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return nil
}

// Run consumes until Stop is called or ctx ends. It returns nil after Stop
// (also when Stop came before Run), and ctx.Err() when ctx ended first. It
// returns an error when it cannot go on: the queue or the dead-letter
// queue does not exist or is not accessible (an AMQP 403, 404, 405 or 406
// from the broker), or the connection closed and Config.Redial is nil
// (ErrConnectionClosed). Other failures to open channels or to consume are
// retried with backoff. A Consumer runs once: a second Run returns an error
// matching idem.ErrAlreadyRunning.
//
// ctx is the parent of every handler's context: cancelling it stops the
// Consumer at once, without waiting for handlers (use Stop to finish them).
func (c *Consumer) Run(ctx context.Context) error {
	return c.life.Run(ctx, fmt.Errorf("idemamqp: queue %s: %w", c.cfg.Queue, idem.ErrAlreadyRunning), c.run)
}

// run is Run's loop; it returns nil when runCtx ends or Stop is called.
func (c *Consumer) run(runCtx context.Context) error {
	conn, owned := c.conn, false
	defer func() {
		if owned {
			_ = conn.Close()
		}
	}()
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 100 * time.Millisecond
	bo.MaxInterval = c.cfg.MaxReconnectInterval
	for {
		if c.life.Stopping() || runCtx.Err() != nil {
			return nil
		}
		if conn.IsClosed() {
			if c.cfg.Redial == nil {
				return fmt.Errorf("%w: queue %s", ErrConnectionClosed, c.cfg.Queue)
			}
			if owned {
				_ = conn.Close()
			}
			owned = false
			next, err := c.cfg.Redial(runCtx)
			if err == nil && next == nil {
				err = errors.New("Redial returned no connection")
			}
			if err == nil && next.IsRecoveryEnabled() {
				_ = next.Close()
				err = errors.New("Redial returned a connection with automatic Recovery")
			}
			if err != nil {
				c.log.Warn("idemamqp: reconnect failed", "err", err)
				if !c.life.Sleep(runCtx, bo.NextBackOff()) {
					return nil
				}
				continue
			}
			conn, owned = next, true
		}
		began := time.Now()
		err := c.session(runCtx, conn)
		if err == nil {
			return nil // stopped
		}
		if isPermanent(err) {
			return fmt.Errorf("idemamqp: consume %s: %w", c.cfg.Queue, err)
		}
		if runCtx.Err() != nil || c.life.Stopping() {
			return nil
		}
		if time.Since(began) > c.cfg.MaxReconnectInterval {
			bo.Reset()
		}
		c.log.Warn("idemamqp: channel lost; resuming", "err", err)
		if !c.life.Sleep(runCtx, bo.NextBackOff()) {
			return nil
		}
	}
}

// isPermanent reports whether err is a broker refusal that reconnecting
// does not fix: the queue is missing, exclusive elsewhere, or forbidden.
func isPermanent(err error) bool {
	var ae *amqp.Error
	if !errors.As(err, &ae) {
		return false
	}
	switch ae.Code {
	case amqp.AccessRefused, amqp.NotFound, amqp.ResourceLocked, amqp.PreconditionFailed:
		return true
	}
	return false
}

// Stop stops the Consumer gracefully: no new deliveries (basic.cancel),
// prefetched deliveries not yet started are requeued, deliveries in flight
// finish and are settled, held ones are requeued, and the channels close.
// It returns nil once Run has returned, or ctx's error if ctx ends first,
// in which case the handlers still running have their contexts cancelled.
// Stop before Run makes Run return nil at once. Stop is idempotent.
func (c *Consumer) Stop(ctx context.Context) error { return c.life.Stop(ctx) }

// session consumes on one pair of channels until Stop (returning nil) or
// until a channel or the connection closes (returning why).
func (c *Consumer) session(ctx context.Context, conn *amqp.Connection) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	dl, err := conn.Channel()
	if err != nil {
		return err
	}
	defer dl.Close()
	if _, err := dl.QueueDeclarePassive(c.cfg.DeadLetter, true, false, false, false, nil); err != nil {
		return fmt.Errorf("dead-letter queue %s: %w", c.cfg.DeadLetter, err)
	}
	if err := dl.Confirm(false); err != nil {
		return err
	}
	if err := ch.Qos(c.cfg.Prefetch, 0, false); err != nil {
		return err
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	dlClosed := dl.NotifyClose(make(chan *amqp.Error, 1))
	deliveries, err := ch.Consume(c.cfg.Queue, c.cfg.ConsumerTag, false, false, false, false, nil)
	if err != nil {
		return err
	}
	c.readyOnce.Do(func() { close(c.ready) })
	s := &session{
		c:       c,
		dl:      dl,
		returns: dl.NotifyReturn(make(chan amqp.Return, 1)),
		held:    map[uint64]*heldDelivery{},
		stop:    make(chan struct{}),
	}
	var workers sync.WaitGroup
	for range c.cfg.Concurrency {
		workers.Go(func() {
			for d := range deliveries {
				s.handle(ctx, d)
			}
		})
	}
	allDone := make(chan struct{})
	go func() { workers.Wait(); close(allDone) }()

	var cause error
	select {
	case <-c.life.Stopped():
		close(s.stop)
		// basic.cancel: the broker sends no more; what amqp091 already
		// buffered still comes out of deliveries and is requeued unstarted.
		if err := ch.Cancel(c.cfg.ConsumerTag, false); err != nil {
			cause = err
		}
	case <-ctx.Done():
		close(s.stop)
		_ = ch.Close()
		<-allDone
		s.releaseHeld()
		return ctx.Err()
	case e := <-closed:
		cause = closeCause(e)
	case e := <-dlClosed:
		cause = closeCause(e)
		_ = ch.Close()
	case <-allDone:
		// deliveries closed: the broker cancelled the consumer (queue
		// deleted) or the channel closed.
		cause = errors.New("the broker cancelled the consumer")
	}
	<-allDone
	s.releaseHeld()
	if c.life.Stopping() {
		return nil
	}
	return cause
}

func closeCause(e *amqp.Error) error {
	if e == nil {
		return amqp.ErrClosed
	}
	return e
}

// session is the state of one consumption on one channel.
type session struct {
	c       *Consumer
	dlMu    sync.Mutex // one dead letter at a time, so a return matches its publish
	dl      *amqp.Channel
	returns chan amqp.Return
	stop    chan struct{}

	heldMu sync.Mutex
	held   map[uint64]*heldDelivery
	closed bool
}

type heldDelivery struct {
	d     amqp.Delivery
	timer *time.Timer
}

// messageID reads the message ID from the configured place.
func (c *Consumer) messageID(d *amqp.Delivery) string {
	if c.cfg.IDHeader == "" {
		return d.MessageId
	}
	switch v := d.Headers[c.cfg.IDHeader].(type) {
	case string:
		return v
	case []byte:
		return string(v)
	}
	return ""
}

func (s *session) handle(ctx context.Context, d amqp.Delivery) {
	c := s.c
	select {
	case <-s.stop:
		// Stopping: a delivery not started goes back to the queue.
		_ = d.Nack(false, true)
		return
	default:
	}
	id := c.messageID(&d)
	h := deliveryHeaders(&d)
	pctx := ctx
	if c.cfg.HandlerTimeout > 0 {
		var cancel context.CancelFunc
		pctx, cancel = context.WithTimeout(ctx, c.cfg.HandlerTimeout)
		defer cancel()
	}
	st := idem.Guard(c.withDelivery(pctx, h), c.cfg.Processor, idem.Message{ID: id, Payload: d.Body, Headers: h}).Settle(c.cfg.RetryDelay)
	switch st.Action {
	case idem.Ack:
		if err := d.Ack(false); err != nil {
			c.log.Warn("idemamqp: ack failed; the broker will redeliver", "message_id", id, "err", err)
		}
	case idem.DeadLetter:
		if err := s.deadLetter(ctx, d, st); err != nil {
			c.log.Warn("idemamqp: dead letter not published; requeueing", "message_id", id, "dead_letter", c.cfg.DeadLetter, "err", err)
			s.hold(d, c.cfg.RetryDelay)
			return
		}
		if err := d.Ack(false); err != nil {
			c.log.Warn("idemamqp: ack of a dead-lettered message failed; the broker will redeliver it", "message_id", id, "err", err)
		}
	default: // Redeliver: held for the delay, then requeued
		s.hold(d, st.Delay)
	}
	st.Log(ctx, c.log, "idemamqp", "dead_letter", c.cfg.DeadLetter)
}

// hold keeps d unacknowledged for delay, then nacks it with requeue. A
// delivery held when the session ends is nacked at once (Stop) or left to
// the broker (channel lost: it requeues it itself).
func (s *session) hold(d amqp.Delivery, delay time.Duration) {
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	if s.closed {
		_ = d.Nack(false, true)
		return
	}
	h := &heldDelivery{d: d}
	h.timer = time.AfterFunc(delay, func() {
		s.heldMu.Lock()
		_, ok := s.held[d.DeliveryTag]
		delete(s.held, d.DeliveryTag)
		s.heldMu.Unlock()
		if ok {
			_ = d.Nack(false, true)
		}
	})
	s.held[d.DeliveryTag] = h
}

// releaseHeld nacks every held delivery with requeue now.
func (s *session) releaseHeld() {
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	s.closed = true
	for tag, h := range s.held {
		if h.timer.Stop() {
			_ = h.d.Nack(false, true)
		}
		delete(s.held, tag)
	}
}

// deadLetter publishes d to the dead-letter queue with the reason headers
// and waits for the broker's confirm.
func (s *session) deadLetter(ctx context.Context, d amqp.Delivery, st idem.Settlement) error {
	c := s.c
	headers := amqp.Table{}
	for k, v := range d.Headers {
		headers[k] = v
	}
	for k, v := range st.DeadLetterHeaders() {
		headers[k] = v
	}
	headers[HeaderOriginalQueue] = c.cfg.Queue
	msg := amqp.Publishing{
		Headers:         headers,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		AppId:           d.AppId,
		Body:            d.Body,
		// Expiration is dropped so the dead letter does not expire, and
		// UserId because the broker checks it against this connection's
		// user.
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultDeadLetterTimeout)
	defer cancel()
	s.dlMu.Lock()
	defer s.dlMu.Unlock()
	for len(s.returns) > 0 {
		<-s.returns
	}
	conf, err := s.dl.PublishWithDeferredConfirmWithContext(ctx, "", c.cfg.DeadLetter, true, false, msg)
	if err != nil {
		return err
	}
	ok, err := conf.WaitContext(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return errors.New("the broker nacked the dead letter")
	}
	// A return comes before the confirm, on the same connection reader.
	select {
	case r := <-s.returns:
		return fmt.Errorf("%w: %d %s", ErrDeadLetterUnroutable, r.ReplyCode, r.ReplyText)
	default:
	}
	return nil
}

// deliveryHeaders returns d's header table (values printed with fmt.Sprint)
// and its content type, correlation ID and type properties, when set, as
// Content-Type, Correlation-Id and Type (idem.Message.Headers); nil when
// there are none.
func deliveryHeaders(d *amqp.Delivery) idem.Headers {
	h := make(idem.Headers, len(d.Headers)+3)
	for k, v := range d.Headers {
		h[k] = []string{fmt.Sprint(v)}
	}
	for k, v := range map[string]string{"Content-Type": d.ContentType, "Correlation-Id": d.CorrelationId, "Type": d.Type} {
		if v != "" {
			h[k] = []string{v}
		}
	}
	if len(h) == 0 {
		return nil
	}
	return h
}
