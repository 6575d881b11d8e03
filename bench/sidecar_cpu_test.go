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
