package idempgxv5_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idempgxv5"
)

// keyOfName returns the key of consumer name in table t's consumers
// table, 0 when it has none.
func keyOfName(t *testing.T, b *bundle, name string) int16 {
	t.Helper()
	var key int16
	err := b.pool.QueryRow(t.Context(), `SELECT COALESCE((SELECT key FROM `+b.table+`_consumers WHERE name = $1), 0)`, name).Scan(&key)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// claimIn claims (consumer, id) with ClaimTx in a transaction of its own,
// committed when commit is set and rolled back otherwise.
func claimIn(t *testing.T, b *bundle, st *idempgxv5.Store, consumer, id string, commit bool) (idemdriver.ClaimResult, error) {
	t.Helper()
	ctx := t.Context()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	res, err := st.ClaimTx(ctx, tx, &idemdriver.ClaimParams{Consumer: consumer, MessageID: id, Fingerprint: fp(id)})
	if err != nil || !commit {
		return res, err
	}
	return res, tx.Commit(ctx)
}

// A consumer's first claim in a transaction of the caller's adds its name
// with the next key, which the Store does not keep (nor when a later claim
// of that transaction, or of a savepoint in it, finds the name its own
// transaction added): when that transaction
// rolls back, the next new name takes the key, and the first consumer's
// next claim gets a key of its own, its records never mixed with the
// other's. A claim of a name whose key is committed keeps it.
func TestConsumerKeyOfRolledBackTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t, poolOpts{})
	st := b.store
	ctx := t.Context()
	// Three claims in one transaction, rolled back: the first adds the
	// name; the second finds it, added by this very transaction; the
	// third finds it from a subtransaction (a savepoint). None keeps it.
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// On a failure, ended before the cleanup's DROP TABLE waits for it.
	defer func() { _ = tx.Rollback(context.Background()) }()
	for _, id := range []string{"m-0", "m-1"} {
		if res, err := st.ClaimTx(ctx, tx, &idemdriver.ClaimParams{Consumer: "first", MessageID: id, Fingerprint: fp(id)}); err != nil || !res.Claimed {
			t.Fatalf("claim rolled back: %+v, %v", res, err)
		}
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := st.ClaimTx(ctx, sp, &idemdriver.ClaimParams{Consumer: "first", MessageID: "m-2", Fingerprint: fp("m-2")}); err != nil || !res.Claimed {
		t.Fatalf("claim in a savepoint: %+v, %v", res, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if k := keyOfName(t, b, "first"); k != 0 {
		t.Fatalf("key of a name added by a rolled-back transaction: %d", k)
	}
	// Another Store (another process) adds another name: it takes the key.
	other, err := idempgxv5.New(b.pool, &idempgxv5.Config{Table: b.table})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := claimIn(t, b, other, "second", "m-1", true); err != nil || !res.Claimed {
		t.Fatalf("second's claim: %+v, %v", res, err)
	}
	if k := keyOfName(t, b, "second"); k != 1 {
		t.Fatalf("second's key %d, want 1 (the key given back)", k)
	}
	// first's message is new to first, then a duplicate, whichever Store
	// claims it.
	for i, s := range []*idempgxv5.Store{st, st, other} {
		res, err := claimIn(t, b, s, "first", "m-1", true)
		if err != nil {
			t.Fatal(err)
		}
		if res.Claimed != (i == 0) {
			t.Fatalf("first's m-1, claim %d: %+v", i, res)
		}
	}
	if k1, k2 := keyOfName(t, b, "first"), keyOfName(t, b, "second"); k1 != 2 || k2 != 1 {
		t.Errorf("keys first %d, second %d; want 2 and 1", k1, k2)
	}
	var n int
	if err := b.pool.QueryRow(t.Context(), `SELECT count(*) FROM `+b.table+` r JOIN `+b.table+`_consumers c ON c.key = r.consumer_key
		WHERE r.message_id = 'm-1' AND c.name IN ('first', 'second')`).Scan(&n); err != nil || n != 2 {
		t.Errorf("records of m-1: %d, want 2 (%v)", n, err)
	}
}

// A table whose 32,767 keys are all given: a new consumer's claim, in
// every form, fails with ErrTooManyConsumers and writes nothing; a
// consumer with a key claims as before.
func TestTooManyConsumers(t *testing.T) {
	t.Parallel()
	b := setup(t, poolOpts{})
	ctx := t.Context()
	st := b.store
	if res, err := claimIn(t, b, st, "known", "m-1", true); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	if _, err := b.pool.Exec(ctx, `INSERT INTO `+b.table+`_consumers (key, name)
		SELECT g, 'filler-' || g FROM generate_series((SELECT max(key) + 1 FROM `+b.table+`_consumers), 32767) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := claimIn(t, b, st, "late", "m-1", true); !errors.Is(err, idempgxv5.ErrTooManyConsumers) {
		t.Errorf("ClaimTx of a new consumer: %v, want ErrTooManyConsumers", err)
	}
	tx, _, err := st.BeginClaim(ctx, &idemdriver.ClaimParams{Consumer: "late", MessageID: "m-2", Fingerprint: fp("m-2")})
	if tx != nil {
		_ = tx.Rollback(ctx)
	}
	if !errors.Is(err, idempgxv5.ErrTooManyConsumers) {
		t.Errorf("BeginClaim of a new consumer: %v, want ErrTooManyConsumers", err)
	}
	_, err = st.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "late", MessageID: "m-3", Fingerprint: fp("m-3"), Lease: time.Minute})
	if !errors.Is(err, idempgxv5.ErrTooManyConsumers) {
		t.Errorf("Acquire of a new consumer: %v, want ErrTooManyConsumers", err)
	}
	if res, err := claimIn(t, b, st, "known", "m-2", true); err != nil || !res.Claimed {
		t.Errorf("claim of a consumer with a key: %+v, %v", res, err)
	}
	var late, keys int
	if err := b.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+b.table+`_consumers WHERE name = 'late'), (SELECT count(*) FROM `+b.table+`_consumers)`).Scan(&late, &keys); err != nil {
		t.Fatal(err)
	}
	if late != 0 || keys != 32767 {
		t.Errorf("consumers table: late %d, %d keys", late, keys)
	}
}

// Stores that found a table of schema v1 make their lease batches in the
// new shape after migration 015 changed it under them: AcquireBatch and
// CompleteBatch fail on the old statements (the pipeline's implicit
// transaction rolled back), find the shape again and run once more; the
// records are those of the consumer's key.
func TestLeaseBatchesAfterShapeChange(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	u := upgradeTable(t, upgradeVariant{name: "default"}, consumerKeysVersion)
	newStore := func() *idempgxv5.Store {
		s, err := idempgxv5.New(u.pool, &idempgxv5.Config{Table: u.table})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	acq, comp := newStore(), newStore()
	held, err := comp.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "l", MessageID: "v1-held", Fingerprint: fp("h"), Lease: time.Minute})
	if err != nil || !held.Acquired {
		t.Fatalf("acquire on v1: %+v, %v", held, err)
	}
	if _, err := acq.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "l", MessageID: "v1-other", Fingerprint: fp("o"), Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := idempgxv5.MigrateWith(ctx, u.store, u.migs); err != nil {
		t.Fatalf("upgrade: %v", err)
	}
	res, errs, err := acq.AcquireBatch(ctx, []*idemdriver.AcquireParams{
		{Consumer: "l", MessageID: "v2-batch-1", Fingerprint: fp("1"), Lease: time.Minute},
		{Consumer: "m", MessageID: "v2-batch-2", Fingerprint: fp("2"), Lease: time.Minute}})
	if err != nil || errs[0] != nil || errs[1] != nil || !res[0].Acquired || !res[1].Acquired {
		t.Errorf("AcquireBatch after the upgrade: %+v, %v, %v", res, errs, err)
	}
	cerrs, err := comp.CompleteBatch(ctx, []*idemdriver.CompleteParams{{Consumer: "l", MessageID: "v1-held", Token: held.Token, Result: []byte("r")}})
	if err != nil || cerrs[0] != nil {
		t.Errorf("CompleteBatch after the upgrade: %v, %v", cerrs, err)
	}
	var recs []string
	rows, err := u.direct.Query(ctx, `SELECT c.name || '/' || r.message_id || '/' || COALESCE(r.state, 2) FROM `+u.table+` r
		JOIN `+u.table+`_consumers c ON c.key = r.consumer_key ORDER BY 1`)
	if err == nil {
		recs, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		t.Fatal(err)
	}
	if want := "l/v1-held/2,l/v1-other/1,l/v2-batch-1/1,m/v2-batch-2/1"; strings.Join(recs, ",") != want {
		t.Errorf("records %v, want %s", recs, want)
	}
}

// The migrations run again over a consumers table left behind when the
// processed table and its migrations table were dropped: the names keep
// their keys, new ones take the next, and claims after it are recorded
// under their own names.
func TestMigrateAgainOverLeftConsumers(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, poolOpts{})
	if res, err := claimIn(t, b, b.store, "c", "m-1", true); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	if _, err := b.pool.Exec(ctx, `DROP TABLE `+b.table+`, `+b.table+`_migrations`); err != nil {
		t.Fatal(err)
	}
	if err := b.store.Migrate(ctx); err != nil {
		t.Fatalf("Migrate over the consumers table left behind: %v", err)
	}
	for _, c := range []string{"d", "c"} {
		if res, err := claimIn(t, b, b.store, c, "m-1", true); err != nil || !res.Claimed {
			t.Fatalf("claim of %s after the second migration: %+v, %v", c, res, err)
		}
	}
	if kc, kd := keyOfName(t, b, "c"), keyOfName(t, b, "d"); kc != 1 || kd != 2 {
		t.Errorf("keys c %d, d %d; want 1 and 2", kc, kd)
	}
	var names string
	if err := b.pool.QueryRow(ctx, `SELECT string_agg(c.name, ',' ORDER BY c.name) FROM `+b.table+` r JOIN `+b.table+`_consumers c ON c.key = r.consumer_key`).Scan(&names); err != nil || names != "c,d" {
		t.Errorf("records of %q, want c,d (%v)", names, err)
	}
}
