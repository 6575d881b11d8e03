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
// consumer name once, in the table <table>_consumers (key smallint, name
// text), and the processed table refers to it by consumer_key: its
// primary key is (consumer_key, message_id), its retention index
// (consumer_key, processed_at), and the name is in no row or index entry
// of it. The recovery points, runs and outbox tables keep the name.
//
// A smallint key makes the primary key's entry that of a hand-written
// table keyed by message ID alone: 8 bytes of header, 2 of key and the
// ID, rounded up to 8 bytes (48 bytes with a 36-character ID, against 56
// with a name of 3 to 10 bytes or an integer key). There are at most
// MaxConsumers keys.
//
// The per-message statements of v2 (claims, duplicate reads, lease
// statements, batches) take the consumer's key as their parameter: a
// Table resolves each name it is asked for once (resolve: a look-up, or
// an insert when the name is new) and keeps the key, so the statements
// probe nothing but the processed table. A key is kept only once its
// row is known to be committed: keys are never changed or deleted, so a
// committed key stays the name's for the table's life. The operator's
// statements (Inspect, Stats, the console's) take the name and find the
// key by a subquery (layout.key).

// layout is the shape of a processed table: v1 (the consumer name in
// each row) or v2 (consumer_key).
type layout struct {
	t  string
	v2 bool
	// point: the table has the column point (migration 016), where the
	// recovery point that a new record's acquisition saves is kept.
	point bool
}

// col is the consumer column.
func (l layout) col() string {
	if l.v2 {
		return `consumer_key`
	}
	return `consumer`
}

// key is the expression of the key of the consumer named by the text
// parameter c (v2), for the operator's statements: an uncorrelated
// subquery, which PostgreSQL runs once per statement (an InitPlan) as a
// probe of the consumers table's unique index on name, and whose value
// the planner does not see (see byKey). A name not in the table gives
// NULL.
func (l layout) key(c string) string {
	return `(SELECT key FROM ` + l.t + `_consumers WHERE name = ` + c + `::text)`
}

// val is the consumer column's value written for the consumer
// parameter c: the name (v1) or the key (v2).
func (l layout) val(c string) string {
	if l.v2 {
		return c + `::smallint`
	}
	return c + `::text`
}

// is is byKey's comparison of the consumer with the consumer parameter c
// (consumerIs; on v2 the key, hidden from the planner in the same way).
func (l layout) is(c string) string {
	if l.v2 {
		return `consumer_key = (SELECT ` + c + `::smallint)`
	}
	return consumerIs(c)
}

// nameIs is the comparison of the consumer with the text parameter c, a
// name, for the operator's statements (on v2 through the consumers
// table: key).
func (l layout) nameIs(c string) string {
	if l.v2 {
		return `consumer_key = ` + l.key(c)
	}
	return consumerIs(c)
}

// plain is the comparison of the consumer with name c as the purge and
// its count write it (v1: the parameter itself).
func (l layout) plain(c string) string {
	if l.v2 {
		return l.nameIs(c)
	}
	return `consumer = ` + c + `::text`
}

// byKey is the condition of the record of the consumer parameter c and
// message ID id (the package's byKey on v1).
func (l layout) byKey(c, id string) string {
	return l.is(c) + ` AND message_id = ` + id
}

// byName is byKey with the consumer's name as the text parameter c.
func (l layout) byName(c, id string) string {
	return l.nameIs(c) + ` AND message_id = ` + id
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
		batch, del, name = `consumer_key = $1::smallint`, `consumer_key = (SELECT $1::smallint)`, `$4`
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

// stepsRead is the statement that reads the recovery points of a record
// (consumer name $1, message ID $2): the rows of the steps table steps
// and, on v2, the point kept in the record (migration 016), which wins
// over a row of the same name. That point is the first write of the
// record's life (its insertion; Reopen clears it), so a step of its name
// saved later, which the steps table holds because no statement checks
// the column before it writes there, would have kept the point's empty
// result. Without the column (l.point false) the record's point is read
// from its row as JSON, NULL when there is none: a store that found the
// table before migration 016 and keeps those statements then still reads
// the points written by stores that found it after. On v1, which
// migration 016 never sees, only the steps table.
func (l layout) stepsRead(steps string) string {
	q := `SELECT step, result FROM ` + steps + ` WHERE consumer = $1::text AND message_id = $2::text`
	if !l.v2 {
		return q
	}
	point := `p.point`
	if !l.point {
		point = `to_jsonb(p) ->> 'point'`
	}
	rec := `(SELECT ` + point + ` AS point FROM ` + l.t + ` AS p WHERE ` + l.byName(`$1`, `$2::text`) + `)`
	return `SELECT s.step, s.result FROM ` + steps + ` AS s LEFT JOIN ` + rec + ` AS r ON r.point = s.step
WHERE s.consumer = $1::text AND s.message_id = $2::text AND r.point IS NULL
UNION ALL
SELECT r.point, ''::bytea FROM ` + rec + ` AS r WHERE r.point IS NOT NULL`
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

// MaxConsumers is the number of consumers a table of schema v2 can
// hold: their keys are smallint, 1 to 32,767, given in order; a key
// committed is never changed, deleted or given to another name.
const MaxConsumers = 32767

// ErrTooManyConsumers is returned (wrapped) by a statement of a consumer
// new to a table of schema v2 whose MaxConsumers keys are all given: the
// consumer's messages are not claimed (nothing is acknowledged). The
// consumers that have a key are not affected; a new one needs a table of
// its own (Config.Table).
var ErrTooManyConsumers = errors.New("the table has as many consumers as its smallint keys allow (32,767)")

// numericOutOfRange is PostgreSQL's SQLSTATE for a value out of its
// type's range: the key after MaxConsumers, in the consumers table's
// smallint column.
const numericOutOfRange = "22003"

// keyCache holds the keys of the consumer names a Table resolved, boxed
// once (a statement's consumer parameter): a map never changed once
// stored (a key is added by storing a copy), so that a look-up takes no
// lock and boxes nothing.
type keyCache struct {
	m  atomic.Pointer[map[string]any]
	mu sync.Mutex // serialises the copies of m
}

// get returns the boxed key of name, nil when not resolved (or c is
// nil: statements not made by a Table).
func (c *keyCache) get(name string) any {
	if c == nil {
		return nil
	}
	if m := c.m.Load(); m != nil {
		return (*m)[name]
	}
	return nil
}

// put keeps key (a boxed int16) as name's.
func (c *keyCache) put(name string, key any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	next := map[string]any{name: key}
	if m := c.m.Load(); m != nil {
		for n, k := range *m {
			next[n] = k
		}
	}
	c.m.Store(&next)
}

// Table is the statements of a processed table in each shape, and which
// shape the table has: found when a store first uses it (one catalog
// read), and again after Reset. A store keeps one Table for its life.
type Table struct {
	// v2 is schema v2 before migration 016, v2p after it (the point
	// column).
	v1, v2, v2p *Queries
	// cur is the shape found (v1, v2 or v2p), nil until found.
	cur atomic.Pointer[Queries]
	// ops are the operator statements of each shape, built on first use.
	ops1, ops2, ops2p func() *sqlstore.Ops
	// keys are the consumers' keys resolved (v2), those of committed
	// rows only.
	keys                  keyCache
	detect, resolve, name string
}

// NewTable returns the statements of table t (validated by
// sqlschema.ParseTable) in each shape; native sets NativeArrays on
// each.
func NewTable(t string, native bool) *Table {
	tb := &Table{v1: New(t), v2: newV2NoPoint(t), v2p: NewV2(t), name: t}
	tb.v1.NativeArrays, tb.v2.NativeArrays, tb.v2p.NativeArrays = native, native, native
	tb.v2.keys, tb.v2p.keys = &tb.keys, &tb.keys
	tb.ops1 = sync.OnceValue(func() *sqlstore.Ops { return Ops(t) })
	tb.ops2 = sync.OnceValue(func() *sqlstore.Ops { return opsV2(layout{t: t, v2: true}) })
	tb.ops2p = sync.OnceValue(func() *sqlstore.Ops { return OpsV2(t) })
	// Whether the table has each of the three columns (a table that does
	// not exist has none), and its row count as its statistics estimate
	// it (0 when never estimated: reltuples -1).
	tb.detect = `SELECT count(*) FILTER (WHERE attname = 'consumer'), count(*) FILTER (WHERE attname = 'consumer_key'), count(*) FILTER (WHERE attname = 'point'),
	COALESCE((SELECT GREATEST(reltuples, 0)::bigint FROM pg_class WHERE oid = to_regclass($1::text)), 0)
FROM pg_attribute WHERE attrelid = to_regclass($1::text) AND attname IN ('consumer', 'consumer_key', 'point') AND NOT attisdropped`
	// name -> (key, committed): the name's row, or a new one whose key
	// is the largest plus one (no sequence, so a transaction that rolls
	// back gives no key away: the next name takes it), committed false.
	// A row found is committed unless its inserting transaction is still
	// in progress, which for a row the statement can see means the
	// caller's own transaction (or a subtransaction of it): its xmin,
	// made a full transaction ID with the epoch of the snapshot's xmax
	// (the one within 2^31 of it: the caller's own ID may be above xmax),
	// is asked pg_xact_status (xmin 2, frozen, is committed). No row when
	// a concurrent transaction
	// inserted the name or took the key: the caller asks again. After
	// MaxConsumers the new key is out of smallint's range (22003).
	c := t + `_consumers`
	tb.resolve = `WITH found AS (
	SELECT key, xmin::text::bigint AS x FROM ` + c + ` WHERE name = $1::text
), ins AS (
	INSERT INTO ` + c + ` (key, name)
	SELECT COALESCE(max(key), 0) + 1, $1::text FROM ` + c + ` HAVING NOT EXISTS (SELECT FROM found)
	ON CONFLICT DO NOTHING
	RETURNING key
), snap AS (
	SELECT e, e - e % 4294967296 AS hi FROM (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS e) AS s
)
SELECT key, false FROM ins
UNION ALL
SELECT f.key, CASE WHEN f.x < 3 OR x8 < 3 THEN true ELSE pg_xact_status(x8::text::xid8) IS DISTINCT FROM 'in progress' END
FROM found AS f, snap, LATERAL (SELECT CASE
	WHEN snap.hi + f.x > snap.e + 2147483648 THEN snap.hi + f.x - 4294967296
	WHEN snap.hi + f.x <= snap.e - 2147483648 THEN snap.hi + f.x + 4294967296
	ELSE snap.hi + f.x END AS x8) AS x`
	return tb
}

// V1 returns the statements of schema v1, whatever the table's shape.
func (tb *Table) V1() *Queries { return tb.v1 }

// Reset forgets the table's shape and the consumers' keys, so that the
// next use finds them again: after a migration, or a statement that
// failed because the shape changed (ShapeChanged).
func (tb *Table) Reset() {
	tb.cur.Store(nil)
	tb.keys.m.Store(nil)
}

// Shape returns the statements of the table's shape, found with one
// catalog read on db when not known yet. A table that has neither
// column (it does not exist yet) gets v1's statements, unremembered. The
// same read takes the table's row estimate (pg_class.reltuples) into the
// statements' batchBase, from which the batch statements' plan
// generation counts (planGeneration).
func (tb *Table) Shape(ctx context.Context, db sqlstore.Querier) (*Queries, error) {
	if q := tb.cur.Load(); q != nil {
		return q, nil
	}
	var name, key, point, rows int64
	if err := db.QueryRow(ctx, tb.detect, tb.name).Scan(&name, &key, &point, &rows); err != nil {
		return nil, fmt.Errorf("table shape: %w", err)
	}
	q := tb.v1
	switch {
	case name == 0 && key == 1 && point == 1:
		q = tb.v2p
	case name == 0 && key == 1:
		q = tb.v2
	case name != 1:
		return q, nil
	}
	q.batchBase.Store(uint64(max(rows, 0)))
	tb.cur.Store(q)
	return q, nil
}

// Refresh finds the table's shape again with one catalog read on db,
// keeping the consumers' keys: for a statement that must not run in a
// shape found before a migration that added a column (Reopen, which
// clears the point column of migration 016; a store that found the
// table before it keeps its statements, which still work).
func (tb *Table) Refresh(ctx context.Context, db sqlstore.Querier) error {
	tb.cur.Store(nil)
	_, err := tb.Shape(ctx, db)
	return err
}

// Cached returns the statements of the table's shape for a statement of
// consumer when no round trip is needed for them (the shape is known,
// and on v2 the consumer's key), else nil: the hot paths try it before
// boxing a Querier for Queries.
func (tb *Table) Cached(consumer string) *Queries {
	q := tb.cur.Load()
	if q == nil || !q.V2 || tb.keys.get(consumer) != nil {
		return q
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

// Queries returns the statements of the table's shape (Shape) for
// statements of consumer, whose key it first resolves on v2 (Ensure), on
// db; with consumer "" (statements that take no key) it resolves
// nothing. committed tells that db runs each statement in a transaction
// of its own (a pool or a connection outside any transaction), so that
// a name it adds is there for good. On db, a transaction of the caller's,
// a key added by it (or by an earlier statement of it) is not kept: the
// statements returned then are for this call alone, with that key (which
// the transaction, should it roll back, gives back).
func (tb *Table) Queries(ctx context.Context, db sqlstore.Querier, consumer string, committed bool) (*Queries, error) {
	if q := tb.Cached(consumer); q != nil {
		return q, nil
	}
	q, err := tb.Shape(ctx, db)
	if err != nil || !q.V2 || consumer == "" {
		return q, err
	}
	key, kept, err := tb.ensure(ctx, db, consumer, committed)
	if err != nil || kept {
		return q, err
	}
	one := *q
	one.one = key
	return &one, nil
}

// Ensure resolves the key of consumer on a table of schema v2 (see
// Queries) unless this Table has it: one statement on db, which adds the
// name to the consumers table when it is new. The key is kept when its
// row is committed (found so, or added with committed set). It returns
// ErrTooManyConsumers (wrapped) when the name is new and every key is
// given.
func (tb *Table) Ensure(ctx context.Context, db sqlstore.Querier, consumer string, committed bool) error {
	if tb.keys.get(consumer) != nil {
		return nil
	}
	_, _, err := tb.ensure(ctx, db, consumer, committed)
	return err
}

// ensure is Ensure, returning the key (boxed int16) and whether it was
// kept.
func (tb *Table) ensure(ctx context.Context, db sqlstore.Querier, consumer string, committed bool) (any, bool, error) {
	for range sqlstore.MaxClaimAttempts {
		var (
			key   int16
			found bool
		)
		switch err := db.QueryRow(ctx, tb.resolve, consumer).Scan(&key, &found); {
		case errors.Is(err, sqlstore.ErrNoRows):
			continue // a concurrent transaction added the name or took the key
		case err != nil:
			var st interface{ SQLState() string }
			if errors.As(err, &st) && st.SQLState() == numericOutOfRange {
				return nil, false, fmt.Errorf("%w: consumer %q: %w", ErrTooManyConsumers, consumer, err)
			}
			return nil, false, fmt.Errorf("consumer key of %q: %w", consumer, err)
		}
		boxed := any(key)
		if found || committed {
			tb.keys.put(consumer, boxed)
			return boxed, true, nil
		}
		return boxed, false, nil
	}
	return nil, false, sqlstore.ErrUnsettled("consumer key", consumer)
}

// Ops returns the operator statements of the table's shape, found on db
// when not known yet (Shape).
func (tb *Table) Ops(ctx context.Context, db sqlstore.Querier) (*sqlstore.Ops, error) {
	q, err := tb.Shape(ctx, db)
	if err != nil {
		return nil, err
	}
	switch q {
	case tb.v2p:
		return tb.ops2p(), nil
	case tb.v2:
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
