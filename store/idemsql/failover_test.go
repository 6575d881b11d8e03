package idemsql_test

import (
	"strings"
	"testing"

	"github.com/idem-go/idem/store/idemsql"
)

// TestFailoverRisk: the fast test PostgreSQL runs with synchronous_commit
// off, which FailoverRisk names (without the connection's address or
// user); MySQL and SQLite are not judged.
func TestFailoverRisk(t *testing.T) {
	forEachDialect(t, func(t *testing.T, d idemsql.Dialect) {
		store, err := idemsql.New(openDB(t, d, envOptions{}), d, nil)
		if err != nil {
			t.Fatal(err)
		}
		risk, err := store.FailoverRisk(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		want := ""
		if d == idemsql.Postgres {
			want = "synchronous_commit is off"
		}
		if want == "" && risk != "" || !strings.Contains(risk, want) {
			t.Errorf("risk %q, want %q", risk, want)
		}
		if strings.Contains(risk, "idem:idem") || strings.Contains(risk, "127.0.0.1") {
			t.Errorf("risk %q names the connection", risk)
		}
	})
}
