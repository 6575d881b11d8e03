package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// envCPUPIDs, when set, names the server processes whose CPU --sidecar
// measures per run beside idem consume's, as comma-separated NAME=PID
// pairs (for example nats=123,postgres=456,redis=789: the NATS server,
// PostgreSQL's postmaster, the Redis server). A process counts with its
// children, live or waited for (a PostgreSQL backend that ends with its
// connection still counts), so run servers of the benchmark's own: the
// CPU of another client's work on a shared server counts too.
const envCPUPIDs = "IDEM_BENCH_CPU_PIDS"

// clockTicks is the unit of /proc/PID/stat's CPU fields (USER_HZ, 100 on
// Linux's every architecture the harness runs on).
const clockTicks = 100

// watchedProc is a server process the harness samples.
type watchedProc struct {
	name string
	pid  int
}

// watchedProcs parses envCPUPIDs; a malformed pair is an error.
func watchedProcs() ([]watchedProc, error) {
	v := os.Getenv(envCPUPIDs)
	if v == "" {
		return nil, nil
	}
	var ps []watchedProc
	for pair := range strings.SplitSeq(v, ",") {
		name, pid, ok := strings.Cut(strings.TrimSpace(pair), "=")
		n, err := strconv.Atoi(pid)
		if !ok || err != nil || name == "" || n <= 0 {
			return nil, fmt.Errorf("%s: %q is not NAME=PID", envCPUPIDs, pair)
		}
		ps = append(ps, watchedProc{name, n})
	}
	return ps, nil
}

// cpuSample is the CPU each watched process (with its children) and this
// process had used at one time.
type cpuSample struct {
	self  time.Duration
	procs []time.Duration
}

// sampleCPU reads the CPU used so far by this process (getrusage) and by
// each of ps (procTreeCPU).
func sampleCPU(ps []watchedProc) cpuSample {
	var s cpuSample
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	for _, p := range ps {
		s.procs = append(s.procs, procTreeCPU(p.pid))
	}
	return s
}

// procTreeCPU is the CPU time of pid (user and system, its own and its
// waited-for children's) plus that of its live children, from /proc;
// zero for what cannot be read.
func procTreeCPU(pid int) time.Duration {
	own, _ := statCPU(pid, true)
	total := own
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if t, ppid := statCPU(child, true); ppid == pid {
			total += t
		}
	}
	return total
}

// statCPU reads /proc/PID/stat: utime+stime (and cutime+cstime when
// children is set) and the parent's PID.
func statCPU(pid int, children bool) (time.Duration, int) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0
	}
	// The command name is in parentheses and may hold spaces: the
	// fields after it start after the last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, 0
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state): ppid is field 4, utime..cstime 14..17.
	if len(f) < 15 {
		return 0, 0
	}
	ppid, _ := strconv.Atoi(f[1])
	last := 12
	if children {
		last = 14
	}
	var ticks int64
	for _, s := range f[11 : last+1] {
		n, _ := strconv.ParseInt(s, 10, 64)
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, ppid
}

// sub is the CPU used between s0 and s.
func (s cpuSample) sub(s0 cpuSample) cpuSample {
	d := cpuSample{self: s.self - s0.self}
	for i := range s.procs {
		d.procs = append(d.procs, s.procs[i]-s0.procs[i])
	}
	return d
}

// writeSidecarCPU appends the table of CPU per message by process to b:
// this process (the service, plus the contender when it runs here),
// idem consume's process, each watched server and their sum, medians of
// the runs, and idem consume's store round trips per message.
func writeSidecarCPU(b *strings.Builder, contenders []sidecarContender, results map[string][]sidecarResult, procs []watchedProc, n int) {
	fmt.Fprintf(b, "\n| contender | CPU µs / message: harness (service, + the contender when in process) | idem consume |")
	for _, p := range procs {
		fmt.Fprintf(b, " %s |", p.name)
	}
	fmt.Fprintf(b, " total | store calls / message | store round trips / message |\n|---|---:|---:|")
	for range procs {
		b.WriteString("---:|")
	}
	b.WriteString("---:|---:|---:|\n")
	perMsg := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(n) }
	for _, c := range contenders {
		rs := results[c.name]
		if len(rs) == 0 {
			continue
		}
		self := make([]float64, len(rs))
		sc := make([]float64, len(rs))
		total := make([]float64, len(rs))
		calls := make([]float64, len(rs))
		trips := make([]float64, len(rs))
		each := make([][]float64, len(procs))
		for i, r := range rs {
			self[i], sc[i] = perMsg(r.cpu.self), perMsg(r.used.cpu)
			total[i] = self[i] + sc[i]
			for j := range procs {
				if j < len(r.cpu.procs) {
					x := perMsg(r.cpu.procs[j])
					each[j] = append(each[j], x)
					total[i] += x
				}
			}
			calls[i], trips[i] = float64(r.used.storeCalls)/float64(n), float64(r.used.storeTrips)/float64(n)
		}
		fmt.Fprintf(b, "| %s | %.0f | %s |", c.name, median(self), orDash(median(sc)))
		for j := range procs {
			if len(each[j]) > 0 {
				fmt.Fprintf(b, " %.0f |", median(each[j]))
			} else {
				b.WriteString(" – |")
			}
		}
		fmt.Fprintf(b, " %.0f | %s | %s |\n", median(total), orDash2(median(calls)), orDash2(median(trips)))
	}
}

// writeSidecarBatches appends the table of idem consume's store batches to
// b: claims and completions per round trip (medians of the runs), and the
// share of the completions that went in batches of each size class, over
// all runs. Contenders without the figures are left out.
func writeSidecarBatches(b *strings.Builder, contenders []sidecarContender, results map[string][]sidecarResult) {
	head := false
	for _, c := range contenders {
		rs := results[c.name]
		var acq, comp []float64
		var in [sizeClasses]uint64
		var total uint64
		for _, r := range rs {
			u := r.used
			if u.acquireTrips == 0 || u.completeTrips == 0 {
				continue
			}
			acq = append(acq, float64(u.acquireCalls)/float64(u.acquireTrips))
			comp = append(comp, float64(u.completeCalls)/float64(u.completeTrips))
			for i, x := range u.completeIn {
				in[i] += x
				total += x
			}
		}
		if len(comp) == 0 || total == 0 {
			continue
		}
		if !head {
			b.WriteString("\n| contender | claims / claim round trip | completions / completion round trip | completions in batches of 1 | 2–3 | 4–7 | 8–15 | 16–31 | 32–63 | 64+ |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
			head = true
		}
		fmt.Fprintf(b, "| %s | %.1f | %.1f |", c.name, median(acq), median(comp))
		for _, x := range in {
			fmt.Fprintf(b, " %.0f %% |", 100*float64(x)/float64(total))
		}
		b.WriteString("\n")
	}
}

// orDash2 formats a per-message ratio with two decimals, or "–".
func orDash2(x float64) string {
	if x <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", x)
}

// roundCPU is the CPU of one run r of n messages, for its line in the
// log: "; CPU µs/msg" followed by the contender's process (when it ran
// apart) and each watched server, so that a report can give each
// figure's spread over the rounds, not only the table's median.
func roundCPU(r sidecarResult, procs []watchedProc, n int) string {
	perMsg := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(n) }
	var b strings.Builder
	fmt.Fprintf(&b, "; CPU µs/msg: harness %.0f", perMsg(r.cpu.self))
	if r.used.cpu > 0 {
		fmt.Fprintf(&b, ", idem consume %.0f", perMsg(r.used.cpu))
	}
	for j, p := range procs {
		if j < len(r.cpu.procs) {
			fmt.Fprintf(&b, ", %s %.0f", p.name, perMsg(r.cpu.procs[j]))
		}
	}
	return b.String()
}
