package pgsql

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/sqlstore"
)

// renewBatch is the statement of RenewBatch on table t: the leases as
// arrays ($1 consumers, $2 message IDs, $3 tokens, $4 leases in µs), one
// row per element (u.ord, from 1) with its outcome: 1 renewed, 0 its
// token does not own the record (lost), 2 owned by its token in the
// statement's snapshot but not renewed (its row was locked by another
// transaction and skipped, or changed after the snapshot): not judged.
// The rows are locked in key order, and locked rows are skipped, so the
// batch never waits for another transaction and never deadlocks with
// another batch. Each lease is set from the server's now(), as Renew sets
// it, and updated_at with it. On schema v2 (v2 set) $1 holds the
// consumers' keys (smallint[]) and the records are found by consumer_key.
func renewBatch(t string, v2 bool) string {
	col, cs := `consumer`, `$1::text[]`
	if v2 {
		col, cs = `consumer_key`, `$1::smallint[]`
	}
	return `WITH u AS (
	SELECT * FROM unnest(` + cs + `, $2::text[], $3::bigint[], $4::bigint[]) WITH ORDINALITY AS u(c, m, tok, lease, ord)
), l AS (
	SELECT r.` + col + `, r.message_id, r.token, u.lease FROM ` + t + ` AS r
	JOIN u ON r.` + col + ` = u.c AND r.message_id = u.m AND r.token = u.tok
	WHERE r.state = 1
	ORDER BY r.` + col + `, r.message_id
	FOR UPDATE OF r SKIP LOCKED
), upd AS (
	UPDATE ` + t + ` AS r SET lease_expires_at = now() + l.lease * interval '1 microsecond', updated_at = now()
	FROM l WHERE r.` + col + ` = l.` + col + ` AND r.message_id = l.message_id AND r.token = l.token
	RETURNING r.` + col + `, r.message_id, r.token
)
SELECT u.ord, CASE WHEN upd.message_id IS NOT NULL THEN 1
	WHEN EXISTS (SELECT FROM ` + t + ` AS r WHERE r.` + col + ` = u.c AND r.message_id = u.m AND r.state = 1 AND r.token = u.tok) THEN 2
	ELSE 0 END
FROM u LEFT JOIN upd ON upd.` + col + ` = u.c AND upd.message_id = u.m AND upd.token = u.tok`
}

// RenewBatch is Queries.RenewBatch in the table's shape (Shape, on db,
// which runs each statement in a transaction of its own), the consumers'
// keys resolved first on schema v2 (Ensure); when the statement fails
// because the shape changed under it (ShapeChanged), once more in the new
// shape.
func (tb *Table) RenewBatch(ctx context.Context, db sqlstore.Querier, ps []idemdriver.RenewParams, order []int, errs []error) error {
	_, err := tb.batchRun(ctx, db, order, func(i int) string { return ps[i].Consumer }, func(q *Queries) error {
		return q.RenewBatch(ctx, db, ps, order, errs)
	})
	return err
}

// RenewBatch renews the elements order names of ps (validated; see
// sqlstore.RenewOrder) in one statement on db, and sets each one's error
// in errs: nil when renewed, ErrLeaseLost when its token does not own the
// record, idemdriver.ErrRenewNotJudged when its row was locked by another
// transaction (skipped, not waited for). An error of the statement is
// returned and errs is then not to be used.
func (q *Queries) RenewBatch(ctx context.Context, db sqlstore.Querier, ps []idemdriver.RenewParams, order []int, errs []error) error {
	cs, err := q.consumerArray(order, func(i int) string { return ps[i].Consumer }, "renewal batch")
	if err != nil {
		return err
	}
	ids := make([]string, len(order))
	toks, leases := make([]int64, len(order)), make([]int64, len(order))
	for k, i := range order {
		p := &ps[i]
		ids[k], toks[k], leases[k] = p.MessageID, p.Token, sqlstore.DurationMicros(p.Lease)
	}
	args := []any{cs, q.textArray(ids), q.int64Param(toks), q.int64Param(leases)}
	rows, err := db.Query(ctx, renewBatch(q.Table, q.V2)+planComment(q.planGeneration()), args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	seen := 0
	for rows.Next() {
		var ord, outcome int64
		if err := rows.Scan(&ord, &outcome); err != nil {
			return err
		}
		if ord < 1 || ord > int64(len(order)) {
			return fmt.Errorf("idem: renewal batch: row %d of %d", ord, len(order))
		}
		i := order[ord-1]
		p := &ps[i]
		switch outcome {
		case 1:
			errs[i] = nil
		case 2:
			errs[i] = fmt.Errorf("%w: message %q (consumer %q)", idemdriver.ErrRenewNotJudged, p.MessageID, p.Consumer)
		default:
			errs[i] = sqlstore.LeaseLost("renew", p.Consumer, p.MessageID, p.Token)
		}
		seen++
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if seen != len(order) {
		return fmt.Errorf("idem: renewal batch: %d rows for %d leases", seen, len(order))
	}
	return nil
}

// int64Array renders ns as a PostgreSQL array literal ('{1,2}'), sent as
// a string parameter and cast with ::bigint[] in SQL (see TextArray).
func int64Array(ns []int64) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, n := range ns {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(n, 10))
	}
	b.WriteByte('}')
	return b.String()
}
