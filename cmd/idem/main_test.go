package main

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// buildIdem builds the idem binary as a user would, with the extra
// `go build` flags given, and returns its path.
func buildIdem(t *testing.T, flags ...string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "idem")
	args := append(append([]string{"build"}, flags...), "-o", bin, ".")
	out, err := exec.Command("go", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func TestBinaryHelpAndBadInput(t *testing.T) {
	t.Parallel()
	bin := buildIdem(t)
	for _, cmd := range []string{"demo", "migrate", "purge", "inspect", "stats"} {
		out, err := exec.Command(bin, cmd, "--help").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "Usage:") {
			t.Errorf("idem %s --help: %v\n%s", cmd, err, out)
		}
	}
	cmd := exec.Command(bin, "migrate", "--store", "mysql://nobody@127.0.0.1:1/x")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("unreachable store: err %v, want exit status 1\n%s", err, out)
	}
	if lines := strings.Count(strings.TrimSpace(string(out)), "\n") + 1; lines != 1 || strings.Contains(string(out), "goroutine") {
		t.Errorf("want a one-line error, got %q", out)
	}
}

// TestNodemoBinary builds the command with the nodemo tag, as for a proxy
// or sidecar image: it has no demo command, links neither the embedded
// NATS server nor kfake (the build info lists the modules linked), and is
// smaller than the full binary.
func TestNodemoBinary(t *testing.T) {
	t.Parallel()
	full, lean := buildIdem(t), buildIdem(t, "-tags", "nodemo")
	out, err := exec.Command(lean, "demo").CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), `unknown command "demo"`) {
		t.Errorf("nodemo idem demo: %v, want exit status 2 and unknown command\n%s", err, out)
	}
	out, err = exec.Command(lean, "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "proxy") || strings.Contains(string(out), "\n  demo ") {
		t.Errorf("nodemo idem --help: %v, want the commands without demo\n%s", err, out)
	}
	embedded := []string{"github.com/nats-io/nats-server/v2", "github.com/twmb/franz-go/pkg/kfake"}
	for bin, want := range map[string]bool{full: true, lean: false} {
		info, err := exec.Command("go", "version", "-m", bin).CombinedOutput()
		if err != nil {
			t.Fatalf("go version -m: %v\n%s", err, info)
		}
		for _, mod := range embedded {
			if got := strings.Contains(string(info), "\tdep\t"+mod+"\t"); got != want {
				t.Errorf("%s links %s: %v, want %v", bin, mod, got, want)
			}
		}
	}
	fs, err := os.Stat(full)
	if err != nil {
		t.Fatal(err)
	}
	ls, err := os.Stat(lean)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("idem %.1f MB, idem built with -tags nodemo %.1f MB", float64(fs.Size())/1e6, float64(ls.Size())/1e6)
	if ls.Size() >= fs.Size() {
		t.Errorf("the nodemo binary (%d bytes) is not smaller than the full one (%d bytes)", ls.Size(), fs.Size())
	}
}

// TestDemoSurvivesSIGKILL kills `idem demo --dir D` at random moments and
// restarts it on the same folder until it finishes; the final report must
// show every payment charged exactly once, by the ledger and the provider.
func TestDemoSurvivesSIGKILL(t *testing.T) {
	t.Parallel()
	bin := buildIdem(t)
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(42, 7))
	args := []string{"demo", "--dir", dir, "--messages", "3000", "--json", "--progress", "none",
		"--ack-wait", "300ms", "--crash-rate", "0.01"}
	kills := 0
	for attempt := 0; attempt < 20; attempt++ {
		cmd := exec.Command(bin, args...)
		var stdout strings.Builder
		cmd.Stdout = &stdout
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		var err error
		if kills < 4 {
			// Kill at a random moment in the first 1.5 seconds of the run.
			select {
			case err = <-done:
			case <-time.After(time.Duration(200+rng.IntN(1300)) * time.Millisecond):
				_ = cmd.Process.Signal(syscall.SIGKILL)
				<-done
				kills++
				continue
			}
		} else {
			err = <-done
		}
		if err != nil {
			t.Fatalf("run %d after %d kills: %v\n%s", attempt, kills, err, stdout.String())
		}
		var rep struct {
			Messages        int   `json:"messages"`
			LedgerCharges   int64 `json:"ledger_charges"`
			ProviderCharges int64 `json:"provider_charges"`
			DoubleCharges   int64 `json:"double_charges"`
			Lost            int64 `json:"lost"`
		}
		if err := json.Unmarshal([]byte(stdout.String()), &rep); err != nil {
			t.Fatalf("report: %v\n%s", err, stdout.String())
		}
		if rep.LedgerCharges != 3000 || rep.ProviderCharges != 3000 || rep.DoubleCharges != 0 || rep.Lost != 0 {
			t.Fatalf("after %d kills: %+v; want 3000 charges, no double charges, none lost", kills, rep)
		}
		t.Logf("finished after %d SIGKILLs", kills)
		return
	}
	t.Fatal("the demo did not finish in 20 runs")
}
