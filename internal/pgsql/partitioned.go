package pgsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/sqlstore"
)

// Partitioned holds the statements of a processed-messages table in the
// partitioned layout (sqlschema.PostgresPartitioned): range-partitioned by
// processed_at, one partition per bucket, with (consumer, message_id)
// made unique by a transaction-scoped advisory lock per key instead of a
// primary key (which must contain processed_at).
//
// A claim is two statements in the claim's transaction: ClaimLock, which
// waits for the key's lock (under the claim's lock timeout), then
// PartClaim, which looks the key up in every partition and inserts it
// into the partition of now() when no partition has it. The second
// statement's READ COMMITTED snapshot is taken after the lock is held, so
// it sees the record of any transaction that held the lock before, which
// has committed or rolled back by then.
type Partitioned struct {
	// Table is the parent table as written in SQL.
	Table string
	// ClaimLock: key (bigint), lock timeout (ms as text, or NULL) ->
	// transaction_isolation. Waits for the key's transaction-scoped
	// advisory lock with lock_timeout set to the parameter for that wait
	// alone.
	ClaimLock string
	// BatchLock: bigint[] of keys, lock timeout -> transaction_isolation;
	// takes every key's lock in ascending key order (so that batches with
	// shared keys do not deadlock).
	BatchLock string
	// Claim: consumer, message ID, fingerprint -> claimed, fingerprint,
	// state, as Queries.Claim, always one row.
	Claim string
	// ClaimBatch: consumer, text[] of IDs, bytea[] of fingerprints -> one
	// row (NULL, NULL, NULL) when every message was inserted, else one
	// (message ID, fingerprint, state) per message already recorded (the
	// others were inserted).
	// Its lookup probes every partition's key once per ID (recordsOf):
	// a new bucket's partition has no column statistics until autovacuum
	// analyzes it.
	ClaimBatch string
	// SetHorizon: consumer, horizon (µs): raises the consumer's recorded
	// purge horizon.
	SetHorizon string
	// Partitions: parent table -> partition name (as written in SQL),
	// lower and upper bounds (µs), detach pending; by upper bound.
	Partitions string
	// Exists: name -> whether the relation exists.
	Exists string
}

// NewPartitioned returns the statements of the partitioned table t
// (validated by sqlschema.ParseTable).
func NewPartitioned(t string) *Partitioned {
	return &Partitioned{
		Table: t,
		ClaimLock: `SELECT set_config('lock_timeout', s.saved, true) IS NULL, current_setting('transaction_isolation')
FROM (SELECT a.saved, pg_advisory_xact_lock($1::bigint) FROM (
	SELECT saved, set_config('lock_timeout', COALESCE($2::text, saved), true) FROM (SELECT current_setting('lock_timeout') AS saved OFFSET 0) AS x OFFSET 0
) AS a OFFSET 0) AS s`,
		BatchLock: `SELECT set_config('lock_timeout', a.saved, true) IS NULL, current_setting('transaction_isolation')
FROM (
	SELECT saved, set_config('lock_timeout', COALESCE($2::text, saved), true) FROM (SELECT current_setting('lock_timeout') AS saved OFFSET 0) AS x OFFSET 0
) AS a, LATERAL (
	SELECT count(*) FROM (SELECT pg_advisory_xact_lock(k) FROM (SELECT k FROM unnest($1::bigint[]) AS k ORDER BY k OFFSET 0) AS ks OFFSET 0) AS l
	WHERE a.saved IS NOT NULL
) AS locks`,
		Claim: `WITH cur AS MATERIALIZED (
	SELECT fingerprint, state FROM ` + t + ` WHERE consumer = $1::text AND message_id = $2::text LIMIT 1
), ins AS (
	INSERT INTO ` + t + ` (consumer, message_id, fingerprint)
	SELECT $1::text, $2::text, $3::bytea WHERE NOT EXISTS (SELECT FROM cur)
	RETURNING 1
)
SELECT true, NULL::bytea, NULL::smallint FROM ins
UNION ALL
SELECT false, fingerprint, state FROM cur`,
		ClaimBatch: `WITH cur AS MATERIALIZED (
	SELECT r.message_id, r.fingerprint, r.state FROM ` + recordsOf(t, `$2::text[]`) + `
), ins AS (
	INSERT INTO ` + t + ` (consumer, message_id, fingerprint)
	SELECT $1::text, u.id, u.fp FROM unnest($2::text[], $3::bytea[]) AS u(id, fp)
	WHERE NOT EXISTS (SELECT FROM cur WHERE cur.message_id = u.id)
)
SELECT NULL::text, NULL::bytea, NULL::smallint WHERE NOT EXISTS (SELECT FROM cur)
UNION ALL
SELECT message_id, fingerprint, state FROM cur`,
		SetHorizon: `INSERT INTO ` + t + `_horizons AS h (consumer, horizon) VALUES ($1::text, ` + TimeParam(`$2`) + `)
ON CONFLICT (consumer) DO UPDATE SET horizon = GREATEST(h.horizon, excluded.horizon)`,
		Partitions: `SELECT c.oid::regclass::text, ` + Micros(`b.m[1]::timestamptz`) + `, ` + Micros(`b.m[2]::timestamptz`) + `, i.inhdetachpending
FROM pg_inherits AS i
JOIN pg_class AS c ON c.oid = i.inhrelid,
LATERAL (SELECT regexp_match(pg_get_expr(c.relpartbound, c.oid), '^FOR VALUES FROM \(''([^'']+)''\) TO \(''([^'']+)''\)$') AS m) AS b
WHERE i.inhparent = $1::regclass AND b.m IS NOT NULL
ORDER BY 3`,
		Exists: `SELECT to_regclass($1::text) IS NOT NULL`,
	}
}

// ErrIsolation is returned by a claim on the partitioned layout in a
// transaction whose isolation level is not READ COMMITTED: its snapshot
// could be older than the commit of a concurrent claim of the same ID,
// which it waited for, and the ID would be claimed twice. Nothing was
// written; roll the transaction back.
var ErrIsolation = errors.New("idem: the partitioned layout claims only under READ COMMITTED")

// ErrNoPartition is returned by a claim on the partitioned layout when no
// partition covers the server's now(): the store creates partitions
// ahead (at Migrate, and whenever a consumer marks itself running), so it
// means none of that ran for longer than the partitions made ahead last.
// The transaction is aborted; nothing was claimed.
var ErrNoPartition = errors.New("idem: no partition of the processed-messages table covers now")

// checkViolation is the SQLSTATE of an INSERT that no partition accepts
// (and of CHECK violations, which validated claims cannot cause).
const checkViolation = "23514"

// WrapPartitioned marks err as WrapLockTimeout does, and a row that no
// partition accepts with ErrNoPartition.
func WrapPartitioned(err error) error {
	var st interface{ SQLState() string }
	if err != nil && errors.As(err, &st) && st.SQLState() == checkViolation && strings.Contains(err.Error(), "no partition") {
		return fmt.Errorf("%w: %w", ErrNoPartition, err)
	}
	return WrapLockTimeout(err)
}

// ClaimKey is the advisory lock key of consumer's message id on table:
// sqlstore.LockKey("claim", table, consumer, id).
func ClaimKey(table, consumer, id string) int64 {
	return sqlstore.LockKey("claim", table, consumer, id)
}

// ScanLock reads the row of ClaimLock or BatchLock: an error matching
// ErrIsolation unless the transaction is READ COMMITTED.
func ScanLock(row sqlstore.Row) error {
	var (
		null bool
		iso  string
	)
	if err := row.Scan(&null, &iso); err != nil {
		return err
	}
	if iso != "read committed" {
		return fmt.Errorf("%w (the transaction is %s)", ErrIsolation, iso)
	}
	return nil
}

// ScanPartClaim reads the row of Partitioned.Claim.
func ScanPartClaim(row sqlstore.Row) (idemdriver.ClaimResult, error) {
	res, settled, err := ScanClaim(row)
	if err == nil && !settled {
		err = errors.New("idem: partitioned claim returned no row")
	}
	return res, err
}

// ClaimTx claims p in tx (READ COMMITTED): ClaimLock then Claim. p must
// have been validated.
func (q *Partitioned) ClaimTx(ctx context.Context, tx sqlstore.Querier, p *idemdriver.ClaimParams) (idemdriver.ClaimResult, error) {
	err := ScanLock(tx.QueryRow(ctx, q.ClaimLock, ClaimKey(q.Table, p.Consumer, p.MessageID), LockTimeoutArg(p.LockTimeout)))
	if err != nil {
		return idemdriver.ClaimResult{}, WrapPartitioned(err)
	}
	res, err := ScanPartClaim(tx.QueryRow(ctx, q.Claim, p.Consumer, p.MessageID, p.Fingerprint))
	return res, WrapPartitioned(err)
}

// BatchKeys returns the lock keys of the messages of p, ascending.
func (q *Partitioned) BatchKeys(p *idemdriver.ClaimBatchParams) []int64 {
	keys := make([]int64, len(p.Messages))
	for i, m := range p.Messages {
		keys[i] = ClaimKey(q.Table, p.Consumer, m.MessageID)
	}
	slices.Sort(keys)
	return keys
}

// ClaimBatchTx claims the messages of p in tx (READ COMMITTED): BatchLock
// on every key, in ascending order, then one ClaimBatch, and returns one
// result per message in the order of p.Messages. p must have been
// validated (no ID twice).
func (q *Partitioned) ClaimBatchTx(ctx context.Context, tx sqlstore.Querier, p *idemdriver.ClaimBatchParams) ([]idemdriver.ClaimResult, error) {
	if err := ScanLock(tx.QueryRow(ctx, q.BatchLock, q.BatchKeys(p), LockTimeoutArg(p.LockTimeout))); err != nil {
		return nil, WrapPartitioned(err)
	}
	ids := make([]string, len(p.Messages))
	fps := make([][]byte, len(p.Messages))
	for i, m := range p.Messages {
		ids[i], fps[i] = m.MessageID, m.Fingerprint
	}
	rows, err := tx.Query(ctx, q.ClaimBatch, p.Consumer, ids, fps)
	if err != nil {
		return nil, WrapPartitioned(err)
	}
	res, err := q.ScanBatch(rows, p)
	return res, WrapPartitioned(err)
}

// ScanBatch reads the rows of ClaimBatch for p.
func (q *Partitioned) ScanBatch(rows sqlstore.Rows, p *idemdriver.ClaimBatchParams) ([]idemdriver.ClaimResult, error) {
	var got map[string]idemdriver.ClaimResult
	all := false
	err := sqlstore.ForEach(rows, func(r sqlstore.Row) error {
		var (
			id    sql.NullString
			fp    []byte
			state sql.NullInt64
		)
		if err := r.Scan(&id, &fp, &state); err != nil {
			return err
		}
		if !id.Valid {
			all = true
			return nil
		}
		if got == nil {
			got = make(map[string]idemdriver.ClaimResult, len(p.Messages))
		}
		got[id.String] = sqlstore.Existing(fp, state)
		return nil
	})
	switch {
	case err != nil:
		return nil, err
	case all:
		return sqlstore.AllClaimed(len(p.Messages)), nil
	}
	for _, m := range p.Messages {
		if _, ok := got[m.MessageID]; !ok {
			got[m.MessageID] = sqlstore.Claimed
		}
	}
	return sqlstore.InOrder(p, got)
}

// Bucket is one partition's range [Lo, Hi) of processed_at.
type Bucket struct {
	Lo, Hi time.Time
}

// BucketAt returns the bucket of length d (whole minutes) holding t,
// aligned on the Unix epoch.
func BucketAt(t time.Time, d time.Duration) Bucket {
	lo := time.UnixMicro(t.UnixMicro() - ((t.UnixMicro()%d.Microseconds())+d.Microseconds())%d.Microseconds()).UTC()
	return Bucket{Lo: lo, Hi: lo.Add(d)}
}

// PartitionName returns the name of b's partition of table t (schema
// kept): t + "_p" + the bucket's start as UTC YYYYMMDDhhmm.
func PartitionName(t string, b Bucket) string {
	return t + "_p" + b.Lo.UTC().Format("200601021504")
}

// literal renders t as a timestamptz literal.
func literal(t time.Time) string {
	return "'" + t.UTC().Format("2006-01-02 15:04:05.999999Z07:00") + "'::timestamptz"
}

// CreatePartition returns the statements that create b's partition of t
// without locking t exclusively: a standalone table like t, with its
// primary key and a CHECK constraint matching the bounds (so that ATTACH
// scans nothing), attached with ATTACH PARTITION (SHARE UPDATE EXCLUSIVE
// on t), after which the CHECK is dropped.
func CreatePartition(t, name string, b Bucket) []string {
	bare := name[strings.LastIndexByte(name, '.')+1:]
	return []string{
		`CREATE TABLE ` + name + ` (LIKE ` + t + ` INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`,
		`ALTER TABLE ` + name + ` ADD CONSTRAINT ` + bare + `_pkey PRIMARY KEY (consumer, message_id, processed_at)`,
		`ALTER TABLE ` + name + ` ADD CONSTRAINT ` + bare + `_bounds CHECK (processed_at >= ` + literal(b.Lo) + ` AND processed_at < ` + literal(b.Hi) + `)`,
		`ALTER TABLE ` + t + ` ATTACH PARTITION ` + name + ` FOR VALUES FROM (` + literal(b.Lo) + `) TO (` + literal(b.Hi) + `)`,
		`ALTER TABLE ` + name + ` DROP CONSTRAINT ` + bare + `_bounds`,
	}
}

// Blockers returns the statement that counts the consumers with records
// in partition p whose recorded horizon is missing or before the bound
// $1 (µs): the distinct consumers come from a loose index scan of the
// primary key (a recursive CTE, one index probe per consumer).
func (q *Partitioned) Blockers(p string) string {
	return `WITH RECURSIVE c AS (
	(SELECT consumer FROM ` + p + ` ORDER BY consumer LIMIT 1)
	UNION ALL
	SELECT (SELECT consumer FROM ` + p + ` WHERE consumer > c.consumer ORDER BY consumer LIMIT 1) FROM c WHERE c.consumer IS NOT NULL
)
SELECT count(*) FROM c LEFT JOIN ` + q.Table + `_horizons AS h ON h.consumer = c.consumer
WHERE c.consumer IS NOT NULL AND (h.horizon IS NULL OR h.horizon < ` + TimeParam(`$1`) + `)`
}

// CountIn returns the statement that counts consumer $1's records in
// partition p.
func CountIn(p string) string {
	return `SELECT count(*) FROM ` + p + ` WHERE consumer = $1::text`
}
