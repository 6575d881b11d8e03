package idempgxv5_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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
	runUpgrades(t, testOutboxFillFactorUpgrade)
}

// upgradeVariant is one layout an upgrade test runs on: the default
// layout, a schema-qualified table, the partitioned layout (plain and
// schema-qualified), or the default layout migrated through PgBouncer.
type upgradeVariant struct {
	name   string
	schema bool
	part   *idempgxv5.Partitions
	o      poolOpts // the store's pool; zero: the direct one
}

// runUpgrades runs test on each of upgradeVariants, in parallel.
func runUpgrades(t *testing.T, test func(*testing.T, upgradeVariant)) {
	t.Parallel()
	for _, v := range upgradeVariants(t) {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			test(t, v)
		})
	}
}

// upgradeVariants returns the layouts of the upgrade tests, with
// PgBouncer in transaction pooling in each exec mode it supports.
func upgradeVariants(t *testing.T) []upgradeVariant {
	vs := []upgradeVariant{
		{name: "default"},
		{name: "schema", schema: true},
		{name: "partitioned", part: &idempgxv5.Partitions{Bucket: time.Hour}},
		{name: "partitioned_schema", schema: true, part: &idempgxv5.Partitions{Bucket: time.Hour}},
	}
	for _, m := range bouncerModes {
		vs = append(vs, upgradeVariant{name: "pgbouncer_" + modeName(m), o: poolOpts{url: bouncerURL(t), mode: m}})
	}
	return vs
}

// upgraded is a table made by upgradeTable.
type upgraded struct {
	direct *pgxpool.Pool // a pool on the database, not through PgBouncer
	pool   *pgxpool.Pool // the store's pool
	table  string
	migs   []sqlschema.Migration // all of the layout's migrations
	exec   func(q string, args ...any)
	store  *idempgxv5.Store
}

// upgradeTable makes a table of v's layout to which the migrations
// before version below are applied by hand (and recorded as Migrate
// records them), dropped when the test ends, and a store on it on v's
// pool. exec runs a statement on the direct pool, failing the test on
// error.
func upgradeTable(t *testing.T, v upgradeVariant, below int) upgraded {
	ctx := t.Context()
	direct := newPool(t, poolOpts{})
	table := randName("idem_t_")
	if v.schema {
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
	if v.part != nil {
		dialect = sqlschema.PostgresPartitioned
	}
	migs := migrationsOf(t, dialect, table)
	apply, exec := applier(t, direct, table)
	for _, m := range migs {
		if m.Version < below {
			apply(m)
		}
	}
	pool := direct
	if v.o.url != "" {
		pool = newPool(t, v.o)
	}
	store, err := idempgxv5.New(pool, &idempgxv5.Config{Table: table, Partitions: v.part})
	if err != nil {
		t.Fatal(err)
	}
	return upgraded{direct: direct, pool: pool, table: table, migs: migs, exec: exec, store: store}
}

func testOutboxFillFactorUpgrade(t *testing.T, v upgradeVariant) {
	ctx := t.Context()
	u := upgradeTable(t, v, 8)
	direct, table, migs, exec, store := u.direct, u.table, u.migs, u.exec, u.store
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

	if v.part != nil {
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
	if err := store.MarkSent(ctx, &idemdriver.MarkSentParams{IDs: sent, Keep: true}); err != nil {
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
	if last := migs[len(migs)-1].Version; versions != len(migs) || maxVersion != last {
		t.Fatalf("%d migrations recorded up to %d, want %d up to %d", versions, maxVersion, len(migs), last)
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
	if err := store.MarkSent(ctx, &idemdriver.MarkSentParams{IDs: ids, Keep: true}); err != nil {
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
