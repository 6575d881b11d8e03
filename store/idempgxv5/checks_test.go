package idempgxv5_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
)

// TestProcessedChecksUpgrade upgrades processed tables made by the
// migrations up to 008, with records in them: Migrate applies 009, which
// drops the CHECK constraints on consumer, message_id, fingerprint and
// state from the table and, in the partitioned layout, from the
// partitions made before it (copies of the table's, which dropping the
// table's constraint would leave behind), and records it; a second
// Migrate does nothing; the records keep their values; a new message is
// claimed and processed once, its redelivery is a Duplicate, and input
// the constraints refused is still refused, before any statement. It
// covers the default layout, a schema-qualified table, the partitioned
// layout, and Migrate through PgBouncer in transaction pooling in each
// exec mode PgBouncer supports.
func TestProcessedChecksUpgrade(t *testing.T) {
	runUpgrades(t, testProcessedChecksUpgrade)
}

func testProcessedChecksUpgrade(t *testing.T, v upgradeVariant) {
	ctx := t.Context()
	u := upgradeTable(t, v, 9)
	direct, table, migs, exec, store := u.direct, u.table, u.migs, u.exec, u.store
	if v.part != nil {
		// Partitions made before 009 carry copies of the constraints.
		if err := store.EnsurePartitions(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// checks counts the CHECK constraints on the four columns, on the
	// table and on its partitions, and the relations that have them.
	checks := func() (n, rels int) {
		t.Helper()
		if err := direct.QueryRow(ctx, `SELECT count(*), count(DISTINCT c.conrelid) FROM pg_constraint c
			JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]
			WHERE c.contype = 'c' AND a.attname IN ('consumer', 'message_id', 'fingerprint', 'state')
			AND (c.conrelid = $1::regclass OR c.conrelid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = $1::regclass))`,
			table).Scan(&n, &rels); err != nil {
			t.Fatal(err)
		}
		return n, rels
	}
	n, rels := checks()
	minRels := 1
	if v.part != nil {
		minRels = 2 // the table and at least the partition of now
	}
	if n != 4*rels || rels < minRels {
		t.Fatalf("before 009: %d constraints on %d relations, want 4 on each of at least %d", n, rels, minRels)
	}
	exec(`INSERT INTO ` + table + ` (consumer, message_id, fingerprint) VALUES ('c', 'old', '\x01')`)
	snapshot := func() string {
		t.Helper()
		var s string
		if err := direct.QueryRow(ctx, `SELECT concat_ws('|', consumer, message_id, fingerprint, processed_at, state, token, attempt)
			FROM `+recordsFrom(t, direct, table)+` WHERE message_id = 'old'`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := snapshot()

	for i := range 2 {
		if err := store.Migrate(ctx); err != nil {
			t.Fatalf("Migrate #%d: %v", i+1, err)
		}
		if n, rels := checks(); n != 0 {
			t.Fatalf("after Migrate #%d: %d constraints left on %d relations, want none", i+1, n, rels)
		}
	}
	var versions, maxVersion int
	if err := direct.QueryRow(ctx, `SELECT count(*), max(version) FROM `+table+`_migrations`).Scan(&versions, &maxVersion); err != nil {
		t.Fatal(err)
	}
	if last := migs[len(migs)-1].Version; versions != len(migs) || maxVersion != last {
		t.Fatalf("%d migrations recorded up to %d, want %d up to %d", versions, maxVersion, len(migs), last)
	}
	if after := snapshot(); after != before {
		t.Errorf("record changed by the upgrade:\n before %s\n after  %s", before, after)
	}

	c, err := idem.NewConsumer[pgx.Tx](store, idem.Config{Name: "c", PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	runs := 0
	h := func(context.Context, pgx.Tx, idem.Message) error { runs++; return nil }
	for i, want := range []idem.Status{idem.Processed, idem.Duplicate} {
		out, err := c.Process(ctx, idem.Message{ID: "new", Payload: []byte("p")}, h)
		if err != nil || out.Status != want {
			t.Fatalf("delivery %d: %v, %v; want %v", i+1, out.Status, err, want)
		}
	}
	// The record from before the upgrade is found, and its fingerprint
	// (one byte, not a payload's) compared.
	if out, _ := c.Process(ctx, idem.Message{ID: "old", Payload: []byte("p")}, h); out.Status != idem.FingerprintMismatch {
		t.Fatalf("the record from before the upgrade: %v; want FingerprintMismatch", out.Status)
	}
	if runs != 1 {
		t.Errorf("handler ran %d times, want 1", runs)
	}
	long := strings.Repeat("x", 256)
	if _, err := c.Process(ctx, idem.Message{ID: long, Payload: []byte("p")}, h); !errors.Is(err, idem.ErrInvalidMessageID) {
		t.Errorf("a message ID of 256 bytes: %v, want ErrInvalidMessageID", err)
	}
	var records int
	if err := direct.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&records); err != nil || records != 2 {
		t.Errorf("%d records, %v; want 2", records, err)
	}
	checkPool(t, u.pool)
}
