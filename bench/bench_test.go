package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestQuick runs `bench --quick` end to end, as ./scripts/test does, so the
// harness cannot rot: every contender on both brokers, on SQLite and (when
// IDEM_TEST_POSTGRES_URL or IDEM_TEST_POSTGRES_DURABLE_URL is set; required
// under IDEM_TEST_REQUIRE_ALL=1)
// PostgreSQL. It checks the three outputs exist and that the correctness
// columns say what the contenders guarantee: idem (and, on PostgreSQL, the
// hand-written best consumer) has no double effect and loses nothing under
// any fault, while the naive consumer applies every
// published duplicate twice and the crash redelivers what it committed.
func TestQuick(t *testing.T) {
	stores := "sqlite"
	if postgresURL() != "" {
		stores += ",postgres"
	} else if os.Getenv("IDEM_TEST_REQUIRE_ALL") == "1" {
		t.Fatalf("missing environment variable %s (required: IDEM_TEST_REQUIRE_ALL=1); scripts/services prints it", envPostgres)
	} else {
		t.Logf("%s not set: PostgreSQL left out", envPostgres)
	}
	if os.Getenv(envMySQL) != "" {
		stores += ",mysql"
	} else if os.Getenv("IDEM_TEST_REQUIRE_ALL") == "1" {
		t.Fatalf("missing environment variable %s (required: IDEM_TEST_REQUIRE_ALL=1); scripts/services prints it", envMySQL)
	} else {
		t.Logf("%s not set: MariaDB left out", envMySQL)
	}
	out := t.TempDir()
	ctx, cancel := testContext(t)
	defer cancel()
	var stdout, stderr bytes.Buffer
	start := time.Now()
	if err := cli(ctx, []string{"--quick", "--out", out, "--stores", stores}, &stdout, &stderr); err != nil {
		t.Fatalf("bench --quick: %v\n%s", err, stderr.String())
	}
	t.Logf("bench --quick took %v\n%s", time.Since(start).Round(time.Millisecond), stdout.String())

	// Per broker and store: every contender (best_checked and its batch
	// included), and on PostgreSQL also the hand-written best consumer.
	contenders := []string{"naive", "best_checked", "best_checked_batch10", "idem", "idem-outbox", "idem-batch10", "watermill-dedup", "relay"}
	nstores := strings.Count(stores, ",") + 1
	want := 2 * nstores * len(contenders)
	if strings.Contains(stores, "postgres") {
		want += 2
	}
	table := stdout.String()
	if !strings.Contains(table, "| broker | store | contender | msgs/s | × naive | × best | × best_checked |") {
		t.Errorf("stdout has no Markdown table header:\n%s", table)
	}
	if got := strings.Count(table, "\n| nats |") + strings.Count(table, "\n| kafka |"); got != want {
		t.Errorf("table has %d result rows, want %d", got, want)
	}

	img, err := os.Open(filepath.Join(out, chartFile))
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	cfg, err := png.DecodeConfig(img)
	if err != nil {
		t.Fatalf("%s is not a PNG: %v", chartFile, err)
	}
	if cfg.Width < 300 || cfg.Height < 200 {
		t.Errorf("%s is %dx%d, too small for a chart", chartFile, cfg.Width, cfg.Height)
	}

	rows := readCSV(t, filepath.Join(out, csvFile))
	if len(rows) != want {
		t.Fatalf("%s has %d rows, want %d", csvFile, len(rows), want)
	}
	bests := 0
	for _, r := range rows {
		name := r["broker"] + "/" + r["store"] + " " + r["contender"]
		if r["error"] != "" {
			t.Errorf("%s: throughput run failed: %s", name, r["error"])
			continue
		}
		if r["fault_timeout"] != "false" {
			t.Errorf("%s: a fault run did not settle in time", name)
		}
		if tp, _ := strconv.ParseFloat(r["msgs_per_s"], 64); tp <= 0 {
			t.Errorf("%s: throughput %q", name, r["msgs_per_s"])
		}
		if p99, _ := strconv.ParseFloat(r["p99_ms"], 64); p99 <= 0 && r["contender"] != "relay" {
			t.Errorf("%s: p99 %q", name, r["p99_ms"])
		}
		n := func(col string) int {
			v, err := strconv.Atoi(r[col])
			if err != nil {
				t.Fatalf("%s: column %s = %q", name, col, r[col])
			}
			return v
		}
		switch c := r["contender"]; {
		case c == "relay":
			// Every message in the outbox reached the broker.
			if n("outgoing_held") < n("messages") || n("messages") < 1 {
				t.Errorf("%s: the broker holds %d of %d relayed messages", name, n("outgoing_held"), n("messages"))
			}
		case strings.HasPrefix(c, "idem"), strings.HasPrefix(c, "best"):
			// idem and idem-batch10 are compared with the hand-written
			// consumer of the same guarantee on every store.
			if (c == "idem" || c == "idem-batch10") && r["throughput_vs_best_checked"] == "" {
				t.Errorf("%s: no throughput_vs_best_checked", name)
			}
			if c == "idem-outbox" {
				// One outgoing message per message, all sent by the
				// relay; throughput compared with idem's.
				if n("outgoing_held") < n("messages") {
					t.Errorf("%s: the broker holds %d of %d emitted messages", name, n("outgoing_held"), n("messages"))
				}
				if r["throughput_vs_idem"] == "" {
					t.Errorf("%s: no throughput_vs_idem", name)
				}
			}
			if c == "best" {
				bests++
				if r["store"] != "postgres" {
					t.Errorf("%s: the hand-written best consumer is PostgreSQL's only", name)
				}
			} else if v := r["throughput_vs_best"]; (r["store"] == "postgres") != (v != "") {
				t.Errorf("%s: throughput_vs_best = %q", name, v)
			}
			for _, col := range []string{"dup_double", "dup_lost", "error_double", "error_lost", "crash_double", "crash_lost"} {
				if n(col) != 0 {
					t.Errorf("%s: %s = %d, want 0", name, col, n(col))
				}
			}
		case c == "naive":
			// Every message published twice is applied twice.
			if dups := n("deliveries") - n("messages"); dups < 1 || n("dup_double") != dups || n("dup_lost") != 0 {
				t.Errorf("%s: duplicates published gave %d double / %d lost, want %d / 0", name, n("dup_double"), n("dup_lost"), dups)
			}
			if n("crash_double") < 1 || n("crash_lost") != 0 {
				t.Errorf("%s: crash gave %d double / %d lost, want at least 1 / 0", name, n("crash_double"), n("crash_lost"))
			}
			// The failed attempt's row rolls back, so nothing is lost.
			// (No claim about doubles: on a machine loaded enough for a
			// delivery to outwait JetStream's ack wait, the naive consumer
			// applies the redelivery too.)
			if n("error_lost") != 0 {
				t.Errorf("%s: handler error lost %d messages, want 0 (the row rolls back)", name, n("error_lost"))
			}
		case c == "watermill-dedup":
			// The in-memory Deduplicator catches duplicates within one
			// process, records the key before the handler runs (so the
			// retry of a failed attempt is dropped as a duplicate), and
			// forgets everything in a crash.
			if n("dup_double") != 0 || n("dup_lost") != 0 {
				t.Errorf("%s: duplicates published gave %d double / %d lost, want 0 / 0", name, n("dup_double"), n("dup_lost"))
			}
			if n("error_lost") < 1 {
				t.Errorf("%s: handler error lost %d messages, want at least 1 (the retry is dropped)", name, n("error_lost"))
			}
			if n("crash_double") < 1 {
				t.Errorf("%s: crash gave %d double effects, want at least 1 (the repository is lost)", name, n("crash_double"))
			}
		}
	}
	if wantBests := strings.Count(stores, "postgres") * 2; bests != wantBests {
		t.Errorf("%d rows of the hand-written best consumer, want %d (one per broker on PostgreSQL)", bests, wantBests)
	}
}

func readCSV(t *testing.T, path string) []map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(recs) < 1 {
		t.Fatalf("%s is empty", path)
	}
	var rows []map[string]string
	for _, rec := range recs[1:] {
		row := map[string]string{}
		for i, col := range recs[0] {
			row[col] = rec[i]
		}
		rows = append(rows, row)
	}
	return rows
}

func TestOptionsValidate(t *testing.T) {
	for _, args := range [][]string{
		{"--dup-fraction", "1.5"},
		{"--brokers", "amqp"},
		{"--stores", "oracle"},
		{"--batch-sizes", "0"},
		{"extra"},
	} {
		var stdout, stderr bytes.Buffer
		err := cli(context.Background(), args, &stdout, &stderr)
		if err == nil || !isUsage(err) {
			t.Errorf("bench %q: got %v, want an error matching errUsage", args, err)
		}
	}
}

func isUsage(err error) bool { return errors.Is(err, errUsage) }

func TestPercentile(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	if got := percentile(ds, 0.5); got != 50*time.Millisecond {
		t.Errorf("p50 = %v, want 50ms", got)
	}
	if got := percentile(ds, 0.99); got != 99*time.Millisecond {
		t.Errorf("p99 = %v, want 99ms", got)
	}
	if got := percentile(nil, 0.5); got != 0 {
		t.Errorf("p50 of nothing = %v, want 0", got)
	}
}

// Example_table shows the Markdown table the harness prints: ratios are
// against the naive consumer of the same broker and store, throughput also
// against the hand-written best consumer (PostgreSQL only; "-" elsewhere)
// and against idem (the cost of the outbox, of batching), the outgoing
// messages the broker holds after an outbox run ("-" for contenders that
// emit nothing), and each fault cell is "message IDs with a double effect / message IDs
// lost".
func Example_table() {
	rs := []result{
		{Broker: "nats", Store: "postgres", Contender: "naive", Throughput: 2000, P50: 2 * time.Millisecond, P99: 10 * time.Millisecond,
			Dup: faultResult{Ran: true, Double: 30}, Fail: faultResult{Ran: true}, Crash: faultResult{Ran: true, Double: 4}},
		{Broker: "nats", Store: "postgres", Contender: "best", Throughput: 1600, P50: 2 * time.Millisecond, P99: 11 * time.Millisecond,
			Dup: faultResult{Ran: true}, Fail: faultResult{Ran: true}, Crash: faultResult{Ran: true}},
		{Broker: "nats", Store: "postgres", Contender: "idem", Throughput: 1500, P50: 3 * time.Millisecond, P99: 12 * time.Millisecond,
			Dup: faultResult{Ran: true}, Fail: faultResult{Ran: true}, Crash: faultResult{Ran: true}},
		{Broker: "nats", Store: "sqlite", Contender: "naive", Throughput: 1000, P50: 4 * time.Millisecond, P99: 20 * time.Millisecond,
			Dup: faultResult{Ran: true, Double: 30}, Fail: faultResult{Ran: true}, Crash: faultResult{Ran: true, Double: 4}},
		{Broker: "nats", Store: "sqlite", Contender: "best_checked", Throughput: 1000, P50: 4 * time.Millisecond, P99: 20 * time.Millisecond,
			Dup: faultResult{Ran: true}, Fail: faultResult{Ran: true}, Crash: faultResult{Ran: true}},
		{Broker: "nats", Store: "sqlite", Contender: "idem", Throughput: 900, P50: 5 * time.Millisecond, P99: 22 * time.Millisecond,
			Dup: faultResult{Ran: true}, Fail: faultResult{Ran: true}, Crash: faultResult{Ran: true}},
	}
	_ = writeMarkdown(os.Stdout, rs)
	// Output:
	// | broker | store | contender | msgs/s | × naive | × best | × best_checked | × idem | p50 ms | p99 ms | p50 × naive | p99 × naive | outgoing held / emitted | duplicates published: double / lost | handler error once: double / lost | crash after commit: double / lost |
	// |---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|
	// | nats | postgres | naive | 2000 | 1.00 | 1.25 | - | 1.33 | 2.00 | 10.00 | 1.00 | 1.00 | - | 30 / 0 | 0 / 0 | 4 / 0 |
	// | nats | postgres | best | 1600 | 0.80 | 1.00 | - | 1.07 | 2.00 | 11.00 | 1.00 | 1.10 | - | 0 / 0 | 0 / 0 | 0 / 0 |
	// | nats | postgres | idem | 1500 | 0.75 | 0.94 | - | - | 3.00 | 12.00 | 1.50 | 1.20 | - | 0 / 0 | 0 / 0 | 0 / 0 |
	// | nats | sqlite | naive | 1000 | 1.00 | - | 1.00 | 1.11 | 4.00 | 20.00 | 1.00 | 1.00 | - | 30 / 0 | 0 / 0 | 4 / 0 |
	// | nats | sqlite | best_checked | 1000 | 1.00 | - | - | 1.11 | 4.00 | 20.00 | 1.00 | 1.00 | - | 0 / 0 | 0 / 0 | 0 / 0 |
	// | nats | sqlite | idem | 900 | 0.90 | - | 0.90 | - | 5.00 | 22.00 | 1.25 | 1.10 | - | 0 / 0 | 0 / 0 | 0 / 0 |
}

// TestHelp: --help prints the flags and is not an error (exit status 0).
func TestHelp(t *testing.T) {
	t.Parallel()
	var errOut strings.Builder
	if err := cli(t.Context(), []string{"--help"}, io.Discard, &errOut); err != nil {
		t.Fatalf("--help: %v", err)
	}
	if !strings.Contains(errOut.String(), "-quick") {
		t.Errorf("--help printed %q", errOut.String())
	}
}

// TestRoundTrips runs `bench --round-trips` and checks the counts of
// every store it opened: with the acquire that records the run point, a
// new message costs two store calls, a duplicate one and a release one;
// before it, three, one and two.
func TestRoundTrips(t *testing.T) {
	ctx, cancel := testContext(t)
	defer cancel()
	var stdout, stderr bytes.Buffer
	if err := cli(ctx, []string{"--round-trips", "5"}, &stdout, &stderr); err != nil {
		t.Fatalf("bench --round-trips: %v\n%s", err, stderr.String())
	}
	rows := 0
	for line := range strings.Lines(stdout.String()) {
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| store ") {
			continue
		}
		rows++
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		want := []string{"2 (Acquire 1 + Complete 1)", "1", "1 (Release 1)",
			"3 (Acquire 1 + SaveStep 1 + Complete 1)", "1", "2 (SaveStep 1 + Release 1)"}
		for i, w := range want {
			if got := strings.TrimSpace(cells[i+1]); got != w {
				t.Errorf("%s: column %d = %q, want %q", strings.TrimSpace(cells[0]), i+1, got, w)
			}
		}
	}
	if rows < 2 {
		t.Errorf("%d store rows, want at least memory and sqlite:\n%s", rows, stdout.String())
	}
}

// testContext bounds a whole harness run in a test by the test binary's
// own deadline (go test -timeout), less a minute so that the run's
// progress is still printed when it is cut off, or by 15 minutes without
// one. The harness's runs take far less on a quiet machine; a fixed bound
// of a few minutes failed them on a loaded one, where they still ran to
// their end.
func testContext(t *testing.T) (context.Context, context.CancelFunc) {
	t.Helper()
	if d, ok := t.Deadline(); ok {
		return context.WithDeadline(context.Background(), d.Add(-time.Minute))
	}
	return context.WithTimeout(context.Background(), 15*time.Minute)
}
