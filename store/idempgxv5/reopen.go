package idempgxv5

import (
	"context"
	"sync"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/sqlstore"
)

var _ idemdriver.Reopener = (*Store)(nil)

// reopenByTable caches the reopen statement per table.
var reopenByTable sync.Map // table -> *sqlstore.Reopen

// ReopenRecord implements [idemdriver.Reopener]: one statement, an
// UPDATE by primary key guarded by the state and the token, which also
// deletes the record's recovery points; when it changed nothing, a read
// of the record says why.
func (s *Store) ReopenRecord(ctx context.Context, p *idemdriver.ReopenRecordParams) (idemdriver.ActionResult, error) {
	r, ok := reopenByTable.Load(s.table.Qualified)
	if !ok {
		r, _ = reopenByTable.LoadOrStore(s.table.Qualified, sqlstore.NewReopen(s.ops(), true))
	}
	return r.(*sqlstore.Reopen).Run(ctx, querier{s.pool}, nil, p)
}
