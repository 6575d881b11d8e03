//go:build !nodemo

package demo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemnats"
	"github.com/idem-go/idem/cmd/idem/internal/connect"
	"github.com/idem-go/idem/cmd/idem/internal/secret"
)

// The demo's JetStream names.
const (
	natsStream   = "IDEM_DEMO_PAYMENTS"
	natsSubject  = "idem.demo.payments.requested"
	natsDurable  = "payments"
	natsDeadSubj = "idem.demo.payments.dead"
	// The receipts story: PaymentCharged events, sent by the outbox relay.
	natsEventsSubject   = "idem.demo.payments.charged"
	natsReceiptsDurable = "receipts"
)

// natsBroker carries the demo's messages on JetStream, in process (file
// storage under the demo folder) or on an external server, through
// idemnats. Each member has a connection of its own, which its crash closes.
type natsBroker struct {
	srv     *server.Server // nil for an external server
	url     string
	nc      *nats.Conn
	stream  jetstream.Stream
	cons    jetstream.Consumer
	events  jetstream.Consumer // the receipts consumer's durable
	relayNC *nats.Conn         // the relay publisher's connection
	prod    *idemnats.Producer
	dropped atomic.Int64 // publishes JetStream dropped within its dedupe window
}

// openNATS starts an in-process JetStream server storing in dir (url
// "nats:embedded") or connects to url, and creates the stream and the
// durable consumer. fresh removes what an earlier run left on the server.
func openNATS(ctx context.Context, url, dir string, ackWait time.Duration, fresh bool) (_ *natsBroker, err error) {
	defer func() { err = secret.Error(err, url) }()
	b := &natsBroker{url: url}
	if url == "nats:embedded" || url == "nats:" {
		var err error
		b.srv, err = server.NewServer(&server.Options{
			JetStream: true, StoreDir: filepath.Join(dir, "nats"),
			DontListen: true, NoSigs: true, NoLog: true, ServerName: "idem-demo",
		})
		if err != nil {
			return nil, fmt.Errorf("embedded NATS: %w", err)
		}
		b.srv.Start()
		if !b.srv.ReadyForConnections(30 * time.Second) {
			b.srv.Shutdown()
			return nil, errors.New("embedded NATS server did not start in 30s")
		}
	}
	js, err := b.connect()
	if err != nil {
		b.close()
		return nil, fmt.Errorf("cannot reach NATS at %s: %w", secret.URL(url), err)
	}
	b.nc = js.Conn()
	if fresh {
		if err := js.DeleteStream(ctx, natsStream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			b.close()
			return nil, fmt.Errorf("NATS: remove the previous demo stream: %w", err)
		}
	}
	b.stream, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:     natsStream,
		Subjects: []string{natsSubject, natsDeadSubj, natsEventsSubject},
		Storage:  jetstream.FileStorage,
		// JetStream drops a publish whose Nats-Msg-Id it saw within this
		// window. The demo keeps it at the 100ms minimum so the producer's
		// retries reach the consumer, as a retry after a 2-minute window
		// would in production: idem, not the broker, absorbs them.
		Duplicates: 100 * time.Millisecond,
	})
	if err == nil {
		b.cons, err = b.stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
			Durable: natsDurable, FilterSubject: natsSubject, AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait,
		})
	}
	if err == nil {
		b.events, err = b.stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
			Durable: natsReceiptsDurable, FilterSubject: natsEventsSubject, AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait,
		})
	}
	if err != nil {
		b.close()
		return nil, fmt.Errorf("NATS: create the stream and consumer: %w", err)
	}
	b.prod = idemnats.NewProducer(dropCounter{js, &b.dropped})
	return b, nil
}

// connect opens a new connection to the server. It reconnects by itself
// for as long as it is open (nats.go's reconnect, every 250ms): a restarted
// server finds the producer, the counts and the members' pull consumers
// back, and the durable consumer, kept in the server's file store,
// redelivers what was not acked.
func (b *natsBroker) connect() (jetstream.JetStream, error) {
	if b.srv != nil {
		return connect.NATS("", nats.InProcessServer(b.srv))
	}
	return connect.NATS(b.url)
}

// dropCounter counts the publishes JetStream drops as repeats of a
// Nats-Msg-Id within the stream's duplicate window.
type dropCounter struct {
	jetstream.JetStream
	n *atomic.Int64
}

func (d dropCounter) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	ack, err := d.JetStream.PublishMsg(ctx, m, opts...)
	if err == nil && ack.Duplicate {
		d.n.Add(1)
	}
	return ack, err
}

// publish publishes with id in Nats-Msg-Id. The demo publishes from one
// goroutine, so a change of the drop count is this publish's.
func (b *natsBroker) publish(ctx context.Context, id string, payload []byte) (dropped bool, err error) {
	before := b.dropped.Load()
	_, err = b.prod.Publish(ctx, natsSubject, payload, idemnats.WithMessageID(id))
	return b.dropped.Load() > before, err
}

// member consumes the durable consumer on a new connection, which its
// crash closes; JetStream redelivers what it had not acked after the ack
// wait.
func (b *natsBroker) member(ctx context.Context, p idem.Processor, log *slog.Logger) (*member, error) {
	return b.join(ctx, natsDurable, p, log)
}

// join runs p on the durable consumer durable, on a new connection.
func (b *natsBroker) join(ctx context.Context, durable string, p idem.Processor, log *slog.Logger) (*member, error) {
	js, err := b.connect()
	if err != nil {
		return nil, err
	}
	cons, err := js.Consumer(ctx, natsStream, durable)
	var c *idemnats.Consumer
	if err == nil {
		c, err = idemnats.NewConsumer(js, cons, idemnats.Config{Processor: p, DeadLetter: natsDeadSubj,
			MaxMessages: 32, RetryDelay: demoRetryDelay, Logger: log})
	}
	if err != nil {
		js.Conn().Close()
		return nil, err
	}
	return &member{run: c.Run, shutdown: js.Conn().Close}, nil
}

// unfinished counts messages not yet delivered or delivered but not acked.
func (b *natsBroker) unfinished(ctx context.Context) (int, error) {
	return natsUnfinished(ctx, b.cons)
}

// natsUnfinished counts cons's messages not yet delivered or not yet acked.
func natsUnfinished(ctx context.Context, cons jetstream.Consumer) (int, error) {
	info, err := cons.Info(ctx)
	if err != nil {
		return 0, err
	}
	return int(info.NumPending) + info.NumAckPending, nil
}

func (b *natsBroker) deadLettered(ctx context.Context) (int64, error) {
	info, err := b.stream.Info(ctx, jetstream.WithSubjectFilter(natsDeadSubj))
	if err != nil {
		return 0, err
	}
	return int64(info.State.Subjects[natsDeadSubj]), nil
}

func (b *natsBroker) close() {
	if b.relayNC != nil {
		b.relayNC.Close()
	}
	if b.nc != nil {
		b.nc.Close()
	}
	if b.srv != nil {
		b.srv.Shutdown()
		b.srv.WaitForShutdown()
	}
}

// eventsDestination is the subject of the PaymentCharged events.
func (b *natsBroker) eventsDestination() string { return natsEventsSubject }

// eventsPublisher is the relay's JetStream publisher, on a connection of
// its own (Nats-Msg-Id carries the outgoing ID).
func (b *natsBroker) eventsPublisher(context.Context) (idem.Publisher, error) {
	js, err := b.connect()
	if err != nil {
		return nil, err
	}
	b.relayNC = js.Conn()
	return idemnats.NewPublisher(js), nil
}

// receiptsMember runs p on the receipts durable consumer.
func (b *natsBroker) receiptsMember(ctx context.Context, p idem.Processor, log *slog.Logger) (*member, error) {
	return b.join(ctx, natsReceiptsDurable, p, log)
}

func (b *natsBroker) eventsUnfinished(ctx context.Context) (int, error) {
	return natsUnfinished(ctx, b.events)
}
