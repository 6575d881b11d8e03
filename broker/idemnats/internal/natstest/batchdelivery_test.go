package natstest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/brokertest"
)

// batchDeliveries is a BatchProcessor that records the idem.Delivery of
// each batch and acks every message.
type batchDeliveries struct {
	mu     sync.Mutex
	seen   []idem.Delivery
	ids    [][]string
	total  int
	allGot chan struct{}
	want   int
}

func (b *batchDeliveries) ProcessBatch(ctx context.Context, msgs []idem.Message) ([]idem.Outcome, error) {
	d, _ := idem.DeliveryFromContext(ctx)
	outs := make([]idem.Outcome, len(msgs))
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		outs[i] = idem.Outcome{Status: idem.Processed, MessageID: m.ID}
		ids[i] = m.ID
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seen = append(b.seen, d)
	b.ids = append(b.ids, ids)
	b.total += len(msgs)
	if b.total == b.want {
		close(b.allGot)
	}
	return outs, nil
}

// TestBatchDelivery: in batch mode each batch's idem.Delivery is a
// batch's (idem.Delivery): the headers of each of its messages in
// BatchHeaders, in the batch's order, and no Header (which would make a
// tracing hook continue the first message's trace for every message); a
// batch of one message has its Header.
func TestBatchDelivery(t *testing.T) {
	t.Parallel()
	const n = 12
	b := newNATSBroker(t, inProcess(t))
	ctx := context.Background()
	for i := range n {
		m := nats.NewMsg(b.streams.subject)
		m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("m-%02d", i))
		m.Header.Set("traceparent", fmt.Sprintf("trace-m-%02d", i))
		m.Data = []byte("p")
		if _, err := b.js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	bp := &batchDeliveries{allGot: make(chan struct{}), want: n}
	member, err := b.StartBatch(ctx, bp, brokertest.StartOptions{Concurrency: 2, BatchSize: n, Redelivery: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	<-bp.allGot
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := member.Stop(sctx); err != nil {
		t.Fatal(err)
	}
	bp.mu.Lock()
	defer bp.mu.Unlock()
	multi := 0
	for k, d := range bp.seen {
		ids := bp.ids[k]
		if d.System != "nats" || d.Destination != b.streams.subject {
			t.Errorf("batch %v: Delivery %s %s", ids, d.System, d.Destination)
		}
		if len(ids) == 1 {
			if d.Header == nil || d.Header.Get("traceparent") != "trace-"+ids[0] {
				t.Errorf("batch of one (%s): Header %v, want its own", ids[0], d.Header)
			}
			continue
		}
		multi++
		if d.Header != nil || len(d.BatchHeaders) != len(ids) {
			t.Errorf("batch %v: Header %v, %d BatchHeaders; want none and %d", ids, d.Header, len(d.BatchHeaders), len(ids))
			continue
		}
		for i, h := range d.BatchHeaders {
			if h == nil || h.Get("traceparent") != "trace-"+ids[i] {
				t.Errorf("batch %v: BatchHeaders[%d] %v, want the headers of %s", ids, i, h, ids[i])
			}
		}
	}
	t.Logf("%d batches, %d of more than one message", len(bp.seen), multi)
}
