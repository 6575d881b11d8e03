package idemkafka

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
)

var noopProcessor = idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
	return idem.Outcome{Status: idem.Processed, MessageID: msg.ID}, nil
})

type noopBatch struct{}

func (noopBatch) ProcessBatch(ctx context.Context, msgs []idem.Message) ([]idem.Outcome, error) {
	return make([]idem.Outcome, len(msgs)), nil
}

// TestNewConsumerConfigErrors checks that every bad Config and every client
// the Consumer cannot drive is refused with an error matching
// idem.ErrInvalidConfig.
func TestNewConsumerConfigErrors(t *testing.T) {
	t.Parallel()
	topic := uniqueName("cfg")
	seeds := newCluster(t, topic).ListenAddrs()
	good := Config{Processor: noopProcessor, DeadLetter: "dead"}

	groupClient := func(t *testing.T, opts ...kgo.Opt) *kgo.Client {
		return newClient(t, seeds, append([]kgo.Opt{kgo.ConsumerGroup(uniqueName("g")), kgo.ConsumeTopics(topic)}, opts...)...)
	}
	tests := []struct {
		name   string
		client func(t *testing.T) *kgo.Client
		cfg    func(Config) Config
	}{
		{"nil client", func(*testing.T) *kgo.Client { return nil }, nil},
		{"no consumer group", func(t *testing.T) *kgo.Client { return newClient(t, seeds) }, nil},
		{"without ClientOpts", func(t *testing.T) *kgo.Client { return groupClient(t) }, nil},
		{"ClientOpts but autocommitting", func(t *testing.T) *kgo.Client {
			// Only the marker and the callbacks: the autocommit is still on.
			return groupClient(t, kgo.WithHooks(clientMarker{}), kgo.BlockRebalanceOnPoll())
		}, nil},
		{"no BlockRebalanceOnPoll", func(t *testing.T) *kgo.Client {
			return groupClient(t, kgo.WithHooks(clientMarker{}), kgo.DisableAutoCommit())
		}, nil},
		{"no processor", nil, func(c Config) Config { c.Processor = nil; return c }},
		{"both processors", nil, func(c Config) Config { c.BatchProcessor = noopBatch{}; return c }},
		{"no dead letter", nil, func(c Config) Config { c.DeadLetter = ""; return c }},
		{"negative concurrency", nil, func(c Config) Config { c.Concurrency = -1; return c }},
		{"negative batch size", nil, func(c Config) Config { c.BatchSize = -1; return c }},
		{"negative max poll records", nil, func(c Config) Config { c.MaxPollRecords = -2; return c }},
		{"negative retry delay", nil, func(c Config) Config { c.RetryDelay = -time.Second; return c }},
		{"negative revoke timeout", nil, func(c Config) Config { c.RevokeTimeout = -time.Second; return c }},
		{"negative retention window", nil, func(c Config) Config { c.RetentionWindow = -time.Hour; return c }},
		{"negative commit timeout", nil, func(c Config) Config { c.CommitTimeout = -time.Second; return c }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var cl *kgo.Client
			if tt.client != nil {
				cl = tt.client(t)
			} else {
				cl = groupClient(t, ClientOpts()...)
			}
			cfg := good
			if tt.cfg != nil {
				cfg = tt.cfg(cfg)
			}
			c, err := NewConsumer(cl, cfg)
			if !errors.Is(err, idem.ErrInvalidConfig) {
				t.Fatalf("NewConsumer = %v, %v; want an error matching idem.ErrInvalidConfig", c, err)
			}
		})
	}

	t.Run("defaults", func(t *testing.T) {
		t.Parallel()
		c, err := NewConsumer(groupClient(t, ClientOpts()...), good)
		if err != nil {
			t.Fatal(err)
		}
		got := c.cfg
		if got.IDHeader != DefaultIDHeader || got.Concurrency != DefaultConcurrency || got.RetryDelay != DefaultRetryDelay ||
			got.MaxPollRecords != DefaultMaxPollRecords || got.RevokeTimeout != DefaultRevokeTimeout ||
			got.CommitTimeout != DefaultCommitTimeout || got.Logger == nil || c.chunk != 1 {
			t.Fatalf("defaults not applied: %+v chunk %d", got, c.chunk)
		}
		b, err := NewConsumer(groupClient(t, ClientOpts()...), Config{BatchProcessor: noopBatch{}, DeadLetter: "d"})
		if err != nil || b.chunk != DefaultBatchSize {
			t.Fatalf("batch mode: %v, chunk %d; want chunk %d", err, b.chunk, DefaultBatchSize)
		}
	})

	t.Run("one running Consumer per client", func(t *testing.T) {
		t.Parallel()
		cl := groupClient(t, ClientOpts()...)
		c, err := NewConsumer(cl, good)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := NewConsumer(cl, good); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Fatalf("second NewConsumer on a live client: %v; want idem.ErrInvalidConfig", err)
		}
		// Stopped before Run: Run returns nil at once, a second Run refuses.
		if err := c.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := c.Run(context.Background()); err != nil {
			t.Fatalf("Run after Stop = %v, want nil", err)
		}
		if err := c.Run(context.Background()); !errors.Is(err, idem.ErrAlreadyRunning) {
			t.Fatalf("second Run = %v, want ErrAlreadyRunning", err)
		}
		// Finished: the client may get a new Consumer.
		if _, err := NewConsumer(cl, good); err != nil {
			t.Fatalf("NewConsumer after the first finished: %v", err)
		}
	})
}

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

	if _, err := NewProducer(nil, ProducerConfig{}).Publish(ctx, topic, nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("Publish with a nil client = %v, want idem.ErrInvalidConfig", err)
	}
	if _, err := NewProducer(cl, ProducerConfig{MaxIDLength: -1}).Publish(ctx, topic, nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("negative MaxIDLength: %v, want idem.ErrInvalidConfig", err)
	}
	p := NewProducer(cl, ProducerConfig{IDHeader: "x-id", MaxIDLength: 40})
	for _, tt := range []struct {
		id   string
		want error
	}{
		{"", idem.ErrMissingMessageID},
		{"bad\x00id", idem.ErrInvalidMessageID},
		{"forty-one-bytes-forty-one-bytes-forty-one", idem.ErrInvalidMessageID},
	} {
		if _, err := p.Publish(ctx, topic, []byte("x"), WithMessageID(tt.id)); !errors.Is(err, tt.want) {
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
	business, err := p.Publish(ctx, topic, []byte("second"), WithMessageID("invoice-42"), WithKey([]byte("k")),
		WithHeaders(kgo.RecordHeader{Key: "trace", Value: []byte("t1")}))
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

// TestHeaderID checks how the message ID is read from the headers.
func TestHeaderID(t *testing.T) {
	t.Parallel()
	h := func(kv ...string) *kgo.Record {
		r := &kgo.Record{}
		for i := 0; i < len(kv); i += 2 {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: kv[i], Value: []byte(kv[i+1])})
		}
		return r
	}
	tests := []struct {
		name    string
		rec     *kgo.Record
		want    string
		wantErr error
	}{
		{"present", h("other", "x", "message-id", "m1"), "m1", nil},
		{"absent", h("other", "x"), "", nil},
		{"case-sensitive key", h("Message-Id", "m1"), "", nil},
		{"repeated, same value", h("message-id", "m1", "message-id", "m1"), "m1", nil},
		{"repeated, different values", h("message-id", "m1", "message-id", "m2"), "", idem.ErrInvalidMessageID},
		{"bytes kept as they are", h("message-id", " M1 "), " M1 ", nil},
	}
	for _, tt := range tests {
		got, err := headerID(tt.rec, "message-id")
		if got != tt.want || !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
			t.Errorf("%s: headerID = %q, %v; want %q, %v", tt.name, got, err, tt.want, tt.wantErr)
		}
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
			m := startMember(t, seeds, uniqueName("g"), topic, Config{Processor: noopProcessor, DeadLetter: "dead", RetentionWindow: tt.window, Logger: logger})
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
