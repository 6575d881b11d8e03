package pgsql

import (
	"strconv"

	"github.com/idem-go/idem/internal/sqlstore"
)

var pgKinds = map[string]string{"text": "text", "bytea": "bytea", "bigint": "bigint", "json": "jsonb"}

// Outbox returns the outbox statements on PostgreSQL for the outbox table
// table (the processed-messages table as configured, plus "_outbox"): one
// UPDATE ... RETURNING whose row selection is FOR UPDATE SKIP LOCKED, so
// relays side by side claim disjoint rows without waiting on each other.
func Outbox(table string) *sqlstore.Outbox {
	return sqlstore.NewOutbox(outboxDialect(table))
}

// OutboxNativeArrays is Outbox for a driver that encodes a []string
// argument as a text[] (pgx does; database/sql drivers need not): marking
// rows sent, or failed, is one statement with array parameters, whatever
// the number of rows, so that a driver's statement cache holds one
// statement for each instead of one per count of rows.
func OutboxNativeArrays(table string) *sqlstore.Outbox {
	d := outboxDialect(table)
	d.IDArray = `id = ANY($1::text[])`
	d.IDSeqArrays = `(id, seq) IN (SELECT v.id, v.seq FROM unnest($1::text[], $2::bigint[]) AS v(id, seq))`
	// The rows to mark are found from the arrays, one probe of the key per
	// row (o.id = v.id alone). With o.id = ANY ($1) beside it, statistics
	// taken while no row was pending (a relay that keeps up) made
	// PostgreSQL start from the outbox, take the rows to mark for one, and
	// read the arrays again for each: 0.6 to 1 s a call for 1,000 rows.
	d.MarkFailedArrays = `UPDATE ` + table + ` AS o SET lease_until = NULL, last_error = v.err,
	failed_at = CASE WHEN v.permanent THEN now() ELSE o.failed_at END,
	available_at = CASE WHEN v.permanent THEN o.available_at ELSE now() + v.retry * interval '1 microsecond' END
FROM unnest($1::text[], $2::bigint[], $3::boolean[], $4::bigint[], $5::text[], $6::bigint[]) AS v(id, attempt, permanent, retry, err, seq)
WHERE o.id = v.id AND o.attempts = v.attempt AND (v.seq = 0 OR o.seq = v.seq) AND o.sent_at IS NULL`
	// The failed rows of a round that holds their locks: its claim wrote
	// nothing, so the attempt is set here; the retry counts from
	// clock_timestamp(), the publish having taken part of the
	// transaction. Found by ID (the primary key), checked by seq.
	d.RoundFailedArrays = `UPDATE ` + table + ` AS o SET lease_until = NULL, attempts = v.attempt, last_error = v.err,
	failed_at = CASE WHEN v.permanent THEN now() ELSE o.failed_at END,
	available_at = CASE WHEN v.permanent THEN o.available_at ELSE clock_timestamp() + v.retry * interval '1 microsecond' END
FROM unnest($1::text[], $2::bigint[], $3::boolean[], $4::bigint[], $5::text[], $6::bigint[]) AS v(id, attempt, permanent, retry, err, seq)
WHERE o.id = v.id AND o.seq = v.seq AND o.sent_at IS NULL`
	d.RoundBound = `(SELECT set_config('idle_in_transaction_session_timeout', $2::text, true)) IS NOT NULL`
	return sqlstore.NewOutbox(d)
}

func outboxDialect(table string) sqlstore.OutboxDialect {
	return sqlstore.OutboxDialect{
		Table: table,
		Param: func(i int, kind string) string {
			return "$" + strconv.Itoa(i) + "::" + pgKinds[kind]
		},
		Now:             `now()`,
		Plus:            func(p string) string { return `(now() + ` + p + ` * interval '1 microsecond')` },
		Minus:           func(p string) string { return `(now() - ` + p + ` * interval '1 microsecond')` },
		LeaseEnd:        func(p string) string { return `(clock_timestamp() + ` + p + ` * interval '1 microsecond')` },
		Micros:          Micros,
		HeadersOut:      `headers::text`,
		TextOut:         `::text`,
		IgnoreDuplicate: ` ON CONFLICT (id) DO NOTHING`,
		HeadersDefault:  true, // jsonb NOT NULL DEFAULT '{}' (migration 004)
		SkipLocked:      ` FOR UPDATE SKIP LOCKED`,
		// The outbox trigger stays silent in a transaction that set
		// idem.outbox_quiet (migration 005); set_config returns the
		// value it set.
		Quiet: `set_config('idem.outbox_quiet', 'on', true) = 'on'`,
		// The key index of migration 011: the hash of the key, then seq,
		// for the rows pending with a key (predicate and expression as
		// the index spells them). On a table migrated only to 010 the
		// same condition runs on migration 007's index on (destination,
		// order_key, seq), whose predicate it implies too.
		KeyPending: `hashtextextended(p.order_key, 0) = hashtextextended(o.order_key, 0) AND p.order_key <> '' AND COALESCE(p.sent_at, p.failed_at) IS NULL`,
	}
}

// OutboxChannel is the LISTEN/NOTIFY channel of the outbox of the
// processed-messages table whose bare name is name, quoted for LISTEN:
// the outbox table's insert trigger notifies it (see the migration).
func OutboxChannel(name string) string { return `"` + name + `_outbox"` }
