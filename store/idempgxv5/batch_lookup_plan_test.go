package idempgxv5_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/jackc/pgx/v5"
)

// A table without column statistics (new, restored, upgraded with
// pg_upgrade, or a new bucket's partition, until autovacuum analyzes it:
// up to autovacuum_naptime, a minute by default, after its first rows)
// makes PostgreSQL take consumer = $1 to match 0.5% of the rows, where it
// matches all of them on a table of one consumer. The batch claim's lookup
// of recorded messages must still probe the primary key by message ID: a
// plan that scans by consumer alone and filters the IDs reads every record
// of the consumer per batch, so claims slow down with the table's size
// until the next analyze (measured on a new bucket's partition: 125 ms per
// batch of 100 at 65,000 records). Checked on both layouts, on the custom
// and the generic plan, with autovacuum off so that no analyze happens
// meanwhile.
func TestBatchLookupWithoutStatisticsProbesByMessageID(t *testing.T) {
	testURL(t)
	ids := make([]string, 100)
	fps := make([][]byte, 100)
	msgs := make([]idemdriver.ClaimMessage, 100)
	for i := range ids {
		ids[i], fps[i] = fmt.Sprintf("new-%d", i), []byte{1}
		msgs[i] = idemdriver.ClaimMessage{MessageID: ids[i], Fingerprint: fps[i]}
	}
	for _, layout := range []struct {
		name string
		part *idempgxv5.Partitions
	}{{"default", nil}, {"partitioned", &idempgxv5.Partitions{Bucket: time.Hour}}} {
		t.Run(layout.name, func(t *testing.T) {
			b := setup(t, poolOpts{part: layout.part})
			var (
				query string
				args  []any
			)
			if layout.part == nil {
				query, args = idempgxv5.ClaimBatchQuery(b.store, &idemdriver.ClaimBatchParams{Consumer: "c", Messages: msgs})
			} else {
				query, args = idempgxv5.PartitionedClaimBatchSQL(b.store), []any{"c", ids, fps}
			}
			lookupPlans(t, b, `EXPLAIN (FORMAT JSON) `+query, args)
		})
	}
}

// lookupPlans fills b's table (its partitions, if any) with 20,000
// records of consumer "c" with autovacuum off, and checks the custom and
// the generic plan of query: every scan of the table probes its key by
// message ID.
func lookupPlans(t *testing.T, b *bundle, query string, args []any) {
	t.Helper()
	ctx := context.Background()
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// The tables that hold rows: the partitions, or the table itself.
	rows, err := conn.Query(ctx, `SELECT oid::regclass::text FROM pg_class WHERE relkind = 'r'
		AND (oid = $1::regclass OR oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = $1::regclass))`, b.table)
	if err != nil {
		t.Fatal(err)
	}
	leaves, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(leaves) == 0 {
		t.Fatalf("leaves of %s %v: %v", b.table, leaves, err)
	}
	for _, tb := range leaves {
		if _, err := conn.Exec(ctx, `ALTER TABLE `+tb+` SET (autovacuum_enabled = off)`); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := conn.Exec(ctx, `INSERT INTO `+b.table+` (consumer, message_id, fingerprint)
		SELECT 'c', 'old-' || g, '\x00'::bytea FROM generate_series(1, 20000) g`); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		if _, err := conn.Exec(ctx, `SET plan_cache_mode = `+mode); err != nil {
			t.Fatal(err)
		}
		var raw []byte
		if err := conn.QueryRow(ctx, query, args...).Scan(&raw); err != nil {
			t.Fatal(err)
		}
		var plan []struct{ Plan planNode }
		if err := json.Unmarshal(raw, &plan); err != nil || len(plan) != 1 {
			t.Fatalf("plan %s: %v", raw, err)
		}
		probes := 0
		plan[0].Plan.walk(func(n *planNode) {
			if !strings.HasPrefix(n.RelationName, b.table) && !strings.HasPrefix(n.IndexName, b.table) {
				return
			}
			switch {
			case strings.Contains(n.IndexCond, "message_id"):
				probes++
			case n.NodeType == "ModifyTable":
			case n.IndexName != "" || n.NodeType == "Seq Scan" || n.NodeType == "Bitmap Heap Scan":
				t.Errorf("%s: a %s of %s%s with index condition %q, not by message ID", mode, n.NodeType, n.RelationName, n.IndexName, n.IndexCond)
			}
		})
		if probes == 0 {
			t.Errorf("%s: no probe by message ID: %s", mode, raw)
		}
	}
	if _, err := conn.Exec(ctx, `RESET plan_cache_mode`); err != nil {
		t.Fatal(err)
	}
}
