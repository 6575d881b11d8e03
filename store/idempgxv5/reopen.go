package idempgxv5

import (
	"context"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/sqlstore"
)

var _ idemdriver.Reopener = (*Store)(nil)

// ReopenRecord implements [idemdriver.Reopener]: one statement, an
// UPDATE by primary key guarded by the state and the token, which also
// deletes the record's recovery points; when it changed nothing, a read
// of the record says why.
func (s *Store) ReopenRecord(ctx context.Context, p *idemdriver.ReopenRecordParams) (idemdriver.ActionResult, error) {
	// The shape found now: one found before migration 016 would not
	// clear the point column.
	if err := s.tab.Refresh(ctx, querier{s.pool}); err != nil {
		return idemdriver.ActionResult{}, err
	}
	return withOps(ctx, s, func(o *sqlstore.Ops) (idemdriver.ActionResult, error) {
		return sqlstore.NewReopen(o, true).Run(ctx, querier{s.pool}, nil, p)
	})
}
