package idemsql

import (
	"context"
	"database/sql"
	"errors"

	"github.com/idem-go/idem/internal/sqlstore"
)

// sqlQuerier is what *sql.DB, *sql.Conn and *sql.Tx share.
type sqlQuerier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// querier runs the shared SQL-store logic (internal/sqlstore,
// internal/pgsql) on a database/sql handle, connection or transaction.
type querier struct{ q sqlQuerier }

func (a querier) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	r, err := a.q.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return r.RowsAffected()
}

func (a querier) Query(ctx context.Context, query string, args ...any) (sqlstore.Rows, error) {
	rows, err := a.q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return sqlRows{rows}, nil
}

func (a querier) QueryRow(ctx context.Context, query string, args ...any) sqlstore.Row {
	return sqlRow{a.q.QueryRowContext(ctx, query, args...)}
}

// sqlRows adapts *sql.Rows, whose Close returns an error (also reported by
// Err).
type sqlRows struct{ *sql.Rows }

func (r sqlRows) Close() { _ = r.Rows.Close() }

// sqlRow maps sql.ErrNoRows to sqlstore.ErrNoRows.
type sqlRow struct{ r *sql.Row }

func (r sqlRow) Scan(dest ...any) error {
	err := r.r.Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return sqlstore.ErrNoRows
	}
	return err
}

// txQuerier is querier over a transaction, pointer-shaped, so that
// passing it as an sqlstore.Querier allocates nothing (a querier holds an
// interface, which the conversion copies to the heap): the claim's path.
type txQuerier struct{ tx *sql.Tx }

func (a txQuerier) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	return querier{a.tx}.Exec(ctx, query, args...)
}

func (a txQuerier) Query(ctx context.Context, query string, args ...any) (sqlstore.Rows, error) {
	return querier{a.tx}.Query(ctx, query, args...)
}

func (a txQuerier) QueryRow(ctx context.Context, query string, args ...any) sqlstore.Row {
	return querier{a.tx}.QueryRow(ctx, query, args...)
}
