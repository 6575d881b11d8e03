package pgsql

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/idem-go/idem/internal/sqlstore"
)

// Schema v2 (migrations 014 and 015 of the default layout) stores each
// consumer name once, in the table <table>_consumers (key integer, name
// text), and the processed table refers to it by consumer_key: its
// primary key is (consumer_key, message_id), its retention index
// (consumer_key, processed_at), and the name is in no row or index entry
// of it. The recovery points, runs and outbox tables keep the name.
//
// The statements of v2 take the consumer name as their parameter, as
// those of v1 do, and look its key up in the consumers table by a
// subquery (layout.key): every driver sends the same arguments on both
// shapes, and the processed table is written with the key a name has in
// the database, never with one a process remembered. A name must be in
// the consumers table before its first record is written:
// Table.Queries adds it (Ensure), once per name and process.

// layout is the shape of a processed table: v1 (the consumer name in
// each row) or v2 (consumer_key).
type layout struct {
	t  string
	v2 bool
}

// col is the consumer column.
func (l layout) col() string {
	if l.v2 {
		return `consumer_key`
	}
	return `consumer`
}

// key is the expression of the key of the consumer named by the text
// parameter c (v2): an uncorrelated subquery, which PostgreSQL runs once
// per statement (an InitPlan) as a probe of the consumers table's unique
// index on name, and whose value the planner does not see (see byKey).
// A name not in the table gives NULL.
func (l layout) key(c string) string {
	return `(SELECT key FROM ` + l.t + `_consumers WHERE name = ` + c + `::text)`
}

// val is the consumer column's value written for the name c.
func (l layout) val(c string) string {
	if l.v2 {
		return l.key(c)
	}
	return c + `::text`
}

// is is byKey's comparison of the consumer with name c (consumerIs).
func (l layout) is(c string) string {
	if l.v2 {
		return `consumer_key = ` + l.key(c)
	}
	return consumerIs(c)
}

// plain is the comparison of the consumer with name c as the purge and
// its count write it (v1: the parameter itself).
func (l layout) plain(c string) string {
	if l.v2 {
		return l.is(c)
	}
	return `consumer = ` + c + `::text`
}

// byKey is the condition of the record of consumer c and message ID id
// (the package's byKey on v1).
func (l layout) byKey(c, id string) string {
	return l.is(c) + ` AND message_id = ` + id
}

// recordsOf is the package's recordsOf in l's shape.
func (l layout) recordsOf(ids string) string {
	return `unnest(` + ids + `) AS u(id),
	LATERAL (SELECT message_id, fingerprint, state FROM ` + l.t + ` WHERE ` + l.byKey(`$1`, `u.id`) + ` LIMIT 1) AS r`
}

// purgeBatch is the statement of one batch of the purge, which deletes
// records of the table l.t and their recovery points on the table steps.
//
// One statement per batch: the batch (oldest first, skipping rows locked
// by others, so claims and other cleaners are never waited for), the
// records, and their recovery points. Purges never touch in_progress
// (state 1) records; a NULL state (a transactional record) is a completed
// one. The batch compares the consumer with the parameter itself, so that
// a custom plan sees the value and walks the retention index; both
// deletes compare it as byKey does (consumerIs): for a consumer rare in
// the statistics, the delete of recovery points otherwise compared every
// step of the consumer with the whole batch (84 s per batch at 200,000
// steps). On v2 the consumer's key is the first parameter (found by
// DeleteRows: behind a subquery the batch's plan would not see it, and
// read the whole table), and its name the fourth, for the recovery points.
func (l layout) purgeBatch(steps string) string {
	batch, del, name := `consumer = $1::text`, consumerIs(`$1`), `$1`
	if l.v2 {
		batch, del, name = `consumer_key = $1::integer`, `consumer_key = (SELECT $1::integer)`, `$4`
	}
	return `WITH batch AS (
	SELECT message_id FROM ` + l.t + `
	WHERE ` + batch + ` AND processed_at < ` + TimeParam(`$2`) + ` AND state IS DISTINCT FROM 1
	ORDER BY processed_at
	LIMIT $3::bigint
	FOR UPDATE SKIP LOCKED
), del AS (
	DELETE FROM ` + l.t + ` WHERE ` + del + ` AND message_id IN (SELECT message_id FROM batch)
	RETURNING message_id
), del_steps AS (
	DELETE FROM ` + steps + ` WHERE ` + consumerIs(name) + ` AND message_id IN (SELECT message_id FROM del)
)
SELECT count(*) FROM del`
}

// stats is the statement of Queries.Stats.
func (l layout) stats() string {
	if !l.v2 {
		return `SELECT consumer, count(*), ` + Micros(`min(processed_at)`) + `, ` + Micros(`max(processed_at)`) +
			` FROM ` + l.t + ` GROUP BY consumer ORDER BY consumer`
	}
	return `SELECT c.name, count(*), ` + Micros(`min(r.processed_at)`) + `, ` + Micros(`max(r.processed_at)`) +
		` FROM ` + l.t + ` r JOIN ` + l.t + `_consumers c ON c.key = r.consumer_key GROUP BY c.name ORDER BY c.name`
}

// Table is the statements of a processed table in both shapes, and which
// shape the table has: found when a store first uses it (one catalog
// read), and again after Reset. A store keeps one Table for its life.
type Table struct {
	v1, v2 *Queries
	// cur is the shape found (v1 or v2), nil until found.
	cur atomic.Pointer[Queries]
	// ops are the operator statements of each shape, built on first use.
	ops1, ops2 func() *sqlstore.Ops
	// known holds the consumer names known to be in the consumers table:
	// a map never changed once stored (a name is added by storing a
	// copy), so that a look-up takes no lock and boxes nothing.
	known                atomic.Pointer[map[string]struct{}]
	mu                   sync.Mutex // serialises the copies of known
	detect, ensure, name string
}

// NewTable returns the statements of table t (validated by
// sqlschema.ParseTable) in both shapes; native sets NativeArrays on
// both.
func NewTable(t string, native bool) *Table {
	tb := &Table{v1: New(t), v2: NewV2(t), name: t}
	tb.v1.NativeArrays, tb.v2.NativeArrays = native, native
	tb.ops1 = sync.OnceValue(func() *sqlstore.Ops { return Ops(t) })
	tb.ops2 = sync.OnceValue(func() *sqlstore.Ops { return OpsV2(t) })
	// Whether the table has each of the two columns; a table that does
	// not exist has neither.
	tb.detect = `SELECT count(*) FILTER (WHERE attname = 'consumer'), count(*) FILTER (WHERE attname = 'consumer_key')
FROM pg_attribute WHERE attrelid = to_regclass($1::text) AND attname IN ('consumer', 'consumer_key') AND NOT attisdropped`
	// One row, true, when the name was already there (committed before
	// the statement's snapshot, or inserted by a transaction it waited
	// for); false when this statement inserted it.
	tb.ensure = `INSERT INTO ` + t + `_consumers (name) VALUES ($1::text) ON CONFLICT (name) DO NOTHING`
	return tb
}

// V1 returns the statements of schema v1, whatever the table's shape.
func (tb *Table) V1() *Queries { return tb.v1 }

// Reset forgets the table's shape, so that the next use finds it again:
// after a migration, or a statement that failed because the shape
// changed (ShapeChanged).
func (tb *Table) Reset() { tb.cur.Store(nil) }

// Shape returns the statements of the table's shape, found with one
// catalog read on db when not known yet. A table that has neither
// column (it does not exist yet) gets v1's statements, unremembered.
func (tb *Table) Shape(ctx context.Context, db sqlstore.Querier) (*Queries, error) {
	if q := tb.cur.Load(); q != nil {
		return q, nil
	}
	var name, key int64
	if err := db.QueryRow(ctx, tb.detect, tb.name).Scan(&name, &key); err != nil {
		return nil, fmt.Errorf("table shape: %w", err)
	}
	switch {
	case name == 0 && key == 1:
		tb.cur.Store(tb.v2)
		return tb.v2, nil
	case name == 1:
		tb.cur.Store(tb.v1)
	}
	return tb.v1, nil
}

// Cached returns the statements of the table's shape for a statement of
// consumer when no round trip is needed for them (the shape is known,
// and on v2 the name is known to be in the consumers table), else nil:
// the hot paths try it before boxing a Querier for Queries.
func (tb *Table) Cached(consumer string) *Queries {
	q := tb.cur.Load()
	if q == nil || !q.V2 {
		return q
	}
	if known := tb.known.Load(); known != nil {
		if _, ok := (*known)[consumer]; ok {
			return q
		}
	}
	return nil
}

// Changed reports whether err is the failure of a statement of the other
// shape (ShapeChanged), and then forgets the shape (Reset), so that the
// caller's next Queries finds it again.
func (tb *Table) Changed(err error) bool {
	if ShapeChanged(err) {
		tb.Reset()
		return true
	}
	return false
}

// Queries returns the statements of the table's shape (Shape) for a
// statement of consumer, whose name it first adds to the consumers table
// on v2 (Ensure), on db; with consumer "" (a statement that writes no
// record) it adds nothing. committed tells that db runs each statement in
// a transaction of its own (a pool or a connection outside any
// transaction), so that a name it adds is there for good.
func (tb *Table) Queries(ctx context.Context, db sqlstore.Querier, consumer string, committed bool) (*Queries, error) {
	if q := tb.Cached(consumer); q != nil {
		return q, nil
	}
	q, err := tb.Shape(ctx, db)
	if err == nil && q.V2 && consumer != "" {
		err = tb.Ensure(ctx, db, consumer, committed)
	}
	return q, err
}

// Ensure adds consumer to the consumers table unless this Table knows it
// is there: one INSERT ... ON CONFLICT DO NOTHING on db, at most once per
// name and process. The name is remembered when the statement found it
// there, or when committed is set; a name added by a transaction of the
// caller's, which may still roll back, is looked for again next time.
func (tb *Table) Ensure(ctx context.Context, db sqlstore.Querier, consumer string, committed bool) error {
	if known := tb.known.Load(); known != nil {
		if _, ok := (*known)[consumer]; ok {
			return nil
		}
	}
	n, err := db.Exec(ctx, tb.ensure, consumer)
	if err != nil {
		return fmt.Errorf("consumer key of %q: %w", consumer, err)
	}
	if n == 0 || committed {
		tb.mu.Lock()
		defer tb.mu.Unlock()
		next := map[string]struct{}{consumer: {}}
		if known := tb.known.Load(); known != nil {
			for c := range *known {
				next[c] = struct{}{}
			}
		}
		tb.known.Store(&next)
	}
	return nil
}

// Ops returns the operator statements of the table's shape, found on db
// when not known yet (Shape).
func (tb *Table) Ops(ctx context.Context, db sqlstore.Querier) (*sqlstore.Ops, error) {
	q, err := tb.Shape(ctx, db)
	if err != nil {
		return nil, err
	}
	if q.V2 {
		return tb.ops2(), nil
	}
	return tb.ops1(), nil
}

// SQLSTATEs of a statement of the other shape: the column it names is
// not there (v1's consumer after migration 015), or its ON CONFLICT
// names columns no unique index has.
const (
	undefinedColumn = "42703"
	invalidConflict = "42P10"
)

// ShapeChanged reports whether err is the failure of a statement written
// for the other shape of the table: the migration to v2 ran while the
// store used v1's statements. The store then forgets the shape (Reset);
// where it began the transaction itself, it runs the statement again.
func ShapeChanged(err error) bool {
	if err == nil { // before st, whose address escapes: no allocation then
		return false
	}
	return shapeChanged(err)
}

// shapeChanged is ShapeChanged of an error.
func shapeChanged(err error) bool {
	var st interface{ SQLState() string }
	if !errors.As(err, &st) {
		return false
	}
	s := st.SQLState()
	return s == undefinedColumn || s == invalidConflict
}

// Retry runs f with the statements of tb's shape for consumer (Queries,
// on db, which runs each statement in a transaction of its own), and,
// when f fails because the shape changed under it (ShapeChanged), once
// more with the shape found again.
func Retry[T any](ctx context.Context, tb *Table, db sqlstore.Querier, consumer string, f func(q *Queries) (T, error)) (T, error) {
	for attempt := 0; ; attempt++ {
		q, err := tb.Queries(ctx, db, consumer, true)
		if err != nil {
			var zero T
			return zero, err
		}
		res, err := f(q)
		if attempt == 0 && ShapeChanged(err) {
			tb.Reset()
			continue
		}
		return res, err
	}
}

// InTx runs f with the statements of tb's shape for consumer in tx, a
// transaction of the caller's: when f fails because the shape changed
// under it, the shape is forgotten (Reset) and the error returned, the
// transaction being aborted; the next use finds the shape again.
func InTx[T any](ctx context.Context, tb *Table, tx sqlstore.Querier, consumer string, f func(q *Queries) (T, error)) (T, error) {
	q, err := tb.Queries(ctx, tx, consumer, false)
	if err != nil {
		var zero T
		return zero, err
	}
	res, err := f(q)
	if ShapeChanged(err) {
		tb.Reset()
	}
	return res, err
}

// WithOps runs f with the operator statements of tb's shape (Ops, found
// on db when not known), again once when the shape changed under it
// (Retry); db runs each statement in a transaction of its own.
func WithOps[T any](ctx context.Context, tb *Table, db sqlstore.Querier, f func(o *sqlstore.Ops) (T, error)) (T, error) {
	return Retry(ctx, tb, db, "", func(*Queries) (T, error) {
		o, err := tb.Ops(ctx, db)
		if err != nil {
			var zero T
			return zero, err
		}
		return f(o)
	})
}
