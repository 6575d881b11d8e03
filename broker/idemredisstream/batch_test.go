package idemredisstream_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemredisstream"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/redis/go-redis/v9"
)

// TestBatchOutcomes: in batch mode the entries one XREADGROUP returns go
// to the BatchProcessor in one call, no more than BatchSize, with each
// entry's fields in the Delivery's BatchHeaders; each entry is then
// settled by its own Outcome as in the default mode: processed acked, a
// failure left pending and reclaimed (by XAUTOCLAIM, in a batch) after
// RetryDelay, a rejection dead-lettered; an entry without the payload
// field is dead-lettered without being handed over.
func TestBatchOutcomes(t *testing.T) {
	t.Parallel()
	stream, dead := keys(t)
	ctx := context.Background()
	rdb := client(t)
	prod := idemredisstream.NewProducer(rdb, idemredisstream.ProducerConfig{})
	payloads := []string{"ok-0", "ok-1", "failed", "ok-2", "reject", "ok-3", "ok-4", "ok-5", "ok-6"}
	for _, payload := range payloads {
		if _, err := prod.Publish(ctx, stream, []byte(payload), idemredisstream.WithMessageID("id-"+payload),
			idemredisstream.WithFields(map[string]string{"trace": "t-" + payload})); err != nil {
			t.Fatal(err)
		}
	}
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"message-id", "id-no-payload", "body", "x"}}).Err(); err != nil {
		t.Fatal(err)
	}

	const batchSize = 4
	var mu sync.Mutex
	seen := map[string]int{} // deliveries by payload
	var sizes []int
	var bad []string // what a batch's Delivery got wrong
	bp := batchProcessor(func(ctx context.Context, msgs []idem.Message) ([]idem.Outcome, error) {
		mu.Lock()
		defer mu.Unlock()
		sizes = append(sizes, len(msgs))
		d, ok := idem.DeliveryFromContext(ctx)
		if !ok || d.Header != nil || len(d.BatchHeaders) != len(msgs) || d.System != idemredisstream.System || d.Destination != stream {
			bad = append(bad, fmt.Sprintf("delivery %+v for %d messages", d, len(msgs)))
		}
		outs := make([]idem.Outcome, len(msgs))
		for i, m := range msgs {
			p := string(m.Payload)
			seen[p]++
			if ok && i < len(d.BatchHeaders) && d.BatchHeaders[i].Get("trace") != "t-"+p {
				bad = append(bad, fmt.Sprintf("%s: batch header trace %q", p, d.BatchHeaders[i].Get("trace")))
			}
			switch {
			case p == "failed" && seen[p] == 1:
				outs[i] = idem.Outcome{Status: idem.Failed, Err: errors.New("store down")}
			case p == "reject":
				outs[i] = idem.Outcome{Status: idem.Rejected, Err: idem.ErrInvalidPayload}
			default:
				outs[i] = idem.Outcome{Status: idem.Processed}
			}
		}
		return outs, nil
	})
	_, _, _ = start(t, idemredisstream.Config{BatchProcessor: bp, BatchSize: batchSize, Stream: stream, Group: "g", Consumer: "c1",
		DeadLetter: dead, Concurrency: 2, MinIdle: 20 * time.Second, RetryDelay: 200 * time.Millisecond, ClaimInterval: 50 * time.Millisecond})

	testenv.Eventually(t, 15*time.Second, "every entry settled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return seen["failed"] >= 2 && pendingCount(t, rdb, stream, "g") == 0
	}, nil)

	mu.Lock()
	defer mu.Unlock()
	for _, b := range bad {
		t.Error(b)
	}
	most := 0
	for _, n := range sizes {
		most = max(most, n)
	}
	if most > batchSize || most < 2 {
		t.Errorf("batches of %v; want at most BatchSize %d, some of more than one entry", sizes, batchSize)
	}
	for _, p := range payloads {
		want := 1
		if p == "failed" {
			want = 2
		}
		if seen[p] != want {
			t.Errorf("%s handed over %d times, want %d", p, seen[p], want)
		}
	}
	if len(seen) != len(payloads) {
		t.Errorf("handed over %v; the entry without a payload field must not be", seen)
	}
	entries, err := rdb.XRange(ctx, dead, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, e := range entries {
		id, _ := e.Values["message-id"].(string)
		got[id], _ = e.Values[idem.HeaderDeadLetterReason].(string)
	}
	if len(got) != 2 || got["id-reject"] == "" || got["id-no-payload"] != idem.ReasonInvalidPayload {
		t.Errorf("dead letters (ID: reason) %v; want id-reject and id-no-payload (%s)", got, idem.ReasonInvalidPayload)
	}
}

// batchProcessor adapts a function to idem.BatchProcessor.
type batchProcessor func(ctx context.Context, msgs []idem.Message) ([]idem.Outcome, error)

// ProcessBatch calls f(ctx, msgs).
func (f batchProcessor) ProcessBatch(ctx context.Context, msgs []idem.Message) ([]idem.Outcome, error) {
	return f(ctx, msgs)
}
