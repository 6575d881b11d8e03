package main

import (
	"os"
	"testing"
)

// TestWatchedProcs: IDEM_BENCH_CPU_PIDS parses as NAME=PID pairs, and a
// malformed pair is an error.
func TestWatchedProcs(t *testing.T) {
	t.Setenv(envCPUPIDs, "nats=12, postgres=34")
	ps, err := watchedProcs()
	if err != nil || len(ps) != 2 || ps[0] != (watchedProc{"nats", 12}) || ps[1] != (watchedProc{"postgres", 34}) {
		t.Fatalf("watchedProcs() = %v, %v", ps, err)
	}
	for _, bad := range []string{"nats", "nats=x", "=3", "nats=-1"} {
		t.Setenv(envCPUPIDs, bad)
		if _, err := watchedProcs(); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// TestStatCPU: this process's /proc entry reads with its parent's PID,
// and CPU that is never negative; an absent process reads as zero.
func TestStatCPU(t *testing.T) {
	d, ppid := statCPU(os.Getpid(), true)
	if ppid != os.Getppid() || d < 0 {
		t.Fatalf("statCPU(self) = %v, parent %d; want parent %d", d, ppid, os.Getppid())
	}
	if d, ppid := statCPU(-1, true); d != 0 || ppid != 0 {
		t.Fatalf("statCPU(-1) = %v, %d", d, ppid)
	}
}

// TestParseMemStats: idem consume's --memstats file parses whole (the
// claims and completions apart, the completions by batch size), and an
// older binary's four lines leave the rest zero.
func TestParseMemStats(t *testing.T) {
	var u usage
	parseMemStats([]byte("mallocs 10\nbytes 20\nstore_calls 6\nstore_round_trips 3\nacquire_calls 3\nacquire_round_trips 1\n"+
		"complete_calls 3\ncomplete_round_trips 2\ncomplete_batches 1 1 0 0 0 0 0\ncomplete_calls_in 1 2 0 0 0 0 0\n"), &u)
	want := usage{mallocs: 10, bytes: 20, storeCalls: 6, storeTrips: 3, acquireCalls: 3, acquireTrips: 1, completeCalls: 3, completeTrips: 2,
		completeBatches: [sizeClasses]uint64{1, 1}, completeIn: [sizeClasses]uint64{1, 2}}
	if u != want {
		t.Errorf("new format: %+v, want %+v", u, want)
	}
	u = usage{}
	parseMemStats([]byte("mallocs 10\nbytes 20\nstore_calls 6\nstore_round_trips 3\n"), &u)
	if want := (usage{mallocs: 10, bytes: 20, storeCalls: 6, storeTrips: 3}); u != want {
		t.Errorf("old format: %+v, want %+v", u, want)
	}
}
