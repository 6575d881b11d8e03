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

	other, err := idemsql.New(e.db, idemsql.Postgres, &idemsql.Config{Table: e.table})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Migrate(ctx); err != nil {
		t.Fatalf("upgrade to v2: %v", err)
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
