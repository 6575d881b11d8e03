package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/idem-go/idem/idemdriver"
)

// Ops is the operator statements of one dialect (idemdriver.Operator and
// idemdriver.OutboxOperator) and the logic that runs them through a
// Querier. The statements find records through the processed table's
// primary key and its (consumer, processed_at) index, and failed outbox
// rows through the outbox's index on failed_at: none reads a whole table.
type Ops struct {
	table, inspect string
	// list: consumer, position (µs) twice, position's message ID, scan,
	// state, limit -> the window's matching rows and its last one.
	list string
	// listFailed, when failedIndex is set: consumer, position (µs) twice,
	// position's message ID, limit -> failed records only, through the
	// partial index of the failed records.
	listFailed  string
	failedIndex bool
	// retry and release: consumer, message ID (release: token).
	retry, release string
	// failures: limit. failed and failedOf: position (µs) twice, its ID,
	// (failedOf: error text), limit. retryOut and outState: ID.
	failures, failed, failedOf, retryOut, outState string
	// consumers -> consumer, 0, oldest (µs), newest (µs), as Stats.
	consumers string
	// steps: consumer, message ID -> step, result.
	steps string
	// reopenSet is more of Reopen's SET clause (", col = value"), for a
	// processed table that keeps a recovery point in the record.
	reopenSet string
	// sortSteps: Steps sorts the rows of steps by name (WithRecordPoint).
	sortSteps bool
	outbox    *Outbox
	// is returns the condition on the processed table that selects the
	// consumer named by a placeholder (see NewOpsKeyed).
	is func(p string) string
}

// NewOps builds the operator statements of the processed table table
// (as written in SQL) and of o's outbox, in o's dialect. inspect is the
// dialect's statement of Inspect; timeParam returns the time column value
// of the bigint microseconds of placeholder p.
func NewOps(table, inspect string, o *Outbox, timeParam func(p string) string) *Ops {
	return NewOpsKeyed(table, inspect, o, timeParam, nil, "")
}

// NewOpsKeyed is NewOps for a processed table whose rows refer to their
// consumer by something else than its name (PostgreSQL's schema v2: a
// key): is returns the condition on the processed table that selects
// the consumer named by placeholder p (nil: consumer = p), and consumers
// is the statement of Consumers ("": a skip scan of the consumer
// column). The recovery points table is found by name either way.
func NewOpsKeyed(table, inspect string, o *Outbox, timeParam func(p string) string, is func(p string) string, consumers string) *Ops {
	d := o.d
	p := d.Param
	x := d.TextOut
	if is == nil {
		is = func(p string) string { return `consumer = ` + p }
	}
	ops := &Ops{table: table, inspect: inspect, outbox: o, is: is}
	// The inner select walks the (consumer, processed_at) index backwards
	// from the position and stops after scan rows; the outer keeps those
	// in the state and the window's last row, which positions the next
	// page when the window was cut.
	ops.list = `SELECT message_id` + x + `, fingerprint, ` + d.Micros(`processed_at`) + `, st, COALESCE(token, 0), COALESCE(attempt, 1), ` +
		d.Micros(`lease_expires_at`) + `, last_error, total FROM (
	SELECT w.*, ROW_NUMBER() OVER (ORDER BY processed_at DESC, message_id DESC) AS n, COUNT(*) OVER () AS total FROM (
		SELECT message_id, fingerprint, processed_at, COALESCE(state, 2) AS st, token, attempt, lease_expires_at, last_error
		FROM ` + table + `
		WHERE ` + is(p(1, "text")) + ` AND processed_at <= ` + timeParam(p(2, "bigint")) + `
			AND (processed_at < ` + timeParam(p(3, "bigint")) + ` OR message_id < ` + p(4, "text") + `)
		ORDER BY processed_at DESC, message_id DESC
		LIMIT ` + p(5, "bigint") + `
	) w
) x
WHERE st = ` + p(6, "bigint") + ` OR n = total
ORDER BY processed_at DESC, message_id DESC
LIMIT ` + p(7, "bigint")
	// The failed records (state 3) through their partial index on
	// (consumer, processed_at, message_id), walked backwards from the
	// position: the page's records and one more, whatever the table holds
	// besides them. The literal "state = 3" is the index's predicate.
	ops.listFailed = `SELECT message_id` + x + `, fingerprint, ` + d.Micros(`processed_at`) + `, 3, COALESCE(token, 0), COALESCE(attempt, 1), ` +
		d.Micros(`lease_expires_at`) + `, last_error, 0
FROM ` + table + `
WHERE ` + is(p(1, "text")) + ` AND state = 3 AND processed_at <= ` + timeParam(p(2, "bigint")) + `
	AND (processed_at < ` + timeParam(p(3, "bigint")) + ` OR message_id < ` + p(4, "text") + `)
ORDER BY processed_at DESC, message_id DESC
LIMIT ` + p(5, "bigint")
	key := ` WHERE ` + is(p(1, "text")) + ` AND message_id = ` + p(2, "text")
	stepsKey := ` WHERE consumer = ` + p(1, "text") + ` AND message_id = ` + p(2, "text")
	stamp := `lease_expires_at = ` + d.Now + `, processed_at = ` + d.Now + `, updated_at = ` + d.Now
	ops.retry = `UPDATE ` + table + ` SET state = 1, token = COALESCE(token, 0) + 1, attempt = 0, ` + stamp + key + ` AND state = 3`
	ops.release = `UPDATE ` + table + ` SET token = token + 1, ` + stamp + key + ` AND state = 1 AND token = ` + p(3, "bigint")

	t := d.Table
	failed := ` FROM ` + t + ` WHERE failed_at IS NOT NULL AND sent_at IS NULL`
	ops.failures = `SELECT COALESCE(last_error, ''), COUNT(*), ` + d.Micros(`MAX(failed_at)`) + `, ` + d.Micros(`MIN(failed_at)`) +
		failed + ` GROUP BY COALESCE(last_error, '') ORDER BY MAX(failed_at) DESC LIMIT ` + p(1, "bigint")
	// The position as a row comparison, which PostgreSQL reads as one
	// condition on the (failed_at, id) index and walks it backwards under
	// the limit; written as "failed_at < $2 OR id < $3", it made two
	// bitmap scans of the index and sorted every failed row.
	page := failed + ` AND failed_at <= ` + timeParam(p(1, "bigint")) + ` AND (failed_at, id) < (` + timeParam(p(2, "bigint")) + `, ` + p(3, "text") + `)`
	cols := `SELECT ` + o.cols + `, ` + d.Micros(`failed_at`) + `, COALESCE(last_error, '')`
	order := ` ORDER BY failed_at DESC, id DESC LIMIT `
	ops.failed = cols + page + order + p(4, "bigint")
	ops.failedOf = cols + page + ` AND COALESCE(last_error, '') = ` + p(4, "text") + order + p(5, "bigint")
	ops.retryOut = `UPDATE ` + t + ` SET failed_at = NULL, lease_until = NULL, available_at = ` + d.Now +
		` WHERE id = ` + p(1, "text") + ` AND failed_at IS NOT NULL AND sent_at IS NULL`
	// A skip scan of the (consumer, processed_at) index: each step finds
	// the next consumer with one probe, then two probes find its oldest
	// and newest record.
	ops.consumers = `WITH RECURSIVE c (consumer) AS (
	SELECT MIN(consumer) FROM ` + table + `
	UNION ALL
	SELECT (SELECT MIN(t.consumer) FROM ` + table + ` t WHERE t.consumer > c.consumer) FROM c WHERE c.consumer IS NOT NULL
)
SELECT c.consumer` + x + `, 0, ` + d.Micros(`(SELECT MIN(t.processed_at) FROM `+table+` t WHERE t.consumer = c.consumer)`) + `, ` +
		d.Micros(`(SELECT MAX(t.processed_at) FROM `+table+` t WHERE t.consumer = c.consumer)`) + `
FROM c WHERE c.consumer IS NOT NULL ORDER BY c.consumer`
	if consumers != "" {
		ops.consumers = consumers
	}
	ops.steps = `SELECT step` + x + `, result FROM ` + table + `_steps` + stepsKey + ` ORDER BY step`
	ops.outState = `SELECT consumer` + x + `, CASE WHEN sent_at IS NOT NULL THEN 2 WHEN failed_at IS NOT NULL THEN 3 ELSE 1 END FROM ` + t + ` WHERE id = ` + p(1, "text")
	return ops
}

// WithFailedIndex makes ListRecords read failed records through the
// partial index of the failed records on (consumer, processed_at,
// message_id) WHERE state = 3, which the dialect's migrations create: a
// page of failed records is then its limit of them (and one more, to
// know that there are), however rare they are among the table's records,
// rather than those among p.Scan records. Leases in progress are still
// listed from a window of p.Scan records. It returns ops.
func (ops *Ops) WithFailedIndex() *Ops {
	ops.failedIndex = true
	return ops
}

// WithRecordPoint makes Steps run steps (consumer, message ID -> step,
// result, in any order), which reads a recovery point kept in the record
// beside those of the recovery points table, and sort its rows by step,
// byte for byte (the "C" collation of the steps table), in Go: a Sort in
// the statement would sort rows read from two tables, where the steps
// table's rows alone come in order from its primary key. The Reopen
// built from ops (NewReopen) also sets set, more of its SET clause
// (", point = NULL", or "" to set nothing more), which clears that
// point. It returns ops.
func (ops *Ops) WithRecordPoint(steps, set string) *Ops {
	ops.steps, ops.reopenSet, ops.sortSteps = steps, set, true
	return ops
}

// Consumers runs the list of idemdriver.ConsumerLister (Count 0).
func (ops *Ops) Consumers(ctx context.Context, db Querier) ([]idemdriver.ConsumerStats, error) {
	return Stats(ctx, db, ops.consumers)
}

// Steps runs the read of idemdriver.StepReader.
func (ops *Ops) Steps(ctx context.Context, db Querier, consumer, messageID string) ([]idemdriver.Step, error) {
	if err := idemdriver.ValidateKey(consumer, messageID); err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, ops.steps, consumer, messageID)
	if err != nil {
		return nil, err
	}
	var out []idemdriver.Step
	err = ForEach(rows, func(r Row) error {
		var st idemdriver.Step
		if err := r.Scan(&st.Name, &st.Result); err != nil {
			return err
		}
		out = append(out, st)
		return nil
	})
	if ops.sortSteps {
		slices.SortFunc(out, func(a, b idemdriver.Step) int { return strings.Compare(a.Name, b.Name) })
	}
	return out, err
}

// OutboxBacklog runs the backlog of idemdriver.OutboxOperator: the
// outbox's own statistics, which read the indexes of the pending and
// failed rows.
func (ops *Ops) OutboxBacklog(ctx context.Context, db Querier) (idemdriver.OutboxStats, error) {
	return ops.outbox.Stats(ctx, db)
}

// ConsumersSQL is the statement of Consumers, for tests that look at its
// plan.
func (ops *Ops) ConsumersSQL() string { return ops.consumers }

// ListSQL is the statement of ListRecords, for tests that look at its plan.
func (ops *Ops) ListSQL() string { return ops.list }

// FailedSQL is the statement of ListFailedOutgoing without an error
// filter, for tests that look at its plan.
func (ops *Ops) FailedSQL() string { return ops.failed }

// ListRecords runs the list of idemdriver.Operator.
func (ops *Ops) ListRecords(ctx context.Context, db Querier, p *idemdriver.ListRecordsParams) (idemdriver.RecordPage, error) {
	pos, err := idemdriver.ValidateListRecordsParams(p)
	if err != nil {
		return idemdriver.RecordPage{}, err
	}
	at := Micros(pos.At)
	q, args := ops.list, []any{p.Consumer, at, at, pos.Key, int64(p.Scan), int64(p.State), int64(p.Limit) + 2}
	if ops.failedIndex && p.State == idemdriver.StateFailed {
		q, args = ops.listFailed, []any{p.Consumer, at, at, pos.Key, int64(p.Limit) + 1}
	}
	rows, err := db.Query(ctx, q, args...)
	if err != nil {
		return idemdriver.RecordPage{}, err
	}
	var (
		window []idemdriver.Record
		total  int64
	)
	err = ForEach(rows, func(row Row) error {
		r := idemdriver.Record{Consumer: p.Consumer}
		var (
			at, state, attempt int64
			leaseEnd           sql.NullInt64
			lastError          sql.NullString
		)
		if err := row.Scan(&r.MessageID, &r.Fingerprint, &at, &state, &r.Token, &attempt, &leaseEnd, &lastError, &total); err != nil {
			return err
		}
		r.ProcessedAt, r.State, r.Attempt = Time(at), idemdriver.RecordState(state), int(attempt)
		if leaseEnd.Valid && r.State == idemdriver.StateInProgress {
			r.LeaseExpiresAt = Time(leaseEnd.Int64)
		}
		r.Error = lastError.String
		window = append(window, r)
		return nil
	})
	if err != nil {
		return idemdriver.RecordPage{}, err
	}
	// listFailed's total is 0: its rows are every failed record after the
	// position, up to the limit and one more.
	return idemdriver.PageRecords(window, p, total == int64(p.Scan)), nil
}

// RetryRecord runs the retry of idemdriver.Operator: one UPDATE of a
// failed record; when it changed nothing, the record is read to say why.
func (ops *Ops) RetryRecord(ctx context.Context, db Querier, consumer, messageID string) (idemdriver.ActionResult, error) {
	if err := idemdriver.ValidateKey(consumer, messageID); err != nil {
		return idemdriver.ActionResult{}, err
	}
	n, err := db.Exec(ctx, ops.retry, consumer, messageID)
	if err != nil {
		return idemdriver.ActionResult{}, err
	}
	rec, err := Inspect(ctx, db, ops.inspect, ops.table, consumer, messageID)
	if err != nil {
		return idemdriver.ActionResult{}, err
	}
	if n == 0 && rec.State != idemdriver.StateInProgress {
		return idemdriver.ActionResult{}, fmt.Errorf("%w: consumer %q, message ID %q is %s; only a failed record can be retried", idemdriver.ErrWrongState, consumer, messageID, rec.State)
	}
	return idemdriver.ActionResult{Changed: n > 0, Record: rec}, nil
}

// ReleaseLease runs the release of idemdriver.Operator: one UPDATE fenced
// by the token; when it changed nothing, the record is read to say why.
func (ops *Ops) ReleaseLease(ctx context.Context, db Querier, p *idemdriver.ReleaseLeaseParams) (idemdriver.ActionResult, error) {
	if err := idemdriver.ValidateReleaseLeaseParams(p); err != nil {
		return idemdriver.ActionResult{}, err
	}
	n, err := db.Exec(ctx, ops.release, p.Consumer, p.MessageID, p.Token)
	if err != nil {
		return idemdriver.ActionResult{}, err
	}
	return actionResult(ctx, db, ops.inspect, ops.table, p.Consumer, p.MessageID, n, func(rec idemdriver.Record) error {
		return idemdriver.CheckRelease(rec, p.Token)
	})
}

// actionResult reads the record after an action that changed n rows with
// the Inspect statement query; when it changed none, check says whether
// that is an error (the action does not apply) or an earlier call's doing.
func actionResult(ctx context.Context, db Querier, query, table, consumer, id string, n int64, check func(idemdriver.Record) error) (idemdriver.ActionResult, error) {
	rec, err := Inspect(ctx, db, query, table, consumer, id)
	if err != nil {
		return idemdriver.ActionResult{}, err
	}
	if n == 0 {
		if err := check(rec); err != nil {
			return idemdriver.ActionResult{}, err
		}
	}
	return idemdriver.ActionResult{Changed: n > 0, Record: rec}, nil
}

// OutboxFailures runs the grouping of idemdriver.OutboxOperator.
func (ops *Ops) OutboxFailures(ctx context.Context, db Querier, limit int) ([]idemdriver.FailureGroup, error) {
	if err := idemdriver.ValidatePageLimit(limit); err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, ops.failures, int64(limit))
	if err != nil {
		return nil, err
	}
	var out []idemdriver.FailureGroup
	err = ForEach(rows, func(r Row) error {
		var (
			g              idemdriver.FailureGroup
			newest, oldest int64
		)
		if err := r.Scan(&g.Error, &g.Count, &newest, &oldest); err != nil {
			return err
		}
		g.Newest, g.Oldest = Time(newest), Time(oldest)
		out = append(out, g)
		return nil
	})
	return out, err
}

// ListFailedOutgoing runs the list of idemdriver.OutboxOperator.
func (ops *Ops) ListFailedOutgoing(ctx context.Context, db Querier, p *idemdriver.ListOutgoingParams) (idemdriver.OutgoingPage, error) {
	pos, err := idemdriver.ValidateListOutgoingParams(p)
	if err != nil {
		return idemdriver.OutgoingPage{}, err
	}
	at := Micros(pos.At)
	q, args := ops.failed, []any{at, at, pos.Key, int64(p.Limit) + 1}
	if p.Error != "" {
		q, args = ops.failedOf, []any{at, at, pos.Key, p.Error, int64(p.Limit) + 1}
	}
	rows, err := db.Query(ctx, q, args...)
	if err != nil {
		return idemdriver.OutgoingPage{}, err
	}
	var page idemdriver.OutgoingPage
	err = ForEach(rows, func(r Row) error {
		var (
			f                idemdriver.FailedOutgoing
			headers          string
			created, failure int64
		)
		if err := r.Scan(&f.ID, &f.Seq, &f.Consumer, &f.SourceID, &f.Destination, &f.Key,
			&f.Payload, &headers, &f.Attempts, &created, &failure, &f.Error); err != nil {
			return err
		}
		f.CreatedAt, f.FailedAt, f.Headers = Time(created), Time(failure), DecodeHeaders(headers)
		page.Rows = append(page.Rows, f)
		return nil
	})
	if err != nil {
		return idemdriver.OutgoingPage{}, err
	}
	if len(page.Rows) > p.Limit {
		page.Rows = page.Rows[:p.Limit]
		last := page.Rows[p.Limit-1]
		page.Next = idemdriver.EncodeCursor(last.FailedAt, last.ID)
	}
	return page, nil
}

// RetryOutgoing runs the retry of idemdriver.OutboxOperator: one UPDATE
// of a failed row; when it changed nothing, the row is read to say why.
func (ops *Ops) RetryOutgoing(ctx context.Context, db Querier, id string) (idemdriver.ActionResult, error) {
	if err := idemdriver.ValidateMessageID(id, 0); err != nil {
		return idemdriver.ActionResult{}, err
	}
	n, err := db.Exec(ctx, ops.retryOut, id)
	if err != nil {
		return idemdriver.ActionResult{}, err
	}
	var (
		consumer string
		state    int64
	)
	err = db.QueryRow(ctx, ops.outState, id).Scan(&consumer, &state)
	if errors.Is(err, ErrNoRows) {
		return idemdriver.ActionResult{}, fmt.Errorf("%w: outbox row %q", idemdriver.ErrNotFound, id)
	}
	if err != nil {
		return idemdriver.ActionResult{}, err
	}
	res := idemdriver.ActionResult{Changed: n > 0, Record: idemdriver.Record{Consumer: consumer, MessageID: id}}
	if n == 0 && state == 2 {
		return idemdriver.ActionResult{}, fmt.Errorf("%w: outbox row %q was sent; only a failed row can be retried", idemdriver.ErrWrongState, id)
	}
	return res, nil
}
