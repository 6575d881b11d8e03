package idempgxv5

import (
	"context"
	"errors"

	"github.com/idem-go/idem/internal/sqlstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// pgxQuerier is what pgx's pool, connections and transactions share.
type pgxQuerier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// querier runs the shared PostgreSQL logic (internal/pgsql) on a pgx
// pool, connection or transaction.
type querier struct{ q pgxQuerier }

func (a querier) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	tag, err := a.q.Exec(ctx, sql, args...)
	return tag.RowsAffected(), err
}

func (a querier) Query(ctx context.Context, sql string, args ...any) (sqlstore.Rows, error) {
	return a.q.Query(ctx, sql, args...)
}

func (a querier) QueryRow(ctx context.Context, sql string, args ...any) sqlstore.Row {
	return row{a.q.QueryRow(ctx, sql, args...)}
}

// modeQuerier runs every statement of q in mode, whatever the
// connections' default (pgx takes a QueryExecMode as the first argument).
type modeQuerier struct {
	q    pgxQuerier
	mode pgx.QueryExecMode
}

func (m modeQuerier) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return m.q.Exec(ctx, sql, append([]any{m.mode}, args...)...)
}

func (m modeQuerier) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return m.q.Query(ctx, sql, append([]any{m.mode}, args...)...)
}

func (m modeQuerier) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return m.q.QueryRow(ctx, sql, append([]any{m.mode}, args...)...)
}

// row maps pgx.ErrNoRows to sqlstore.ErrNoRows.
type row struct{ r pgx.Row }

func (r row) Scan(dest ...any) error {
	err := r.r.Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return sqlstore.ErrNoRows
	}
	return err
}
