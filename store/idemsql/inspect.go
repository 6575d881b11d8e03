package idemsql

import (
	"context"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/pgsql"
	"github.com/idem-go/idem/internal/sqlstore"
)

// Inspect implements [idemdriver.Inspector]: the committed record of
// (consumer, messageID), compared byte for byte, in either mode, with its
// stored result when completed and its times by the server's clock in UTC: processed_at is the claiming
// transaction's start on PostgreSQL (now()), the claim statement's time on
// MySQL (UTC_TIMESTAMP(6)) and on SQLite (millisecond precision); lease
// mode stamps it again when an attempt takes the record over, completes
// it or releases it. It returns an error matching idemdriver.ErrNotFound
// when there is none, one matching idemdriver.ErrInvalidConsumerName,
// ErrInvalidMessageID or ErrMissingMessageID for names that no record can
// have (idemdriver.ValidateKey), and the driver's error otherwise.
func (s *Store) Inspect(ctx context.Context, consumer, messageID string) (idemdriver.Record, error) {
	if s.dialect == Postgres {
		return pgsql.Retry(ctx, s.pg, querier{s.db}, "", func(q *pgsql.Queries) (idemdriver.Record, error) {
			return sqlstore.Inspect(ctx, querier{s.db}, q.Inspect, s.table.Qualified, consumer, messageID)
		})
	}
	return sqlstore.Inspect(ctx, querier{s.db}, s.q.inspect, s.table.Qualified, consumer, messageID)
}

// Stats implements [idemdriver.Inspector]: one entry per consumer with
// records in the table, ordered by consumer name (byte order). It reads
// the whole table (one GROUP BY over the (consumer, processed_at) index),
// so it is an operator's tool, not something to call per message.
func (s *Store) Stats(ctx context.Context) ([]idemdriver.ConsumerStats, error) {
	if s.dialect == Postgres {
		return pgsql.Retry(ctx, s.pg, querier{s.db}, "", func(q *pgsql.Queries) ([]idemdriver.ConsumerStats, error) {
			return sqlstore.Stats(ctx, querier{s.db}, q.Stats)
		})
	}
	return sqlstore.Stats(ctx, querier{s.db}, s.q.stats)
}
