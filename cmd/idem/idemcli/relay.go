package idemcli

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/spf13/cobra"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemamqp"
	"github.com/idem-go/idem/broker/idemkafka"
	"github.com/idem-go/idem/broker/idemnats"
	"github.com/idem-go/idem/broker/idemredisstream"
)

func newRelayCmd() *cobra.Command {
	var (
		sf       storeFlags
		broker   string
		exchange string
		cfg      idem.RelayConfig
	)
	cmd := &cobra.Command{
		Use:   "relay",
		Short: "Send the outbox's messages to a broker",
		Long: `relay runs an outbox relay until interrupted: it claims the pending rows of
the store's outbox table (<table>_outbox), publishes them to the broker with
their message IDs, and marks them sent once the broker confirmed. Several
relays may run on one store. The store is polled (from 50ms, doubling to 5s
while idle).

--broker names the broker and what a row's destination means there:
  nats://HOST:PORT          JetStream; destination = subject
  kafka://HOST:PORT,...     Kafka; destination = topic, ordering key = record key
  amqp://USER:PASS@HOST/    RabbitMQ; destination = routing key on --exchange
                            (default exchange: the queue name)
  redis://HOST:PORT/DB      Redis Streams; destination = stream key`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			st, err := sf.openExisting(ctx)
			if err != nil {
				return err
			}
			defer st.db.Close()
			pub, closeBroker, err := openPublisher(ctx, broker, exchange)
			if err != nil {
				return err
			}
			defer closeBroker()
			cfg.Store, cfg.Publisher = st.store, pub
			cfg.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			r, err := idem.NewRelay(cfg)
			if err != nil {
				return usageError{err}
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "relaying the outbox of %s to %s\n", st.where, redact(broker))
			return r.Run(ctx)
		},
	}
	sf.add(cmd)
	cmd.Flags().StringVar(&broker, "broker", "", "broker URL: nats://..., kafka://..., amqp://..., redis://... (required)")
	cmd.Flags().StringVar(&exchange, "exchange", "", "RabbitMQ exchange to publish to (default: the default exchange)")
	cmd.Flags().IntVar(&cfg.BatchSize, "batch-size", idem.DefaultRelayBatchSize, "rows claimed per round")
	cmd.Flags().DurationVar(&cfg.Lease, "lease", idem.DefaultRelayLease, "how long claimed rows stay leased to this relay")
	cmd.Flags().DurationVar(&cfg.Retention, "retention", idem.DefaultOutboxRetention, "how long sent rows are kept before purging")
	return cmd
}

// openPublisher connects to the broker at url and returns its relay
// Publisher and a function that closes the connection.
func openPublisher(ctx context.Context, url, exchange string) (idem.Publisher, func(), error) {
	switch {
	case url == "":
		return nil, nil, usageError{fmt.Errorf("--broker is required (or IDEM_BROKER)")}
	case strings.HasPrefix(url, "nats:"):
		js, err := dialNATS(url)
		if err != nil {
			return nil, nil, fmt.Errorf("cannot reach NATS at %s: %w", redact(url), err)
		}
		return idemnats.NewPublisher(js), js.Conn().Close, nil
	case strings.HasPrefix(url, "kafka:"):
		cl, err := dialKafka(ctx, strings.Split(strings.TrimPrefix(strings.TrimPrefix(url, "kafka://"), "kafka:"), ","))
		if err != nil {
			return nil, nil, err
		}
		return idemkafka.NewPublisher(cl, idemkafka.ProducerConfig{}), cl.Close, nil
	case strings.HasPrefix(url, "amqp:") || strings.HasPrefix(url, "amqps:"):
		conn, err := dialAMQP(url)
		if err != nil {
			return nil, nil, fmt.Errorf("cannot reach RabbitMQ at %s: %w", redact(url), err)
		}
		return idemamqp.NewPublisher(conn, idemamqp.ProducerConfig{Exchange: exchange}), func() { _ = conn.Close() }, nil
	case strings.HasPrefix(url, "redis:") || strings.HasPrefix(url, "rediss:"):
		client, _, err := dialRedis(ctx, url)
		if err != nil {
			return nil, nil, err
		}
		return idemredisstream.NewPublisher(client, idemredisstream.ProducerConfig{}), func() { _ = client.Close() }, nil
	}
	return nil, nil, usageError{fmt.Errorf("%w: --broker %q: want nats://HOST:PORT, kafka://HOST:PORT, amqp://USER:PASS@HOST:PORT/ or redis://HOST:PORT/DB", errBadURL, redact(url))}
}
