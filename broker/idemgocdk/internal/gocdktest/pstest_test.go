package gocdktest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/pstest"
	"gocloud.dev/pubsub"
	"gocloud.dev/pubsub/gcppubsub"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// pstestProject is the project of every topic and subscription on the fake.
const pstestProject = "projects/idem-test"

// pubsubFake is Google's in-process Pub/Sub fake (pstest) with an admin
// connection, closed at cleanup. Its ack deadlines may be as short as 1s
// (pstest.SetMinAckDeadline in TestMain; the service's minimum is 10s).
type pubsubFake struct {
	srv   *pstest.Server
	names atomic.Int64
}

func newPubsubFake(t *testing.T) *pubsubFake {
	srv := pstest.NewServer()
	t.Cleanup(func() { _ = srv.Close() })
	return &pubsubFake{srv: srv}
}

// dial opens a connection of its own to the fake.
func (f *pubsubFake) dial(t *testing.T) *grpc.ClientConn {
	conn, err := grpc.NewClient(f.srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial pstest: %v", err)
	}
	return conn
}

// channel creates a topic with one subscription (ack deadline ackDeadline,
// whole seconds) and a dead-letter topic with its own, on one connection
// closed at cleanup; each member gets a connection of its own, which its
// crash closes.
func (f *pubsubFake) channel(t *testing.T, ackDeadline time.Duration) channel {
	ctx := context.Background()
	n := f.names.Add(1)
	conn := f.dial(t)
	pubc, err := gcppubsub.PublisherClient(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	subc, err := gcppubsub.SubscriberClient(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	create := func(name string) (topicPath, subPath string) {
		topicPath = fmt.Sprintf("%s/topics/%s-%d", pstestProject, name, n)
		subPath = fmt.Sprintf("%s/subscriptions/%s-%d", pstestProject, name, n)
		if _, err := pubc.CreateTopic(ctx, &pubsubpb.Topic{Name: topicPath}); err != nil {
			t.Fatalf("create topic: %v", err)
		}
		if _, err := subc.CreateSubscription(ctx, &pubsubpb.Subscription{Name: subPath, Topic: topicPath,
			AckDeadlineSeconds: int32(ackDeadline / time.Second)}); err != nil {
			t.Fatalf("create subscription: %v", err)
		}
		return topicPath, subPath
	}
	topicPath, subPath := create("orders")
	deadTopicPath, deadSubPath := create("orders-dead")
	open := func(path string) *pubsub.Topic {
		topic, err := gcppubsub.OpenTopicByPath(pubc, path, nil)
		if err != nil {
			t.Fatal(err)
		}
		return topic
	}
	topic, dead := open(topicPath), open(deadTopicPath)
	deadSub, err := gcppubsub.OpenSubscriptionByPath(subc, deadSubPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = topic.Shutdown(ctx)
		_ = dead.Shutdown(ctx)
		drain(deadSub, (*pubsub.Message).Ack)
		_ = deadSub.Shutdown(ctx)
		_ = subc.Close()
		_ = pubc.Close()
		_ = conn.Close()
	})
	return channel{topic: topic, dead: dead, deadSub: deadSub, system: "gcp_pubsub",
		member: func(t *testing.T) memberSub {
			mconn := f.dial(t)
			client, err := gcppubsub.SubscriberClient(ctx, mconn)
			if err != nil {
				t.Fatal(err)
			}
			sub, err := gcppubsub.OpenSubscriptionByPath(client, subPath, &gcppubsub.SubscriptionOptions{ReceiveBatcherOptions: *oneAtATime})
			if err != nil {
				t.Fatal(err)
			}
			var once sync.Once
			return memberSub{sub: sub, crash: func() {
				once.Do(func() {
					_ = client.Close()
					_ = mconn.Close()
				})
			}}
		}}
}
