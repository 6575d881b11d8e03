package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// envSidecarBroker chooses the broker of --sidecar: "nats" (JetStream,
// the default: envNATS names the server), "kafka" (franz-go's
// in-process kfake cluster, sidecarPartitions partitions per run) or
// "redis" (Redis Streams on the Redis envRedis names).
const envSidecarBroker = "IDEM_BENCH_SIDECAR_BROKER"

// sidecarPartitions is the number of partitions of a --sidecar Kafka
// topic: the Kafka adapter runs one record per partition at a time in
// partition order (the default; --kafka-order key runs up to --hold), so
// at least the concurrency (8 by default) lets it run as many calls at
// once as on JetStream.
const sidecarPartitions = 8

// kafkaBus is --sidecar on kfake: its topics, the bare relay over
// franz-go, and the broker URL idem consume is given.
type kafkaBus struct {
	fake *kfake.Cluster
	prod *kgo.Client
}

func newKafkaBus(ctx context.Context) (*kafkaBus, error) {
	fake, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.DefaultNumPartitions(sidecarPartitions), kfake.AllowAutoTopicCreation())
	if err != nil {
		return nil, fmt.Errorf("kfake: %w", err)
	}
	prod, err := kgo.NewClient(kgo.SeedBrokers(fake.ListenAddrs()...), kgo.ProducerLinger(0),
		kgo.AllowAutoTopicCreation(), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	if err != nil {
		fake.Close()
		return nil, fmt.Errorf("kfake: %w", err)
	}
	return &kafkaBus{fake: fake, prod: prod}, nil
}

func (b *kafkaBus) url() string { return "kafka://" + strings.Join(b.fake.ListenAddrs(), ",") }

func (b *kafkaBus) close() {
	b.prod.Close()
	b.fake.Close()
}

// publish produces n records, keyed by their IDs (so spread over the
// partitions), to the run's topic, and returns it.
func (b *kafkaBus) publish(ctx context.Context, tag string, n int, payload []byte) (stream, subject string, cleanup func(), err error) {
	topic := "bench-" + tag
	rs := make([]*kgo.Record, n)
	for i := range rs {
		id := fmt.Sprintf("%s-%d", tag, i)
		rs[i] = &kgo.Record{Topic: topic, Key: []byte(id), Value: payload, Headers: []kgo.RecordHeader{{Key: kafkaIDHeader, Value: []byte(id)}}}
	}
	if err := b.prod.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		return "", "", nil, fmt.Errorf("produce: %w", err)
	}
	return topic, topic, func() {}, nil
}

// bareRelay is the Kafka contender that only moves records: a franz-go
// consumer group member that polls, POSTs each record with its ID as
// Idempotency-Key (the records of one partition one after another, as
// the Kafka adapter runs them, up to concurrency partitions at once), and
// commits the offsets of each polled batch once its calls have answered
// 2xx.
func (b *kafkaBus) bareRelay(concurrency int) func(ctx context.Context, stream, subject, url, tag string) (func() usage, error) {
	return b.relay(concurrency, func(fs kgo.Fetches, post func(*kgo.Record), sem chan struct{}, wg *sync.WaitGroup) {
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				for _, r := range p.Records {
					post(r)
				}
			})
		})
	})
}

// relay is a bare relay that hands each polled batch to spread (which
// starts its POSTs on wg, each goroutine holding a slot of sem, of
// concurrency slots) and commits the batch's offsets once wg is done.
func (b *kafkaBus) relay(concurrency int, spread func(fs kgo.Fetches, post func(*kgo.Record), sem chan struct{}, wg *sync.WaitGroup)) func(ctx context.Context, stream, subject, url, tag string) (func() usage, error) {
	return func(ctx context.Context, topic, _, url, tag string) (func() usage, error) {
		cl, err := kgo.NewClient(kgo.SeedBrokers(b.fake.ListenAddrs()...), kgo.ConsumerGroup("bare-"+tag),
			kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.DisableAutoCommit(), kgo.FetchMaxWait(250*time.Millisecond))
		if err != nil {
			return nil, err
		}
		ctx, cancel := context.WithCancel(ctx)
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: concurrency}}
		post := func(r *kgo.Record) {
			for ctx.Err() == nil { // a failed call is tried again, in order
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(string(r.Value)))
				if err != nil {
					return
				}
				for _, h := range r.Headers {
					if h.Key == kafkaIDHeader {
						req.Header.Set("Idempotency-Key", string(h.Value))
					}
				}
				resp, err := client.Do(req)
				if err != nil {
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode/100 == 2 {
					return
				}
			}
		}
		var wg sync.WaitGroup
		wg.Go(func() {
			sem := make(chan struct{}, concurrency)
			for ctx.Err() == nil {
				fs := cl.PollFetches(ctx)
				var pw sync.WaitGroup
				spread(fs, post, sem, &pw)
				pw.Wait()
				if ctx.Err() == nil {
					_ = cl.CommitUncommittedOffsets(ctx)
				}
			}
		})
		return func() usage { cancel(); wg.Wait(); cl.Close(); client.CloseIdleConnections(); return usage{} }, nil
	}
}

// bareRelayByKey is bareRelay keeping only the order idem consume keeps
// under --kafka-order key: the records of each polled batch with the same
// key one after another, in offset order, records with different keys at
// once (up to concurrency calls over all partitions), and the batch's
// offsets committed once all its calls have answered 2xx. It is the fair
// comparison for key order, a weaker order than the partition's.
func (b *kafkaBus) bareRelayByKey(concurrency int) func(ctx context.Context, stream, subject, url, tag string) (func() usage, error) {
	return b.relay(concurrency, func(fs kgo.Fetches, post func(*kgo.Record), sem chan struct{}, wg *sync.WaitGroup) {
		chains := map[string][]*kgo.Record{}
		var keys []string
		fs.EachRecord(func(r *kgo.Record) {
			k := string(r.Key)
			if _, ok := chains[k]; !ok {
				keys = append(keys, k)
			}
			chains[k] = append(chains[k], r)
		})
		for _, k := range keys {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				for _, r := range chains[k] {
					post(r)
				}
			})
		}
	})
}

// sidecarBus is the broker of --sidecar: JetStream (natsBus), kfake
// (kafkaBus) or Redis Streams (redisStreamBus).
type sidecarBus interface {
	// url is idem consume's --broker.
	url() string
	// publish makes the run's stream (topic) and publishes n messages
	// with IDs TAG-0 to TAG-(n-1); cleanup removes what it made.
	publish(ctx context.Context, tag string, n int, payload []byte) (stream, subject string, cleanup func(), err error)
	// bareRelay is the contender that only fetches, POSTs and acks.
	bareRelay(concurrency int) func(ctx context.Context, stream, subject, url, tag string) (func() usage, error)
	close()
}
