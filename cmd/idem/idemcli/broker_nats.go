package idemcli

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The demo's JetStream names.
const (
	natsStream   = "IDEM_DEMO_PAYMENTS"
	natsSubject  = "idem.demo.payments.requested"
	natsDurable  = "payments"
	natsDeadSubj = "idem.demo.payments.dead"
)

// natsBroker carries the demo's messages on JetStream, in process (file
// storage under the demo folder) or on an external server.
type natsBroker struct {
	srv  *server.Server // nil for an external server
	nc   *nats.Conn
	js   jetstream.JetStream
	cons jetstream.Consumer
}

// openNATS starts an in-process JetStream server storing in dir (url
// "nats:embedded") or connects to url, and creates the stream and the
// durable consumer. fresh removes what an earlier run left on the server.
func openNATS(ctx context.Context, url, dir string, ackWait time.Duration, fresh bool) (*natsBroker, error) {
	b := &natsBroker{}
	var err error
	if url == "nats:embedded" || url == "nats:" {
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
		b.nc, err = nats.Connect("", nats.InProcessServer(b.srv))
	} else {
		b.nc, err = nats.Connect(url, nats.Timeout(5*time.Second))
	}
	if err != nil {
		b.close()
		return nil, fmt.Errorf("cannot reach NATS at %s: %w", url, err)
	}
	if b.js, err = jetstream.New(b.nc); err != nil {
		b.close()
		return nil, err
	}
	if fresh {
		if err := b.js.DeleteStream(ctx, natsStream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			b.close()
			return nil, fmt.Errorf("NATS: remove the previous demo stream: %w", err)
		}
	}
	stream, err := b.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:     natsStream,
		Subjects: []string{natsSubject, natsDeadSubj},
		Storage:  jetstream.FileStorage,
		// JetStream drops a publish whose Nats-Msg-Id it saw within this
		// window. The demo keeps it at the 100ms minimum so the producer's
		// retries reach the consumer, as a retry after a 2-minute window
		// would in production: idem, not the broker, absorbs them.
		Duplicates: 100 * time.Millisecond,
	})
	if err != nil {
		b.close()
		return nil, fmt.Errorf("NATS: create stream: %w", err)
	}
	b.cons, err = stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       natsDurable,
		FilterSubject: natsSubject,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait,
		MaxAckPending: 4096,
	})
	if err != nil {
		b.close()
		return nil, fmt.Errorf("NATS: create consumer: %w", err)
	}
	return b, nil
}

// publish publishes payload with the message ID id in Nats-Msg-Id and
// reports whether JetStream dropped it as a duplicate of a publish within its
// dedupe window.
func (b *natsBroker) publish(ctx context.Context, id string, payload []byte) (dropped bool, err error) {
	ack, err := b.js.Publish(ctx, natsSubject, payload, jetstream.WithMsgID(id))
	if err != nil {
		return false, err
	}
	return ack.Duplicate, nil
}

func (b *natsBroker) deadLetter(ctx context.Context, d delivery, reason error) error {
	msg := nats.NewMsg(natsDeadSubj)
	msg.Data = d.payload()
	msg.Header.Set("Idem-Dead-Letter-Reason", reason.Error())
	msg.Header.Set("Idem-Original-Message-Id", d.id())
	_, err := b.js.PublishMsg(ctx, msg)
	return err
}

// worker returns a consumer on the shared durable JetStream consumer.
func (b *natsBroker) worker(context.Context) (demoWorker, error) { return natsWorker{b}, nil }

// natsWorker acks message by message; a crash leaves its unacked messages
// to come back after the ack wait.
type natsWorker struct{ b *natsBroker }

func (w natsWorker) fetch(ctx context.Context, n int, maxWait time.Duration) ([]delivery, error) {
	return w.b.fetch(ctx, n, maxWait)
}
func (natsWorker) batchDone(context.Context) {}
func (natsWorker) crash()                    {}
func (natsWorker) close()                    {}

// fetch returns up to n deliveries, waiting at most maxWait.
func (b *natsBroker) fetch(ctx context.Context, n int, maxWait time.Duration) ([]delivery, error) {
	batch, err := b.cons.Fetch(n, jetstream.FetchMaxWait(maxWait))
	if err != nil {
		return nil, err
	}
	var out []delivery
	for m := range batch.Messages() {
		out = append(out, natsDelivery{m})
	}
	return out, batch.Error()
}

// unfinished counts messages not yet delivered or delivered but not acked.
func (b *natsBroker) unfinished(ctx context.Context) (int, error) {
	info, err := b.cons.Info(ctx)
	if err != nil {
		return 0, err
	}
	return int(info.NumPending) + info.NumAckPending, nil
}

func (b *natsBroker) close() {
	if b.nc != nil {
		b.nc.Close()
	}
	if b.srv != nil {
		b.srv.Shutdown()
		b.srv.WaitForShutdown()
	}
}

type natsDelivery struct{ m jetstream.Msg }

// id is the producer's message ID, carried in JetStream's Nats-Msg-Id header.
func (d natsDelivery) id() string                       { return d.m.Headers().Get(jetstream.MsgIDHeader) }
func (d natsDelivery) payload() []byte                  { return d.m.Data() }
func (d natsDelivery) ack() error                       { return d.m.Ack() }
func (d natsDelivery) retryAfter(t time.Duration) error { return d.m.NakWithDelay(t) }
func (d natsDelivery) settle() error                    { return d.m.Term() }
