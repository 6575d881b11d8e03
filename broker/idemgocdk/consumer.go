package idemgocdk

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"runtime"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/lifecycle"
	"gocloud.dev/pubsub"
)

// Defaults applied by NewConsumer to zero Config fields.
const (
	// DefaultIDKey is the metadata key holding the message ID, the one
	// Producer writes.
	DefaultIDKey = "Idem-Message-Id"
	// DefaultRetryDelay is how long a Failed message waits before it is
	// nacked (redelivered), on drivers that can nack.
	DefaultRetryDelay = time.Second
	// DefaultSettleTimeout bounds one dead letter's Send.
	DefaultSettleTimeout = 30 * time.Second
	// DefaultHandlerTimeout is Config.HandlerTimeout's default.
	DefaultHandlerTimeout = 5 * time.Minute
	// DefaultSystem is the messaging system the Consumer reports in each
	// idem.Delivery when Config.System is empty.
	DefaultSystem = "gocdk"
)

// Metadata of a dead letter that locates the original, besides the keys
// every idem adapter writes (idem.HeaderDeadLetterReason,
// idem.HeaderDeadLetterError, idem.HeaderDeadLetterStatus,
// idem.HeaderOriginalMessageID) and the original message's own metadata.
const (
	// MetadataOriginalLoggableID is the driver's ID of the original
	// message (pubsub.Message.LoggableID): the Pub/Sub message ID, the SQS
	// MessageId.
	MetadataOriginalLoggableID = "Idem-Original-Loggable-Id"
)

// Config configures a Consumer. Zero values take the documented defaults.
type Config struct {
	// Processor runs each message through an Idempotent Consumer
	// (idem.Bind, idem.BindLease, or an idem.ProcessorFunc). Required. It
	// must be safe for concurrent use when Concurrency > 1.
	Processor idem.Processor
	// DeadLetter is the topic that receives dead letters: the original
	// body and metadata plus the keys every idem adapter writes. Required
	// (no silent drops); it must not reach the consumed subscription. The
	// Consumer only sends on it: the caller opens it and shuts it down
	// after Stop.
	DeadLetter *pubsub.Topic
	// IDKey is the metadata key holding the message ID. Defaults to
	// DefaultIDKey ("Idem-Message-Id"). Ignored when MessageID is set.
	IDKey string
	// MessageID, when set, returns the message ID of a received message
	// instead of its IDKey metadata value; "" means the message has none
	// (it is dead-lettered with idem.ErrMissingMessageID). DriverMessageID
	// takes the driver's own ID; a function calling m.As can read any
	// driver-specific field.
	MessageID func(m *pubsub.Message) string
	// Concurrency is how many messages are processed at once; the
	// Consumer calls Receive only when a worker is free. Defaults to 1.
	Concurrency int
	// RetryDelay is how long a Failed (retryable) message waits before
	// the Consumer nacks it, on a driver that can nack
	// (pubsub.Message.Nackable); the delay of an InProgress message whose
	// Outcome has no RetryAfter. Defaults to DefaultRetryDelay (1s). On a
	// driver that cannot nack the message is redelivered when its ack
	// deadline lapses, whatever the delay.
	RetryDelay time.Duration
	// HandlerTimeout bounds one delivery's processing: the context the
	// Processor gets ends HandlerTimeout after the message was received,
	// so a handler blocked on a stalled connection (a database call with
	// no deadline of its own, behind a black-holed network path) gives
	// up, its transaction rolls back, and the message is nacked for
	// redelivery instead of being held for as long as the connection
	// stays stalled (for ever on a driver without an ack deadline, such
	// as rabbitpubsub). A handler that ignores its context still holds
	// its message. Defaults to DefaultHandlerTimeout (5 minutes);
	// negative disables it.
	HandlerTimeout time.Duration
	// Destination names the subscription in each idem.Delivery, in logs
	// and in metrics (a Pub/Sub subscription, an SQS queue); optional.
	Destination string
	// System is the messaging.system of each idem.Delivery ("gcp_pubsub",
	// "aws_sqs", ...). Defaults to DefaultSystem ("gocdk").
	System string
	// Logger receives every settlement at the level idem.Settlement.Level
	// gives it, and receive and dead-letter problems at warn. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

// Consumer receives messages from a Go CDK subscription and runs each
// through an idem.Processor; see the package doc. Create it with
// NewConsumer, run it with Run, stop it with Stop.
type Consumer struct {
	sub  *pubsub.Subscription
	cfg  Config
	log  *slog.Logger
	life *lifecycle.Lifecycle

	// delayed holds the messages waiting for a delayed nack, each with
	// its timer; Run nacks what is left when it returns.
	delayMu sync.Mutex
	delayed map[*pubsub.Message]*time.Timer
	closed  bool // Run returned: nack at once
}

// NewConsumer returns a Consumer of sub, the caller's subscription, opened
// with any driver (mempubsub, gcppubsub, awssnssqs, azuresb, ...). It does
// no I/O; the caller shuts sub down after Stop. Errors match
// idem.ErrInvalidConfig: a nil sub, a missing Processor or DeadLetter, a
// negative Concurrency or RetryDelay.
func NewConsumer(sub *pubsub.Subscription, cfg Config) (*Consumer, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: idemgocdk: "+format, append([]any{idem.ErrInvalidConfig}, args...)...)
	}
	switch {
	case sub == nil:
		return nil, bad("nil subscription")
	case cfg.Processor == nil:
		return nil, bad("Processor is required")
	case cfg.DeadLetter == nil:
		return nil, bad("DeadLetter is required: a message that cannot be processed is never dropped")
	case cfg.Concurrency < 0:
		return nil, bad("Concurrency %d is negative", cfg.Concurrency)
	case cfg.RetryDelay < 0:
		return nil, bad("RetryDelay %v is negative", cfg.RetryDelay)
	}
	if cfg.IDKey == "" {
		cfg.IDKey = DefaultIDKey
	}
	if cfg.MessageID == nil {
		key := cfg.IDKey
		cfg.MessageID = func(m *pubsub.Message) string { return m.Metadata[key] }
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 1
	}
	if cfg.RetryDelay == 0 {
		cfg.RetryDelay = DefaultRetryDelay
	}
	if cfg.HandlerTimeout == 0 {
		cfg.HandlerTimeout = DefaultHandlerTimeout
	}
	if cfg.System == "" {
		cfg.System = DefaultSystem
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	log := cfg.Logger
	if cfg.Destination != "" {
		log = log.With("subscription", cfg.Destination)
	}
	return &Consumer{sub: sub, cfg: cfg, log: log, life: lifecycle.New(),
		delayed: map[*pubsub.Message]*time.Timer{}}, nil
}

// DriverMessageID returns the driver's own ID of m (m.LoggableID: the
// Pub/Sub message ID, the SQS MessageId), or "" when the driver gave none.
// Use it as Config.MessageID when producers cannot set metadata: a
// redelivery of the same broker message is then recognised, but a
// producer's retried Send is a new broker message with a new ID, and is
// processed again.
func DriverMessageID(m *pubsub.Message) string {
	// The portable type writes "unknown" when the driver set nothing.
	if m.LoggableID == "unknown" {
		return ""
	}
	return m.LoggableID
}

// Run receives until Stop is called or ctx ends. It returns nil after Stop
// (also when Stop came before Run), and ctx.Err() when ctx ended first.
// It returns the subscription's error, wrapped, when Receive fails for good
// (the Go CDK retries retryable errors itself; a Subscription shut down
// under a running Consumer is such an error). A Consumer runs once: a
// second Run returns an error matching idem.ErrAlreadyRunning.
//
// ctx is the parent of every handler's context: cancelling it stops the
// Consumer at once, without waiting for handlers (use Stop to finish
// them); what they did not settle is redelivered when its ack deadline
// lapses.
func (c *Consumer) Run(ctx context.Context) error {
	return c.life.Run(ctx, fmt.Errorf("idemgocdk: %w", idem.ErrAlreadyRunning), c.run)
}

// Stop stops the Consumer gracefully: no new Receive, the messages already
// received are processed and settled. It returns nil once Run has
// returned, or ctx's error if ctx ends first, in which case the handlers
// still running have their contexts cancelled and what they had not
// settled is redelivered after its ack deadline. Stop before Run makes Run
// return nil at once. Stop is idempotent. Acks are sent in the background
// by the Go CDK: shut the Subscription down after Stop to flush them.
func (c *Consumer) Stop(ctx context.Context) error { return c.life.Stop(ctx) }

func (c *Consumer) run(runCtx context.Context) error {
	defer c.nackDelayed()
	recvCtx, stopRecv := context.WithCancel(runCtx)
	defer stopRecv()
	go func() {
		select {
		case <-c.life.Stopped():
			stopRecv()
		case <-recvCtx.Done():
		}
	}()
	slots := make(chan struct{}, c.cfg.Concurrency)
	var workers sync.WaitGroup
	defer workers.Wait()
	for {
		select {
		case slots <- struct{}{}:
		case <-recvCtx.Done():
			return nil
		}
		m, err := c.sub.Receive(recvCtx)
		if err != nil {
			<-slots
			if recvCtx.Err() != nil {
				return nil
			}
			return fmt.Errorf("idemgocdk: receive: %w", err)
		}
		workers.Go(func() {
			defer func() { <-slots }()
			c.handle(runCtx, m)
		})
	}
}

// handle runs m through the Processor and settles it.
func (c *Consumer) handle(ctx context.Context, m *pubsub.Message) {
	id := c.cfg.MessageID(m)
	h := idem.Headers{}
	for k, v := range m.Metadata {
		h[k] = []string{v}
	}
	d := idem.Delivery{System: c.cfg.System, Destination: c.cfg.Destination, Header: h}
	pctx := ctx
	if c.cfg.HandlerTimeout > 0 {
		var cancel context.CancelFunc
		pctx, cancel = context.WithTimeout(ctx, c.cfg.HandlerTimeout)
		defer cancel()
	}
	out := idem.Guard(idem.WithDelivery(pctx, d), c.cfg.Processor, idem.Message{ID: id, Payload: m.Body, Headers: h})
	st := out.Settle(c.cfg.RetryDelay)
	// Settle even when ctx ended: the handler's effects may have committed.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultSettleTimeout)
	defer cancel()
	switch st.Action {
	case idem.Ack:
		m.Ack()
	case idem.DeadLetter:
		if err := c.deadLetter(sctx, m, st); err != nil {
			c.log.Warn("idemgocdk: dead letter not sent; the message will be redelivered", "message_id", id, "loggable_id", m.LoggableID, "err", err)
			c.redeliver(m, c.cfg.RetryDelay)
			return
		}
		m.Ack()
	default:
		c.redeliver(m, st.Delay)
	}
	st.Log(sctx, c.log, "idemgocdk", "loggable_id", m.LoggableID)
}

// deadLetter sends m's body and metadata, with the settlement's keys, to
// the dead-letter topic, and returns once the driver has it.
func (c *Consumer) deadLetter(ctx context.Context, m *pubsub.Message, st idem.Settlement) error {
	md := maps.Clone(m.Metadata)
	if md == nil {
		md = map[string]string{}
	}
	maps.Copy(md, st.DeadLetterHeaders())
	if id := DriverMessageID(m); id != "" {
		md[MetadataOriginalLoggableID] = id
	}
	return c.cfg.DeadLetter.Send(ctx, &pubsub.Message{Body: m.Body, Metadata: md})
}

// redeliver nacks m after delay when the driver can nack; otherwise it
// leaves m to the driver's ack deadline.
func (c *Consumer) redeliver(m *pubsub.Message, delay time.Duration) {
	if !m.Nackable() {
		// Neither Ack nor Nack: the ack deadline lapses and the service
		// redelivers m. Drop the Go CDK's finalizer, which would log
		// that m was never acked.
		runtime.SetFinalizer(m, nil)
		return
	}
	c.delayMu.Lock()
	defer c.delayMu.Unlock()
	if delay <= 0 || c.closed {
		m.Nack()
		return
	}
	c.delayed[m] = time.AfterFunc(delay, func() {
		c.delayMu.Lock()
		_, waiting := c.delayed[m]
		delete(c.delayed, m)
		c.delayMu.Unlock()
		if waiting {
			m.Nack()
		}
	})
}

// nackDelayed nacks at once the messages still waiting for their delayed
// nack, when Run returns: no timer outlives Run, and another member can
// take them.
func (c *Consumer) nackDelayed() {
	c.delayMu.Lock()
	c.closed = true
	waiting := c.delayed
	c.delayed = map[*pubsub.Message]*time.Timer{}
	c.delayMu.Unlock()
	for m, t := range waiting {
		// A timer that already fired found m gone from c.delayed and did
		// not nack it: every message here is nacked exactly once.
		t.Stop()
		m.Nack()
	}
}
