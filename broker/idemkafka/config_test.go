package idemkafka

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

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
	// NewConsumer checks the client's options and never dials: the seed is
	// an address nothing listens on (the cluster tests are in kafkatest).
	const topic = "cfg"
	good := Config{Processor: noopProcessor, DeadLetter: "dead"}
	var groups atomic.Int64
	newClient := func(t *testing.T, opts ...kgo.Opt) *kgo.Client {
		t.Helper()
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers("127.0.0.1:1")}, opts...)...)
		if err != nil {
			t.Fatalf("kgo.NewClient: %v", err)
		}
		t.Cleanup(cl.Close)
		return cl
	}
	groupClient := func(t *testing.T, opts ...kgo.Opt) *kgo.Client {
		group := fmt.Sprintf("g-%d", groups.Add(1))
		return newClient(t, append([]kgo.Opt{kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic)}, opts...)...)
	}
	tests := []struct {
		name   string
		client func(t *testing.T) *kgo.Client
		cfg    func(Config) Config
	}{
		{"nil client", func(*testing.T) *kgo.Client { return nil }, nil},
		{"no consumer group", func(t *testing.T) *kgo.Client { return newClient(t) }, nil},
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
