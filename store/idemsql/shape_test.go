package idemsql_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idemsql"
)

// TestPostgresShapeChangeUnderStore runs a store on a table of schema v1
// (the migrations before 014 applied) and upgrades the table to schema
// v2 with another store's Migrate while the first one holds the shape it
// found. Its next claim in the caller's transaction fails with SQLSTATE
// 42703 (the consumer column is gone), so that message is not
// acknowledged; delivered again, it is processed in the new shape, once.
// A lease-mode Acquire, whose statement the store runs on its own, finds
// the new shape and succeeds at once. The records written before the
// upgrade are duplicates after it.
func TestPostgresShapeChangeUnderStore(t *testing.T) {
	t.Parallel()
	e := newEnv(t, idemsql.Postgres, envOptions{noMigrate: true})
	ctx := t.Context()
	migs := migrationsOf(t, idemsql.Postgres, e.table)
	if _, err := e.db.ExecContext(ctx, `CREATE TABLE `+e.table+`_migrations (version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	for _, m := range migs {
		if m.Version >= 14 {
			break
		}
		for _, st := range m.Statements() {
			if _, err := e.db.ExecContext(ctx, st); err != nil {
				t.Fatalf("migration %s: %v", m.Name, err)
			}
		}
		if _, err := e.db.ExecContext(ctx, `INSERT INTO `+e.table+`_migrations (version) VALUES ($1)`, m.Version); err != nil {
			t.Fatal(err)
		}
	}
	c := e.consumer("c")
	if out, err := c.Process(ctx, idem.Message{ID: "v1", Payload: []byte("v1")}, e.effectHandler); err != nil || out.Status != idem.Processed {
		t.Fatalf("claim on v1: %v, %v", out.Status, err)
	}
	// A store in lease mode that has found v1 too.
	lease, err := idemsql.New(e.db, idemsql.Postgres, &idemsql.Config{Table: e.table})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := lease.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "l", MessageID: "v1-lease", Fingerprint: fp("a"), Lease: time.Minute}); err != nil || !r.Acquired {
		t.Fatalf("acquire on v1: %+v, %v", r, err)
	}

	// Two more that have found v1, for the batches.
	acq, err := idemsql.New(e.db, idemsql.Postgres, &idemsql.Config{Table: e.table})
	if err != nil {
		t.Fatal(err)
	}
	comp, err := idemsql.New(e.db, idemsql.Postgres, &idemsql.Config{Table: e.table})
	if err != nil {
		t.Fatal(err)
	}
	held, err := comp.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "l", MessageID: "v1-held", Fingerprint: fp("h"), Lease: time.Minute})
	if err != nil || !held.Acquired {
		t.Fatalf("acquire on v1: %+v, %v", held, err)
	}
	if _, err := acq.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "l", MessageID: "v1-other", Fingerprint: fp("o"), Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}

	other, err := idemsql.New(e.db, idemsql.Postgres, &idemsql.Config{Table: e.table})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Migrate(ctx); err != nil {
		t.Fatalf("upgrade to v2: %v", err)
	}

	// The batches, in transactions the stores begin, are made again in
	// the new shape.
	res, errs, err := acq.AcquireBatch(ctx, []*idemdriver.AcquireParams{
		{Consumer: "l", MessageID: "v2-batch-1", Fingerprint: fp("1"), Lease: time.Minute},
		{Consumer: "l", MessageID: "v2-batch-2", Fingerprint: fp("2"), Lease: time.Minute}})
	if err != nil || errs[0] != nil || errs[1] != nil || !res[0].Acquired || !res[1].Acquired {
		t.Errorf("AcquireBatch after the upgrade: %+v, %v, %v", res, errs, err)
	}
	cerrs, err := comp.CompleteBatch(ctx, []*idemdriver.CompleteParams{{Consumer: "l", MessageID: "v1-held", Token: held.Token, Result: []byte("r")}})
	if err != nil || cerrs[0] != nil {
		t.Errorf("CompleteBatch after the upgrade: %v, %v", cerrs, err)
	}
	if r, err := comp.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "l", MessageID: "v1-held", Fingerprint: fp("h"), Lease: time.Minute}); err != nil || r.State != idemdriver.StateCompleted || string(r.Result) != "r" {
		t.Errorf("the record CompleteBatch completed: %+v, %v", r, err)
	}

	var pgErr *pgconn.PgError
	_, err = c.Process(ctx, idem.Message{ID: "after", Payload: []byte("after")}, e.effectHandler)
	if !errors.As(err, &pgErr) || pgErr.Code != "42703" {
		t.Errorf("first claim after the upgrade: %v, want SQLSTATE 42703", err)
	}
	for _, tt := range []struct {
		id   string
		want idem.Status
	}{{"after", idem.Processed}, {"after", idem.Duplicate}, {"v1", idem.Duplicate}} {
		if out, err := c.Process(ctx, idem.Message{ID: tt.id, Payload: []byte(tt.id)}, e.effectHandler); err != nil || out.Status != tt.want {
			t.Errorf("Process(%s) after the upgrade: %v, %v; want %v", tt.id, out.Status, err, tt.want)
		}
	}
	e.wantEffects("after", 1)
	e.wantEffects("v1", 1)
	e.wantRecords("c", 2)

	// The lease store's statements still name the consumer column: its
	// Acquire finds the new shape and runs again, without an error.
	if r, err := lease.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "l", MessageID: "v1-lease", Fingerprint: fp("a"), Lease: time.Minute}); err != nil || r.Acquired || r.State != idemdriver.StateInProgress {
		t.Errorf("acquire of the v1 lease record after the upgrade: %+v, %v; want in progress", r, err)
	}
	if r, err := lease.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "l", MessageID: "v2-lease", Fingerprint: fp("b"), Lease: time.Minute}); err != nil || !r.Acquired {
		t.Errorf("acquire of a new message after the upgrade: %+v, %v", r, err)
	}
}

// A table of schema v2 whose 32,767 consumer keys are all given: a new
// consumer's claim fails with ErrTooManyConsumers and is not
// acknowledged; a consumer with a key processes as before.
func TestPostgresTooManyConsumers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, idemsql.Postgres, envOptions{})
	ctx := t.Context()
	known := e.consumer("known")
	if out, err := known.Process(ctx, idem.Message{ID: "m-1", Payload: []byte("m-1")}, e.effectHandler); err != nil || out.Status != idem.Processed {
		t.Fatalf("Process: %v, %v", out.Status, err)
	}
	if _, err := e.db.ExecContext(ctx, `INSERT INTO `+e.table+`_consumers (key, name)
		SELECT g, 'filler-' || g FROM generate_series((SELECT max(key) + 1 FROM `+e.table+`_consumers), 32767) g`); err != nil {
		t.Fatal(err)
	}
	late := e.consumer("late")
	if _, err := late.Process(ctx, idem.Message{ID: "m-1", Payload: []byte("m-1")}, e.effectHandler); !errors.Is(err, idemsql.ErrTooManyConsumers) {
		t.Errorf("Process of a new consumer: %v, want ErrTooManyConsumers", err)
	}
	if out, err := known.Process(ctx, idem.Message{ID: "m-2", Payload: []byte("m-2")}, e.effectHandler); err != nil || out.Status != idem.Processed {
		t.Errorf("Process of a consumer with a key: %v, %v", out.Status, err)
	}
	e.wantEffects("m-1", 1)
	e.wantRecords("late", 0)
}
