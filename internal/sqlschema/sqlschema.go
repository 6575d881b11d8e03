// Package sqlschema holds the SQL schema of idem's SQL stores: embedded,
// numbered migrations per dialect with a configurable table name. It is
// shared by store/idempgxv5 and store/idemsql and is not a public API.
package sqlschema

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/template"
)

//go:embed migrations
var files embed.FS

// Dialect names a migrations folder: "postgres", "mysql" or "sqlite".
type Dialect string

// The dialects with migrations.
const (
	Postgres Dialect = "postgres"
	MySQL    Dialect = "mysql"
	SQLite   Dialect = "sqlite"
	// PostgresPartitioned is PostgreSQL with the processed-messages table
	// range-partitioned by processed_at: its own migrations 001 (the
	// partitioned table) and 002 (the horizons table), then Postgres's
	// from 003 on (runs, outbox, and 006, which makes the lease-mode
	// columns nullable: the partitioned table has the same ones), except
	// those of a version its own folder has too (012: no index of the
	// failed records, which CREATE INDEX CONCURRENTLY cannot build on a
	// partitioned table).
	PostgresPartitioned Dialect = "postgres_partitioned"
)

// overlays are the dialects made of another dialect's migrations with
// some versions replaced: dialect -> (base, first base version used).
var overlays = map[Dialect]struct {
	base Dialect
	from int
}{PostgresPartitioned: {Postgres, 3}}

// DefaultTable is the processed-messages table name used when none is given.
const DefaultTable = "idem_processed"

// ErrInvalidTable is returned for a table name that is not a plain SQL identifier.
var ErrInvalidTable = errors.New("invalid table name")

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,47}$`)

// Table is a validated table name, optionally schema-qualified.
type Table struct {
	// Qualified is the name as written in SQL, e.g. "app.idem_processed".
	Qualified string
	// Name is the bare table name, used to name constraints and indexes.
	Name string
}

// ParseTable validates name: one identifier or schema.identifier, each of
// letters, digits and underscores, starting with a letter or underscore, at
// most 48 bytes (room for index-name suffixes within every dialect's limit).
// Quoting is never needed, so names cannot smuggle SQL. Empty means DefaultTable.
func ParseTable(name string) (Table, error) {
	if name == "" {
		name = DefaultTable
	}
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return Table{}, fmt.Errorf("%w: %q", ErrInvalidTable, name)
	}
	for _, p := range parts {
		if !identRE.MatchString(p) {
			return Table{}, fmt.Errorf("%w: %q (want [A-Za-z_][A-Za-z0-9_]*, at most 48 bytes, optionally schema-qualified)", ErrInvalidTable, name)
		}
	}
	return Table{Qualified: name, Name: parts[len(parts)-1]}, nil
}

// Migration is one numbered schema step.
type Migration struct {
	// Version numbers migrations from 1, in the order they apply.
	Version int
	// Name is the file name, e.g. "001_processed.sql".
	Name string
	// SQL is the statement text with the table name filled in; statements
	// are separated by ";" at the end of a line.
	SQL string
	// NoTransaction is set for a migration whose file has the line
	// "-- idem:no-transaction": its statements cannot run inside a
	// transaction block (PostgreSQL's CREATE INDEX CONCURRENTLY, which
	// builds an index without blocking writes), so the runner runs each
	// one on its own, after every earlier migration committed. Such
	// statements must be safe to run again after a failure part way.
	// On PostgreSQL, a statement of such a migration that is not
	// Concurrent (an ALTER TABLE that adds a nullable column or a NOT
	// VALID constraint, a VALIDATE, a batch of a backfill) runs in a
	// transaction of its own whose lock_timeout is one second, again
	// after a pause while it times out, so that no statement holds or
	// queues for the table's lock for longer while consumers run: this
	// is how a migration upgrades a live table in place.
	NoTransaction bool
	// SmallTable, for a NoTransaction migration, is a table (as written
	// in SQL) below whose size (SmallRows rows) the migration runs in a
	// transaction after all, as InTransaction spells it: the line
	// "-- idem:no-transaction unless-small TABLE". On a small table a
	// plain CREATE INDEX holds its lock for milliseconds, while CREATE
	// INDEX CONCURRENTLY waits for every transaction of the database that
	// is older than it, whatever tables they use.
	SmallTable string
}

// SmallRows is the size below which a migration's SmallTable counts as
// small.
const SmallRows = 10_000

// RepeatMark, written at the start of a statement (it is a comment to
// the server), marks a batch of a backfill: the runner runs the
// statement again and again, each run in a transaction of its own when
// the migration is NoTransaction, until a run changes no row. Such a
// statement changes at most a bounded number of rows per run (LIMIT in a
// subquery), finds them by an index (a partial index of the rows still to
// change, built first), and leaves a row it changed out of its next run,
// so that each run is short, holds its row locks for a moment and the
// backfill ends. On a table with concurrent writers, what they write must
// already be in the new form (a trigger, or binaries that write it),
// or the backfill would chase them. A run must not skip the rows it
// cannot lock (SKIP LOCKED): when only locked rows are left, it changes
// none, which ends the backfill with those rows unchanged; without it,
// the run waits for them (in a NoTransaction migration, at most its
// lock_timeout, and then runs again).
const RepeatMark = "/* idem:repeat */"

// Repeats reports whether statement st is marked with RepeatMark.
func Repeats(st string) bool { return strings.HasPrefix(strings.TrimSpace(st), RepeatMark) }

// Concurrent reports whether statement st is one that PostgreSQL runs
// without a lock that blocks the table's writers and cannot run in a
// transaction block (CREATE INDEX CONCURRENTLY, DROP INDEX CONCURRENTLY,
// REINDEX ... CONCURRENTLY).
func Concurrent(st string) bool { return strings.Contains(st, " CONCURRENTLY ") }

// InTransaction is m's statements as they run in a transaction: without
// the word CONCURRENTLY.
func (m Migration) InTransaction() Migration {
	m.SQL = strings.ReplaceAll(m.SQL, " CONCURRENTLY ", " ")
	m.NoTransaction, m.SmallTable = false, ""
	return m
}

// noTransaction is the line that marks a migration as NoTransaction.
const noTransaction = "-- idem:no-transaction"

// Statements splits the migration into single statements, for drivers that
// run one statement per call (MySQL without multiStatements).
func (m Migration) Statements() []string {
	var out []string
	for _, s := range strings.Split(m.SQL, ";\n") {
		// Drop comment-only lines so an all-comment chunk is skipped.
		var lines []string
		for _, l := range strings.Split(s, "\n") {
			if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "--") {
				lines = append(lines, l)
			}
		}
		if st := strings.TrimSuffix(strings.TrimSpace(strings.Join(lines, "\n")), ";"); st != "" {
			out = append(out, st)
		}
	}
	return out
}

// templateData is what the migration templates see: {{.Table}} (and
// {{.Qualified}}) is the table as written in SQL, {{.Name}} the bare name.
type templateData struct {
	Table, Qualified, Name string
}

// Migrations returns the dialect's migrations for table, in version order.
func Migrations(d Dialect, table Table) ([]Migration, error) {
	out, err := migrations(d, table)
	if err != nil {
		return nil, err
	}
	if o, ok := overlays[d]; ok {
		base, err := migrations(o.base, table)
		if err != nil {
			return nil, err
		}
		own := map[int]bool{}
		for _, m := range out {
			own[m.Version] = true
		}
		for _, m := range base {
			if m.Version >= o.from && !own[m.Version] {
				out = append(out, m)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// migrations returns the migrations in d's own folder.
func migrations(d Dialect, table Table) ([]Migration, error) {
	dir := path.Join("migrations", string(d))
	entries, err := fs.ReadDir(files, dir)
	if err != nil {
		return nil, fmt.Errorf("unknown dialect %q", d)
	}
	var out []Migration
	for _, e := range entries {
		v, err := strconv.Atoi(strings.SplitN(e.Name(), "_", 2)[0])
		if err != nil {
			return nil, fmt.Errorf("migration %s: no version prefix", e.Name())
		}
		raw, err := fs.ReadFile(files, path.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		t, err := template.New(e.Name()).Parse(string(raw))
		if err != nil {
			return nil, err
		}
		var b bytes.Buffer
		if err := t.Execute(&b, templateData{Table: table.Qualified, Qualified: table.Qualified, Name: table.Name}); err != nil {
			return nil, err
		}
		m := Migration{Version: v, Name: e.Name(), SQL: b.String()}
		for _, l := range strings.Split(m.SQL, "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0]+" "+f[1] == noTransaction {
				m.NoTransaction = true
				if len(f) == 4 && f[2] == "unless-small" {
					m.SmallTable = f[3]
				}
			}
		}
		out = append(out, m)
	}
	return out, nil
}
