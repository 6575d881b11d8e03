package pgsql

import (
	"fmt"
	"strings"
)

// FailoverRiskQuery reads what FailoverRisk judges: synchronous_commit,
// synchronous_standby_names and the number of standbys streaming from the
// server (pg_stat_replication's rows, visible to any role).
const FailoverRiskQuery = `SELECT current_setting('synchronous_commit'),
	current_setting('synchronous_standby_names'), (SELECT count(*) FROM pg_stat_replication)`

// FailoverRisk judges FailoverRiskQuery's row: "" when a commit is
// acknowledged only once flushed and, with standbys, once a synchronous
// standby has it; else one line naming the settings that let a crash or a
// failover lose acknowledged commits.
func FailoverRisk(commit, names string, standbys int) string {
	var risks []string
	switch commit {
	case "off":
		risks = append(risks, "synchronous_commit is off: a commit is acknowledged before it is flushed")
	case "local":
		risks = append(risks, "synchronous_commit is local: a commit is acknowledged before a standby has it")
	}
	if standbys > 0 && strings.TrimSpace(names) == "" {
		risks = append(risks, fmt.Sprintf("%d standby(s) replicate asynchronously (synchronous_standby_names is empty): a failover can lose acknowledged commits", standbys))
	}
	return strings.Join(risks, "; ")
}
