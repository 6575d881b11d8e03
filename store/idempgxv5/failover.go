package idempgxv5

import (
	"context"
	"fmt"
	"strings"

	"github.com/idem-go/idem/idemdriver"
)

var _ idemdriver.FailoverRiskReporter = (*Store)(nil)

// FailoverRisk reads, on one of the pool's connections, the settings that
// decide whether PostgreSQL acknowledges a commit that a crash or a
// failover can lose: synchronous_commit (off acknowledges before the
// local flush, local before any standby has it) and, when standbys stream
// from this server (pg_stat_replication), synchronous_standby_names (empty:
// they replicate asynchronously, and the one promoted may lack the last
// commits). It returns "" when neither applies, else one line naming the
// settings. See docs/failover.md for the settings that give no loss.
func (s *Store) FailoverRisk(ctx context.Context) (string, error) {
	var commit, names string
	var standbys int
	if err := s.pool.QueryRow(ctx, `SELECT current_setting('synchronous_commit'),
		current_setting('synchronous_standby_names'), (SELECT count(*) FROM pg_stat_replication)`).
		Scan(&commit, &names, &standbys); err != nil {
		return "", fmt.Errorf("idempgxv5: reading the replication settings: %w", err)
	}
	return pgFailoverRisk(commit, names, standbys), nil
}

// pgFailoverRisk is FailoverRisk's judgement of the settings read.
func pgFailoverRisk(commit, names string, standbys int) string {
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
