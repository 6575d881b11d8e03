package idemsql

import (
	"context"
	"database/sql"
	"sync"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/sqlstore"
)

var _ idemdriver.Reopener = (*Store)(nil)

// reopenCache caches the reopen statements per dialect and table.
var reopenCache sync.Map // dialect + " " + table -> *sqlstore.Reopen

// ReopenRecord implements [idemdriver.Reopener]: on PostgreSQL one
// statement, an UPDATE by primary key guarded by the state and the token
// that also deletes the record's recovery points; on MySQL and SQLite the
// UPDATE and the DELETE in one transaction. When it changed nothing, a
// read of the record says why.
func (s *Store) ReopenRecord(ctx context.Context, p *idemdriver.ReopenRecordParams) (idemdriver.ActionResult, error) {
	inTx := func(ctx context.Context, fn func(sqlstore.Querier) error) error {
		return s.inTx(ctx, func(tx *sql.Tx) error { return fn(querier{tx}) })
	}
	if s.dialect == Postgres { // the statement of the table's shape
		// Found now: one found before migration 016 would not clear
		// the point column.
		if err := s.pg.Refresh(ctx, querier{s.db}); err != nil {
			return idemdriver.ActionResult{}, err
		}
		return withOps(ctx, s, func(o *sqlstore.Ops) (idemdriver.ActionResult, error) {
			return sqlstore.NewReopen(o, true).Run(ctx, querier{s.db}, inTx, p)
		})
	}
	k := s.dialect.String() + " " + s.table.Qualified
	r, ok := reopenCache.Load(k)
	if !ok {
		r, _ = reopenCache.LoadOrStore(k, sqlstore.NewReopen(s.ops(), false))
	}
	return r.(*sqlstore.Reopen).Run(ctx, querier{s.db}, inTx, p)
}
