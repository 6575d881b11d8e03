package idemcli

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/spf13/pflag"
)

// TestProfileFlags checks that the hidden profiling flags of idem consume
// are hidden and write what they say: a CPU profile, an allocation
// profile, and the counters as "mallocs N", "bytes N", "store_calls N"
// and "store_round_trips N".
func TestProfileFlags(t *testing.T) {
	var f profileFlags
	fl := pflag.NewFlagSet("consume", pflag.ContinueOnError)
	f.register(fl)
	dir := t.TempDir()
	cpu, mem, stats := filepath.Join(dir, "cpu"), filepath.Join(dir, "allocs"), filepath.Join(dir, "memstats")
	if err := fl.Parse([]string{"--cpuprofile", cpu, "--memprofile", mem, "--memstats", stats}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"cpuprofile", "memprofile", "memstats"} {
		if !fl.Lookup(name).Hidden {
			t.Errorf("--%s is not hidden", name)
		}
	}
	stop, err := f.start()
	if err != nil {
		t.Fatal(err)
	}
	sink := make([][]byte, 0, 100)
	for range 100 {
		sink = append(sink, make([]byte, 1024))
	}
	_ = sink
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{cpu, mem} {
		if st, err := os.Stat(p); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v, want a profile", filepath.Base(p), err)
		}
	}
	b, err := os.ReadFile(stats)
	if err != nil {
		t.Fatal(err)
	}
	var mallocs, bytes, calls, trips uint64
	if _, err := fmt.Sscanf(string(b), "mallocs %d\nbytes %d\nstore_calls %d\nstore_round_trips %d\n", &mallocs, &bytes, &calls, &trips); err != nil {
		t.Fatalf("memstats %q: %v; want four lines: mallocs N, bytes N, store_calls N, store_round_trips N", b, err)
	}
	if mallocs < 100 || bytes < 100*1024 {
		t.Fatalf("memstats %q: mallocs %d, bytes %d; want at least the test's 100 allocations of 1 KiB", b, mallocs, bytes)
	}
}
