package pgsql

import "github.com/idem-go/idem/internal/sqlstore"

// Ops returns the operator statements (sqlstore.Ops) on PostgreSQL for
// the processed-messages table t and its outbox t + "_outbox"; failed
// records are listed through the partial index of migration 012
// (sqlstore.Ops.WithFailedIndex).
func Ops(t string) *sqlstore.Ops {
	return sqlstore.NewOps(t, New(t).Inspect, Outbox(t+`_outbox`), TimeParam).WithFailedIndex()
}

// OpsV2 is Ops on a table of schema v2 (NewV2): records are found by
// their consumer's key, looked up by name in the consumers table, and
// the consumers listed are those of the consumers table that have a
// record, each with its oldest and newest (two probes of the retention
// index on (consumer_key, processed_at)). A record's recovery points
// include the one kept in its point column (layout.stepsRead), which
// Reopen clears with the others.
func OpsV2(t string) *sqlstore.Ops { return opsV2(layout{t: t, v2: true, point: true}) }

// opsV2 is OpsV2 in l's shape (with or without the point column).
func opsV2(l layout) *sqlstore.Ops {
	t := l.t
	consumers := `SELECT c.name, 0, ` + Micros(`(SELECT MIN(r.processed_at) FROM `+t+` r WHERE r.consumer_key = c.key)`) + `, ` +
		Micros(`(SELECT MAX(r.processed_at) FROM `+t+` r WHERE r.consumer_key = c.key)`) + `
FROM ` + t + `_consumers c WHERE EXISTS (SELECT FROM ` + t + ` r WHERE r.consumer_key = c.key) ORDER BY c.name`
	ops := sqlstore.NewOpsKeyed(t, NewV2(t).Inspect, Outbox(t+`_outbox`), TimeParam, l.nameIs, consumers).WithFailedIndex()
	set := `` // Reopen clears the point where the table has the column
	if l.point {
		set = `, point = NULL`
	}
	return ops.WithRecordPoint(l.stepsRead(t+`_steps`), set)
}
