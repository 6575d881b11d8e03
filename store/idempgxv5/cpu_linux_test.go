//go:build linux

package idempgxv5_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// cpuMeter measures the CPU time a benchmark costs: this process's (the
// client: pgx and idem) and that of the pool's PostgreSQL backends, read
// from /proc when the server runs on this machine. On a shared machine
// throughput moves with the other load; CPU per message does much less,
// and when the benchmark is CPU-bound throughput is its inverse.
type cpuMeter struct {
	pids   []int
	server time.Duration // -1 when the backends' /proc entries are not readable
	client time.Duration
}

// startCPU acquires every connection of pool once to learn the backends'
// process IDs, and starts measuring.
func startCPU(tb testing.TB, pool *pgxpool.Pool) *cpuMeter {
	tb.Helper()
	ctx := context.Background()
	var conns []*pgxpool.Conn
	for range pool.Config().MaxConns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			tb.Fatal(err)
		}
		conns = append(conns, c)
	}
	m := &cpuMeter{}
	for _, c := range conns {
		m.pids = append(m.pids, int(c.Conn().PgConn().PID()))
		c.Release()
	}
	m.server, m.client = m.read()
	return m
}

// startCPUs is startCPU over the backends of several pools at once.
func startCPUs(tb testing.TB, pools ...*pgxpool.Pool) *cpuMeter {
	tb.Helper()
	m := &cpuMeter{}
	for _, p := range pools {
		m.pids = append(m.pids, startCPU(tb, p).pids...)
	}
	m.server, m.client = m.read()
	return m
}

func (m *cpuMeter) read() (server, client time.Duration) {
	for _, pid := range m.pids {
		d, ok := procCPU(pid)
		if !ok {
			server = -1
			break
		}
		server += d
	}
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	client = time.Duration(syscall.TimevalToNsec(ru.Utime) + syscall.TimevalToNsec(ru.Stime))
	return server, client
}

// report adds the metrics client-us/msg, and server-us/msg and
// cpu-us/msg (their sum) when the backends could be measured.
func (m *cpuMeter) report(b *testing.B, msgs int) {
	server, client := m.read()
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(msgs) }
	b.ReportMetric(us(client-m.client), "client-us/msg")
	if server >= 0 && m.server >= 0 {
		b.ReportMetric(us(server-m.server), "server-us/msg")
		b.ReportMetric(us(server-m.server+client-m.client), "cpu-us/msg")
	}
}

// procCPU returns the user and system CPU time of process pid, from
// /proc/pid/stat (fields 14 and 15, in clock ticks of 1/100 s).
func procCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, true
}
