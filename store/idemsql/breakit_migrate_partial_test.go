package idemsql_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/idem-go/idem/internal/sqlschema"
	"github.com/idem-go/idem/store/idemsql"
)

// TestBreakMigratePartial: Migrate run again over every partial state an
// interrupted run can leave (`idem migrate` killed, the connection lost):
// the migrations before N applied and recorded, then the first k
// statements of N run, for every k up to all of them (run but not
// recorded). On MySQL every statement commits on its own, so each such
// state can happen; on PostgreSQL only in a migration that runs outside a
// transaction (an index built concurrently). Migrate must complete, and
// leave the same schema (columns, indexes and their validity,
// constraints) and the same recorded versions as on a table migrated in
// one go. SQLite runs its migrations in one transaction: nothing partial.
// By default the last migration of each dialect is interrupted at every
// statement; IDEM_BREAKIT_MIGRATE=1 interrupts every migration.
func TestBreakMigratePartial(t *testing.T) {
	t.Parallel()
	all := os.Getenv("IDEM_BREAKIT_MIGRATE") == "1"
	for _, d := range []idemsql.Dialect{idemsql.MySQL, idemsql.Postgres} {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			ref := newEnv(t, d, envOptions{})
			want := schemaOf(t, ctx, ref.db, d, ref.table)
			migs := migrationsOf(t, d, ref.table)
			cases := 0
			for i, m := range migs {
				if d == idemsql.Postgres && !m.NoTransaction {
					continue // transactional: nothing of it stays after a failure
				}
				if !all && i != len(migs)-1 && !(d == idemsql.Postgres && m.Version == lastNoTx(migs)) {
					continue
				}
				for k := 1; k <= len(m.Statements()); k++ {
					cases++
					t.Run(fmt.Sprintf("%03d-%d-of-%d", m.Version, k, len(m.Statements())), func(t *testing.T) {
						e := newEnv(t, d, envOptions{noMigrate: true})
						own := migrationsOf(t, d, e.table)
						if err := idemsql.MigrateWith(ctx, e.store, own[:i]); err != nil {
							t.Fatalf("migrations before %03d: %v", m.Version, err)
						}
						for _, st := range own[i].Statements()[:k] {
							if _, err := e.db.ExecContext(ctx, st); err != nil {
								t.Fatalf("statement of %03d: %v\n%s", m.Version, err, st)
							}
						}
						if err := e.store.Migrate(ctx); err != nil {
							t.Fatalf("Migrate over %03d stopped after statement %d: %v", m.Version, k, err)
						}
						if got := schemaOf(t, ctx, e.db, d, e.table); got != want {
							t.Errorf("schema after Migrate over the partial state:\n%s\nwant (migrated in one go):\n%s", got, want)
						}
					})
				}
			}
			if cases == 0 {
				t.Fatal("no migration to interrupt")
			}
		})
	}
}

// lastNoTx is the version of the last migration of migs that runs
// outside a transaction, 0 when none does.
func lastNoTx(migs []sqlschema.Migration) int {
	v := 0
	for _, m := range migs {
		if m.NoTransaction {
			v = m.Version
		}
	}
	return v
}

var autoIncrement = regexp.MustCompile(` AUTO_INCREMENT=\d+`)

// schemaOf describes the tables of table (itself, _steps, _runs,
// _outbox, _migrations' versions) with table's name replaced by T, so
// that two tables' descriptions compare.
func schemaOf(t *testing.T, ctx context.Context, db *sql.DB, d idemsql.Dialect, table string) string {
	t.Helper()
	var b strings.Builder
	rows := func(q string, args ...any) []string {
		t.Helper()
		rs, err := db.QueryContext(ctx, q, args...)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		defer rs.Close()
		var out []string
		for rs.Next() {
			var s string
			if err := rs.Scan(&s); err != nil {
				t.Fatal(err)
			}
			out = append(out, s)
		}
		if err := rs.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	for _, suffix := range []string{"", "_steps", "_runs", "_outbox"} {
		name := table + suffix
		fmt.Fprintf(&b, "-- T%s\n", suffix)
		switch d {
		case idemsql.MySQL:
			var n, create string
			if err := db.QueryRowContext(ctx, "SHOW CREATE TABLE "+name).Scan(&n, &create); err != nil {
				fmt.Fprintf(&b, "absent (%v)\n", err)
				continue
			}
			b.WriteString(autoIncrement.ReplaceAllString(create, "") + "\n")
		default:
			cols := rows(`SELECT column_name || ' ' || data_type || ' ' || is_nullable || ' ' || COALESCE(column_default, '')
				FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = $1 ORDER BY ordinal_position`, name)
			idx := rows(`SELECT pg_get_indexdef(i.indexrelid) || CASE WHEN i.indisvalid THEN '' ELSE ' INVALID' END
				FROM pg_index i WHERE i.indrelid = to_regclass($1)`, name)
			cons := rows(`SELECT conname || ' ' || pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = to_regclass($1)`, name)
			slices.Sort(idx)
			slices.Sort(cons)
			for _, s := range slices.Concat(cols, idx, cons) {
				b.WriteString(s + "\n")
			}
		}
	}
	b.WriteString("-- versions\n")
	cast := `CAST(version AS CHAR(10))`
	if d == idemsql.Postgres {
		cast = `version::text`
	}
	versions := rows(`SELECT ` + cast + ` FROM ` + table + `_migrations ORDER BY version`)
	b.WriteString(strings.Join(versions, " ") + "\n")
	return strings.ReplaceAll(b.String(), table, "T")
}
