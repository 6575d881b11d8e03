package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/sqlschema"
)

// MigrationTable is the statements of a dialect's migrations table
// (Table + "_migrations": version, applied_at).
type MigrationTable struct {
	// Name is the table, as written in SQL.
	Name string
	// Create creates it if it does not exist.
	Create string
	// Record records one version (its only parameter) with the server's
	// time.
	Record string
}

// Apply creates the migrations table and runs, on db (a transaction or a
// connection holding the dialect's migration lock), every migration of
// migs whose version it does not record, statement by statement, recording
// each. Errors name the step that failed.
func Apply(ctx context.Context, db Querier, migs []sqlschema.Migration, mt MigrationTable) error {
	todo, err := Pending(ctx, db, migs, mt)
	if err != nil {
		return err
	}
	for _, m := range todo {
		if err := Run(ctx, db, db, m, mt); err != nil {
			return err
		}
	}
	return nil
}

// Pending creates the migrations table if it does not exist and returns
// the migrations of migs whose version it does not record, in the order
// of migs.
func Pending(ctx context.Context, db Querier, migs []sqlschema.Migration, mt MigrationTable) ([]sqlschema.Migration, error) {
	if _, err := db.Exec(ctx, mt.Create); err != nil {
		return nil, fmt.Errorf("create %s: %w", mt.Name, err)
	}
	rows, err := db.Query(ctx, `SELECT version FROM `+mt.Name)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", mt.Name, err)
	}
	done := map[int64]bool{}
	err = ForEach(rows, func(r Row) error {
		var v int64
		err := r.Scan(&v)
		done[v] = true
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", mt.Name, err)
	}
	var todo []sqlschema.Migration
	for _, m := range migs {
		if !done[int64(m.Version)] {
			todo = append(todo, m)
		}
	}
	return todo, nil
}

// Run runs m's statements on db, one by one, then records its version on
// rec (db itself, or, for a NoTransaction migration run outside any
// transaction, the transaction holding the migration lock). A statement
// marked sqlschema.RepeatMark runs until it changes no row. Errors name
// the step that failed.
func Run(ctx context.Context, db, rec Querier, m sqlschema.Migration, mt MigrationTable) error {
	for _, st := range m.Statements() {
		for {
			n, err := db.Exec(ctx, st)
			if err != nil {
				return fmt.Errorf("migration %s: %w", m.Name, err)
			}
			if n == 0 || !sqlschema.Repeats(st) {
				break
			}
		}
	}
	if _, err := rec.Exec(ctx, mt.Record, m.Version); err != nil {
		return fmt.Errorf("record migration %s: %w", m.Name, err)
	}
	return nil
}

// RetryLockTimeout runs run, a statement of a migration on a live table
// whose wait for a table lock the database bounds (PostgreSQL's
// lock_timeout, MySQL's lock_wait_timeout), until it returns anything but
// an error matching idemdriver.ErrLockTimeout, and returns that. A
// statement waiting for a table's exclusive lock queues every later
// statement on the table behind it, so it gives way when its bound passes
// and runs again after a pause: 100 ms, doubling up to 5 s, until ctx
// ends. When ctx ends in a pause, or run fails after ctx ended, once a
// run timed out, the error matches both idemdriver.ErrLockTimeout (the
// last timeout) and ctx.Err().
func RetryLockTimeout(ctx context.Context, run func() (int64, error)) (int64, error) {
	pause := 100 * time.Millisecond
	var timedOut error
	for {
		n, err := run()
		if err == nil {
			return n, nil
		}
		if !errors.Is(err, idemdriver.ErrLockTimeout) {
			if timedOut != nil && ctx.Err() != nil {
				return 0, errors.Join(timedOut, err, ctx.Err())
			}
			return 0, err
		}
		timedOut = err
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, errors.Join(err, ctx.Err())
		case <-t.C:
		}
		pause = min(2*pause, 5*time.Second)
	}
}
