package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idem-go/idem/idemdriver"
)

// Inspect reads one record with query (consumer, message ID ->
// fingerprint, processed_at µs, state, token, attempt, lease_expires_at µs
// or NULL, last_error or NULL, result or NULL, content_type or NULL),
// after checking the names. The result is kept for a completed record. No record is an
// error matching idemdriver.ErrNotFound, naming table.
func Inspect(ctx context.Context, db Querier, query, table, consumer, messageID string) (idemdriver.Record, error) {
	if err := idemdriver.ValidateKey(consumer, messageID); err != nil {
		return idemdriver.Record{}, err
	}
	r := idemdriver.Record{Consumer: consumer, MessageID: messageID}
	var (
		at, state int64
		attempt   int64
		leaseEnd  sql.NullInt64
		lastError sql.NullString
		result    []byte
		ctype     sql.NullString
	)
	err := db.QueryRow(ctx, query, consumer, messageID).
		Scan(&r.Fingerprint, &at, &state, &r.Token, &attempt, &leaseEnd, &lastError, &result, &ctype)
	if errors.Is(err, ErrNoRows) {
		return idemdriver.Record{}, fmt.Errorf("%w: consumer %q, message ID %q in %s", idemdriver.ErrNotFound, consumer, messageID, table)
	}
	if err != nil {
		return idemdriver.Record{}, err
	}
	r.ProcessedAt = Time(at)
	r.State = idemdriver.RecordState(state)
	r.Attempt = int(attempt)
	if leaseEnd.Valid {
		r.LeaseExpiresAt = Time(leaseEnd.Int64)
	}
	r.Error = lastError.String
	if r.State == idemdriver.StateCompleted {
		r.Result, r.ContentType = result, ctype.String
	}
	return r, nil
}

// Stats reads the per-consumer statistics with query (-> consumer, count,
// oldest processed_at µs, newest µs), ordered by consumer.
func Stats(ctx context.Context, db Querier, query string) ([]idemdriver.ConsumerStats, error) {
	rows, err := db.Query(ctx, query)
	if err != nil {
		return nil, err
	}
	var out []idemdriver.ConsumerStats
	err = ForEach(rows, func(r Row) error {
		var (
			c              idemdriver.ConsumerStats
			oldest, newest int64
		)
		if err := r.Scan(&c.Consumer, &c.Count, &oldest, &newest); err != nil {
			return err
		}
		c.Oldest, c.Newest = Time(oldest), Time(newest)
		out = append(out, c)
		return nil
	})
	return out, err
}
