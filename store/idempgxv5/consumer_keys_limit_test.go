package idempgxv5_test

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// Migration 014 on a v1 table of 32,768 consumer names, one more than
// a smallint key can number: Migrate fails with SQLSTATE 22003 before
// it changes anything (no consumers table, no consumer_key column, no
// trigger, the migration not recorded), so the table's consumers keep
// running on schema v1. With one name fewer (32,767, the most a table
// can hold) the migrations complete and every name has its key.
func TestConsumerKeysMigrationRefusesTooManyNames(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	u := upgradeTable(t, upgradeVariant{name: "default"}, 14)
	direct, table, exec, store := u.direct, u.table, u.exec, u.store
	exec(`INSERT INTO ` + table + ` (consumer, message_id, fingerprint, processed_at)
		SELECT 'c-' || g, 'm', '\x01'::bytea, now() FROM generate_series(1, 32768) g`)
	err := store.Migrate(ctx)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "22003" {
		t.Fatalf("Migrate over 32,768 names: %v, want SQLSTATE 22003", err)
	}
	var consumers, column, trigger, recorded bool
	if err := direct.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL,
		EXISTS (SELECT FROM pg_attribute WHERE attrelid = $2::regclass AND attname = 'consumer_key' AND NOT attisdropped),
		EXISTS (SELECT FROM pg_trigger WHERE tgrelid = $2::regclass AND NOT tgisinternal),
		EXISTS (SELECT FROM `+table+`_migrations WHERE version = 14)`, table+"_consumers", table).Scan(&consumers, &column, &trigger, &recorded); err != nil {
		t.Fatal(err)
	}
	if consumers || column || trigger || recorded {
		t.Errorf("after the refusal: consumers table %v, consumer_key column %v, trigger %v, 014 recorded %v; want none", consumers, column, trigger, recorded)
	}
	exec(`DELETE FROM ` + table + ` WHERE consumer = 'c-32768'`)
	if err := store.Migrate(ctx); err != nil {
		t.Fatalf("Migrate over 32,767 names: %v", err)
	}
	var keys, maxKey int
	if err := direct.QueryRow(ctx, `SELECT count(*), max(key) FROM `+table+`_consumers`).Scan(&keys, &maxKey); err != nil || keys != 32767 || maxKey != 32767 {
		t.Errorf("consumers: %d keys, the largest %d (%v); want 32767 and 32767", keys, maxKey, err)
	}
}
