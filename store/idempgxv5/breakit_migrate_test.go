package idempgxv5_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/sqlschema"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/idempgxv5"
)

// TestBreakMigrateKilledMidBuild: Migrate of a table whose outbox is
// large enough for migration 011 to build its index concurrently is
// killed (its backends terminated, as when `idem migrate` dies and its
// sessions end) while CREATE INDEX CONCURRENTLY waits for a writer's
// transaction, which leaves an invalid index behind. Two Migrates then
// run at once, on pools of their own: both succeed, every index of the
// table and its outbox is valid, the new one exists, the old one is
// gone, each version is recorded once, and no outbox row was lost.
func TestBreakMigrateKilledMidBuild(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	u := upgradeTable(t, upgradeVariant{name: "default"}, 11)
	outbox := u.table + "_outbox"
	u.exec(`INSERT INTO ` + outbox + ` (id, destination, order_key, payload) SELECT 'id-' || g, 'd', 'k' || (g % 50), '\x00' FROM generate_series(1, ` + strconv.Itoa(sqlschema.SmallRows) + `) g`)

	// A writer's transaction, open: a concurrent build waits for it.
	blocker, err := u.direct.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = blocker.Rollback(context.Background()) }()
	if _, err := blocker.Exec(ctx, `INSERT INTO `+outbox+` (id, destination, payload) VALUES ('blocker', 'd', '\x00')`); err != nil {
		t.Fatal(err)
	}

	app := randName("breakit_migrate_")
	killed, err := idempgxv5.New(namedPool(t, testURL(t), app, 2), &idempgxv5.Config{Table: u.table})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- killed.Migrate(ctx) }()
	waitForLockWaiters(t, u.direct, "CREATE INDEX CONCURRENTLY "+u.table+"_outbox_khash", 1)
	var n int
	if err := u.direct.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n); err != nil || n < 2 {
		t.Fatalf("terminated %d of the migration's backends (%v); want its lock's and its build's", n, err)
	}
	if err := <-done; err == nil {
		t.Fatal("Migrate whose backends were terminated returned nil")
	}
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	invalid := func() int {
		t.Helper()
		var n int
		if err := u.direct.QueryRow(ctx, `SELECT count(*) FROM pg_index WHERE NOT indisvalid AND indrelid IN ($1::regclass, $2::regclass)`, u.table, outbox).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := invalid(); n != 1 {
		t.Errorf("%d invalid indexes after the kill; want the interrupted build's", n)
	}

	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		s, err := idempgxv5.New(newPool(t, poolOpts{maxConns: 2}), &idempgxv5.Config{Table: u.table})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = s.Migrate(ctx) }()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Migrate %d after the kill: %v", i, err)
		}
	}
	if n := invalid(); n != 0 {
		t.Errorf("%d invalid indexes after the second runs", n)
	}
	var khash, keyPending bool
	if err := u.direct.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL`, outbox+"_khash", outbox+"_key_pending").Scan(&khash, &keyPending); err != nil || !khash || keyPending {
		t.Errorf("khash index %v, key_pending index %v (%v); want the new one and not the old", khash, keyPending, err)
	}
	var versions, distinct, last int
	if err := u.direct.QueryRow(ctx, `SELECT count(*), count(DISTINCT version), max(version) FROM `+u.table+`_migrations`).Scan(&versions, &distinct, &last); err != nil || versions != distinct || last != u.migs[len(u.migs)-1].Version || versions != len(u.migs) {
		t.Errorf("migrations: %d recorded, %d distinct, last %d (%v); want %d, each once, last %d", versions, distinct, last, err, len(u.migs), u.migs[len(u.migs)-1].Version)
	}
	if err := u.direct.QueryRow(ctx, `SELECT count(*) FROM `+outbox).Scan(&n); err != nil || n != sqlschema.SmallRows {
		t.Errorf("%d outbox rows (%v); want %d", n, err, sqlschema.SmallRows)
	}
}

// TestBreakOnlineBackfillLockedTail: the online upgrade to schema v2
// (migration 014) backfills in batches marked /* idem:repeat */, each
// run until it changes no row. A record whose row another transaction
// holds locked (a lease renewal, an operator's retry: any UPDATE in
// flight) when the backfill reaches it must still be filled: the
// backfill waits for it (its lock_timeout gives way and runs again) and
// the upgrade completes once the lock is gone, rather than taking a batch
// that skipped it for the end of the backfill and failing the check's
// validation on the unfilled row (as it did with FOR UPDATE SKIP LOCKED).
func TestBreakOnlineBackfillLockedTail(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	u := upgradeTable(t, upgradeVariant{name: "default"}, consumerKeysVersion)
	u.exec(`INSERT INTO ` + u.table + ` (consumer, message_id, fingerprint) SELECT 'c', 'm-' || g, '\x01' FROM generate_series(1, 50) g`)
	// 014 in two migrations: up to the backfill, then from it, so that
	// the row is locked once the column exists (a row lock before would
	// hold off the ALTER TABLE that adds it).
	var migs []sqlschema.Migration
	var m sqlschema.Migration
	for _, x := range u.migs {
		if x.Version < consumerKeysVersion {
			migs = append(migs, x)
		} else if x.Version == consumerKeysVersion {
			m = x
		}
	}
	head, tail, ok := strings.Cut(m.SQL, sqlschema.RepeatMark)
	if !ok {
		t.Fatal("014 has no backfill")
	}
	first, second := m, m
	first.SQL = head
	second.Version, second.Name, second.SQL = m.Version+1, "backfill.sql", "-- idem:no-transaction\n"+sqlschema.RepeatMark+tail
	second.SmallTable = ""
	migs = append(migs, first)
	if err := idempgxv5.MigrateWith(ctx, u.store, migs); err != nil {
		t.Fatal(err)
	}
	locker, err := u.direct.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = locker.Rollback(context.Background()) }()
	if _, err := locker.Exec(ctx, `SELECT 1 FROM `+u.table+` WHERE consumer = 'c' AND message_id = 'm-7' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- idempgxv5.MigrateWith(ctx, u.store, append(migs, second)) }()
	// Whatever waits for the row's lock, or for the table's lock the
	// row's transaction holds, the upgrade must complete once it ends.
	var waiting string
	testenv.Eventually(t, 30*time.Second, "the upgrade waiting for a lock", func() bool {
		err := u.direct.QueryRow(ctx, `SELECT query FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0 LIMIT 1`, u.table).Scan(&waiting)
		return err == nil
	}, nil)
	var unfilledThen int
	if err := u.direct.QueryRow(ctx, `SELECT count(*) FROM `+u.table+` WHERE consumer_key IS NULL`).Scan(&unfilledThen); err != nil {
		t.Fatal(err)
	}
	t.Logf("waiting: %.60s...; %d rows unfilled then", waiting, unfilledThen)
	if err := locker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Errorf("the upgrade after the lock ended: %v", err)
	}
	var unfilled int
	if err := u.direct.QueryRow(ctx, `SELECT count(*) FROM `+u.table+` WHERE consumer_key IS NULL`).Scan(&unfilled); err != nil || unfilled != 0 {
		t.Errorf("%d rows unfilled (%v)", unfilled, err)
	}
}
