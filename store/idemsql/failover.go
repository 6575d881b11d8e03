package idemsql

import (
	"context"
	"fmt"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/pgsql"
)

var _ idemdriver.FailoverRiskReporter = (*Store)(nil)

// FailoverRisk implements [idemdriver.FailoverRiskReporter]. On PostgreSQL
// it reads, on one of the handle's connections, synchronous_commit,
// synchronous_standby_names and the standbys streaming from the server,
// as store/idempgxv5 does, and returns one line naming the settings that
// let a crash or a failover lose acknowledged commits ("" when none do).
// On MySQL and SQLite it reads nothing and returns "": idem does not
// judge their durability settings.
func (s *Store) FailoverRisk(ctx context.Context) (string, error) {
	if s.dialect != Postgres {
		return "", nil
	}
	var commit, names string
	var standbys int
	if err := s.db.QueryRowContext(ctx, pgsql.FailoverRiskQuery).Scan(&commit, &names, &standbys); err != nil {
		return "", fmt.Errorf("idemsql: reading the replication settings: %w", err)
	}
	return pgsql.FailoverRisk(commit, names, standbys), nil
}
