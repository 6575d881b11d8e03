package pgsql

import (
	"context"
	"encoding/hex"
	"fmt"
	"math/bits"
	"strconv"
	"sync/atomic"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/sqlstore"
)

// The lease batches (idemdriver.LeaseBatcher) are one statement each over
// arrays, one element per record, in the order the caller sorted them
// (sqlstore.AcquireOrder: by consumer name, then message ID, byte for
// byte), numbered from 1 (WITH ORDINALITY, u.ord). Each statement writes
// and locks its rows in that order, so two batches never wait for each
// other in a cycle. A record appears once in a statement: ON CONFLICT DO
// UPDATE cannot change a row twice in one statement, and a later
// element of the same record must see what the earlier one wrote, so a
// repeat runs after the batch, alone (see firsts).

// batchArrays are the parameters of a batch statement's arrays: the
// consumers' expression (v1 names, v2 keys; hidden) and a bytea array's
// type, either
// native (bytea[], for NativeArrays) or hex text in a text[] literal,
// which dec turns into bytea.
func batchArrays(l layout, native bool) (cs, bytea string, dec func(string) string) {
	cs = hidden(`$1::text[]`)
	if l.v2 {
		cs = hidden(`$1::smallint[]`)
	}
	if native {
		return cs, `bytea[]`, func(x string) string { return x }
	}
	return cs, `text[]`, func(x string) string { return `decode(` + x + `, 'hex')` }
}

// hidden is the array parameter expression p as an uncorrelated scalar
// subquery (an InitPlan), whose value the planner does not see, so that
// it estimates the rows of unnest as for a generic plan (10) whatever the
// batch's size. Given the arrays themselves (a custom plan: a
// statement's first five executions on a connection, every execution
// behind PgBouncer or with the simple protocol), it counted their
// elements and, for a batch of 64 on a table of 10,000 records, scanned
// the whole table (a hash join, or a sequential scan filtered on state =
// 1, which the statistics show rare) instead of probing the primary key
// per element: about 90k server instructions more per message, measured
// with callgrind.
func hidden(p string) string {
	return `(SELECT ` + p + `)`
}

// acquireBatch is the statement of AcquireBatch on l's table: the arrays
// $1 consumers (v1 names, v2 keys), $2 message IDs, $3 fingerprints, $4
// leases (µs); with steps (the recovery points table, "" for none) also
// $5 step prefixes (empty for none) and, on v2, $6 the consumers' names. It
// returns one row per element it judged, ord first, then the columns of
// the acquire statement (acquire): the elements inserted or taken over
// by the INSERT ... ON CONFLICT DO UPDATE (whose WHERE is acquire's,
// judged on the latest committed version of each row), then, in a branch
// skipped when the INSERT took every element (a one-time filter), the
// records of the others as of the statement's snapshot, with the
// remaining lease and whether the record is acquirable judged by
// clock_timestamp(), read after every lock wait of the INSERT (see the
// package doc's Clocks). An element the snapshot shows no record of (one
// inserted by a transaction the INSERT waited for) has no row; its
// Acquire runs again (AcquireFrom), as does one reported acquirable.
// With a step prefix, the element's recovery point prefix || token is
// saved when it is acquired, in the same statement: in the record's point
// column when the statement inserts it on a table with that column
// (l.point), else in the steps table.
func acquireBatch(l layout, steps string, native bool) string {
	cs, bytea, dec := batchArrays(l, native)
	arrays, cols, pick := cs+`, `+hidden(`$2::text[]`)+`, `+hidden(`$3::`+bytea)+`, `+hidden(`$4::bigint[]`), `c, m, fp, lease, ord`, `a.c, a.m, `+dec(`a.fp`)+` AS fp, a.lease`
	if steps != "" {
		arrays, cols, pick = arrays+`, `+hidden(`$5::text[]`), `c, m, fp, lease, pre, ord`, pick+`, a.pre`
		if l.v2 {
			arrays, cols, pick = arrays+`, `+hidden(`$6::text[]`), `c, m, fp, lease, pre, name, ord`, pick+`, a.name`
		} else {
			pick += `, a.c AS name`
		}
	}
	col := l.col()
	// With a point column, a new record's recovery point (token 1) is
	// kept in the record; a takeover's goes to the steps table.
	pointCol, pointVal, taken := "", "", ""
	if steps != "" && l.point {
		pointCol, pointVal, taken = `, point`, `, NULLIF(u.pre, '') || '1'`, ` AND won.token > 1`
	}
	q := `WITH u AS (
	SELECT ` + pick + `, a.ord FROM unnest(` + arrays + `) WITH ORDINALITY AS a(` + cols + `)
), up AS (
	INSERT INTO ` + l.t + ` AS r (` + col + `, message_id, fingerprint, processed_at, state, token, attempt, lease_expires_at` + pointCol + `)
	SELECT u.c, u.m, u.fp, now(), 1, 1, 1, now() + u.lease * interval '1 microsecond'` + pointVal + ` FROM u ORDER BY u.ord
	ON CONFLICT (` + col + `, message_id) DO UPDATE
	SET token = COALESCE(r.token, 0) + 1, attempt = COALESCE(r.attempt, 1) + 1, lease_expires_at = excluded.lease_expires_at,
		processed_at = excluded.processed_at, updated_at = NULL
	WHERE r.state = 1 AND r.lease_expires_at <= now() AND r.fingerprint = excluded.fingerprint
	RETURNING r.` + col + ` AS c, r.message_id AS m, r.token, r.attempt
), won AS (
	SELECT u.*, up.token, up.attempt FROM up JOIN u ON u.c = up.c AND u.m = up.m
)`
	if steps != "" {
		q += `, point AS (
	INSERT INTO ` + steps + ` (consumer, message_id, step, result, created_at)
	SELECT won.name::text, won.m, won.pre || won.token::text, ''::bytea, now() FROM won WHERE won.pre <> ''` + taken + `
	ON CONFLICT (consumer, message_id, step) DO NOTHING
)`
	}
	return q + `
SELECT ord, true, 0::bigint, token::bigint, attempt::bigint, NULL::bytea, 0::bigint, NULL::bytea, NULL::text, NULL::text, false FROM won
UNION ALL
SELECT u.ord, false, COALESCE(r.state, 2)::bigint, COALESCE(r.token, 0), COALESCE(r.attempt, 1)::bigint, r.fingerprint,
	CASE WHEN r.state = 1 AND r.lease_expires_at > now()
	THEN GREATEST(` + Micros(`r.lease_expires_at`) + ` - ` + Micros(`GREATEST(clock_timestamp(), r.updated_at, r.processed_at)`) + `, 0) ELSE 0 END,
	r.result, r.content_type, r.last_error,
	COALESCE(r.state = 1 AND r.lease_expires_at <= clock_timestamp() AND r.fingerprint = u.fp, false)
FROM u JOIN ` + l.t + ` AS r ON r.` + col + ` = u.c AND r.message_id = u.m
WHERE (SELECT count(*) FROM up) < cardinality($2::text[]) AND NOT EXISTS (SELECT FROM won WHERE won.ord = u.ord)`
}

// completeBatch is the statement of CompleteBatch on l's table: the
// arrays $1 consumers (v1 names, v2 keys), $2 message IDs, $3 tokens, $4
// results, $5 content types; one row, ord, per element completed (its
// token owned the record, in_progress). The rows are locked first, in
// the order of the elements (FOR UPDATE after ORDER BY), each judged
// again on its latest committed version when it waits for another
// transaction (READ COMMITTED), then updated as Complete updates one.
func completeBatch(l layout, native bool) string {
	cs, bytea, dec := batchArrays(l, native)
	col := l.col()
	return `WITH u AS (
	SELECT a.c, a.m, a.tok, ` + dec(`a.res`) + ` AS res, a.ct, a.ord
	FROM unnest(` + cs + `, ` + hidden(`$2::text[]`) + `, ` + hidden(`$3::bigint[]`) + `, ` + hidden(`$4::`+bytea) + `, ` + hidden(`$5::text[]`) + `) WITH ORDINALITY AS a(c, m, tok, res, ct, ord)
), l AS (
	SELECT r.` + col + ` AS c, r.message_id AS m, u.tok, u.res, u.ct, u.ord FROM ` + l.t + ` AS r
	JOIN u ON r.` + col + ` = u.c AND r.message_id = u.m
	WHERE r.state = 1 AND r.token = u.tok
	ORDER BY u.ord
	FOR UPDATE OF r
)
UPDATE ` + l.t + ` AS r SET state = 2, result = l.res, content_type = l.ct,
	lease_expires_at = now(), processed_at = now(), updated_at = NULL
FROM l WHERE r.` + col + ` = l.c AND r.message_id = l.m AND r.state = 1 AND r.token = l.tok
RETURNING l.ord`
}

// batchTexts are a batch statement's two texts: with the arrays as
// literals in strings (plain) and as native arrays (NativeArrays); gen
// holds both for the latest plan generation asked for (planGeneration).
type batchTexts struct {
	plain, native string
	gen           *atomic.Pointer[genTexts] // shared by copies of the Queries
}

// newBatchTexts returns the batchTexts of plain and native.
func newBatchTexts(plain, native string) batchTexts {
	return batchTexts{plain: plain, native: native, gen: new(atomic.Pointer[genTexts])}
}

// genTexts are a batchTexts' texts for plan generation g.
type genTexts struct {
	g             int
	plain, native string
}

// get returns the text for q's NativeArrays in q's plan generation.
func (b *batchTexts) get(q *Queries) string {
	g := q.planGeneration()
	t := b.gen.Load()
	if t == nil || t.g != g {
		t = &genTexts{g: g, plain: b.plain + planComment(g), native: b.native + planComment(g)}
		b.gen.Store(t)
	}
	if q.NativeArrays {
		return t.native
	}
	return t.plain
}

// A batch statement joins its arrays with the table by key. PostgreSQL
// plans a prepared statement's generic plan once (at its sixth execution
// on a connection) and keeps it until something invalidates it, such as
// an ANALYZE of the table. On a new table that plan is made while the
// table holds a few hundred rows, when a hash join over a sequential
// scan is cheaper than a probe of the primary key per element, and it
// stays while the table grows until autovacuum first analyzes it: every
// CompleteBatch then read the whole table (measured at 30,000 records:
// ~100 µs of server time a row instead of ~25). So the batch statements
// carry a comment naming a plan generation, which changes as the records
// the table is known to hold double from 1,024 up to
// 1,024 << (maxPlanGeneration-1): a new text is a new prepared statement
// (for pgx's statement cache, and for PgBouncer's), planned afresh for
// the table's size then. The records known are those the table's
// statistics counted when this process first found its shape (the
// planner's own estimate) plus those this process acquired in batches
// since: a table already large when the process starts is not planned
// again until it doubles (every new generation costs each connection a
// parse and six plans of each statement, the first five custom), and
// not past the last generation; PostgreSQL's own statistics of
// statements (pg_stat_statements' queryid ignores comments) see one
// statement.
const maxPlanGeneration = 12

// planGeneration is q's plan generation: 0 while the records known
// (batchBase + batchWrites) are fewer than 1,024, then one more at each
// doubling, at most maxPlanGeneration.
func (q *Queries) planGeneration() int {
	return min(bits.Len64((q.batchBase.Load()+q.batchWrites.Load())>>10), maxPlanGeneration)
}

// planComment is the comment that ends a batch statement of plan
// generation g: none for 0.
func planComment(g int) string {
	if g == 0 {
		return ""
	}
	return "\n-- idem plan generation " + strconv.Itoa(g)
}

// firsts splits order (indexes of elements sorted by key, see
// sqlstore.AcquireOrder) into the first element of each key, which the
// batch statement judges, and the repeats of a key already in it, which
// run after the statement, alone, in order: each then sees what the
// earlier elements of its record wrote, as the single calls in order
// would.
func firsts(order []int, key func(i int) (string, string)) (first, repeats []int) {
	first = make([]int, 0, len(order))
	for k, i := range order {
		if k > 0 {
			c0, m0 := key(order[k-1])
			if c, m := key(i); c == c0 && m == m0 {
				repeats = append(repeats, i)
				continue
			}
		}
		first = append(first, i)
	}
	return first, repeats
}

// batchQueries returns the statements of the table's shape (Shape, on
// db) for a batch of the consumers of the elements order names (name),
// each consumer's key resolved first on schema v2 (Ensure, committed: db
// runs each statement in a transaction of its own).
func batchQueries(ctx context.Context, tb *Table, db sqlstore.Querier, order []int, name func(i int) string) (*Queries, error) {
	q, err := tb.Shape(ctx, db)
	if err != nil || !q.V2 {
		return q, err
	}
	for _, i := range order {
		if err := tb.Ensure(ctx, db, name(i), true); err != nil {
			return nil, err
		}
	}
	return q, nil
}

// consumerArray is the consumers parameter of a batch statement of q for
// the elements order names (name): their names (v1) or keys (v2), as a
// native array or a literal; op names the batch in an error.
func (q *Queries) consumerArray(order []int, name func(i int) string, op string) (any, error) {
	if !q.V2 {
		cs := make([]string, len(order))
		for k, i := range order {
			cs[k] = name(i)
		}
		if q.NativeArrays {
			return cs, nil
		}
		return TextArray(cs), nil
	}
	keys := make([]int64, len(order))
	for k, i := range order {
		key, ok := q.ConsumerArg(name(i)).(int16)
		if !ok {
			return nil, fmt.Errorf("idem: %s: consumer %q has no key", op, name(i))
		}
		keys[k] = int64(key)
	}
	if q.NativeArrays {
		return keys, nil
	}
	return int64Array(keys), nil
}

// textArray is a text[] parameter: ss itself for NativeArrays, else a
// literal (TextArray).
func (q *Queries) textArray(ss []string) any {
	if q.NativeArrays {
		return ss
	}
	return TextArray(ss)
}

// byteaArray is a bytea[] parameter: bs itself for NativeArrays, else a
// literal of their hex (which the statement decodes).
func (q *Queries) byteaArray(bs [][]byte) any {
	if q.NativeArrays {
		return bs
	}
	hs := make([]string, len(bs))
	for i, b := range bs {
		hs[i] = hex.EncodeToString(b)
	}
	return TextArray(hs)
}

// int64Param is a bigint[] parameter: ns itself for NativeArrays, else a
// literal.
func (q *Queries) int64Param(ns []int64) any {
	if q.NativeArrays {
		return ns
	}
	return int64Array(ns)
}

// AcquireBatch implements idemdriver.LeaseBatcher's AcquireBatch on db,
// which runs each statement in a transaction of its own: the elements of
// ps validated and sorted by key (sqlstore.AcquireOrder), then one
// statement (acquireBatch) for the first element of each record, in the
// table's shape (found again, and the statement run once more, when the
// shape changed under it), whose commit is the batch's; then, element by
// element, what a single Acquire does after its statement (AcquireFrom: a
// takeover's recovery points, or the statement again when its snapshot
// could not show the record), and the Acquire of a repeated record. An
// error of those is the element's, in errs, as is one of validation; an
// error of the statement is returned (nothing acquired).
func (tb *Table) AcquireBatch(ctx context.Context, db sqlstore.Querier, ps []*idemdriver.AcquireParams) ([]idemdriver.AcquireResult, []error, error) {
	order, errs, err := sqlstore.AcquireOrder(ps)
	if err != nil {
		return nil, nil, err
	}
	res := make([]idemdriver.AcquireResult, len(ps))
	if len(order) == 0 {
		return res, errs, nil
	}
	first, repeats := firsts(order, func(i int) (string, string) { return ps[i].Consumer, ps[i].MessageID })
	var rows []AcquireRow
	q, err := tb.batchRun(ctx, db, first, func(i int) string { return ps[i].Consumer }, func(q *Queries) (err error) {
		rows, err = q.acquireBatch(ctx, db, ps, first)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	for k, i := range first {
		res[i], errs[i] = q.AcquireFrom(ctx, db, ps[i], rows[k])
	}
	for _, i := range repeats {
		res[i], errs[i] = q.Acquire(ctx, db, ps[i])
	}
	return res, errs, nil
}

// batchRun runs f with the statements of the table's shape for a batch of
// the elements order names (batchQueries; name gives an element's
// consumer), and once more when f failed because the shape changed under
// it (Changed); it returns the statements of f's last run and its error.
func (tb *Table) batchRun(ctx context.Context, db sqlstore.Querier, order []int, name func(i int) string, f func(q *Queries) error) (*Queries, error) {
	for attempt := 0; ; attempt++ {
		q, err := batchQueries(ctx, tb, db, order, name)
		if err != nil {
			return nil, err
		}
		err = f(q)
		if attempt == 0 && tb.Changed(err) {
			continue
		}
		return q, err
	}
}

// acquireBatch runs the batch acquire statement of the elements order
// names of ps (one per record) on db and returns each one's row, in the
// order of order: sqlstore.ErrNoRows as its error when the statement
// returned none for it.
func (q *Queries) acquireBatch(ctx context.Context, db sqlstore.Querier, ps []*idemdriver.AcquireParams, order []int) ([]AcquireRow, error) {
	cs, err := q.consumerArray(order, func(i int) string { return ps[i].Consumer }, "lease batch")
	if err != nil {
		return nil, err
	}
	n := len(order)
	ids, fps, leases := make([]string, n), make([][]byte, n), make([]int64, n)
	var pres, names []string // the step prefixes and consumer names, when an element has a prefix
	for k, i := range order {
		p := ps[i]
		ids[k], fps[k], leases[k] = p.MessageID, p.Fingerprint, sqlstore.DurationMicros(p.Lease)
		if p.StepPrefix != "" && pres == nil {
			pres, names = make([]string, n), make([]string, n)
		}
	}
	query, args := q.acquireBatchTexts.get(q), []any{cs, q.textArray(ids), q.byteaArray(fps), q.int64Param(leases)}
	if pres != nil {
		for k, i := range order {
			pres[k], names[k] = ps[i].StepPrefix, ps[i].Consumer
		}
		query, args = q.acquireBatchStepTexts.get(q), append(args, q.textArray(pres))
		if q.V2 {
			args = append(args, q.textArray(names))
		}
	}
	out := make([]AcquireRow, n)
	for k := range out {
		out[k].err = sqlstore.ErrNoRows
	}
	q.batchWrites.Add(uint64(n))
	rows, err := db.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	var ord int64
	var a AcquireRow
	dest := a.r.ScanArgs(&ord, &a.won)
	err = sqlstore.ForEach(rows, func(r sqlstore.Row) error {
		a = AcquireRow{}
		if err := r.Scan(dest...); err != nil {
			return err
		}
		if ord < 1 || ord > int64(n) || out[ord-1].err == nil {
			return fmt.Errorf("idem: lease batch: row %d of %d", ord, n)
		}
		out[ord-1] = a
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// CompleteBatch implements idemdriver.LeaseBatcher's CompleteBatch on
// db, which runs each statement in a transaction of its own: the elements
// of ps validated and sorted by key (sqlstore.CompleteOrder), then one
// statement (completeBatch) that completes the first element of each
// record whose token owns it, in the table's shape (found again, and the
// statement run once more, when the shape changed under it); a repeated
// record's later elements then run alone (Complete), in order. Each
// element's error is nil when completed, ErrLeaseLost when its token does
// not own the record, or its validation's (a repeat's: its Complete's).
// An error of the statement is returned (nothing completed).
func (tb *Table) CompleteBatch(ctx context.Context, db sqlstore.Querier, ps []*idemdriver.CompleteParams) ([]error, error) {
	order, errs, err := sqlstore.CompleteOrder(ps)
	if err != nil || len(order) == 0 {
		return errs, err
	}
	first, repeats := firsts(order, func(i int) (string, string) { return ps[i].Consumer, ps[i].MessageID })
	q, err := tb.batchRun(ctx, db, first, func(i int) string { return ps[i].Consumer }, func(q *Queries) error {
		return q.completeBatch(ctx, db, ps, first, errs)
	})
	if err != nil {
		return nil, err
	}
	for _, i := range repeats {
		errs[i] = q.Complete(ctx, db, ps[i])
	}
	return errs, nil
}

// completeBatch runs the batch complete statement of the elements order
// names of ps (one per record) on db and sets each one's error in errs.
func (q *Queries) completeBatch(ctx context.Context, db sqlstore.Querier, ps []*idemdriver.CompleteParams, order []int, errs []error) error {
	cs, err := q.consumerArray(order, func(i int) string { return ps[i].Consumer }, "lease batch")
	if err != nil {
		return err
	}
	n := len(order)
	ids, toks, results, cts := make([]string, n), make([]int64, n), make([][]byte, n), make([]string, n)
	for k, i := range order {
		p := ps[i]
		ids[k], toks[k], results[k], cts[k] = p.MessageID, p.Token, sqlstore.NonNil(p.Result), p.ContentType
	}
	rows, err := db.Query(ctx, q.completeBatchTexts.get(q), cs, q.textArray(ids), q.int64Param(toks), q.byteaArray(results), q.textArray(cts))
	if err != nil {
		return err
	}
	done := make([]bool, n)
	err = sqlstore.ForEach(rows, func(r sqlstore.Row) error {
		var ord int64
		if err := r.Scan(&ord); err != nil {
			return err
		}
		if ord < 1 || ord > int64(n) || done[ord-1] {
			return fmt.Errorf("idem: lease batch: completion row %d of %d", ord, n)
		}
		done[ord-1] = true
		return nil
	})
	if err != nil {
		return err
	}
	for k, i := range order {
		errs[i] = nil
		if !done[k] {
			p := ps[i]
			errs[i] = sqlstore.LeaseLost("complete", p.Consumer, p.MessageID, p.Token)
		}
	}
	return nil
}
