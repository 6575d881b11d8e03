package idempgxv5

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/sqlschema"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// finishTimeout bounds a rollback or an unlock that runs after the caller's
// context has ended, so a connection is never handed back to the pool in an
// unknown state.
const finishTimeout = 10 * time.Second

// maxClaimAttempts bounds how often one claim is re-run when its record
// vanished between the conflict and the read of its fingerprint (a purge
// deleted it in that instant). In practice the first attempt settles.
const maxClaimAttempts = 3

// Config configures a [Store]. The zero value (or a nil *Config) is valid.
type Config struct {
	// Table is the processed-messages table: an identifier or
	// schema.identifier of letters, digits and underscores, at most 48 bytes
	// each, never quoted. Migrate creates it, and the table that records the
	// applied migrations, named Table + "_migrations". Defaults to
	// "idem_processed".
	Table string
}

// Store is an [idemdriver.TxStore] for PostgreSQL on pgx v5. The transactions it
// hands to handlers are ordinary pgx transactions (*pgxpool.Tx) on the
// Store's pool. It also implements [idemdriver.BeginClaimer] (begin and claim in
// one round trip), [idemdriver.Migrator], and [idemdriver.LeaseStore] for
// [idem.LeaseConsumer] (lease mode, on the same table; see the package
// doc).
//
// A handler uses the transaction it is given for its writes and leaves
// ending it to the Consumer: a handler that commits or rolls it back
// itself makes the Consumer's Commit fail with pgx.ErrTxClosed.
//
// A Store is safe for concurrent use. It owns no goroutine and nothing to
// close: the caller owns the pool.
type Store struct {
	pool  *pgxpool.Pool
	table sqlschema.Table
	q     queries
	lq    leaseQueries
}

// Interface checks.
var (
	_ idemdriver.TxStore[pgx.Tx]      = (*Store)(nil)
	_ idemdriver.BeginClaimer[pgx.Tx] = (*Store)(nil)
	_ idemdriver.Migrator             = (*Store)(nil)
)

// queries holds the statements of one Store, with its table name filled in
// once so that pgx's statement cache sees the same text on every call.
type queries struct {
	claim, claimBatch, fingerprint, fingerprints           string
	horizon, purgeCount, purgeBatch, inspect, stats, migTb string
}

func newQueries(t string) queries {
	return queries{
		// One statement claims and, on a conflict with a committed row,
		// reads its fingerprint and state (a lease-mode record of the same
		// consumer may be in progress or failed): the data-modifying CTE's insert is not
		// visible to the outer SELECT, whose snapshot shows only rows
		// committed before the statement began. A row committed by a
		// concurrent transaction this one waited for is not in that
		// snapshot (READ COMMITTED): the fingerprint comes back NULL and a
		// follow-up SELECT, with a new snapshot, reads it. The lookup sits
		// in a CASE branch, an InitPlan that PostgreSQL runs only when the
		// insert did nothing, so a new message costs the INSERT alone,
		// whatever plan the lookup has.
		claim: `WITH ins AS (
	INSERT INTO ` + t + ` (consumer, message_id, fingerprint)
	VALUES ($1::text, $2::text, $3::bytea)
	ON CONFLICT (consumer, message_id) DO NOTHING
	RETURNING 1
)
SELECT EXISTS (SELECT FROM ins),
	CASE WHEN EXISTS (SELECT FROM ins) THEN NULL
	ELSE (SELECT fingerprint FROM ` + t + ` WHERE consumer = $1::text AND message_id = $2::text) END,
	CASE WHEN EXISTS (SELECT FROM ins) THEN NULL
	ELSE (SELECT state FROM ` + t + ` WHERE consumer = $1::text AND message_id = $2::text) END`,
		// The batch version: one row with a NULL message_id when every
		// message was inserted (the common case: nothing else is sent);
		// otherwise the inserted IDs with a NULL fingerprint and the
		// committed records' IDs with their fingerprints and states. The lookup is skipped (a
		// one-time filter) when every message was inserted.
		claimBatch: `WITH ins AS (
	INSERT INTO ` + t + ` (consumer, message_id, fingerprint)
	SELECT $1::text, u.id, u.fp FROM unnest($2::text[], $3::bytea[]) AS u(id, fp)
	ON CONFLICT (consumer, message_id) DO NOTHING
	RETURNING message_id
), n AS (
	SELECT count(*) = cardinality($2::text[]) AS all_claimed FROM ins
)
SELECT NULL::text, NULL::bytea, NULL::smallint WHERE (SELECT all_claimed FROM n)
UNION ALL
SELECT message_id, NULL::bytea, NULL::smallint FROM ins WHERE NOT (SELECT all_claimed FROM n)
UNION ALL
SELECT message_id, fingerprint, state FROM ` + t + `
WHERE consumer = $1::text AND message_id = ANY ($2::text[]) AND NOT (SELECT all_claimed FROM n)`,
		fingerprint:  `SELECT fingerprint, state FROM ` + t + ` WHERE consumer = $1::text AND message_id = $2::text`,
		fingerprints: `SELECT message_id, fingerprint, state FROM ` + t + ` WHERE consumer = $1::text AND message_id = ANY ($2::text[])`,
		horizon:      `SELECT max(processed_at) - $2::bigint * interval '1 microsecond' FROM ` + t + ` WHERE consumer = $1::text`,
		// Purges never touch in_progress (state 1) lease records.
		purgeCount: `SELECT count(*) FROM ` + t + ` WHERE consumer = $1::text AND processed_at < $2::timestamptz AND state <> 1`,
		// One statement per batch: the batch (oldest first, skipping rows
		// locked by others), the records, and their recovery points.
		purgeBatch: `WITH batch AS (
	SELECT message_id FROM ` + t + `
	WHERE consumer = $1::text AND processed_at < $2::timestamptz AND state <> 1
	ORDER BY processed_at
	LIMIT $3::bigint
	FOR UPDATE SKIP LOCKED
), del AS (
	DELETE FROM ` + t + ` WHERE consumer = $1::text AND message_id IN (SELECT message_id FROM batch)
	RETURNING message_id
), del_steps AS (
	DELETE FROM ` + t + `_steps WHERE consumer = $1::text AND message_id IN (SELECT message_id FROM del)
)
SELECT count(*) FROM del`,
		inspect: `SELECT consumer, message_id, fingerprint, processed_at, state, token, attempt, lease_expires_at, last_error
FROM ` + t + ` WHERE consumer = $1::text AND message_id = $2::text`,
		stats: `SELECT consumer, count(*), min(processed_at), max(processed_at) FROM ` + t + ` GROUP BY consumer ORDER BY consumer`,
		migTb: t + `_migrations`,
	}
}

// New returns a Store on pool. cfg may be nil. It returns an error matching
// [idem.ErrInvalidConfig] when pool is nil or cfg.Table is not a valid
// table name. New does not touch the database; call [Store.Migrate] (or
// `idem migrate`) to create the tables.
func New(pool *pgxpool.Pool, cfg *Config) (*Store, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: idempgxv5: nil pool", idem.ErrInvalidConfig)
	}
	if cfg == nil {
		cfg = &Config{}
	}
	table, err := sqlschema.ParseTable(cfg.Table)
	if err != nil {
		return nil, fmt.Errorf("%w: idempgxv5: %w", idem.ErrInvalidConfig, err)
	}
	return &Store{pool: pool, table: table, q: newQueries(table.Qualified), lq: newLeaseQueries(table.Qualified)}, nil
}

// Table returns the processed-messages table name, as written in SQL.
func (s *Store) Table() string { return s.table.Qualified }

// Begin implements [idemdriver.TxStore]: it begins a transaction on a connection
// acquired from the pool (pgxpool.Pool.Begin). The connection goes back to
// the pool at Commit or Rollback.
func (s *Store) Begin(ctx context.Context) (pgx.Tx, error) {
	return s.pool.Begin(ctx)
}

// BeginClaim implements [idemdriver.BeginClaimer]: it acquires a connection, and
// sends BEGIN and the claim of p as one pipelined pgx.Batch (pgx's
// Batch.BeginTx), so that beginning and claiming cost one network round
// trip. The result is that of [Store.Begin] followed by [Store.ClaimTx].
//
// On success the transaction is open, whatever the claim's result, and the
// caller commits or rolls it back. On error no transaction is left open:
// the transaction is rolled back (with a context detached from ctx) and the
// connection goes back to the pool, or is closed if its state is unknown.
func (s *Store) BeginClaim(ctx context.Context, p *idemdriver.ClaimParams) (pgx.Tx, idemdriver.ClaimResult, error) {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue(s.q.claim, p.Consumer, p.MessageID, p.Fingerprint)
	br := s.pool.SendBatch(ctx, b)
	tx := br.Tx()
	var (
		claimed bool
		fp      []byte
		state   *int16
	)
	_, err := br.Exec() // BEGIN
	if err == nil {
		err = br.QueryRow().Scan(&claimed, &fp, &state)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	res := claimResult(claimed, fp, state)
	if err == nil && !claimed && fp == nil {
		res, err = s.settle(ctx, tx, p)
	}
	if err != nil {
		abort(ctx, tx)
		return nil, idemdriver.ClaimResult{}, err
	}
	return tx, res, nil
}

// ClaimTx implements [idemdriver.TxStore]: one INSERT ... ON CONFLICT DO NOTHING
// in tx, which also returns the stored fingerprint of a committed record.
// tx may be any pgx transaction, including one the caller began itself
// (Consumer.ProcessTx): a duplicate raises no error inside the database, so
// tx stays usable. A claim that waited for a concurrent transaction which
// then committed reads the fingerprint with a second SELECT.
//
// Under REPEATABLE READ or SERIALIZABLE, a conflict with a row committed
// after tx's snapshot was taken is a serialization failure (SQLSTATE 40001)
// from PostgreSQL; retry the whole transaction.
func (s *Store) ClaimTx(ctx context.Context, tx pgx.Tx, p *idemdriver.ClaimParams) (idemdriver.ClaimResult, error) {
	var (
		claimed bool
		fp      []byte
		state   *int16
	)
	if err := tx.QueryRow(ctx, s.q.claim, p.Consumer, p.MessageID, p.Fingerprint).Scan(&claimed, &fp, &state); err != nil {
		return idemdriver.ClaimResult{}, err
	}
	if claimed || fp != nil {
		return claimResult(claimed, fp, state), nil
	}
	return s.settle(ctx, tx, p)
}

// claimResult builds the result of a claim statement's row: claimed, or
// the stored fingerprint and state (NULL state: completed).
func claimResult(claimed bool, fp []byte, state *int16) idemdriver.ClaimResult {
	if claimed {
		return idemdriver.ClaimResult{Claimed: true}
	}
	st := idemdriver.StateCompleted
	if state != nil && *state != 0 {
		st = idemdriver.RecordState(*state)
	}
	return idemdriver.ClaimResult{Fingerprint: fp, State: st}
}

// settle finishes a claim whose statement found a conflict but could not
// see the committed row: it reads the fingerprint with a new snapshot, and
// re-runs the claim if the row is gone.
func (s *Store) settle(ctx context.Context, tx pgx.Tx, p *idemdriver.ClaimParams) (idemdriver.ClaimResult, error) {
	for range maxClaimAttempts {
		var (
			fp    []byte
			state *int16
		)
		err := tx.QueryRow(ctx, s.q.fingerprint, p.Consumer, p.MessageID).Scan(&fp, &state)
		switch {
		case err == nil:
			return claimResult(false, fp, state), nil
		case !errors.Is(err, pgx.ErrNoRows):
			return idemdriver.ClaimResult{}, err
		}
		var claimed bool
		if err := tx.QueryRow(ctx, s.q.claim, p.Consumer, p.MessageID, p.Fingerprint).Scan(&claimed, &fp, &state); err != nil {
			return idemdriver.ClaimResult{}, err
		}
		if claimed || fp != nil {
			return claimResult(claimed, fp, state), nil
		}
	}
	return idemdriver.ClaimResult{}, fmt.Errorf("idempgxv5: claim of consumer %q, message ID %q did not settle after %d attempts",
		p.Consumer, p.MessageID, maxClaimAttempts)
}

// ClaimBatchTx implements [idemdriver.TxStore]: the messages are claimed with one
// INSERT ... SELECT FROM unnest(...) ON CONFLICT DO NOTHING statement that
// also returns the fingerprints of committed records, in one round trip.
// Messages are inserted in byte order of their IDs, so that concurrent
// batches with overlapping IDs take their row locks in the same order and
// do not deadlock. Results come back in the order of p.Messages.
func (s *Store) ClaimBatchTx(ctx context.Context, tx pgx.Tx, p *idemdriver.ClaimBatchParams) ([]idemdriver.ClaimResult, error) {
	out := make([]idemdriver.ClaimResult, len(p.Messages))
	if len(p.Messages) == 0 {
		return out, nil
	}
	order := make([]int, len(p.Messages))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(p.Messages[a].MessageID, p.Messages[b].MessageID) })
	index := make(map[string]int, len(p.Messages))
	ids := make([]string, len(order))
	fps := make([][]byte, len(order))
	for k, i := range order {
		m := p.Messages[i]
		index[m.MessageID] = i
		ids[k], fps[k] = m.MessageID, m.Fingerprint
	}
	if len(index) != len(ids) {
		return nil, fmt.Errorf("idempgxv5: batch claim of consumer %q: message IDs are not distinct", p.Consumer)
	}

	for range maxClaimAttempts {
		settled := make(map[string]bool, len(ids))
		rows, err := tx.Query(ctx, s.q.claimBatch, p.Consumer, ids, fps)
		if err != nil {
			return nil, err
		}
		var (
			id    *string
			fp    []byte
			state *int16
			all   bool
		)
		_, err = pgx.ForEachRow(rows, []any{&id, &fp, &state}, func() error {
			if id == nil { // every message of this attempt was inserted
				all = true
				return nil
			}
			i, ok := index[*id]
			if !ok {
				return fmt.Errorf("idempgxv5: claim returned unknown message ID %q", *id)
			}
			if fp == nil {
				out[i] = idemdriver.ClaimResult{Claimed: true}
			} else if !out[i].Claimed { // a row this statement inserted wins
				out[i] = claimResult(false, fp, state)
			}
			settled[*id] = true
			return nil
		})
		if err != nil {
			return nil, err
		}
		if all {
			for _, id := range ids {
				out[index[id]] = idemdriver.ClaimResult{Claimed: true}
			}
			return out, nil
		}
		if len(settled) == len(ids) {
			return out, nil
		}
		// Conflicts with rows committed while this statement waited:
		// read them with a new snapshot, and claim again what vanished.
		var rest []string
		for _, id := range ids {
			if !settled[id] {
				rest = append(rest, id)
			}
		}
		rows, err = tx.Query(ctx, s.q.fingerprints, p.Consumer, rest)
		if err != nil {
			return nil, err
		}
		var sid string
		_, err = pgx.ForEachRow(rows, []any{&sid, &fp, &state}, func() error {
			if i, ok := index[sid]; ok {
				out[i] = claimResult(false, fp, state)
				settled[sid] = true
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		ids, fps = ids[:0], fps[:0]
		for _, id := range rest {
			if !settled[id] {
				ids = append(ids, id)
				fps = append(fps, p.Messages[index[id]].Fingerprint)
			}
		}
		if len(ids) == 0 {
			return out, nil
		}
	}
	return nil, fmt.Errorf("idempgxv5: batch claim of consumer %q did not settle after %d attempts", p.Consumer, maxClaimAttempts)
}

// Commit implements [idemdriver.TxStore]: tx.Commit, which returns the
// connection to the pool. An error means nothing committed, or that the
// outcome is unknown (the connection was lost during COMMIT); a COMMIT of a
// transaction aborted by an earlier error is reported as
// pgx.ErrTxCommitRollback.
func (s *Store) Commit(ctx context.Context, tx pgx.Tx) error {
	return tx.Commit(ctx)
}

// Rollback implements [idemdriver.TxStore]: tx.Rollback, which returns the
// connection to the pool, or closes it when ROLLBACK fails. Rolling back a
// transaction that already ended (committed, rolled back, or a failed
// Commit) returns nil.
func (s *Store) Rollback(ctx context.Context, tx pgx.Tx) error {
	if err := tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return err
	}
	return nil
}

// abort rolls tx back after a failure, even when ctx has ended. pgx closes
// the connection when the ROLLBACK fails, and the pool then destroys it
// instead of reusing it.
func abort(ctx context.Context, tx pgx.Tx) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	_ = tx.Rollback(ctx) // the claim's error is the one to report
}
