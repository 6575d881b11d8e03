package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem/store/idempgxv5"
)

// measure seeds a processed-messages table of each layout, created by
// idempgxv5's Migrate on the PostgreSQL at IDEM_TEST_POSTGRES_URL, with
// --n records of one consumer ("orders"), random UUIDv4 message IDs (36
// bytes, inserted in random order as a broker delivers them) and SHA-256
// fingerprints, and prints pg_total_relation_size (heap, indexes, TOAST;
// every partition; a table that is not partitioned has no partition
// tree) over the records. The tables are dropped after.
func measure(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("capacity measure", flag.ContinueOnError)
	n := fs.Int("n", 1_000_000, "records to seed")
	if err := fs.Parse(args); err != nil {
		return err
	}
	url := os.Getenv("IDEM_TEST_POSTGRES_URL")
	if url == "" {
		return fmt.Errorf("capacity measure needs IDEM_TEST_POSTGRES_URL (eval \"$(scripts/services)\" sets it)")
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	var rb [3]byte
	_, _ = rand.Read(rb[:])
	for _, l := range []struct {
		name   string
		cfg    *idempgxv5.Partitions
		suffix string
	}{{"default", nil, "d"}, {"partitioned (4 h buckets)", &idempgxv5.Partitions{Bucket: 4 * time.Hour}, "p"}} {
		table := "capacity_" + hex.EncodeToString(rb[:]) + "_" + l.suffix
		per, err := seedAndSize(ctx, pool, table, l.cfg, *n)
		drop(pool, table)
		if err != nil {
			return fmt.Errorf("%s: %w", l.name, err)
		}
		fmt.Fprintf(stdout, "%s\t%d records\t%.1f bytes per record\n", l.name, *n, per)
	}
	return nil
}

func seedAndSize(ctx context.Context, pool *pgxpool.Pool, table string, parts *idempgxv5.Partitions, n int) (float64, error) {
	store, err := idempgxv5.New(pool, &idempgxv5.Config{Table: table, Partitions: parts})
	if err != nil {
		return 0, err
	}
	if err := store.Migrate(ctx); err != nil {
		return 0, err
	}
	// The default layout refers to its consumer by key (schema v2), the
	// partitioned one by name.
	insert := `INSERT INTO ` + table + ` (consumer, message_id, fingerprint, processed_at)
		SELECT 'orders', gen_random_uuid()::text, sha256(g::text::bytea), now() FROM generate_series(1, $1::int) g`
	if parts == nil {
		insert = `WITH k AS (INSERT INTO ` + table + `_consumers (key, name) SELECT COALESCE(max(key), 0) + 1, 'orders' FROM ` + table + `_consumers
			ON CONFLICT (name) DO UPDATE SET name = excluded.name RETURNING key)
		INSERT INTO ` + table + ` (consumer_key, message_id, fingerprint, processed_at)
		SELECT (SELECT key FROM k), gen_random_uuid()::text, sha256(g::text::bytea), now() FROM generate_series(1, $1::int) g`
	}
	if _, err := pool.Exec(ctx, insert, n); err != nil {
		return 0, err
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE `+table); err != nil {
		return 0, err
	}
	var total int64
	if err := pool.QueryRow(ctx, `SELECT COALESCE((SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree($1::regclass)),
		pg_total_relation_size($1::regclass))::bigint`, table).Scan(&total); err != nil {
		return 0, err
	}
	return float64(total) / float64(n), nil
}

// drop removes table and everything Migrate made beside it (the outbox's
// domains included).
func drop(pool *pgxpool.Pool, table string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, _ = pool.Exec(ctx, fmt.Sprintf(`DROP TABLE IF EXISTS %s, %s_steps, %s_runs, %s_outbox, %s_migrations, %s_horizons CASCADE`, table, table, table, table, table, table))
	_, _ = pool.Exec(ctx, fmt.Sprintf(`DROP FUNCTION IF EXISTS %s_outbox_notify() CASCADE`, table))
	_, _ = pool.Exec(ctx, fmt.Sprintf(`DROP DOMAIN IF EXISTS %s_outbox_id, %s_outbox_str CASCADE`, table, table))
}
