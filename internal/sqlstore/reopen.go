package sqlstore

import (
	"context"

	"github.com/idem-go/idem/idemdriver"
)

// Reopen is the statements of idemdriver.Reopener in one dialect, and the
// logic that runs them through a Querier: an UPDATE of the record by its
// primary key, guarded by its state and token, and the deletion of its
// recovery points by theirs, as one statement (PostgreSQL's data-modifying
// WITH) or in one transaction.
type Reopen struct {
	table, inspect string
	// counted: consumer, message ID, token -> the number of records
	// reopened, their recovery points deleted by the same statement.
	counted string
	// update: consumer, message ID, token -> rows affected. steps:
	// consumer, message ID. Run in one transaction when counted is empty.
	update, steps string
}

// NewReopen builds the statements of ops's processed table in ops's
// dialect; oneStatement (PostgreSQL) makes them one statement.
func NewReopen(ops *Ops, oneStatement bool) *Reopen {
	d := ops.outbox.d
	p := d.Param
	key := ` WHERE ` + ops.is(p(1, "text")) + ` AND message_id = ` + p(2, "text")
	stepsKey := ` WHERE consumer = ` + p(1, "text") + ` AND message_id = ` + p(2, "text")
	r := &Reopen{table: ops.table, inspect: ops.inspect}
	r.update = `UPDATE ` + ops.table + ` SET state = 1, token = token + 1, attempt = 0, result = NULL, content_type = NULL, ` +
		`lease_expires_at = ` + d.Now + `, processed_at = ` + d.Now + `, updated_at = ` + d.Now + ops.reopenSet +
		key + ` AND state = 2 AND token = ` + p(3, "bigint")
	r.steps = `DELETE FROM ` + ops.table + `_steps` + stepsKey
	if oneStatement {
		r.counted = `WITH r AS (` + r.update + ` RETURNING 1), d AS (` + r.steps + ` AND EXISTS (SELECT FROM r))
SELECT count(*) FROM r`
	}
	return r
}

// Run runs a ReopenRecord on db; inTx runs its function in one
// transaction (for a dialect without the one statement; nil otherwise).
// When it changed nothing, the record is read to say why
// (idemdriver.CheckReopen).
func (r *Reopen) Run(ctx context.Context, db Querier, inTx func(ctx context.Context, fn func(tx Querier) error) error,
	p *idemdriver.ReopenRecordParams) (idemdriver.ActionResult, error) {
	if err := idemdriver.ValidateReopenRecordParams(p); err != nil {
		return idemdriver.ActionResult{}, err
	}
	var n int64
	var err error
	if r.counted != "" {
		err = db.QueryRow(ctx, r.counted, p.Consumer, p.MessageID, p.Token).Scan(&n)
	} else {
		err = inTx(ctx, func(tx Querier) error {
			var err error
			if n, err = tx.Exec(ctx, r.update, p.Consumer, p.MessageID, p.Token); err != nil || n == 0 {
				return err
			}
			_, err = tx.Exec(ctx, r.steps, p.Consumer, p.MessageID)
			return err
		})
	}
	if err != nil {
		return idemdriver.ActionResult{}, err
	}
	return actionResult(ctx, db, r.inspect, r.table, p.Consumer, p.MessageID, n, func(rec idemdriver.Record) error {
		return idemdriver.CheckReopen(rec, p.Token)
	})
}
