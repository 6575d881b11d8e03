package idemnats

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// batchRecorder is a BatchProcessor that processes every message and
// records the size of each batch; done is closed once it has had want
// messages.
type batchRecorder struct {
	mu    sync.Mutex
	sizes []int
	seen  int
	want  int
	done  chan struct{}
}

func (r *batchRecorder) ProcessBatch(_ context.Context, msgs []idem.Message) ([]idem.Outcome, error) {
	outs := make([]idem.Outcome, len(msgs))
	for i, m := range msgs {
		outs[i] = idem.Outcome{Status: idem.Processed, MessageID: m.ID}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sizes = append(r.sizes, len(msgs))
	if r.seen < r.want && r.seen+len(msgs) >= r.want {
		close(r.done)
	}
	r.seen += len(msgs)
	return outs, nil
}

// runJoinCase publishes n messages to a new stream, then consumes them in
// batch mode (one handler, 64 held) with maxAckPending on the JetStream
// consumer and joinWait as the Consumer's, and returns the batch sizes.
func runJoinCase(t *testing.T, js jetstream.JetStream, name string, n, maxAckPending int, joinWait time.Duration) []int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	subject := name + ".in"
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	for i := range n {
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: []byte("x"),
			Header: nats.Header{DefaultIDHeader: []string{fmt.Sprint("m", i)}}}); err != nil {
			t.Fatal(err)
		}
	}
	cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", FilterSubject: subject,
		AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: maxAckPending})
	if err != nil {
		t.Fatal(err)
	}
	rec := &batchRecorder{want: n, done: make(chan struct{})}
	c, err := NewConsumer(js, cons, Config{BatchProcessor: rec, DeadLetter: name + ".dead", Concurrency: 1, MaxMessages: 64})
	if err != nil {
		t.Fatal(err)
	}
	c.joinWait = joinWait
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx) }()
	select {
	case <-rec.done:
	case <-ctx.Done():
		t.Fatalf("%d of %d messages processed in a minute", rec.seen, n)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return slices.Clone(rec.sizes)
}

// TestBatchJoinsRequest: in batch mode the messages one pull request
// delivers go to the handler as one batch while the stream has more
// pending for it (the last message, with none pending, ends the batch);
// and when the pending messages do not come (the consumer's
// MaxAckPending reached), the batch goes after the join wait.
func TestBatchJoinsRequest(t *testing.T) {
	url := testenv.URL(t, testenv.NATSEnv, "nats://127.0.0.1:4222 (a JetStream-enabled server)")
	nc, err := nats.Connect(url, nats.Timeout(10*time.Second))
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	id := nats.NewInbox()[len(nats.InboxPrefix):]

	// A wait no test run reaches: only the messages decide.
	if got := runJoinCase(t, js, "JOIN_ALL_"+id, 40, 0, time.Hour); !slices.Equal(got, []int{40}) {
		t.Errorf("40 messages pending before the first pull request of 64: batches %v, want one of 40", got)
	}
	// 10 delivered at a time, 30 still pending: each batch waits the
	// join wait, then goes with what came.
	got := runJoinCase(t, js, "JOIN_CAPPED_"+id, 40, 10, 20*time.Millisecond)
	total := 0
	for _, n := range got {
		if n > 10 {
			t.Errorf("batch of %d with MaxAckPending 10", n)
		}
		total += n
	}
	if total != 40 {
		t.Errorf("batches %v: %d messages, want 40", got, total)
	}
}
