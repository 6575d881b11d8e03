// Command proxyload measures what `idem proxy` costs itself: it starts
// the given idem binary as a proxy (any --store URL) in front of a
// do-nothing upstream of its own, sends new keys from concurrent clients
// and prints the proxy process's CPU per request (from /proc/PID/stat,
// Linux only), its throughput and its resident memory (VmHWM, VmRSS).
// The client and the upstream run in this process, so none of their CPU
// counts.
//
//	go build -o /tmp/idem ./cmd/idem
//	go run ./cmd/idem/internal/proxyload -idem /tmp/idem -store redis://127.0.0.1:6379/1 -n 6000
//	go run ./cmd/idem/internal/proxyload -idem /tmp/idem -store redis://127.0.0.1:6379/1 -n 6000 -gogc 400
//
// -args passes more flags to `idem proxy` (space-separated), such as
// "--cpuprofile /tmp/proxy.cpu". The proxy is stopped with SIGINT, so the
// profiles are written.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// clockTick is the unit of the CPU times in /proc/PID/stat (USER_HZ,
// 100 on Linux).
const clockTick = 10 * time.Millisecond

// procCPU returns the user and system CPU time process pid has used.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')') // the command name may hold spaces
	if i < 0 || i+2 > len(s) {
		return 0, errors.New("unexpected /proc stat format")
	}
	f := strings.Fields(s[i+2:]) // from field 3 (state) on
	if len(f) < 13 {
		return 0, errors.New("unexpected /proc stat format")
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(utime+stime) * clockTick, nil
}

// procMem returns field (VmHWM, VmRSS) of /proc/PID/status, in kB.
func procMem(pid int, field string) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "?"
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			return strings.TrimSuffix(strings.TrimSpace(v), " kB")
		}
	}
	return "?"
}

func main() {
	idem := flag.String("idem", "", "the idem binary (required)")
	store := flag.String("store", "", "the proxy's --store URL (required)")
	n := flag.Int("n", 20000, "requests measured, after 2,000 of warm-up")
	clients := flag.Int("clients", 32, "concurrent clients")
	gogc := flag.String("gogc", "", "GOGC of the proxy (empty: not set)")
	extra := flag.String("args", "", "more `idem proxy` flags, space-separated")
	flag.Parse()
	if *idem == "" || *store == "" {
		log.Fatal("proxyload: -idem and -store are required")
	}
	var seq atomic.Int64
	up := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d,"status":"accepted"}`, seq.Add(1))
	})}
	ul, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = up.Serve(ul) }()
	defer up.Close()
	pl, err := net.Listen("tcp", "127.0.0.1:0") // a free port for the proxy
	if err != nil {
		log.Fatal(err)
	}
	addr := pl.Addr().String()
	pl.Close()

	cmd := exec.Command(*idem, "proxy", "--listen", addr, "--upstream", "http://"+ul.Addr().String(), "--store", *store)
	cmd.Args = append(cmd.Args, strings.Fields(*extra)...)
	// A fixed scope secret: this is a load test, not a deployment.
	env := []string{"IDEM_SCOPE_SECRET=proxyload-scope-secret-0123456789"}
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "GOGC=") {
			env = append(env, e)
		}
	}
	if *gogc != "" {
		env = append(env, "GOGC="+*gogc)
	}
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	stop := func() {
		_ = cmd.Process.Signal(os.Interrupt) // the proxy writes its profiles
		_ = cmd.Wait()
	}
	fail := func(err error) {
		stop()
		log.Fatal(err)
	}

	cl := &http.Client{Transport: &http.Transport{MaxIdleConns: 512, MaxIdleConnsPerHost: 512}}
	for i := 0; ; i++ {
		r, err := cl.Get("http://" + addr + "/healthz")
		if err == nil {
			r.Body.Close()
			break
		}
		if i > 200 {
			fail(fmt.Errorf("the proxy did not answer on %s: %w", addr, err))
		}
		time.Sleep(50 * time.Millisecond)
	}
	prefix := strconv.FormatInt(time.Now().UnixNano(), 36)
	var keys atomic.Int64
	var firstErr atomic.Pointer[error]
	post := func() error {
		req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/payments", strings.NewReader(`{"amount":1000,"currency":"EUR"}`))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer proxyload")
		req.Header.Set("Idempotency-Key", fmt.Sprintf(`"%s-%d"`, prefix, keys.Add(1)))
		resp, err := cl.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			return fmt.Errorf("status %d, want 201", resp.StatusCode)
		}
		return nil
	}
	run := func(total int) time.Duration {
		var next atomic.Int64
		var wg sync.WaitGroup
		t0 := time.Now()
		for range *clients {
			wg.Go(func() {
				for firstErr.Load() == nil && next.Add(1) <= int64(total) {
					if err := post(); err != nil {
						firstErr.CompareAndSwap(nil, &err)
					}
				}
			})
		}
		wg.Wait()
		if p := firstErr.Load(); p != nil {
			fail(*p)
		}
		return time.Since(t0)
	}
	run(2000)
	pid := cmd.Process.Pid
	c0, err := procCPU(pid)
	if err != nil {
		fail(err)
	}
	elapsed := run(*n)
	c1, err := procCPU(pid)
	if err != nil {
		fail(err)
	}
	fmt.Printf("gogc=%q clients=%d req/s %.0f proxy-cpu-µs/req %.1f VmHWM_kB %s VmRSS_kB %s\n", *gogc, *clients,
		float64(*n)/elapsed.Seconds(), float64((c1-c0).Microseconds())/float64(*n), procMem(pid, "VmHWM"), procMem(pid, "VmRSS"))
	stop()
}
