package kafkatest

import (
	"context"
	"errors"
	"fmt"
	"github.com/idem-go/idem/internal/testenv"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemkafka"
)

// TestRetryInPlaceKeepsOrder: within a partition, a record whose outcome is
// InProgress is retried after its RetryAfter, and a Failed one after
// RetryDelay, with the partition paused meanwhile: no later record of the
// partition is processed before it succeeds, so the records are done in
// offset order. A record without a message ID is dead-lettered with the
// reason headers and counted as done: the group's offsets end up committed
// past every record.
func TestRetryInPlaceKeepsOrder(t *testing.T) {
	t.Parallel()
	topic, dead, group := uniqueName("ordered"), uniqueName("ordered-dead"), uniqueName("ordered-group")
	seeds := newCluster(t, topic, dead).ListenAddrs()
	raw := newClient(t, seeds)
	p := idemkafka.NewProducer(raw, idemkafka.ProducerConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()

	// Ten records in one partition (one key); the fourth has no ID.
	const n = 10
	var ids []string
	for i := range n {
		if i == 3 {
			if err := raw.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("no id")}).FirstErr(); err != nil {
				t.Fatal(err)
			}
			continue
		}
		id := fmt.Sprintf("m%d", i)
		ids = append(ids, id)
		if _, err := p.Publish(ctx, topic, []byte("payload "+id), idemkafka.WithMessageID(id), idemkafka.WithKey([]byte("k"))); err != nil {
			t.Fatal(err)
		}
	}

	const retryAfter, retryDelay = 300 * time.Millisecond, 200 * time.Millisecond
	var (
		mu       sync.Mutex
		attempts = map[string][]time.Time{}
		done     []string // IDs in the order they were Processed
	)
	proc := idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
		mu.Lock()
		defer mu.Unlock()
		if msg.ID == "" {
			return idem.Outcome{Status: idem.Rejected, Err: idem.ErrMissingMessageID}, idem.ErrMissingMessageID
		}
		attempts[msg.ID] = append(attempts[msg.ID], time.Now())
		k := len(attempts[msg.ID])
		switch {
		case msg.ID == "m2" && k <= 2: // held by another attempt's lease
			return idem.Outcome{Status: idem.InProgress, MessageID: msg.ID, Err: idem.ErrInProgress, RetryAfter: retryAfter}, idem.ErrInProgress
		case msg.ID == "m6" && k == 1: // the store was down
			err := fmt.Errorf("%w: connection refused", idem.ErrStore)
			return idem.Outcome{Status: idem.Failed, MessageID: msg.ID, Err: err}, err
		}
		done = append(done, msg.ID)
		return idem.Outcome{Status: idem.Processed, MessageID: msg.ID}, nil
	})
	m := startMember(t, seeds, group, topic, idemkafka.Config{Processor: proc, DeadLetter: dead, Concurrency: 4, RetryDelay: retryDelay})
	testenv.Eventually(t, waitFor, "all records processed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(done) == len(ids)
	}, func() string {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprintf("done %v", done)
	})
	if err := m.stop(ctx); err != nil {
		t.Fatal(err)
	}

	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(done, ids) {
		t.Errorf("records done in order %v, want offset order %v", done, ids)
	}
	if a := attempts["m2"]; len(a) != 3 || a[1].Sub(a[0]) < retryAfter || a[2].Sub(a[1]) < retryAfter {
		t.Errorf("m2 (InProgress twice) attempts at %v: want 3, %v apart", a, retryAfter)
	}
	if a := attempts["m6"]; len(a) != 2 || a[1].Sub(a[0]) < retryDelay {
		t.Errorf("m6 (Failed once) attempts at %v: want 2, %v apart", a, retryDelay)
	}
	// No later record started before the retried one succeeded.
	for _, later := range []string{"m4", "m5"} {
		if first := attempts[later][0]; first.Before(attempts["m2"][2]) {
			t.Errorf("%s started at %v, before m2 succeeded at %v: the partition skipped ahead", later, first, attempts["m2"][2])
		}
	}
	if first := attempts["m7"][0]; first.Before(attempts["m6"][1]) {
		t.Errorf("m7 started before m6's retry: the partition skipped ahead")
	}

	dls, err := deadLetters(ctx, seeds, dead)
	if err != nil || len(dls) != 1 {
		t.Fatalf("dead letter: %d records (%v), want 1", len(dls), err)
	}
	dl := dls[0]
	wantHeaders := map[string]string{
		idem.HeaderDeadLetterReason:    idem.ReasonMissingMessageID,
		idem.HeaderDeadLetterError:     idem.ErrMissingMessageID.Error(),
		idem.HeaderDeadLetterStatus:    "Rejected",
		idemkafka.HeaderOriginalTopic:  topic,
		idemkafka.HeaderOriginalOffset: "3",
	}
	for k, v := range wantHeaders {
		if got := header(dl, k); got != v {
			t.Errorf("dead letter header %s = %q, want %q", k, got, v)
		}
	}
	if _, err := strconv.Atoi(header(dl, idemkafka.HeaderOriginalPartition)); err != nil || string(dl.Value) != "no id" || string(dl.Key) != "k" {
		t.Errorf("dead letter %q key %q partition %q: want the original record", dl.Value, dl.Key, header(dl, idemkafka.HeaderOriginalPartition))
	}
	if lag := groupLag(t, seeds, group, topic); lag != 0 {
		t.Errorf("group lag %d after Stop, want 0: every record, the dead-lettered one included, is committed", lag)
	}
}

// TestDeadLetterFailureIsNotAck: when the dead letter cannot be written (the
// topic does not exist and cannot be created), the record is not counted as
// done: its offset is never committed, and it is retried.
func TestDeadLetterFailureIsNotAck(t *testing.T) {
	t.Parallel()
	topic, group := uniqueName("dl-fail"), uniqueName("dl-fail-group")
	seeds := newCluster(t, topic).ListenAddrs() // no dead-letter topic
	raw := newClient(t, seeds)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if err := raw.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("no id")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	calls := 0
	proc := idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
		mu.Lock()
		calls++
		mu.Unlock()
		return idem.Outcome{Status: idem.Rejected, Err: idem.ErrMissingMessageID}, idem.ErrMissingMessageID
	})
	m := startMember(t, seeds, group, topic, idemkafka.Config{Processor: proc, DeadLetter: uniqueName("missing"),
		RetryDelay: 50 * time.Millisecond, CommitTimeout: 300 * time.Millisecond})
	testenv.Eventually(t, waitFor, "the record retried", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return calls >= 3
	}, func() string { return fmt.Sprintf("%d calls", calls) })
	if err := m.stop(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
	if lag := groupLag(t, seeds, group, topic); lag != 1 {
		t.Errorf("group lag %d, want 1: a record whose dead letter failed must stay uncommitted", lag)
	}
}
