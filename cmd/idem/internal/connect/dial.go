package connect

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem/cmd/idem/internal/secret"
)

// The broker connections shared by the demo, `idem consume` and `idem
// relay` (so not behind the nodemo build tag).

// NATS connects to the NATS server at url with opts (by default a 5s
// timeout, endless reconnects, and pings every 2s, two unanswered of
// which end the connection) and returns its JetStream context.
func NATS(url string, opts ...nats.Option) (jetstream.JetStream, error) {
	if len(opts) == 0 {
		// A connection that stops answering without closing (half-open
		// TCP) is given up after two pings two seconds apart unanswered,
		// as idem consume's is, not nats.go's default two minutes apart:
		// meanwhile nothing is published or consumed (a black-holed
		// connection held a consumer for 6 minutes with the defaults).
		opts = []nats.Option{nats.Timeout(5 * time.Second), nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond),
			nats.PingInterval(2 * time.Second), nats.MaxPingsOutstanding(2)}
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
	}
	return js, err
}

// AMQP connects to RabbitMQ at url, with a 5s dial timeout.
func AMQP(url string) (*amqp.Connection, error) {
	return amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
}

// Kafka returns a client of the cluster at seeds (auto-creating
// topics) once it answers a ping, within 10 seconds.
func Kafka(ctx context.Context, seeds []string) (*kgo.Client, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.AllowAutoTopicCreation())
	if err == nil {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = cl.Ping(pctx)
		cancel()
		if err != nil {
			cl.Close()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("cannot reach Kafka at %s: %w", strings.Join(seeds, ","), err)
	}
	return cl, nil
}

// Redis returns a client of the broker Redis at url once it answers a
// ping, within 10 seconds. Its errors carry no password (secret.Error);
// a URL go-redis cannot parse is ErrBadURL.
func Redis(ctx context.Context, url string) (*redis.Client, *redis.Options, error) {
	return dialRedis(ctx, url, "broker")
}

// RedisStore is Redis for the URL of a Redis store (redis://, or
// rediss:// for TLS); its errors name a store.
func RedisStore(ctx context.Context, url string) (*redis.Client, *redis.Options, error) {
	return dialRedis(ctx, url, "store")
}

func dialRedis(ctx context.Context, url, what string) (_ *redis.Client, _ *redis.Options, err error) {
	defer func() { err = secret.Error(err, url) }()
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %s %q: %v", ErrBadURL, what, secret.URL(url), err)
	}
	client := redis.NewClient(opts)
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := QuietPing(func() error { return client.Ping(pctx).Err() }); err != nil {
		client.Close()
		return nil, nil, fmt.Errorf("cannot reach Redis at %s: %w", opts.Addr, err)
	}
	return client, opts, nil
}

// quietPings counts the first pings under way, or failed, whose drivers'
// package-level log lines are dropped (QuietPing).
var quietPings atomic.Int32

// QuietPing runs ping, the first ping of a client the command just made,
// with the lines the drivers log through their package-level loggers
// dropped (DriverLogsQuiet): go-redis logs "connection pool: failed to
// dial after 5 attempts" for each retry of a ping, from dial goroutines
// detached from the ping's context, and the ping's error, which the
// command prints as "cannot reach ...", says the same. When ping fails
// the lines stay dropped, since the command is ending with its error and
// the client's dials may go on logging until it exits; when it succeeds
// they are logged again.
func QuietPing(ping func() error) error {
	quietPings.Add(1)
	err := ping()
	if err == nil {
		quietPings.Add(-1)
	}
	return err
}

// DriverLogsQuiet reports whether a QuietPing is under way or has failed,
// so that the drivers' package-level log lines are to be dropped.
func DriverLogsQuiet() bool { return quietPings.Load() > 0 }
