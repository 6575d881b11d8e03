package idempgxv5

import (
	"context"
	"fmt"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/pgsql"
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
	if err := s.pool.QueryRow(ctx, pgsql.FailoverRiskQuery).Scan(&commit, &names, &standbys); err != nil {
		return "", fmt.Errorf("idempgxv5: reading the replication settings: %w", err)
	}
	return pgsql.FailoverRisk(commit, names, standbys), nil
}
