package idempgxv5_test

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pointRows reads the point column of the record of consumer c and
// message ID id on table t, and the names of its rows in t + "_steps",
// sorted: "point|step,step".
func pointRows(tb testing.TB, pool *pgxpool.Pool, t, c, id string) string {
	tb.Helper()
	var point *string
	err := pool.QueryRow(context.Background(), `SELECT point FROM `+t+` WHERE message_id = $1 AND consumer_key = (SELECT key FROM `+t+`_consumers WHERE name = $2)`, id, c).Scan(&point)
	if err != nil {
		tb.Fatalf("point of %s: %v", id, err)
	}
	rows, err := pool.Query(context.Background(), `SELECT step FROM `+t+`_steps WHERE consumer = $1 AND message_id = $2 ORDER BY step`, c, id)
	if err != nil {
		tb.Fatal(err)
	}
	steps, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		tb.Fatal(err)
	}
	p := "NULL"
	if point != nil {
		p = *point
	}
	return p + "|" + strings.Join(steps, ",")
}

// stepsOf renders a map of recovery points as sorted "name=result".
func stepsOf(m map[string][]byte) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, k+"="+string(m[k]))
	}
	return strings.Join(out, ",")
}

// listSteps renders the recovery points the operator reads (StepReader).
func listSteps(tb testing.TB, s *idempgxv5.Store, c, id string) string {
	tb.Helper()
	steps, err := s.Steps(context.Background(), c, id)
	if err != nil {
		tb.Fatalf("Steps(%s): %v", id, err)
	}
	var out []string
	for _, st := range steps {
		out = append(out, st.Name+"="+string(st.Result))
	}
	return strings.Join(out, ",")
}

// completeReopen completes the record id of consumer "c" on s's table t
// under token, reopens it, and checks that neither its point column nor
// the steps table holds a recovery point of it any more.
func completeReopen(tb testing.TB, s *idempgxv5.Store, pool *pgxpool.Pool, t, id string, token int64) {
	tb.Helper()
	ctx := context.Background()
	if err := s.Complete(ctx, &idemdriver.CompleteParams{Consumer: "c", MessageID: id, Token: token}); err != nil {
		tb.Fatal(err)
	}
	if r, err := s.ReopenRecord(ctx, &idemdriver.ReopenRecordParams{Consumer: "c", MessageID: id, Token: token}); err != nil || !r.Changed {
		tb.Fatalf("ReopenRecord(%s): %+v, %v", id, r, err)
	}
	if got, want := pointRows(tb, pool, t, "c", id), "NULL|"; got != want {
		tb.Errorf("%s after Reopen: %q, want %q", id, got, want)
	}
}

// A new record's acquisition with a StepPrefix keeps its recovery point in
// the record (migration 016), single and batched, and writes no row of
// the steps table; a takeover reports it among the earlier attempts'
// points and saves its own in the steps table; a later save of the same
// name keeps the point's empty result; the operator's read lists it;
// Reopen clears it with the others.
func TestRecordPoint(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, poolOpts{})
	s := b.store
	acq := func(id string) idemdriver.AcquireResult {
		t.Helper()
		res, err := s.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "c", MessageID: id, Fingerprint: fp(id), Lease: time.Minute, StepPrefix: "run:"})
		if err != nil || !res.Acquired {
			t.Fatalf("Acquire(%s): %+v, %v", id, res, err)
		}
		return res
	}
	first := acq("m-1")
	res, errs, err := s.AcquireBatch(ctx, []*idemdriver.AcquireParams{
		{Consumer: "c", MessageID: "m-2", Fingerprint: fp("m-2"), Lease: time.Minute, StepPrefix: "run:"},
		{Consumer: "c", MessageID: "m-3", Fingerprint: fp("m-3"), Lease: time.Minute}})
	if err != nil || errs[0] != nil || errs[1] != nil || !res[0].Acquired || !res[1].Acquired {
		t.Fatalf("AcquireBatch: %+v, %v, %v", res, errs, err)
	}
	for id, want := range map[string]string{"m-1": "run:1|", "m-2": "run:1|", "m-3": "NULL|"} {
		if got := pointRows(t, b.pool, b.table, "c", id); got != want {
			t.Errorf("%s after its acquisition: %q, want %q", id, got, want)
		}
	}
	for _, st := range []*idemdriver.StepParams{
		{Consumer: "c", MessageID: "m-1", Token: first.Token, Step: "run:1", Result: []byte("late")},
		{Consumer: "c", MessageID: "m-1", Token: first.Token, Step: "s2", Result: []byte("y")},
	} {
		if err := s.SaveStep(ctx, st); err != nil {
			t.Fatalf("SaveStep(%s): %v", st.Step, err)
		}
	}
	if err := s.Release(ctx, &idemdriver.ReleaseParams{Consumer: "c", MessageID: "m-1", Token: first.Token, Error: "e"}); err != nil {
		t.Fatal(err)
	}
	again := acq("m-1")
	if got, want := stepsOf(again.Steps), "run:1=,s2=y"; again.Token != 3 || got != want {
		t.Errorf("takeover: token %d, steps %q, want 3 and %q", again.Token, got, want)
	}
	if got, want := pointRows(t, b.pool, b.table, "c", "m-1"), "run:1|run:1,run:3,s2"; got != want {
		t.Errorf("m-1 after the takeover: %q, want %q", got, want)
	}
	if got, want := listSteps(t, s, "c", "m-1"), "run:1=,run:3=,s2=y"; got != want {
		t.Errorf("Steps(m-1): %q, want %q", got, want)
	}
	completeReopen(t, s, b.pool, b.table, "m-1", again.Token)
	if after := acq("m-1"); len(after.Steps) != 0 {
		t.Errorf("acquisition after Reopen: steps %q, want none", stepsOf(after.Steps))
	}
}

// A store that found the table before migration 016 keeps its statements
// after it (nothing fails), writing its points to the steps table, and
// still reads the points that stores which found the table after the
// migration keep in the record: its takeover reports them, and its
// Reopen (which finds the shape again) clears them.
func TestRecordPointAcrossMigration(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	u := upgradeTable(t, upgradeVariant{name: "default"}, 16)
	newStore := func() *idempgxv5.Store {
		s, err := idempgxv5.New(u.pool, &idempgxv5.Config{Table: u.table})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	acq := func(s *idempgxv5.Store, id string) idemdriver.AcquireResult {
		t.Helper()
		res, err := s.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "c", MessageID: id, Fingerprint: fp(id), Lease: time.Minute, StepPrefix: "run:"})
		if err != nil || !res.Acquired {
			t.Fatalf("Acquire(%s): %+v, %v", id, res, err)
		}
		return res
	}
	old := newStore()
	before := acq(old, "m-0")
	if err := idempgxv5.MigrateWith(ctx, u.store, u.migs); err != nil {
		t.Fatalf("upgrade: %v", err)
	}
	if got, want := pointRows(t, u.direct, u.table, "c", "m-0"), "NULL|run:1"; got != want {
		t.Errorf("m-0, acquired before the migration: %q, want %q", got, want)
	}
	fresh := newStore()
	first := acq(fresh, "m-1")
	if got, want := pointRows(t, u.direct, u.table, "c", "m-1"), "run:1|"; got != want {
		t.Errorf("m-1, acquired by a store that found the new shape: %q, want %q", got, want)
	}
	for _, p := range []*idemdriver.ReleaseParams{
		{Consumer: "c", MessageID: "m-0", Token: before.Token, Error: "e"},
		{Consumer: "c", MessageID: "m-1", Token: first.Token, Error: "e"},
	} {
		if err := fresh.Release(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	taken := acq(old, "m-1")
	if got, want := stepsOf(taken.Steps), "run:1="; got != want {
		t.Errorf("takeover by the store of the old shape: steps %q, want %q", got, want)
	}
	if got, want := stepsOf(acq(fresh, "m-0").Steps), "run:1="; got != want {
		t.Errorf("takeover of m-0 by the store of the new shape: steps %q, want %q", got, want)
	}
	if got, want := listSteps(t, old, "c", "m-1"), "run:1=,run:3="; got != want {
		t.Errorf("Steps(m-1) by the store of the old shape: %q, want %q", got, want)
	}
	completeReopen(t, old, u.direct, u.table, "m-1", taken.Token)
}
