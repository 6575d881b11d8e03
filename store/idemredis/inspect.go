package idemredis

import (
	"context"
	"fmt"

	"github.com/idem-go/idem/idemdriver"
)

var _ idemdriver.Inspector = (*Store)(nil)

// Inspect implements [idemdriver.Inspector]: one HGETALL of the record's
// hash, read as ListRecords reads it (state, fencing token, attempt,
// fingerprint, last error; the lease's end for a record in progress, the
// stored result for a completed one). Its
// times are by the Redis server's clock (millisecond precision, UTC):
// ProcessedAt is when a completed or failed record finished, and when a
// record in progress was last acquired or released. It returns an error
// matching idemdriver.ErrNotFound when there is no record (never one, or
// one removed by retention), and one matching
// idemdriver.ErrInvalidConsumerName, ErrInvalidMessageID or
// ErrMissingMessageID for names that no record can have
// (idemdriver.ValidateKey). The recovery points are read with Steps.
func (s *Store) Inspect(ctx context.Context, consumer, messageID string) (idemdriver.Record, error) {
	if err := idemdriver.ValidateKey(consumer, messageID); err != nil {
		return idemdriver.Record{}, err
	}
	return s.read(ctx, consumer, messageID)
}

// Stats implements [idemdriver.Inspector] by refusing: Redis keeps no
// index of the consumers (their keys are found only by scanning the whole
// keyspace, on every node of a cluster), so it returns an error matching
// [idemdriver.ErrUnsupported]. Inspect reads one record; ListRecords
// lists a consumer's failed records.
func (s *Store) Stats(ctx context.Context) ([]idemdriver.ConsumerStats, error) {
	return nil, fmt.Errorf("%w: idemredis keeps no index of its consumers; inspect a record by its consumer and ID", idemdriver.ErrUnsupported)
}
