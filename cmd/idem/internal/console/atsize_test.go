//go:build atsize

package console_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/cmd/idem/internal/connect"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/pgsql"
	"github.com/idem-go/idem/internal/pgsql/pgsqltest"
	"github.com/idem-go/idem/internal/sqlstore"
	"github.com/idem-go/idem/store/idemsql"
)

// TestPagesAtSize times every page of the console and its JSON through
// the console's own handler, on a PostgreSQL table filled by
// scripts/console-at-size/fill-postgres.sql (not part of the suite: build
// tag atsize), or a SQLite one filled by fill-sqlite.sql
// (sqlite:PATH; times only). For each page, the first page and a deep one (reached by
// following the pages' cursors): median (min–max) of
// IDEM_CONSOLE_ATSIZE_RUNS requests (7), after one to warm up; the
// statements the server ran for it (pg_stat_statements, when the role
// may reset it); and the EXPLAIN (ANALYZE, BUFFERS) of each read, as
// the server plans it for a prepared statement (generic plan) and for
// its first runs (custom plan). It fails when a plan scans the records,
// steps or outbox table sequentially.
//
//	IDEM_CONSOLE_ATSIZE_URL=postgres://... go test -tags atsize -run TestPagesAtSize -v -timeout 30m ./cmd/idem/internal/console/
func TestPagesAtSize(t *testing.T) {
	u := os.Getenv("IDEM_CONSOLE_ATSIZE_URL")
	if u == "" {
		t.Fatal("IDEM_CONSOLE_ATSIZE_URL is not set: the PostgreSQL store filled by scripts/console-at-size/fill-postgres.sql")
	}
	table := os.Getenv("IDEM_CONSOLE_ATSIZE_TABLE")
	if table == "" {
		table = "idem_processed"
	}
	runs := 7
	if n, err := strconv.Atoi(os.Getenv("IDEM_CONSOLE_ATSIZE_RUNS")); err == nil && n > 0 {
		runs = n
	}
	ctx := context.Background()
	st, err := connect.OpenSQL(ctx, u, table)
	if err != nil {
		t.Fatal(err)
	}
	defer st.DB.Close()
	srv, err := console.New(console.Config{Store: st.Store, Where: "at size", ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) ([]byte, time.Duration) {
		t.Helper()
		req := httptest.NewRequest(http.MethodGet, "http://127.0.0.1"+path, nil)
		w := httptest.NewRecorder()
		start := time.Now()
		srv.ServeHTTP(w, req)
		d := time.Since(start)
		if w.Code != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, w.Code, w.Body.String())
		}
		return w.Body.Bytes(), d
	}
	// deep follows the next links of a JSON list pages times and returns
	// the cursor reached.
	deep := func(path string, pages int) string {
		cursor := ""
		for range pages {
			p := path
			if cursor != "" {
				p += "&cursor=" + url.QueryEscape(cursor)
			}
			body, _ := get(p)
			var v struct {
				Next string `json:"next"`
			}
			if err := json.Unmarshal(body, &v); err != nil {
				t.Fatal(err)
			}
			if v.Next == "" {
				break
			}
			cursor = v.Next
		}
		return cursor
	}
	var msgID, errText string
	if err := st.DB.QueryRowContext(ctx, `SELECT s.message_id FROM `+table+`_steps s JOIN `+table+`_consumers c ON c.name = s.consumer JOIN `+table+` p ON p.consumer_key = c.key AND p.message_id = s.message_id
		WHERE s.consumer = 'payments' AND p.state = 3 LIMIT 1`).Scan(&msgID); err != nil {
		t.Fatal(err)
	}
	if err := st.DB.QueryRowContext(ctx, `SELECT last_error FROM `+table+`_outbox WHERE failed_at IS NOT NULL AND sent_at IS NULL LIMIT 1`).Scan(&errText); err != nil {
		t.Fatal(err)
	}
	failedDeep := deep("/api/failed?consumer=payments", 40)
	heldDeep := deep("/api/failed?consumer=payments&state=in_progress", 40)
	outboxDeep := deep("/api/outbox?x=", 40)
	t.Logf("deep cursors: failed %s, in progress %s, outbox %s", failedDeep, heldDeep, outboxDeep)

	type target struct{ name, path string }
	q := url.QueryEscape
	var targets []target
	for _, p := range []target{
		{"consumers", "consumers"},
		{"failed, first page", "failed?consumer=payments"},
		{"failed, page 41", "failed?consumer=payments&cursor=" + q(failedDeep)},
		{"in progress, first page", "failed?consumer=payments&state=in_progress"},
		{"in progress, page 41", "failed?consumer=payments&state=in_progress&cursor=" + q(heldDeep)},
		{"outbox, first page", "outbox"},
		{"outbox, page 41", "outbox?cursor=" + q(outboxDeep)},
		{"outbox of one error", "outbox?error=" + q(errText)},
		{"message", "message?consumer=payments&id=" + q(msgID)},
	} {
		targets = append(targets, target{p.name, "/" + p.path}, target{p.name + " (JSON)", "/api/" + p.path})
	}
	load := func() string {
		b, _ := os.ReadFile("/proc/loadavg")
		return strings.TrimSpace(string(b))
	}
	t.Logf("load before: %s", load())
	statements := canReset(ctx, st.DB)
	for _, tg := range targets {
		get(tg.path) // warm up: the connection and the statement cache
		if statements {
			if _, err := st.DB.ExecContext(ctx, `SELECT pg_stat_statements_reset()`); err != nil {
				t.Fatal(err)
			}
		}
		var ds []time.Duration
		for range runs {
			_, d := get(tg.path)
			ds = append(ds, d)
		}
		slices.Sort(ds)
		t.Logf("%-32s %8.2f ms (%.2f–%.2f), %d runs", tg.name, ms(ds[len(ds)/2]), ms(ds[0]), ms(ds[len(ds)-1]), runs)
		if statements {
			logStatements(t, st.DB)
		}
	}
	t.Logf("load after: %s", load())

	if st.Dialect != idemsql.Postgres {
		return // the plans below are PostgreSQL's
	}
	// The plans, with the arguments of the pages above.
	ops := pgsql.Ops(table)
	reads := ops.Reads()
	pos := func(c string) []any {
		p, err := idemdriver.DecodeCursor(c)
		if err != nil {
			t.Fatal(err)
		}
		return []any{sqlstore.Micros(p.At), sqlstore.Micros(p.At), p.Key}
	}
	held := func(c string) []any {
		return append(append([]any{"payments"}, pos(c)...), int64(idemdriver.DefaultScanLimit), int64(idemdriver.StateInProgress), int64(idemdriver.DefaultPageSize+2))
	}
	for _, e := range []struct {
		name, read string
		args       []any
	}{
		{"consumers", "consumers", nil},
		{"failed, first page", "listFailed", append(append([]any{"payments"}, pos("")...), int64(idemdriver.DefaultPageSize+1))},
		{"failed, page 41", "listFailed", append(append([]any{"payments"}, pos(failedDeep)...), int64(idemdriver.DefaultPageSize+1))},
		{"in progress, first page", "list", held("")},
		{"in progress, page 41", "list", held(heldDeep)},
		{"outbox groups", "failures", []any{int64(50)}},
		{"outbox, first page", "failed", append(pos(""), int64(idemdriver.DefaultPageSize+1))},
		{"outbox, page 41", "failed", append(pos(outboxDeep), int64(idemdriver.DefaultPageSize+1))},
		{"outbox of one error", "failedOf", append(pos(""), errText, int64(idemdriver.DefaultPageSize+1))},
		{"outbox backlog", "backlog", nil},
		{"message", "inspect", []any{"payments", msgID}},
		{"message's steps", "steps", []any{"payments", msgID}},
	} {
		for _, mode := range []string{"force_generic_plan", "force_custom_plan"} {
			plan := explain(t, st.DB, mode, reads[e.read], e.args)
			t.Logf("EXPLAIN %s (%s, %s):\n%s", e.name, e.read, mode, plan)
			for _, tb := range []string{table, table + "_steps", table + "_outbox"} {
				if strings.Contains(plan, "Seq Scan on "+tb+" ") {
					t.Errorf("%s (%s): a sequential scan of %s", e.name, mode, tb)
				}
			}
		}
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// canReset reports whether the role may reset pg_stat_statements (a
// superuser grants it: GRANT EXECUTE ON FUNCTION pg_stat_statements_reset
// TO role).
func canReset(ctx context.Context, db *sql.DB) bool {
	_, err := db.ExecContext(ctx, `SELECT pg_stat_statements_reset()`)
	return err == nil
}

// logStatements logs the statements pg_stat_statements counted since its
// reset: calls, mean execution time, and shared buffers a call.
func logStatements(t *testing.T, db *sql.DB) {
	t.Helper()
	rows, err := db.Query(`SELECT calls, total_exec_time / calls, (shared_blks_hit + shared_blks_read) / calls, shared_blks_read / calls,
		left(regexp_replace(query, '\s+', ' ', 'g'), 110)
		FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND query NOT LIKE '%pg_stat_statements%' ORDER BY total_exec_time DESC`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			calls, blks, read int64
			mean              float64
			query             string
		)
		if err := rows.Scan(&calls, &mean, &blks, &read, &query); err != nil {
			t.Fatal(err)
		}
		t.Logf("    %3d calls, %7.2f ms, %6d buffers (%d read) a call: %s", calls, mean, blks, read, query)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
}

// explain prepares query and runs EXPLAIN (ANALYZE, BUFFERS) of its
// execution with args under plan_cache_mode mode, on a connection of its
// own, and returns the plan.
func explain(t *testing.T, db *sql.DB, mode, query string, args []any) string {
	t.Helper()
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	exec := "EXECUTE atsize" + pgsqltest.ExecuteArgs(args)
	for _, s := range []string{`SET plan_cache_mode = ` + mode, `PREPARE atsize AS ` + query} {
		if _, err := conn.ExecContext(ctx, s); err != nil {
			t.Fatalf("%v: %s", err, s)
		}
	}
	defer conn.ExecContext(ctx, `RESET plan_cache_mode`)
	defer conn.ExecContext(ctx, `DEALLOCATE atsize`)
	rows, err := conn.QueryContext(ctx, `EXPLAIN (ANALYZE, BUFFERS) `+exec)
	if err != nil {
		t.Fatalf("%v: %s", err, exec)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintln(&b, line)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}
