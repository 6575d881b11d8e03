package idemsql

import (
	"context"

	"github.com/idem-go/idem/internal/sqlschema"
)

// MigrateWith applies migs to s's table as Migrate applies the embedded
// migrations (tests: a table left with some migrations applied).
func MigrateWith(ctx context.Context, s *Store, migs []sqlschema.Migration) error {
	return s.migrate(ctx, migs)
}
