package idemcli

import (
	"context"
	"database/sql"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem/cmd/idem/internal/connect"
	"github.com/idem-go/idem/cmd/idem/internal/secret"
	"github.com/idem-go/idem/store/idemsql"
)

// The commands' names for what package connect opens and dials.

// errBadURL marks a store or broker URL that cannot be parsed or used.
var errBadURL = connect.ErrBadURL

// sqlStore is an opened SQL store: the database, its dialect and the idem store over it.
type sqlStore struct {
	db      *sql.DB
	dialect idemsql.Dialect
	store   *idemsql.Store
	// where names the database for messages, without credentials.
	where string
	// pooler is set when PostgreSQL is behind a pooler (connect.SQLStore).
	pooler bool
}

// openSQLStore opens the store named by rawURL (connect.OpenSQL).
func openSQLStore(ctx context.Context, rawURL, table string) (*sqlStore, error) {
	s, err := connect.OpenSQL(ctx, rawURL, table)
	if err != nil {
		return nil, err
	}
	return &sqlStore{db: s.DB, dialect: s.Dialect, store: s.Store, where: s.Where, pooler: s.Pooler}, nil
}

// redact hides the password of a URL for messages, even of one that does
// not parse (secret.URL).
func redact(raw string) string { return secret.URL(raw) }

// rebind rewrites ?-placeholders for the dialect (connect.Rebind).
func rebind(d idemsql.Dialect, q string) string { return connect.Rebind(d, q) }

// pgStoreSettings bounds a PostgreSQL connection's waits (connect.PGStoreSettings).
func pgStoreSettings(cfg *pgx.ConnConfig) { connect.PGStoreSettings(cfg) }

func dialNATS(url string, opts ...nats.Option) (jetstream.JetStream, error) {
	return connect.NATS(url, opts...)
}

func dialAMQP(url string) (*amqp.Connection, error) { return connect.AMQP(url) }

func dialKafka(ctx context.Context, seeds []string) (*kgo.Client, error) {
	return connect.Kafka(ctx, seeds)
}

func dialRedis(ctx context.Context, url string) (*redis.Client, *redis.Options, error) {
	return connect.Redis(ctx, url)
}
