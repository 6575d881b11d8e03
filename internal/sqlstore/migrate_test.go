package sqlstore

import (
	"context"
	"slices"
	"testing"

	"github.com/idem-go/idem/internal/sqlschema"
)

// execLog is a Querier that records the statements it runs and answers
// each with the next of its row counts (0 once they run out).
type execLog struct {
	ran  []string
	rows []int64
}

func (e *execLog) Exec(_ context.Context, q string, _ ...any) (int64, error) {
	e.ran = append(e.ran, q)
	var n int64
	if len(e.rows) > 0 {
		n, e.rows = e.rows[0], e.rows[1:]
	}
	return n, nil
}

func (e *execLog) Query(context.Context, string, ...any) (Rows, error) { panic("unused") }
func (e *execLog) QueryRow(context.Context, string, ...any) Row        { panic("unused") }

// Run runs a statement marked sqlschema.RepeatMark until it changes no
// row, and any other statement once whatever it changed, then records the
// version.
func TestRunRepeats(t *testing.T) {
	batch := sqlschema.RepeatMark + " UPDATE t SET k = 1 WHERE id IN (SELECT id FROM t WHERE k IS NULL LIMIT 2)"
	m := sqlschema.Migration{Version: 7, Name: "007_x.sql", SQL: "UPDATE t SET a = 1;\n" + batch + ";\nALTER TABLE t ADD c int;\n"}
	db := &execLog{rows: []int64{5, 2, 2, 1, 0, 0}}
	if err := Run(t.Context(), db, db, m, MigrationTable{Record: "RECORD"}); err != nil {
		t.Fatal(err)
	}
	want := []string{"UPDATE t SET a = 1", batch, batch, batch, batch, "ALTER TABLE t ADD c int", "RECORD"}
	if !slices.Equal(db.ran, want) {
		t.Errorf("ran %q, want %q", db.ran, want)
	}
	if !sqlschema.Repeats(batch) || sqlschema.Repeats("UPDATE t SET a = 1") {
		t.Error("Repeats does not tell the marked statement")
	}
	if !sqlschema.Concurrent("CREATE INDEX CONCURRENTLY i ON t (a)") || sqlschema.Concurrent("ALTER TABLE t ADD c int") {
		t.Error("Concurrent does not tell CREATE INDEX CONCURRENTLY")
	}
}
