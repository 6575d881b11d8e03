package idemcli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/cmd/idem/internal/deadletter"
	"github.com/idem-go/idem/cmd/idem/internal/operate"
)

// The operator commands (failed, retry, release, replay, console) live in
// internal/operate; this registers them over the SQL and Redis stores and the
// brokers' dead letters.
func init() {
	for i := range operate.Commands(openOperated, openDeadLetters, nil) {
		extraCommands = append(extraCommands, func() *cobra.Command {
			return adaptOperate(operate.Commands(openOperated, openDeadLetters, nil)[i])
		})
	}
}

// openOperated opens the store for the operator commands: a SQL store
// whose table exists, or the Redis store under redisPrefix (a --table
// there is a usage error: Redis has key prefixes, not tables).
func openOperated(ctx context.Context, storeURL, table, redisPrefix string) (operate.Opened, error) {
	if isRedisURL(storeURL) {
		if table != "" {
			return operate.Opened{}, usageError{fmt.Errorf("%w: --table names a SQL table; a Redis store's keys are under --redis-prefix", errBadURL)}
		}
		rs, err := openRedisStore(ctx, storeURL, redisPrefix)
		if err != nil {
			return operate.Opened{}, err
		}
		return operate.Opened{Store: rs.store, Where: rs.where, Close: rs.client.Close}, nil
	}
	st, err := (&storeFlags{store: storeURL, table: table}).openExisting(ctx)
	if err != nil {
		return operate.Opened{}, err
	}
	return operate.Opened{Store: st.store, Where: st.where, Close: st.db.Close}, nil
}

// openDeadLetters connects to the broker at rawURL for its dead letters:
// NATS JetStream, Redis Streams and Kafka are read in place; RabbitMQ's
// and the Go CDK's queues cannot be browsed without taking their
// messages, and say so.
func openDeadLetters(ctx context.Context, rawURL string) (console.DeadLetters, func(), error) {
	if isGoCDKURL(rawURL) {
		return deadletter.Unbrowsable{Broker: "the Go CDK queue at " + redact(rawURL)}, func() {}, nil
	}
	scheme, _, _ := strings.Cut(rawURL, ":")
	switch strings.ToLower(scheme) {
	case "nats", "tls":
		nc, err := nats.Connect(rawURL, nats.Timeout(5*time.Second))
		if err != nil {
			return nil, nil, fmt.Errorf("cannot reach NATS at %s: %w", redact(rawURL), err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			nc.Close()
			return nil, nil, err
		}
		return deadletter.NewJetStream(js, "NATS at "+redact(rawURL), nil), nc.Close, nil
	case "redis", "rediss":
		rdb, opts, err := dialRedis(ctx, rawURL)
		if err != nil {
			return nil, nil, err
		}
		return deadletter.NewRedisStreams(rdb, "Redis Streams at "+opts.Addr), func() { _ = rdb.Close() }, nil
	case "amqp", "amqps":
		return deadletter.Unbrowsable{Broker: "RabbitMQ at " + redact(rawURL)}, func() {}, nil
	case "kafka":
		seeds := strings.Split(strings.TrimPrefix(strings.TrimPrefix(rawURL, "kafka://"), "kafka:"), ",")
		cl, err := dialKafka(ctx, seeds)
		if err != nil {
			return nil, nil, err
		}
		return deadletter.NewKafka(cl, "Kafka at "+strings.Join(seeds, ","), kgo.SeedBrokers(seeds...)), cl.Close, nil
	}
	return nil, nil, usageError{fmt.Errorf("%w: broker %q: want nats://, redis:// or kafka:// (dead letters read in place)", errBadURL, redact(rawURL))}
}

// adaptOperate makes the command's usage errors the idem command's (exit
// status 2) and marks its token flag secret.
func adaptOperate(c *cobra.Command) *cobra.Command {
	run := c.RunE
	c.RunE = func(cmd *cobra.Command, args []string) error {
		err := run(cmd, args)
		var ue operate.UsageError
		if errors.As(err, &ue) {
			return usageError{err}
		}
		return err
	}
	if c.Flags().Lookup("token") != nil && c.Name() == "console" {
		markSecret(c, "token")
	}
	return c
}
