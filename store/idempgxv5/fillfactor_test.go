package idempgxv5_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/sqlschema"
	"github.com/idem-go/idem/store/idempgxv5"
)

// TestOutboxFillFactorUpgrade upgrades outbox tables made by migrations
// up to 007 that hold pending, leased and sent rows: Migrate applies 008
// (the outbox's fill factor of 50) and records it, a second Migrate does
// nothing, the rows keep every value, and the relay's statements still
// work on them. It covers the default layout, a schema-qualified table,
// the partitioned layout, and Migrate through PgBouncer in transaction
// pooling in each exec mode PgBouncer supports.
func TestOutboxFillFactorUpgrade(t *testing.T) {
	t.Parallel()
	type variant struct {
		name   string
		schema bool
		part   *idempgxv5.Partitions
		url    string
		mode   pgx.QueryExecMode
	}
	variants := []variant{
		{name: "default"},
		{name: "schema", schema: true},
		{name: "partitioned", part: &idempgxv5.Partitions{Bucket: time.Hour}},
		{name: "partitioned_schema", schema: true, part: &idempgxv5.Partitions{Bucket: time.Hour}},
	}
	for _, m := range bouncerModes {
		variants = append(variants, variant{name: "pgbouncer_" + modeName(m), url: bouncerURL(t), mode: m})
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			testOutboxFillFactorUpgrade(t, v.schema, v.part, poolOpts{url: v.url, mode: v.mode})
		})
	}
}

func testOutboxFillFactorUpgrade(t *testing.T, schema bool, part *idempgxv5.Partitions, o poolOpts) {
	ctx := t.Context()
	direct := newPool(t, poolOpts{})
	table := randName("idem_t_")
	if schema {
		s := randName("idem_s_")
		if _, err := direct.Exec(ctx, `CREATE SCHEMA `+s); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := direct.Exec(ctx, `DROP SCHEMA `+s+` CASCADE`); err != nil {
				t.Errorf("drop test schema: %v", err)
			}
		})
		table = s + "." + table
	} else {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := dropTables(ctx, direct, table); err != nil {
				t.Errorf("drop test tables: %v", err)
			}
		})
	}
	dialect := sqlschema.Postgres
	if part != nil {
		dialect = sqlschema.PostgresPartitioned
	}
	migs := migrationsOf(t, dialect, table)
	if last := migs[len(migs)-1]; last.Version != 8 {
		t.Fatalf("last migration %s, want 008", last.Name)
	}
	apply, exec := applier(t, direct, table)
	for _, m := range migs[:len(migs)-1] {
		apply(m)
	}
	outbox := table + "_outbox"
	fillfactor := func() string {
		t.Helper()
		var opts []string
		if err := direct.QueryRow(ctx, `SELECT COALESCE(reloptions, '{}') FROM pg_class WHERE oid = $1::regclass`, outbox).Scan(&opts); err != nil {
			t.Fatal(err)
		}
		if len(opts) == 0 {
			return ""
		}
		if len(opts) != 1 {
			t.Fatalf("%s's options %v, want at most the fill factor", outbox, opts)
		}
		return opts[0]
	}
	if ff := fillfactor(); ff != "" {
		t.Fatalf("before 008: options %q, want none", ff)
	}
	// 30 pending rows, 10 of them then leased by a claim, and 5 of those
	// marked sent: all on full pages.
	const n = 30
	exec(`INSERT INTO `+outbox+` (id, destination, order_key, payload)
		SELECT 'id-' || g, 'orders', 'order-' || g, '\x7b7d'::bytea FROM generate_series(1, $1::int) g`, n)
	snapshot := func() []string {
		t.Helper()
		rows, _ := direct.Query(ctx, `SELECT concat_ws('|', id, seq, attempts, lease_until, sent_at, failed_at, available_at, created_at)
			FROM `+outbox+` ORDER BY seq`)
		s, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	pool := direct
	if o.url != "" {
		pool = newPool(t, o)
	}
	store, err := idempgxv5.New(pool, &idempgxv5.Config{Table: table, Partitions: part})
	if err != nil {
		t.Fatal(err)
	}
	if part != nil {
		if err := store.EnsurePartitions(ctx); err != nil {
			t.Fatal(err)
		}
	}
	claimed, err := store.ClaimOutgoing(ctx, &idemdriver.ClaimOutgoingParams{Limit: 10, Lease: time.Hour})
	if err != nil || len(claimed) != 10 {
		t.Fatalf("claim before 008: %d rows, %v; want 10", len(claimed), err)
	}
	var sent []string
	for _, r := range claimed[:5] {
		sent = append(sent, r.ID)
	}
	if err := store.MarkSent(ctx, &idemdriver.MarkSentParams{IDs: sent}); err != nil {
		t.Fatal(err)
	}
	before := snapshot()

	for i := range 2 {
		if err := store.Migrate(ctx); err != nil {
			t.Fatalf("Migrate #%d: %v", i+1, err)
		}
		if ff := fillfactor(); ff != "fillfactor=50" {
			t.Fatalf("after Migrate #%d: options %q, want fillfactor=50", i+1, ff)
		}
	}
	var versions, maxVersion int
	if err := direct.QueryRow(ctx, `SELECT count(*), max(version) FROM `+table+`_migrations`).Scan(&versions, &maxVersion); err != nil {
		t.Fatal(err)
	}
	if versions != len(migs) || maxVersion != 8 {
		t.Fatalf("%d migrations recorded up to %d, want %d up to 8", versions, maxVersion, len(migs))
	}
	after := snapshot()
	if len(after) != len(before) {
		t.Fatalf("%d rows after the upgrade, want %d", len(after), len(before))
	}
	for i := range before {
		if before[i] != after[i] {
			t.Errorf("row changed by the upgrade:\n before %s\n after  %s", before[i], after[i])
		}
	}

	// The relay's statements on the upgraded table: the 20 rows never
	// claimed are claimed and marked; the 5 still leased stay leased.
	rest, err := store.ClaimOutgoing(ctx, &idemdriver.ClaimOutgoingParams{Limit: 100, Lease: time.Hour})
	if err != nil || len(rest) != n-10 {
		t.Fatalf("claim after 008: %d rows, %v; want %d", len(rest), err, n-10)
	}
	ids := make([]string, len(rest))
	for i, r := range rest {
		ids[i] = r.ID
	}
	if err := store.MarkSent(ctx, &idemdriver.MarkSentParams{IDs: ids}); err != nil {
		t.Fatal(err)
	}
	var nSent, nLeased int
	if err := direct.QueryRow(ctx, `SELECT count(*) FILTER (WHERE sent_at IS NOT NULL AND lease_until IS NULL),
		count(*) FILTER (WHERE sent_at IS NULL AND lease_until > now()) FROM `+outbox).Scan(&nSent, &nLeased); err != nil {
		t.Fatal(err)
	}
	if nSent != n-5 || nLeased != 5 {
		t.Errorf("%d rows sent and %d leased, want %d and 5", nSent, nLeased, n-5)
	}
}
