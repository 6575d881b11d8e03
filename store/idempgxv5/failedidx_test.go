package idempgxv5_test

import (
	"testing"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/sqlschema"
)

// Migration 012 on a table of more than sqlschema.SmallRows records (so
// built with CREATE INDEX CONCURRENTLY, outside a transaction): the
// default layout gets the partial index of the failed records, valid,
// and the partitioned layout none (its own 012 changes nothing, as
// CREATE INDEX CONCURRENTLY cannot run on a partitioned table); both
// record the migration, run Migrate twice, and list every failed record.
func TestFailedIndexUpgrade(t *testing.T) {
	runUpgrades(t, testFailedIndexUpgrade)
}

func testFailedIndexUpgrade(t *testing.T, v upgradeVariant) {
	ctx := t.Context()
	u := upgradeTable(t, v, 12)
	direct, table, exec, store := u.direct, u.table, u.exec, u.store
	if v.part != nil {
		if err := store.EnsurePartitions(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Every 100th record failed for good, the others completed; each a
	// microsecond older than the last, so that all of them fall in the
	// current partition unless an hour (a bucket) began within the last
	// 11 ms (a millisecond apart, the seed failed with "no partition found
	// for row" when run in the first 11 s of an hour).
	const rows = sqlschema.SmallRows + 500
	exec(`INSERT INTO `+table+` (consumer, message_id, fingerprint, processed_at, state, token, attempt, last_error)
		SELECT 'c', 'm-' || g, '\x01'::bytea, now() - g * interval '1 microsecond', CASE WHEN g % 100 = 0 THEN 3 ELSE 2 END, 1, 1,
			CASE WHEN g % 100 = 0 THEN 'boom' END
		FROM generate_series(1, $1::int) g`, rows)
	for i := range 2 {
		if err := store.Migrate(ctx); err != nil {
			t.Fatalf("Migrate #%d: %v", i+1, err)
		}
	}
	var recorded bool
	if err := direct.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+table+`_migrations WHERE version = 12)`).Scan(&recorded); err != nil || !recorded {
		t.Errorf("migration 12 recorded: %v, %v", recorded, err)
	}
	var n int
	var valid bool
	if err := direct.QueryRow(ctx, `SELECT count(*), COALESCE(bool_and(i.indisvalid), false) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		WHERE i.indrelid = $1::regclass AND c.relname LIKE '%\_failed\_idx'`, table).Scan(&n, &valid); err != nil {
		t.Fatal(err)
	}
	if v.part == nil && (n != 1 || !valid) {
		t.Errorf("default layout: %d failed records' indexes (valid: %v), want one valid", n, valid)
	}
	if v.part != nil && n != 0 {
		t.Errorf("partitioned layout: %d failed records' indexes, want none", n)
	}
	var got int
	p := idemdriver.ListRecordsParams{Consumer: "c", State: idemdriver.StateFailed, Limit: 50}
	for {
		page, err := store.ListRecords(ctx, &p)
		if err != nil {
			t.Fatal(err)
		}
		got += len(page.Records)
		if page.Next == "" {
			break
		}
		p.Cursor = page.Next
	}
	if got != rows/100 {
		t.Errorf("failed records listed: %d, want %d", got, rows/100)
	}
}
