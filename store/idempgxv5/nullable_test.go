package idempgxv5_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/pgsql"
	"github.com/idem-go/idem/internal/sqlschema"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// rawLease is a record's lease-mode columns as stored: nil is NULL.
type rawLease struct {
	state, attempt *int32
	token          *int64
}

func (r rawLease) null() bool { return r.state == nil && r.token == nil && r.attempt == nil }

func (r rawLease) is(state int32, token int64, attempt int32) bool {
	return r.state != nil && *r.state == state && r.token != nil && *r.token == token && r.attempt != nil && *r.attempt == attempt
}

// TestNullableLeaseColumns upgrades a table made by migrations 001 to 005
// that holds records of every kind (one from before migration 002, whose
// lease columns were added with their defaults; transactional ones; an
// expired in_progress lease-mode record; a completed one): migration 006
// keeps their values, new transactional claims (single and batch) store
// NULL lease columns, and every statement reads NULL as completed, token
// 0 and attempt 1, in both query modes: claims and batch claims report
// duplicates, Acquire neither takes over nor miscounts them, fenced writes
// with token 0 own nothing, Inspect reports them, and the purge deletes
// them (but never an in_progress record).
func TestNullableLeaseColumns(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			testNullableLeaseColumns(t, mode)
		})
	}
}

func testNullableLeaseColumns(t *testing.T, mode pgx.QueryExecMode) {
	ctx := t.Context()
	pool := newPool(t, poolOpts{mode: mode})
	table, effects := randName("idem_t_"), randName("idem_fx_")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := dropTables(ctx, pool, table, effects); err != nil {
			t.Errorf("drop test tables: %v", err)
		}
	})
	migs := migrationsOf(t, sqlschema.Postgres, table)
	apply, exec := applier(t, pool, table)
	apply(migs[0])
	// A record of the version-1 store: its lease columns come from the
	// defaults migration 002 adds them with.
	insert := `INSERT INTO ` + table + ` (consumer, message_id, fingerprint) VALUES ($1, $2, $3)`
	exec(insert, "c", "v1", fp("v1"))
	for _, m := range migs[1:5] {
		apply(m)
	}
	if migs[5].Version != 6 {
		t.Fatalf("migration %s sixth, want 006", migs[5].Name)
	}
	exec(insert, "c", "v5", fp("v5")) // a claim before migration 006

	store, err := idempgxv5.New(pool, &idempgxv5.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	const long = time.Hour
	acquire := func(what, id string, want bool) idemdriver.AcquireResult {
		t.Helper()
		r, err := store.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "c", MessageID: id, Fingerprint: fp(id), Lease: long})
		if err != nil || r.Acquired != want {
			t.Fatalf("%s: Acquire(%s) = %+v, %v; want acquired %v", what, id, r, err, want)
		}
		return r
	}
	// Lease-mode records of the old schema: one in_progress (its lease
	// then expired), one completed.
	acquire("before 006", "old-lease", true)
	done := acquire("before 006", "old-done", true)
	if err := store.Complete(ctx, &idemdriver.CompleteParams{Consumer: "c", MessageID: "old-done", Token: done.Token, Result: []byte("r")}); err != nil {
		t.Fatal(err)
	}
	exec(`UPDATE ` + table + ` SET lease_expires_at = now() - interval '1 minute', updated_at = now() - interval '2 minutes' WHERE message_id = 'old-lease'`)

	if err := store.Migrate(ctx); err != nil {
		t.Fatalf("Migrate to 006: %v", err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	var nVersions, maxVersion int
	if err := pool.QueryRow(ctx, `SELECT count(*), max(version) FROM `+table+`_migrations`).Scan(&nVersions, &maxVersion); err != nil || nVersions != len(migs) || maxVersion != migs[len(migs)-1].Version {
		t.Fatalf("versions: %d up to %d, %v; want %d", nVersions, maxVersion, err, len(migs))
	}
	wantNullable(t, pool, table)

	raw := func(id string) rawLease { return readRaw(t, pool, table, id) }
	for _, id := range []string{"v1", "v5"} {
		if r := raw(id); !r.is(2, 0, 1) {
			t.Errorf("%s after migration 006: %+v, want its values kept (2, 0, 1)", id, r)
		}
	}

	// New transactional records: NULL lease columns.
	claim := func(id string, payloadOf string) idemdriver.ClaimResult {
		t.Helper()
		tx, res, err := store.BeginClaim(ctx, &idemdriver.ClaimParams{Consumer: "c", MessageID: id, Fingerprint: fp(payloadOf)})
		if err != nil {
			t.Fatalf("BeginClaim(%s): %v", id, err)
		}
		if res.Claimed {
			err = store.Commit(ctx, tx)
		} else {
			err = store.Rollback(ctx, tx)
		}
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := claim("new", "new"); !res.Claimed {
		t.Fatalf("claim of a new message: %+v", res)
	}
	tx, batch, err := store.BeginClaimBatch(ctx, &idemdriver.ClaimBatchParams{Consumer: "c", Messages: []idemdriver.ClaimMessage{
		{MessageID: "b1", Fingerprint: fp("b1")}, {MessageID: "b2", Fingerprint: fp("b2")},
	}})
	if err != nil || len(batch) != 2 || !batch[0].Claimed || !batch[1].Claimed {
		t.Fatalf("batch claim of new messages: %+v, %v", batch, err)
	}
	if err := store.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"new", "b1", "b2"} {
		if r := raw(id); !r.null() {
			t.Errorf("%s: lease columns %+v, want NULL", id, r)
		}
	}

	// Every kind of record as a duplicate: single claims, and one batch
	// of them all plus a new message.
	kinds := []string{"v1", "v5", "new", "b1", "old-done"}
	for _, id := range kinds {
		if res := claim(id, id); res.Claimed || res.State != idemdriver.StateCompleted || !bytes.Equal(res.Fingerprint, fp(id)) {
			t.Errorf("claim of %s again: %+v, want the completed record", id, res)
		}
	}
	if res := claim("old-lease", "old-lease"); res.Claimed || res.State != idemdriver.StateInProgress {
		t.Errorf("claim of old-lease: %+v, want the in_progress record", res)
	}
	msgs := []idemdriver.ClaimMessage{{MessageID: "b3", Fingerprint: fp("b3")}}
	for _, id := range kinds {
		msgs = append(msgs, idemdriver.ClaimMessage{MessageID: id, Fingerprint: fp(id)})
	}
	tx, batch, err = store.BeginClaimBatch(ctx, &idemdriver.ClaimBatchParams{Consumer: "c", Messages: msgs})
	if err != nil || len(batch) != len(msgs) {
		t.Fatalf("batch of duplicates: %+v, %v", batch, err)
	}
	for i, r := range batch {
		if r.Claimed != (i == 0) || (i > 0 && r.State != idemdriver.StateCompleted) {
			t.Errorf("batch: %s: %+v", msgs[i].MessageID, r)
		}
	}
	if err := store.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}

	// Lease mode on the same table: transactional records are completed,
	// attempt 1, never taken over; the in_progress record from before the
	// migration is taken over once its lease has ended.
	for _, id := range []string{"v1", "v5", "new", "b3"} {
		r := acquire("transactional record", id, false)
		if r.State != idemdriver.StateCompleted || r.Attempt != 1 || r.LeaseRemaining != 0 || !bytes.Equal(r.Fingerprint, fp(id)) {
			t.Errorf("Acquire(%s): %+v, want the completed record, attempt 1", id, r)
		}
	}
	took := acquire("takeover", "old-lease", true)
	if took.Token != 2 || took.Attempt != 2 {
		t.Errorf("takeover of old-lease: token %d, attempt %d; want 2, 2", took.Token, took.Attempt)
	}
	if r := acquire("completed lease record", "old-done", false); r.State != idemdriver.StateCompleted || string(r.Result) != "r" {
		t.Errorf("Acquire(old-done): %+v, want its stored result", r)
	}
	// Fenced writes by token 0 (a transactional record's) own nothing.
	for _, id := range []string{"v5", "new"} {
		for op, err := range map[string]error{
			"Renew":    store.Renew(ctx, &idemdriver.RenewParams{Consumer: "c", MessageID: id, Token: 0, Lease: long}),
			"Complete": store.Complete(ctx, &idemdriver.CompleteParams{Consumer: "c", MessageID: id, Token: 0}),
			"Release":  store.Release(ctx, &idemdriver.ReleaseParams{Consumer: "c", MessageID: id, Token: 0, Terminal: true}),
			"SaveStep": store.SaveStep(ctx, &idemdriver.StepParams{Consumer: "c", MessageID: id, Token: 0, Step: "s", Result: []byte{}}),
		} {
			if !errors.Is(err, idemdriver.ErrLeaseLost) {
				t.Errorf("%s(%s, token 0): %v, want ErrLeaseLost", op, id, err)
			}
		}
		if r := raw(id); (id == "new") != r.null() {
			t.Errorf("%s after the fenced writes: %+v, want it unchanged", id, r)
		}
	}
	// A new lease-mode record is written in full.
	fresh := acquire("new lease record", "lease-new", true)
	if fresh.Token != 1 || fresh.Attempt != 1 || !raw("lease-new").is(1, 1, 1) {
		t.Errorf("lease-new: %+v, stored %+v; want token 1, attempt 1", fresh, raw("lease-new"))
	}

	// Inspect reports the NULLs as a transactional record's values.
	for _, id := range []string{"v1", "new", "b1"} {
		r, err := store.Inspect(ctx, "c", id)
		if err != nil || r.State != idemdriver.StateCompleted || r.Token != 0 || r.Attempt != 1 || !r.LeaseExpiresAt.IsZero() {
			t.Errorf("Inspect(%s): %+v, %v; want completed, token 0, attempt 1", id, r, err)
		}
	}
	if r, err := store.Inspect(ctx, "c", "old-lease"); err != nil || r.State != idemdriver.StateInProgress || r.Token != 2 || r.Attempt != 2 {
		t.Errorf("Inspect(old-lease): %+v, %v", r, err)
	}

	// The purge counts and deletes completed records whatever their
	// columns hold, and keeps the in_progress ones.
	s, err := store.BeginPurge(ctx, &idemdriver.BeginPurgeParams{Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close(ctx) }()
	var now time.Time
	if err := pool.QueryRow(ctx, `SELECT clock_timestamp() + interval '1 second'`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	const completed = 9 // v1 v5 old-done new b1 b2 b3, and two more below
	// Schema v2 since migration 015: the consumer's key.
	exec(`INSERT INTO `+table+` (consumer_key, message_id, fingerprint) VALUES ((SELECT key FROM `+table+`_consumers WHERE name = $1), $2, $3)`, "c", "x1", fp("x1"))
	exec(`INSERT INTO `+table+` (consumer_key, message_id, fingerprint, state) VALUES ((SELECT key FROM `+table+`_consumers WHERE name = 'c'), 'x2', $1, 3)`, fp("x2"))
	if n, err := s.CountBefore(ctx, now); err != nil || n != completed {
		t.Errorf("CountBefore: %d, %v; want %d (every record but the two in_progress)", n, err, completed)
	}
	var deleted int64
	for {
		n, err := s.DeleteBatch(ctx, &idemdriver.PurgeBatchParams{Horizon: now, Limit: 4})
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		deleted += n
	}
	if deleted != completed {
		t.Errorf("purge deleted %d, want %d", deleted, completed)
	}
	var left []string
	rows, _ := pool.Query(ctx, `SELECT message_id FROM `+table+` ORDER BY message_id`)
	if left, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil || len(left) != 2 || left[0] != "lease-new" || left[1] != "old-lease" {
		t.Errorf("left after the purge: %v, %v; want the two in_progress records", left, err)
	}
}

// migrationsOf returns the migrations of d for table, and checks that
// 006 is among them.
func migrationsOf(t *testing.T, d sqlschema.Dialect, table string) []sqlschema.Migration {
	t.Helper()
	parsed, err := sqlschema.ParseTable(table)
	if err != nil {
		t.Fatal(err)
	}
	migs, err := sqlschema.Migrations(d, parsed)
	if err != nil {
		t.Fatal(err)
	}
	if len(migs) < 6 {
		t.Fatalf("%d migrations, want 006 among them", len(migs))
	}
	return migs
}

// applier returns apply, which runs one migration on table by hand and
// records it as Migrate does (the migrations table made first), and exec,
// which runs a statement; both fail the test on error.
func applier(t *testing.T, pool *pgxpool.Pool, table string) (apply func(sqlschema.Migration), exec func(q string, args ...any)) {
	mt := pgsql.New(table).Migrations
	exec = func(q string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(t.Context(), q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	apply = func(m sqlschema.Migration) {
		t.Helper()
		for _, st := range m.Statements() {
			exec(st)
		}
		exec(mt.Record, m.Version)
	}
	exec(mt.Create)
	return apply, exec
}

// readRaw reads the lease columns of consumer c's record id as stored.
func readRaw(t *testing.T, pool *pgxpool.Pool, table, id string) rawLease {
	t.Helper()
	var r rawLease
	if err := pool.QueryRow(t.Context(), `SELECT state::int4, token, attempt FROM `+recordsFrom(t, pool, table)+` WHERE consumer = 'c' AND message_id = $1`, id).Scan(&r.state, &r.token, &r.attempt); err != nil {
		t.Fatalf("read %s: %v", id, err)
	}
	return r
}

// wantNullable checks that every relation whose name starts with table
// (the table, and a partitioned table's partitions) has state, token and
// attempt nullable without a default.
func wantNullable(t *testing.T, pool *pgxpool.Pool, table string) {
	t.Helper()
	var rels, bad int
	if err := pool.QueryRow(t.Context(), `SELECT count(DISTINCT table_name), count(*) FILTER (WHERE is_nullable <> 'YES' OR column_default IS NOT NULL)
		FROM information_schema.columns
		WHERE starts_with(table_name, $1) AND column_name IN ('state', 'token', 'attempt')`, table).Scan(&rels, &bad); err != nil || rels == 0 || bad != 0 {
		t.Fatalf("lease columns: %d of %d relations' NOT NULL or with a default, %v; want none", bad, rels, err)
	}
}

// TestNullableLeaseColumnsPartitioned upgrades a partitioned table (made
// by the partitioned layout's migrations up to 005, with its partitions)
// holding a transactional record: migration 006 reaches the partitions
// already attached and those created later, the old record keeps its
// values, a new claim stores NULLs, and both are completed duplicates
// that Inspect reports alike.
func TestNullableLeaseColumnsPartitioned(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := newPool(t, poolOpts{})
	table := randName("idem_t_")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := dropTables(ctx, pool, table); err != nil {
			t.Errorf("drop test tables: %v", err)
		}
	})
	migs := migrationsOf(t, sqlschema.PostgresPartitioned, table)
	apply, _ := applier(t, pool, table)
	for _, m := range migs {
		if m.Version < 6 {
			apply(m)
		}
	}
	store, err := idempgxv5.New(pool, &idempgxv5.Config{Table: table, Partitions: &idempgxv5.Partitions{Bucket: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.EnsurePartitions(ctx); err != nil {
		t.Fatal(err)
	}
	claim := func(id string) idemdriver.ClaimResult {
		t.Helper()
		tx, res, err := store.BeginClaim(ctx, &idemdriver.ClaimParams{Consumer: "c", MessageID: id, Fingerprint: fp(id)})
		if err != nil {
			t.Fatalf("BeginClaim(%s): %v", id, err)
		}
		if err := store.Commit(ctx, tx); err != nil {
			t.Fatal(err)
		}
		return res
	}
	if !claim("old").Claimed {
		t.Fatal("claim of old before 006: not claimed")
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatalf("Migrate to 006: %v", err)
	}
	// A partition created after the migration, too.
	if err := idempgxv5.EnsurePartitionsAt(ctx, store, time.Now().Add(24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	wantNullable(t, pool, table)
	if !claim("new").Claimed {
		t.Fatal("claim of new: not claimed")
	}
	if r := readRaw(t, pool, table, "old"); !r.is(2, 0, 1) {
		t.Errorf("old: %+v, want (2, 0, 1) kept", r)
	}
	if r := readRaw(t, pool, table, "new"); !r.null() {
		t.Errorf("new: %+v, want NULLs", r)
	}
	for _, id := range []string{"old", "new"} {
		if res := claim(id); res.Claimed || res.State != idemdriver.StateCompleted || !bytes.Equal(res.Fingerprint, fp(id)) {
			t.Errorf("claim of %s again: %+v, want the completed record", id, res)
		}
		if r, err := store.Inspect(ctx, "c", id); err != nil || r.State != idemdriver.StateCompleted || r.Token != 0 || r.Attempt != 1 {
			t.Errorf("Inspect(%s): %+v, %v; want completed, token 0, attempt 1", id, r, err)
		}
	}
}
