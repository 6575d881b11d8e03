package idemwatermill

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/idem-go/idem"
)

// Defaults applied to zero Config fields.
const (
	// DefaultRetryDelay is how long a delivery that is to be redelivered
	// (Failed, or InProgress without a RetryAfter) is held before the
	// middleware returns its error and the Router nacks it.
	DefaultRetryDelay = time.Second
	// DefaultSystem is the messaging system reported in each
	// idem.Delivery when Config.System is empty.
	DefaultSystem = "watermill"
)

// ResultContentType is the content type of the stored result in lease
// mode: the messages the handler returned, replayed to duplicates.
const ResultContentType = "application/vnd.idem.watermill-messages+json"

// Config configures the middleware. Zero values take the documented
// defaults.
type Config struct {
	// IDKey is the metadata key holding the message ID. Empty (the
	// default): the message's UUID (message.Message.UUID), which
	// Watermill Pub/Subs carry from the publisher to the subscriber, so a
	// producer that publishes the same message again (same UUID) is
	// deduplicated. Name a key when the ID is a business key the producer
	// writes, or when the Pub/Sub does not keep UUIDs.
	IDKey string
	// RetryDelay is how long a delivery to be redelivered is held before
	// its error is returned (and the Router nacks it): Failed deliveries
	// wait RetryDelay (or the Outcome's RetryAfter when longer),
	// InProgress ones their Outcome's RetryAfter (what is left of the
	// other delivery's lease). Most Pub/Subs redeliver a nacked message at
	// once, so this is the pause between attempts, as middleware.Retry
	// makes one. Defaults to DefaultRetryDelay (1s); the wait ends early
	// when the message's context ends.
	RetryDelay time.Duration
	// System is the messaging.system of each idem.Delivery, for hooks
	// and metrics ("amqp", "postgresql", ...). Defaults to DefaultSystem
	// ("watermill"). The destination is the topic the Router's handler
	// subscribed to (message.SubscribeTopicFromCtx).
	System string
	// Logger receives every settlement at the level idem.Settlement.Level
	// gives it (a delivery cancelled by the Router closing: debug, and
	// nacked). Defaults to slog.Default().
	Logger *slog.Logger
}

// fill checks cfg, for a consumer named what that is nil when missing, and
// applies the defaults.
func (cfg *Config) fill(missing bool, what string) error {
	switch {
	case missing:
		return fmt.Errorf("%w: idemwatermill: nil %s", idem.ErrInvalidConfig, what)
	case cfg.RetryDelay < 0:
		return fmt.Errorf("%w: idemwatermill: RetryDelay %v is negative", idem.ErrInvalidConfig, cfg.RetryDelay)
	}
	cfg.RetryDelay = cmp.Or(cfg.RetryDelay, DefaultRetryDelay)
	cfg.System = cmp.Or(cfg.System, DefaultSystem)
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	return nil
}

// Error is the error the middleware returns for a delivery that must not
// be acknowledged: the Router then nacks it. It carries the idem
// Settlement: Action is idem.Redeliver (Failed, InProgress) or
// idem.DeadLetter (Rejected: no or an invalid message ID;
// FingerprintMismatch; poison). It unwraps to the Outcome's error, so
// errors.Is(err, idem.ErrMissingMessageID) and the like hold.
type Error struct {
	Settlement idem.Settlement
}

// Error returns "idemwatermill: " with the settlement's reason and error.
func (e *Error) Error() string {
	return fmt.Sprintf("idemwatermill: %s: %v", e.Settlement.Reason, e.Settlement.Err)
}

// Unwrap returns the Outcome's error.
func (e *Error) Unwrap() error { return e.Settlement.Err }

// ShouldDeadLetter reports whether err, returned by a handler wrapped in
// this package's middleware, is for a message that no redelivery can
// help (an *Error whose Settlement.Action is idem.DeadLetter). Pass it to
// Watermill's middleware.PoisonQueueWithFilter, added before (outside)
// this middleware, to move such messages to a poison topic, with idem's
// dead-letter keys in their metadata, and acknowledge them there. Without
// a poison queue they are nacked, and redelivered, for ever.
func ShouldDeadLetter(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Settlement.Action == idem.DeadLetter
}

type txKey struct{}

type attemptKey struct{}

// Tx returns the transaction that holds the message's claim, from the
// context of the message a transactional-mode handler was given
// (msg.Context()), and false when there is none (the handler was not
// wrapped by Transactional, or TTx is not the Consumer's transaction type).
// Write every database effect with it; never commit or roll it back.
func Tx[TTx any](ctx context.Context) (TTx, bool) {
	tx, ok := ctx.Value(txKey{}).(TTx)
	return tx, ok
}

// Attempt returns the lease-mode attempt (fencing token, Key for
// idempotency keys of external calls, Step for recovery points) from the
// context of the message a lease-mode handler was given (msg.Context()),
// or nil when the handler was not wrapped by Lease.
func Attempt(ctx context.Context) *idem.Attempt {
	a, _ := ctx.Value(attemptKey{}).(*idem.Attempt)
	return a
}

// Transactional returns the middleware that runs each message through c in
// transactional mode: it claims the message ID in a transaction of c's
// store, calls the wrapped handler with that transaction in msg.Context()
// (read it with Tx[TTx]), and commits the claim with the handler's
// database effects, or rolls both back when the handler returns an error
// or panics. A duplicate is acknowledged without calling the handler.
//
// The messages the handler returns are published by the Router after the
// commit; a crash between the commit and that publish loses them (the
// redelivery is a Duplicate). Publish them inside the transaction instead,
// with a Publisher on the transaction (watermill-sql's
// sql.NewPublisher(sql.TxFromStdSQL(tx), ...)), when they must not be lost.
//
// Errors match idem.ErrInvalidConfig: a nil c, a negative RetryDelay.
func Transactional[TTx any](c *idem.Consumer[TTx], cfg Config) (message.HandlerMiddleware, error) {
	if err := cfg.fill(c == nil, "Consumer"); err != nil {
		return nil, err
	}
	return txMiddleware(&cfg, c.Process), nil
}

// txMiddleware is the transactional-mode middleware over process, which
// claims a message and runs the handler in a transaction.
func txMiddleware[TTx any](cfg *Config, process func(context.Context, idem.Message, idem.Handler[TTx]) (idem.Outcome, error)) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			var produced []*message.Message
			p := idem.ProcessorFunc(func(ctx context.Context, m idem.Message) (idem.Outcome, error) {
				return process(ctx, m, func(ctx context.Context, tx TTx, _ idem.Message) error {
					var err error
					produced, err = call(h, msg, context.WithValue(ctx, txKey{}, tx))
					return err
				})
			})
			out := guard(cfg, p, msg)
			if out.Status != idem.Processed {
				produced = nil
			}
			return settle(cfg, msg, out, produced)
		}
	}
}

// TransactionalIn is Transactional inside a database/sql transaction the
// Pub/Sub already holds for the message, which from returns from
// msg.Context(). The claim and the handler's effects are made in it
// (idem.Consumer.ProcessTx) and the Pub/Sub commits it with its own ack,
// so the claim, the effects and the ack are one commit: a crash at any
// point leaves all of them or none (what was not committed is delivered
// again and processed afresh).
//
// watermill-sql's subscriber is such a Pub/Sub: it consumes a batch of
// messages (its schema adapter's SubscribeBatchSize, 100 by default) in
// one transaction, in msg.Context() (its sql.TxFromContext), committed
// with the acks of the batch, and sends a nacked message again in the
// same transaction. Each message is therefore claimed and handled under a
// SAVEPOINT: a failed handler (or claim) is rolled back to it, claim and
// effects together, before the nack, so the message sent again is claimed
// afresh; a processed one releases it. SAVEPOINT is standard SQL
// (PostgreSQL, MySQL, SQLite). Since the batch is one transaction, its
// effects are visible once it commits, after its last handler has
// returned, not as each handler returns; a Router closed before that
// commit leaves the whole batch uncommitted (offsets, claims and
// effects), to be delivered again. With an idemsql store on the same
// *sql.DB:
//
//	from := func(ctx context.Context) (*sql.Tx, bool) {
//		tx, ok := wsql.TxFromContext(ctx)
//		std, isStd := tx.(*wsql.StdSQLTx)
//		if !ok || !isStd {
//			return nil, false
//		}
//		return std.Tx, true
//	}
//
// The handler reads the same transaction with Tx[*sql.Tx]. A message whose
// context holds no transaction is Failed with an error matching
// idem.ErrInvalidConfig (nacked, never acked). watermill-sql consumes in
// REPEATABLE READ: a claim that meets another consumer's claim of the same
// ID fails to serialise, is rolled back to the savepoint, and the message
// sent again is then a Duplicate.
//
// Errors match idem.ErrInvalidConfig: a nil c or from, a negative
// RetryDelay.
func TransactionalIn(c *idem.Consumer[*sql.Tx], from func(ctx context.Context) (*sql.Tx, bool), cfg Config) (message.HandlerMiddleware, error) {
	if err := cfg.fill(c == nil || from == nil, "Consumer or transaction source"); err != nil {
		return nil, err
	}
	return txMiddleware(&cfg, func(ctx context.Context, m idem.Message, h idem.Handler[*sql.Tx]) (idem.Outcome, error) {
		failed := func(err error) (idem.Outcome, error) {
			return idem.Outcome{Status: idem.Failed, MessageID: m.ID, Err: err}, err
		}
		tx, ok := from(ctx)
		if !ok {
			return failed(fmt.Errorf("%w: idemwatermill: the message's context holds no transaction", idem.ErrInvalidConfig))
		}
		if _, err := tx.ExecContext(ctx, `SAVEPOINT idem_watermill`); err != nil {
			return failed(fmt.Errorf("%w: idemwatermill: savepoint: %w", idem.ErrStore, err))
		}
		out, err := c.ProcessTx(ctx, tx, m, h)
		end := `RELEASE SAVEPOINT idem_watermill`
		if err != nil {
			end = `ROLLBACK TO SAVEPOINT idem_watermill`
		}
		if _, serr := tx.ExecContext(context.WithoutCancel(ctx), end); serr != nil {
			// The transaction cannot be trusted any more: never ack.
			return failed(errors.Join(err, fmt.Errorf("%w: idemwatermill: %s: %w", idem.ErrStore, end, serr)))
		}
		return out, err
	}), nil
}

// Lease returns the middleware that runs each message through c in lease
// mode, for handlers whose effects are outside c's store (an HTTP call, a
// payment provider, another database): it takes the message's lease,
// calls the wrapped handler with the idem.Attempt in msg.Context() (read
// it with Attempt; pass Attempt.Key or Attempt.Token to the external
// system), and completes the attempt when the handler returns nil. A
// handler error releases the lease for a retry, or poisons the message
// after c's MaxAttempts; another live attempt makes the delivery
// InProgress (redelivered after the lease's remaining time).
//
// The messages the handler returns are stored with the record (JSON, with
// content type ResultContentType) and returned again to every duplicate,
// which the Router then publishes again: a crash between the completion
// and the publish loses nothing, and downstream the same UUIDs arrive at
// least once (deduplicate them there, with this package on the UUID).
//
// Errors match idem.ErrInvalidConfig: a nil c, a negative RetryDelay.
func Lease(c *idem.LeaseConsumer, cfg Config) (message.HandlerMiddleware, error) {
	if err := cfg.fill(c == nil, "LeaseConsumer"); err != nil {
		return nil, err
	}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			var produced []*message.Message
			p := idem.ProcessorFunc(func(ctx context.Context, m idem.Message) (idem.Outcome, error) {
				return c.Process(ctx, m, func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
					var err error
					produced, err = call(h, msg, context.WithValue(ctx, attemptKey{}, a))
					if err != nil || len(produced) == 0 {
						return idem.Result{}, err
					}
					body, err := encodeMessages(produced)
					if err != nil {
						return idem.Result{}, err
					}
					return idem.Result{Body: body, ContentType: ResultContentType}, nil
				})
			})
			out := guard(&cfg, p, msg)
			switch out.Status {
			case idem.Processed:
			case idem.Duplicate:
				produced = nil
				if out.ContentType == ResultContentType && len(out.Result) > 0 {
					replay, err := decodeMessages(out.Result)
					if err != nil {
						// The record is there but its messages cannot be
						// read back: not ackable as done.
						out = idem.Outcome{Status: idem.Failed, MessageID: out.MessageID,
							Err: fmt.Errorf("idemwatermill: stored messages of a duplicate: %w", err)}
						break
					}
					produced = replay
				}
			default:
				produced = nil
			}
			return settle(&cfg, msg, out, produced)
		}
	}, nil
}

// call runs h on msg with ctx as its context, and gives msg its own
// context back afterwards.
func call(h message.HandlerFunc, msg *message.Message, ctx context.Context) ([]*message.Message, error) {
	orig := msg.Context()
	msg.SetContext(ctx)
	defer msg.SetContext(orig)
	return h(msg)
}

// guard runs msg through p with the delivery's metadata in its context.
func guard(cfg *Config, p idem.Processor, msg *message.Message) idem.Outcome {
	id := msg.UUID
	if cfg.IDKey != "" {
		id = msg.Metadata.Get(cfg.IDKey)
	}
	ctx := msg.Context()
	d := idem.Delivery{System: cfg.System, Destination: message.SubscribeTopicFromCtx(ctx), Header: metadataCarrier(msg.Metadata)}
	return idem.Guard(idem.WithDelivery(ctx, d), p, idem.Message{ID: id, Payload: msg.Payload})
}

// settle turns out into what the Router does: nil error (ack, after the
// Router publishes produced), or an *Error (nack).
func settle(cfg *Config, msg *message.Message, out idem.Outcome, produced []*message.Message) ([]*message.Message, error) {
	st := out.Settle(cfg.RetryDelay)
	ctx := msg.Context()
	st.Log(ctx, cfg.Logger, "idemwatermill", "message_uuid", msg.UUID)
	switch st.Action {
	case idem.Ack:
		return produced, nil
	case idem.DeadLetter:
		// For a poison queue outside this middleware: its copy carries
		// the reason the way every idem adapter writes it.
		for k, v := range st.DeadLetterHeaders() {
			msg.Metadata.Set(k, v)
		}
	default:
		if st.Delay > 0 {
			t := time.NewTimer(st.Delay)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		}
	}
	return nil, &Error{Settlement: st}
}

// metadataCarrier reads Watermill metadata as an idem.HeaderCarrier,
// without copying it.
type metadataCarrier message.Metadata

func (m metadataCarrier) Get(key string) string { return m[key] }

func (m metadataCarrier) Keys() []string { return slices.Sorted(maps.Keys(m)) }

// storedMessage is one returned message as the lease-mode result holds it.
type storedMessage struct {
	UUID     string            `json:"uuid"`
	Metadata map[string]string `json:"metadata,omitempty"`
	Payload  []byte            `json:"payload"`
}

func encodeMessages(msgs []*message.Message) ([]byte, error) {
	stored := make([]storedMessage, len(msgs))
	for i, m := range msgs {
		stored[i] = storedMessage{UUID: m.UUID, Metadata: m.Metadata, Payload: m.Payload}
	}
	return json.Marshal(stored)
}

func decodeMessages(body []byte) ([]*message.Message, error) {
	var stored []storedMessage
	if err := json.Unmarshal(body, &stored); err != nil {
		return nil, err
	}
	msgs := make([]*message.Message, len(stored))
	for i, s := range stored {
		msgs[i] = message.NewMessage(s.UUID, s.Payload)
		maps.Copy(msgs[i].Metadata, s.Metadata)
	}
	return msgs, nil
}
