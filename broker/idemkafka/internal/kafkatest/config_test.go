package kafkatest

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemkafka"
)

var noopProcessor = idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
	return idem.Outcome{Status: idem.Processed, MessageID: msg.ID}, nil
})

// TestProducer checks the message ID rules of Publish: a UUIDv7 by default,
// the caller's business key with WithMessageID, and a typed error before
// anything is sent for an ID that breaks idem's rules.
func TestProducer(t *testing.T) {
	t.Parallel()
	topic := uniqueName("prod")
	seeds := newCluster(t, topic).ListenAddrs()
	cl := newClient(t, seeds, kgo.ConsumeTopics(topic), kgo.FetchMaxWait(250*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()

	if _, err := idemkafka.NewProducer(nil, idemkafka.ProducerConfig{}).Publish(ctx, topic, nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("Publish with a nil client = %v, want idem.ErrInvalidConfig", err)
	}
	if _, err := idemkafka.NewProducer(cl, idemkafka.ProducerConfig{MaxIDLength: -1}).Publish(ctx, topic, nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("negative MaxIDLength: %v, want idem.ErrInvalidConfig", err)
	}
	p := idemkafka.NewProducer(cl, idemkafka.ProducerConfig{IDHeader: "x-id", MaxIDLength: 40})
	for _, tt := range []struct {
		id   string
		want error
	}{
		{"", idem.ErrMissingMessageID},
		{"bad\x00id", idem.ErrInvalidMessageID},
		{"forty-one-bytes-forty-one-bytes-forty-one", idem.ErrInvalidMessageID},
	} {
		if _, err := p.Publish(ctx, topic, []byte("x"), idemkafka.WithMessageID(tt.id)); !errors.Is(err, tt.want) {
			t.Fatalf("Publish(WithMessageID(%q)) = %v, want %v", tt.id, err, tt.want)
		}
	}

	generated, err := p.Publish(ctx, topic, []byte("first"))
	if err != nil {
		t.Fatal(err)
	}
	if u, err := uuid.Parse(generated); err != nil || u.Version() != 7 {
		t.Fatalf("default ID %q is not a UUIDv7 (%v)", generated, err)
	}
	business, err := p.Publish(ctx, topic, []byte("second"), idemkafka.WithMessageID("invoice-42"), idemkafka.WithKey([]byte("k")),
		idemkafka.WithHeaders(kgo.RecordHeader{Key: "trace", Value: []byte("t1")}))
	if err != nil || business != "invoice-42" {
		t.Fatalf("Publish with a business key = %q, %v", business, err)
	}

	// Only the two valid records reached the topic, with their headers.
	var recs []*kgo.Record
	for len(recs) < 2 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read back: %v (got %d records)", ctx.Err(), len(recs))
		}
		recs = append(recs, fs.Records()...)
	}
	byValue := map[string]*kgo.Record{}
	for _, r := range recs {
		byValue[string(r.Value)] = r
	}
	if r := byValue["first"]; r == nil || header(r, "x-id") != generated || r.Key != nil {
		t.Fatalf("first record %+v, want x-id %q and no key", r, generated)
	}
	if r := byValue["second"]; r == nil || header(r, "x-id") != "invoice-42" || string(r.Key) != "k" || header(r, "trace") != "t1" {
		t.Fatalf("second record %+v, want x-id invoice-42, key k, trace t1", r)
	}
	if len(recs) != 2 {
		t.Fatalf("%d records on the topic, want 2: refused IDs must not be sent", len(recs))
	}
}

// TestRetentionWarning checks the start-up warning: a topic that keeps records longer than the processed IDs'
// retention window is named in a warning; a shorter one is not.
func TestRetentionWarning(t *testing.T) {
	t.Parallel()
	topic := uniqueName("retained")
	seeds := newCluster(t, topic).ListenAddrs() // kfake: retention.ms 7 days
	for _, tt := range []struct {
		window   time.Duration
		wantWarn bool
	}{
		{24 * time.Hour, true},
		{30 * 24 * time.Hour, false},
	} {
		t.Run(tt.window.String(), func(t *testing.T) {
			t.Parallel()
			var logs syncBuffer
			logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
			m := startMember(t, seeds, uniqueName("g"), topic, idemkafka.Config{Processor: noopProcessor, DeadLetter: "dead", RetentionWindow: tt.window, Logger: logger})
			if err := m.stop(context.Background()); err != nil {
				t.Fatal(err)
			}
			out := logs.String()
			warned := strings.Contains(out, "keeps records longer") && strings.Contains(out, "topic="+topic)
			if warned != tt.wantWarn {
				t.Fatalf("window %v: warned=%v, want %v; log:\n%s", tt.window, warned, tt.wantWarn, out)
			}
		})
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
