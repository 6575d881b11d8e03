//go:build !nogocdk

package idemcli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/pstest"
	"gocloud.dev/pubsub"
	"gocloud.dev/pubsub/gcppubsub"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemgocdk"
)

// TestGoCDKURLs: how --broker joins --from, --to and --dead-letter into Go
// CDK URLs, and which --broker values are refused.
func TestGoCDKURLs(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		broker, src, wantURL, wantDead string
	}{
		{"gcppubsub://", "projects/p/subscriptions/orders", "gcppubsub://projects/p/subscriptions/orders", "projects/p/topics/orders-dead"},
		{"gcppubsub://projects/p", "subscriptions/orders", "gcppubsub://projects/p/subscriptions/orders", "topics/orders-dead"},
		{"awssqs://", "sqs.us-east-2.amazonaws.com/123/orders?region=us-east-2",
			"awssqs://sqs.us-east-2.amazonaws.com/123/orders?region=us-east-2", "sqs.us-east-2.amazonaws.com/123/orders-dead?region=us-east-2"},
		{"mem://", "orders", "mem://orders", "orders-dead"},
	} {
		b, err := openSidecarBroker(t.Context(), tt.broker, 0)
		if err != nil {
			t.Fatalf("%s: %v", tt.broker, err)
		}
		g := b.(*goCDKSidecar)
		if got := g.url(tt.src); got != tt.wantURL {
			t.Errorf("%s + %s = %s, want %s", tt.broker, tt.src, got, tt.wantURL)
		}
		if got := g.deadLetterTopic(tt.src, defaultDeadLetter(tt.broker, tt.src)); got != tt.wantDead {
			t.Errorf("%s: dead letter of %s = %s, want %s", tt.broker, tt.src, got, tt.wantDead)
		}
		b.close()
	}
	for _, bad := range []string{"gcppubsub:projects/p", "mem:orders"} {
		if _, err := openSidecarBroker(t.Context(), bad, 0); !errors.Is(err, errBadURL) {
			t.Errorf("--broker %s: %v, want errBadURL", bad, err)
		}
	}
}

// TestGoCDKSidecarMem: the sidecar broker on mem:// (see
// exerciseGoCDKSidecar), and `idem publish --broker mem://`, which sends
// with the ID in the metadata.
func TestGoCDKSidecarMem(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	src := fmt.Sprintf("orders-%d", time.Now().UnixNano())
	exerciseGoCDKSidecar(t, "mem://", src, src, "mem://"+src+"-dead")

	// idem publish, in this process: the mem:// topic is shared.
	sub, err := pubsub.OpenSubscription(ctx, "mem://"+src)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Shutdown(context.Background())
	if code, out, errOut := run(t, "publish", "--broker", "mem://", "--to", src, "--id", "order-3"); code != 0 {
		t.Fatalf("idem publish: exit %d, %s %s", code, out, errOut)
	}
	m, err := sub.Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m.Ack()
	if id := m.Metadata[idemgocdk.DefaultIDKey]; id != "order-3" || !strings.Contains(string(m.Body), "order-3") {
		t.Errorf("published %q with ID %q, want order-3", m.Body, id)
	}
}

// exerciseGoCDKSidecar runs the sidecar broker of brokerURL the way `idem
// consume` does, from src with the default dead letter, over a lease
// consumer's Processor: a producer's repeat (published to dst) is a
// Duplicate, and a message without an ID is Rejected and dead-lettered
// (read back from the subscription deadURL), with its body and reason.
func exerciseGoCDKSidecar(t *testing.T, brokerURL, src, dst, deadURL string) {
	t.Helper()
	ctx := t.Context()
	b, err := openSidecarBroker(ctx, brokerURL, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	lc, err := idem.NewLeaseConsumer(idem.NewMemoryStore(nil), idem.Config{Name: "sidecar"})
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	bound := idem.BindLease(lc, func(context.Context, *idem.Attempt) (idem.Result, error) { return idem.Result{}, nil })
	outcomes := make(chan idem.Status, 8)
	p := idem.ProcessorFunc(func(ctx context.Context, m idem.Message) (idem.Outcome, error) {
		out, err := bound.Process(ctx, m)
		outcomes <- out.Status
		return out, err
	})
	runC, stopC, err := b.consume(ctx, src, p, consumeConfig{deadLetter: defaultDeadLetter(brokerURL, src), concurrency: 2,
		retryDelay: 100 * time.Millisecond, logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	dead, err := pubsub.OpenSubscription(ctx, deadURL) // before the dead letter is sent
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Shutdown(context.Background())
	done := make(chan error, 1)
	go func() { done <- runC(context.Background()) }()

	for _, id := range []string{"order-1", "order-1", "order-2"} {
		if err := b.publish(ctx, dst, id, []byte(`{"amount":1}`)); err != nil {
			t.Fatal(err)
		}
	}
	topic, err := b.(*goCDKSidecar).topic(ctx, dst)
	if err != nil {
		t.Fatal(err)
	}
	if err := topic.Send(ctx, &pubsub.Message{Body: []byte("no id")}); err != nil {
		t.Fatal(err)
	}
	got := map[idem.Status]int{}
	for range 4 {
		got[<-outcomes]++
	}
	if got[idem.Processed] != 2 || got[idem.Duplicate] != 1 || got[idem.Rejected] != 1 {
		t.Errorf("outcomes %v, want 2 Processed, 1 Duplicate, 1 Rejected", got)
	}
	dl, err := dead.Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dl.Ack()
	if string(dl.Body) != "no id" || dl.Metadata[idem.HeaderDeadLetterReason] != idem.ReasonMissingMessageID {
		t.Errorf("dead letter %q %v, want the body and reason %s", dl.Body, dl.Metadata, idem.ReasonMissingMessageID)
	}
	if err := stopC(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// cliPubSubFake is the process's one Pub/Sub fake: the Go CDK's default
// gcppubsub:// opener dials PUBSUB_EMULATOR_HOST once per process and keeps
// that connection, so the fake lives as long as the process (a rerun with
// -count gets the same one, and a project of its own).
var cliPubSubFake = sync.OnceValue(func() *pstest.Server { return pstest.NewServer() })

// TestGoCDKSidecarPubSub: `idem consume`'s and `idem publish`'s broker on
// gcppubsub:// URLs, against Google's in-process Pub/Sub fake (pstest)
// through PUBSUB_EMULATOR_HOST, as the Go CDK's default opener reads it:
// a repeat is a Duplicate, and the dead letter goes to the topic named
// after the subscription. (Not parallel: it sets the environment, which
// the Go CDK reads once per process, at the first gcppubsub:// URL.)
func TestGoCDKSidecarPubSub(t *testing.T) {
	srv := cliPubSubFake()
	t.Setenv("PUBSUB_EMULATOR_HOST", srv.Addr)
	ctx := t.Context()
	project := fmt.Sprintf("projects/idem-cli-%d", time.Now().UnixNano())
	conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	pubc, err := gcppubsub.PublisherClient(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	subc, err := gcppubsub.SubscriberClient(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{"orders", "orders-dead"} {
		if _, err := pubc.CreateTopic(ctx, &pubsubpb.Topic{Name: project + "/topics/" + topic}); err != nil {
			t.Fatal(err)
		}
		if _, err := subc.CreateSubscription(ctx, &pubsubpb.Subscription{Name: project + "/subscriptions/" + topic,
			Topic: project + "/topics/" + topic, AckDeadlineSeconds: 10}); err != nil {
			t.Fatal(err)
		}
	}
	exerciseGoCDKSidecar(t, "gcppubsub://", project+"/subscriptions/orders", project+"/topics/orders",
		"gcppubsub://"+project+"/subscriptions/orders-dead")
}
