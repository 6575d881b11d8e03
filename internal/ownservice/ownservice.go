// Package ownservice runs one service of scripts/services (Debian's
// PostgreSQL, RabbitMQ, NATS, ...) for a single test, in a state directory
// and on ports of its own, so that the test can kill -9 it and start it
// again without touching the services other tests share. It is stopped
// and its state removed when the test ends.
//
// scripts/services runs the daemons as root: without root the test is
// skipped, or fails under IDEM_TEST_REQUIRE_ALL=1.
package ownservice

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testenv"
)

// Service is one service of scripts/services run by a test.
type Service struct {
	// Name is the scripts/services service name ("rabbitmq", "nats",
	// "postgres-durable", ...).
	Name string
	// Dir is the service's state directory (IDEM_SERVICES_DIR).
	Dir string
	// URL is the service's URL, as scripts/services exports it; the same
	// after a Restart (the service keeps its ports).
	URL string

	script string
	env    []string
	ports  map[string]int // by knob
}

// Port returns the port scripts/services was given in the knob (e.g.
// "IDEM_REDIS_HA_PORT2"), or 0 for a knob it was not given.
func (s *Service) Port(knob string) int { return s.ports[knob] }

// Command runs scripts/services with the service's state directory and
// ports (e.g. "promote", "postgres-ha"), returning an error with its
// output when it fails.
func (s *Service) Command(args ...string) error {
	if out, err := s.run(args...); err != nil {
		return fmt.Errorf("scripts/services %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// Start starts service with its own state directory and ports, and
// returns once it answers.
func Start(t *testing.T, service string) *Service {
	t.Helper()
	return StartEnv(t, service)
}

// StartEnv is Start with more environment for scripts/services, as
// "NAME=value" words (e.g. "IDEM_POSTGRES_HA_SYNC=on").
func StartEnv(t *testing.T, service string, env ...string) *Service {
	t.Helper()
	if os.Geteuid() != 0 {
		if testenv.Required() {
			t.Fatalf("scripts/services needs root to start a %s of the test's own (required: %s=1)", service, testenv.RequireAllEnv)
		}
		t.Skipf("scripts/services needs root to start a %s of the test's own", service)
	}
	script, err := findScript()
	if err != nil {
		t.Fatal(err)
	}
	// Not t.TempDir: the services' users must be able to traverse it.
	dir, err := os.MkdirTemp("", "idem-own-"+service+"-")
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	knobs := []string{"IDEM_POSTGRES_PORT", "IDEM_POSTGRES_DURABLE_PORT", "IDEM_PGBOUNCER_PORT", "IDEM_MYSQL_PORT",
		"IDEM_REDIS_PORT", "IDEM_AMQP_PORT", "IDEM_NATS_PORT", "IDEM_AMQP_DIST_PORT", "IDEM_EPMD_PORT",
		"IDEM_POSTGRES_HA_PORT", "IDEM_POSTGRES_HA_PORT2", "IDEM_REDIS_HA_PORT", "IDEM_REDIS_HA_PORT2", "IDEM_REDIS_SENTINEL_PORT",
		"IDEM_REDIS_CLUSTER_PORT", "IDEM_REDIS_CLUSTER_BUS_PORT",
		"IDEM_NATS_HA_PORT", "IDEM_NATS_HA_PORT2", "IDEM_NATS_HA_PORT3",
		"IDEM_NATS_HA_ROUTE_PORT", "IDEM_NATS_HA_ROUTE_PORT2", "IDEM_NATS_HA_ROUTE_PORT3"}
	s := &Service{Name: service, Dir: dir, script: script,
		env: append(os.Environ(), "IDEM_SERVICES_DIR="+dir, "IDEM_AMQP_NODE=idem-test-"+filepath.Base(dir)+"@localhost")}
	ports, err := FreePorts(len(knobs))
	if err != nil {
		t.Fatal(err)
	}
	s.ports = map[string]int{}
	next := 0 // the next port of the blocks' range
	for i, port := range ports {
		if n := portBlocks[knobs[i]]; n > 0 {
			if next == 0 {
				total := 0
				for _, n := range portBlocks {
					total += n
				}
				if next, err = FreePortBlock(total); err != nil {
					t.Fatal(err)
				}
			}
			port, next = next, next+n
		}
		s.env = append(s.env, fmt.Sprintf("%s=%d", knobs[i], port))
		s.ports[knobs[i]] = port
	}
	s.env = append(s.env, env...)
	t.Cleanup(func() {
		if out, err := s.run("stop", service); err != nil {
			t.Errorf("scripts/services stop %s: %v\n%s", service, err, out)
		}
		_ = os.RemoveAll(dir)
	})
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	return s
}

// findScript returns scripts/services of the repository the test runs in:
// the first one found going up from the working directory.
func findScript() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, "scripts", "services")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("scripts/services not found above the working directory")
		}
		dir = parent
	}
}

// FreePorts returns n distinct loopback ports that were free a moment ago.
func FreePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// portBlocks are the knobs that name the first of a block of ports, with
// the block's size: the Redis Cluster's six nodes and their cluster bus
// ports.
var portBlocks = map[string]int{"IDEM_REDIS_CLUSTER_PORT": 6, "IDEM_REDIS_CLUSTER_BUS_PORT": 6}

// FreePortBlock returns the first of n consecutive loopback ports that
// were all free a moment ago, below Linux's default range of ephemeral
// ports (32768 and up), so that no client connection of another process
// takes one of them between this check and the server's bind (which a
// port after FreePorts' could: those come from the ephemeral range).
func FreePortBlock(n int) (int, error) {
	const lo, hi = 20000, 32768
	for range 200 {
		base := lo + rand.IntN(hi-lo-n)
		free := true
		var ls []net.Listener
		for p := base; p < base+n && free; p++ {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				free = false
				break
			}
			ls = append(ls, l)
		}
		for _, l := range ls {
			_ = l.Close()
		}
		if free {
			return base, nil
		}
	}
	return 0, fmt.Errorf("ownservice: no %d consecutive free ports between %d and %d", n, lo, hi)
}

// run runs scripts/services with the service's environment.
func (s *Service) run(args ...string) (string, error) {
	cmd := exec.Command(s.script, args...)
	cmd.Env = s.env
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	return out.String() + errOut.String(), err
}

// Restart starts the service (again, on the same state and ports) and,
// the first time, reads its URL from the export line. A PostgreSQL whose
// postmaster was killed refuses to start while its old backends, orphaned,
// still hold its shared memory (they exit when they notice): a failed
// start is tried again, a second apart, for up to three minutes. It may
// be called on any goroutine; URL does not change.
func (s *Service) Restart() error {
	var out string
	var err error
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(time.Second) {
		if out, err = s.run("start", s.Name); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("scripts/services start %s: %v\n%s", s.Name, err, out)
	}
	if s.URL != "" {
		return nil
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if _, v, ok := strings.Cut(sc.Text(), "_URL='"); ok && strings.HasPrefix(sc.Text(), "export ") {
			s.URL = strings.TrimSuffix(v, "'")
		}
	}
	if s.URL == "" {
		return fmt.Errorf("scripts/services start %s printed no URL:\n%s", s.Name, out)
	}
	return nil
}

// Stop stops the service gracefully (scripts/services stop), keeping its
// state for Restart.
func (s *Service) Stop() error {
	if out, err := s.run("stop", s.Name); err != nil {
		return fmt.Errorf("scripts/services stop %s: %v\n%s", s.Name, err, out)
	}
	return nil
}

// Kill sends SIGKILL to the server's main process, read from its pid
// file, and returns once it is gone. It may be called on any goroutine.
func (s *Service) Kill() error {
	pidFile, ok := map[string]string{
		"rabbitmq":         "rabbitmq/rabbitmq.pid",
		"nats":             "nats/nats.pid",
		"postgres-durable": "postgres-durable/data/postmaster.pid",
		"mariadb":          "mariadb/mariadbd.pid",
	}[s.Name]
	if !ok {
		return fmt.Errorf("ownservice: no pid file known for %s", s.Name)
	}
	return KillPIDFile(filepath.Join(s.Dir, pidFile))
}

// KillPIDFile sends SIGKILL to the process whose pid is the first line of
// pidFile and returns once it is gone. It may be called on any goroutine.
func KillPIDFile(pidFile string) error {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		return fmt.Errorf("%s: %w", pidFile, err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill -9 %s (pid %d): %w", pidFile, pid, err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(testenv.Poll) {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		// Gone, or a zombie waiting for its parent (init, after setsid).
		if err != nil || strings.Contains(string(st), ") Z ") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s (pid %d) still running a minute after kill -9", pidFile, pid)
		}
	}
}
