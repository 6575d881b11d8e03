package pgsql

import "github.com/idem-go/idem/internal/sqlstore"

// Ops returns the operator statements (sqlstore.Ops) on PostgreSQL for
// the processed-messages table t and its outbox t + "_outbox"; failed
// records are listed through the partial index of migration 012
// (sqlstore.Ops.WithFailedIndex).
func Ops(t string) *sqlstore.Ops {
	return sqlstore.NewOps(t, New(t).Inspect, Outbox(t+`_outbox`), TimeParam).WithFailedIndex()
}
