package idempgxv5_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem/internal/pgsql"
	"github.com/idem-go/idem/store/idempgxv5"
)

// TestFailoverRisk reads the test server's settings: the fast test
// instance runs with synchronous_commit off, which FailoverRisk names; a
// connection that sets it on, on a server without standbys, has no risk.
// The judgement of standbys and synchronous_standby_names is checked on
// the settings themselves (internal/failovertest checks it on a real
// primary with a standby).
func TestFailoverRisk(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	for _, tt := range []struct {
		commit string
		want   string // substring of the risk; "" for none
	}{
		{"off", "synchronous_commit is off"},
		{"on", ""},
	} {
		cfg, err := pgxpool.ParseConfig(testURL(t))
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = tt.commit
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		store, err := idempgxv5.New(pool, nil)
		if err != nil {
			t.Fatal(err)
		}
		risk, err := store.FailoverRisk(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if tt.want == "" && risk != "" || !strings.Contains(risk, tt.want) {
			t.Errorf("synchronous_commit=%s: risk %q, want %q", tt.commit, risk, tt.want)
		}
		if strings.Contains(risk, "idem:idem") || strings.Contains(risk, "127.0.0.1") {
			t.Errorf("risk %q names the connection", risk)
		}
	}
	for _, tt := range []struct {
		commit, names string
		standbys      int
		want          string
	}{
		{"on", "", 0, ""},
		{"on", "", 1, "1 standby(s) replicate asynchronously"},
		{"on", "node1,node2", 1, ""},
		{"remote_apply", "FIRST 1 (a, b)", 2, ""},
		{"local", "node2", 1, "synchronous_commit is local"},
		{"off", "", 2, "synchronous_commit is off: a commit is acknowledged before it is flushed; 2 standby(s)"},
	} {
		got := pgsql.FailoverRisk(tt.commit, tt.names, tt.standbys)
		if tt.want == "" && got != "" || !strings.Contains(got, tt.want) {
			t.Errorf("%s, %q, %d standbys: risk %q, want %q", tt.commit, tt.names, tt.standbys, got, tt.want)
		}
	}
}
