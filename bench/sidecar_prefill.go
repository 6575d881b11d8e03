package main

import (
	"context"
	"fmt"
	"os/exec"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A sidecar contender on PostgreSQL runs on a table of its own, new in
// each run. A new table is a poor picture of a store in use: the planner
// has no statistics for it, a prepared statement's generic plan is made
// (at its sixth execution) while the table holds a few hundred rows, and
// nothing tells PostgreSQL to plan again until autovacuum analyzes the
// table, which does not happen within a run of seconds. A batch statement
// that joins its array of IDs with the table then scans the whole table
// each time (idem's CompleteBatch measured ~100 µs a row at 30,000
// messages instead of ~10). So before a run's CPU is first sampled, the
// contender's table is created and holds prefillRows records of another
// consumer per message of the run (completed, as a retention window
// keeps them), analyzed: the steady state a running consumer's table is
// in. The same for the hand-written sidecar and idem consume.
const prefillRows = 1

// prefillIdemPG creates idem's tables for table (idem migrate, the binary
// bin) on the PostgreSQL at url, fills it with n completed records of the
// consumer "prefill" and analyzes it.
func prefillIdemPG(ctx context.Context, bin, url, table string, n int) error {
	if out, err := exec.CommandContext(ctx, bin, "migrate", "--store", url, "--table", table).CombinedOutput(); err != nil {
		return fmt.Errorf("idem migrate: %w: %s", err, out)
	}
	t := pgx.Identifier{table}.Sanitize()
	consumers := pgx.Identifier{table + "_consumers"}.Sanitize()
	return prefillPG(ctx, url, table,
		`INSERT INTO `+consumers+` (key, name) VALUES (32000, 'prefill') ON CONFLICT DO NOTHING`,
		`INSERT INTO `+t+` (consumer_key, message_id, fingerprint, processed_at, state, token, attempt, lease_expires_at, result, content_type)
SELECT 32000, 'prefill-' || g, sha256(g::text::bytea), now(), 2, 1, 1, now(), '', '' FROM generate_series(1, $1::int) AS g`, n)
}

// prefillHandPG creates the hand-written sidecar's table on the
// PostgreSQL at url, fills it with n finished records and analyzes it.
func prefillHandPG(ctx context.Context, url, table string, n int) error {
	st, err := newHandPG(ctx, url, table)
	if err != nil {
		return err
	}
	st.close()
	t := pgx.Identifier{table}.Sanitize()
	return prefillPG(ctx, url, table, "",
		`INSERT INTO `+t+` (message_id, fingerprint, state, token, lease_until, call_started)
SELECT 'prefill-' || g, sha256(g::text::bytea), 2, 1, now(), 1 FROM generate_series(1, $1::int) AS g`, n)
}

// prefillPG runs first (when not empty), then fill with n, then ANALYZE
// on table, on the PostgreSQL at url.
func prefillPG(ctx context.Context, url, table, first, fill string, n int) error {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	if first != "" {
		if _, err := pool.Exec(ctx, first); err != nil {
			return fmt.Errorf("prefill %s: %w", table, err)
		}
	}
	if _, err := pool.Exec(ctx, fill, n); err != nil {
		return fmt.Errorf("prefill %s: %w", table, err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE `+pgx.Identifier{table}.Sanitize()); err != nil {
		return fmt.Errorf("prefill %s: %w", table, err)
	}
	return nil
}
