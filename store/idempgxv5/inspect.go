package idempgxv5

import (
	"context"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/pgsql"
	"github.com/idem-go/idem/internal/sqlstore"
)

// Inspect implements [idemdriver.Inspector]: the committed record of
// (consumer, messageID), in either mode, compared byte for byte, with its
// times by the server's clock in UTC and, when completed, its stored result. It returns an error matching
// idemdriver.ErrNotFound when there is none, and one matching
// idemdriver.ErrInvalidConsumerName, ErrInvalidMessageID or
// ErrMissingMessageID for names that no record can have
// (idemdriver.ValidateKey).
func (s *Store) Inspect(ctx context.Context, consumer, messageID string) (idemdriver.Record, error) {
	return pgsql.Retry(ctx, s.tab, querier{s.pool}, "", func(q *pgsql.Queries) (idemdriver.Record, error) {
		return sqlstore.Inspect(ctx, querier{s.pool}, q.Inspect, s.table.Qualified, consumer, messageID)
	})
}

// Stats implements [idemdriver.Inspector]: one entry per consumer with
// records in the table, ordered by consumer name (byte order). It scans
// the whole table (one GROUP BY), so it is an operator's tool, not
// something to call per message.
func (s *Store) Stats(ctx context.Context) ([]idemdriver.ConsumerStats, error) {
	return pgsql.Retry(ctx, s.tab, querier{s.pool}, "", func(q *pgsql.Queries) ([]idemdriver.ConsumerStats, error) {
		return sqlstore.Stats(ctx, querier{s.pool}, q.Stats)
	})
}
