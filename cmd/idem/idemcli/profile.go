package idemcli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"

	"github.com/spf13/pflag"

	"github.com/idem-go/idem/internal/leasebatch"
)

// profileFlags are the hidden profiling flags of a long-running command
// (`idem consume`, `idem proxy`): a CPU profile, an allocation profile and the
// process's allocation counters, each written to a file for the
// benchmark harness (go run ./bench --sidecar) and for `go tool pprof`.
type profileFlags struct {
	cpu, mem, memStats string
	// storeStats, when set, reports the store calls the process sent and
	// the round trips they went in, for --memstats.
	storeStats func() leasebatch.Stats
}

func (f *profileFlags) register(fl *pflag.FlagSet) {
	fl.StringVar(&f.cpu, "cpuprofile", "", "write a CPU profile of the whole run to FILE (runtime/pprof)")
	fl.StringVar(&f.mem, "memprofile", "", "write an allocation profile (the allocs profile) to FILE at exit")
	fl.StringVar(&f.memStats, "memstats", "", "write the process's allocation counters at exit to FILE: lines \"mallocs N\" and \"bytes N\" (runtime.MemStats Mallocs and TotalAlloc), then \"store_calls N\" and \"store_round_trips N\" (the batched claims and completions, and the store calls they went in), then the same for claims and completions apart (\"acquire_calls N\", \"acquire_round_trips N\", \"complete_calls N\", \"complete_round_trips N\") and, by batch size 1, 2-3, 4-7, ... 64+, the completion batches (\"complete_batches N N ...\") and the completions in them (\"complete_calls_in N N ...\")")
	for _, name := range []string{"cpuprofile", "memprofile", "memstats"} {
		_ = fl.MarkHidden(name)
	}
}

// start starts the CPU profile when asked and returns the function that
// stops it and writes the other files; its error names the file.
func (f *profileFlags) start() (stop func() error, err error) {
	var cpu *os.File
	if f.cpu != "" {
		if cpu, err = os.Create(f.cpu); err != nil {
			return nil, fmt.Errorf("--cpuprofile: %w", err)
		}
		if err := pprof.StartCPUProfile(cpu); err != nil {
			cpu.Close()
			return nil, fmt.Errorf("--cpuprofile: %w", err)
		}
	}
	return func() error {
		var errs []error
		if cpu != nil {
			pprof.StopCPUProfile()
			if err := cpu.Close(); err != nil {
				errs = append(errs, fmt.Errorf("--cpuprofile: %w", err))
			}
		}
		if f.mem != "" {
			if err := writeFile(f.mem, func(fh *os.File) error { return pprof.Lookup("allocs").WriteTo(fh, 0) }); err != nil {
				errs = append(errs, fmt.Errorf("--memprofile: %w", err))
			}
		}
		if f.memStats != "" {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			if err := writeFile(f.memStats, func(fh *os.File) error {
				var st leasebatch.Stats
				if f.storeStats != nil {
					st = f.storeStats()
				}
				a, c := st.Acquire, st.Complete
				_, err := fmt.Fprintf(fh, "mallocs %d\nbytes %d\nstore_calls %d\nstore_round_trips %d\n"+
					"acquire_calls %d\nacquire_round_trips %d\ncomplete_calls %d\ncomplete_round_trips %d\ncomplete_batches%s\ncomplete_calls_in%s\n",
					ms.Mallocs, ms.TotalAlloc, a.Calls+c.Calls, a.Trips+c.Trips, a.Calls, a.Trips, c.Calls, c.Trips, words(c.Batches[:]), words(c.CallsIn[:]))
				return err
			}); err != nil {
				errs = append(errs, fmt.Errorf("--memstats: %w", err))
			}
		}
		return errors.Join(errs...)
	}, nil
}

// words formats xs as " x1 x2 ...", each after a space.
func words(xs []uint64) string {
	var b strings.Builder
	for _, x := range xs {
		fmt.Fprintf(&b, " %d", x)
	}
	return b.String()
}

// startFor is start for the command name: the returned stop reports its
// error on stderr.
func (f *profileFlags) startFor(name string, stderr io.Writer) (stop func(), err error) {
	stopFiles, err := f.start()
	if err != nil {
		return nil, err
	}
	return func() {
		if err := stopFiles(); err != nil {
			fmt.Fprintf(stderr, "idem %s: %v\n", name, err)
		}
	}, nil
}

// writeFile creates name, writes it with write and closes it.
func writeFile(name string, write func(*os.File) error) error {
	fh, err := os.Create(name)
	if err != nil {
		return err
	}
	if err := write(fh); err != nil {
		fh.Close()
		return err
	}
	return fh.Close()
}
