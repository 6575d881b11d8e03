package main

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// TestProcessMode runs `bench --process` briefly on SQLite, and on
// PostgreSQL (both drivers) and MariaDB when their URLs are set (required
// under IDEM_TEST_REQUIRE_ALL=1), and checks that every case of every
// store printed one result line per round with its counters and its
// ratios, and the summary a row per case.
func TestProcessMode(t *testing.T) {
	stores := []string{"sqlite"}
	requireAll := os.Getenv("IDEM_TEST_REQUIRE_ALL") == "1"
	if postgresURL() != "" {
		stores = append(stores, "postgres", "postgres-sql")
	} else if requireAll {
		t.Fatalf("missing environment variable %s (required: IDEM_TEST_REQUIRE_ALL=1)", envPostgres)
	}
	if os.Getenv(envMySQL) != "" {
		stores = append(stores, "mysql")
	} else if requireAll {
		t.Fatalf("missing environment variable %s (required: IDEM_TEST_REQUIRE_ALL=1)", envMySQL)
	}
	ctx, cancel := testContext(t)
	defer cancel()
	var stdout, stderr bytes.Buffer
	args := []string{"--process", "50ms", "--rounds", "2", "--workers", "2", "--stores", strings.Join(stores, ",")}
	if err := cli(ctx, args, &stdout, &stderr); err != nil {
		t.Fatalf("bench %v: %v\n%s", args, err, stderr.String())
	}
	out := stdout.String()
	t.Log(out)
	logUnit := map[string]string{"sqlite": "write-B/msg", "postgres": "wal-B/msg", "postgres-sql": "wal-B/msg", "mysql": "redo-B/msg"}
	// best_outbox1 is on database/sql stores only (pgx's is
	// store/idempgxv5's BenchmarkOutbox).
	absent := map[string]bool{"postgres/best_outbox1": true}
	for _, s := range stores {
		for _, c := range processCases {
			if absent[s+"/"+c] {
				if strings.Contains(out, "BenchmarkProcess/"+s+"/"+c+"#") {
					t.Errorf("a result line for %s %s, which the store does not have", s, c)
				}
				continue
			}
			for _, round := range []string{"#00", "#01"} {
				re := regexp.MustCompile(`(?m)^BenchmarkProcess/` + regexp.QuoteMeta(s+"/"+c+round) + `\t[1-9]\d*\t.*$`)
				line := re.FindString(out)
				if line == "" {
					t.Errorf("no result line for %s %s round %s", s, c, round)
					continue
				}
				want := []string{" msgs/s", " client-us/msg", " cpu-us/msg", " " + logUnit[s], " allocs/msg"}
				if _, err := os.Stat("/proc/stat"); err == nil {
					want = append(want, " others-cores")
				}
				for _, ref := range processRefs[c] {
					if !absent[s+"/"+ref] {
						want = append(want, " x-"+ref, " cpu-x-"+ref)
						if _, err := os.Stat("/proc/stat"); err == nil {
							want = append(want, " free-x-"+ref)
						}
					}
				}
				if s == "postgres-sql" && !absent["postgres/"+c] {
					want = append(want, " x-postgres")
				}
				if s == "postgres" || s == "postgres-sql" {
					want = append(want, " server-us/msg") // the server runs here in the tests
				}
				for _, w := range want {
					if !strings.Contains(line, w) {
						t.Errorf("%s: no%s", line, w)
					}
				}
			}
			if !strings.Contains(out, "| "+s+" | "+c+" | 2 | ") {
				t.Errorf("no summary row for %s %s over 2 rounds", s, c)
			}
		}
	}
	if !strings.Contains(out, "load-before ") || !strings.Contains(out, "load-after ") {
		t.Error("the load average is not recorded")
	}
	if !regexp.MustCompile(`harness allocations per message, in every allocs/msg: [1-9][0-9.]* one at a time, [1-9][0-9.]* in batches`).MatchString(out) {
		t.Error("the harness's own allocations per message are not printed")
	}
}

// TestHarnessAllocs checks that the harness's own allocations per message
// are counted, and few: the ID and the payload.
func TestHarnessAllocs(t *testing.T) {
	one, batch := harnessAllocs()
	if one < 1 || one > 8 || batch < 1 || batch > 8 {
		t.Errorf("harness allocations per message: %.1f one at a time, %.1f in batches; want 1 to 8", one, batch)
	}
}

// TestProcessModeUsage checks that --process refuses what it cannot run
// before it opens any store.
func TestProcessModeUsage(t *testing.T) {
	for _, args := range [][]string{
		{"--process", "1s", "--contenders", "idem,naive"},
		{"--process", "1s", "--stores", "oracle"},
		{"--process", "1s", "--store", "oracle"},
		{"--process", "1s", "--workers", "-1"},
	} {
		var stdout, stderr bytes.Buffer
		if err := cli(context.Background(), args, &stdout, &stderr); !errors.Is(err, errUsage) {
			t.Errorf("bench %v: %v, want an error matching errUsage", args, err)
		}
	}
}

// TestRoundCases checks the order of a round's cases: each case next to
// its reference, the reference first in odd rounds and second in even
// ones, and every other reference of a case in an earlier pair.
func TestRoundCases(t *testing.T) {
	for round := 1; round <= 2; round++ {
		cs := roundCases(round)
		if len(cs) != len(processCases) {
			t.Fatalf("round %d: %d cases, want %d", round, len(cs), len(processCases))
		}
		at := map[string]int{}
		for i, c := range cs {
			at[c] = i
		}
		for i := 0; i+1 < len(processCases); i += 2 {
			ref, c := processCases[i], processCases[i+1]
			if !slices.Contains(processRefs[c], ref) {
				t.Errorf("%s is paired with %s, which is not among its references %v", c, ref, processRefs[c])
			}
			first, second := ref, c
			if round%2 == 0 {
				first, second = c, ref
			}
			if at[first] != i || at[second] != i+1 {
				t.Errorf("round %d: %s at %d and %s at %d, want %d and %d", round, first, at[first], second, at[second], i, i+1)
			}
			for _, other := range processRefs[c] {
				if other != ref && at[other] >= i {
					t.Errorf("round %d: %s's reference %s runs at %d, not before its pair at %d", round, c, other, at[other], i)
				}
			}
		}
	}
}

// TestCheckpointWAL checks that the SQLite store's settle step empties
// the WAL before a timed section: a write leaves frames in it, and after
// checkpointWAL the file is truncated to zero bytes.
func TestCheckpointWAL(t *testing.T) {
	ctx := context.Background()
	s, err := openProcessStore(ctx, "sqlite", 1)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		s.rdb.close()
		s.db.close()
	}()
	if s.settle == nil {
		t.Fatal("the SQLite store has no settle step")
	}
	ok, err := s.chk.one()(ctx, idem.Message{ID: "wal-1", Payload: payload("wal-1")})
	if err != nil || !ok {
		t.Fatalf("best_checked: %v, %v", ok, err)
	}
	wals, err := filepath.Glob(filepath.Join(s.db.(*sqliteDB).dir, "*.db-wal"))
	if err != nil || len(wals) != 1 {
		t.Fatalf("WAL files: %v, %v; want one", wals, err)
	}
	walSize := func() int64 {
		fi, err := os.Stat(wals[0])
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	if n := walSize(); n == 0 {
		t.Fatal("the WAL is empty after a write; want frames in it")
	}
	if err := s.settle(ctx); err != nil {
		t.Fatal(err)
	}
	if n := walSize(); n != 0 {
		t.Fatalf("the WAL has %d bytes after the checkpoint, want 0", n)
	}
}

// TestFreeRatio checks the throughput ratio per free core: two cases at
// the same rate per core the rest of the machine left them compare as 1,
// and one without the machine's CPU measured has none.
func TestFreeRatio(t *testing.T) {
	n := float64(runtime.NumCPU())
	sec := time.Second
	// ref: 1,000 msgs/s with the others on half the cores; s: 500 msgs/s
	// with them on three quarters: per free core, the same rate.
	ref := sample{msgs: 1000, elapsed: sec, client: 0, server: -1, machine: time.Duration(n / 2 * float64(sec))}
	s := sample{msgs: 500, elapsed: sec, client: 0, server: -1, machine: time.Duration(n * 3 / 4 * float64(sec))}
	if f, ok := s.freeRatio(ref); !ok || math.Abs(f-1) > 1e-9 {
		t.Errorf("free ratio %v, %v; want 1", f, ok)
	}
	if raw := s.rate() / ref.rate(); raw != 0.5 {
		t.Errorf("raw ratio %v, want 0.5", raw)
	}
	s.machine = -1
	if _, ok := s.freeRatio(ref); ok {
		t.Error("a free ratio without the machine's CPU")
	}
}

// TestTreeCPUKeepsExitedChildren checks that a server's CPU does not fall
// when one of its children exits: a child of this process that burned CPU
// and was waited for still counts in treeCPU of this process.
func TestTreeCPUKeepsExitedChildren(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	before, ok := treeCPU(os.Getpid())
	if !ok {
		t.Fatal("treeCPU of this process not read")
	}
	cmd := exec.Command("sh", "-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	child := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	after, ok := treeCPU(os.Getpid())
	if !ok {
		t.Fatal("treeCPU of this process not read")
	}
	// /proc counts in ticks of 10 ms: allow two for the rounding.
	if got := after - before; got < child-20*time.Millisecond {
		t.Errorf("treeCPU grew by %v across a child that used %v and exited", got, child)
	}
}
