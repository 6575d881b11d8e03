// Package leakcheck finds goroutines a test binary left running, with the
// standard library only (the root module takes no third-party dependency,
// so no goleak). Use it from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(leakcheck.Run(m)) }
//
// It is shared by the packages of this repository and is not a public API.
package leakcheck

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Grace is how long Run waits for goroutines to finish after the tests,
// since a goroutine stopped by Close may still be on its way out.
const Grace = 5 * time.Second

// Run runs the tests and then checks that every goroutine started while
// they ran has ended, waiting up to Grace. Leaked goroutines are printed
// with their stacks and turn a passing run into exit code 1. A goroutine
// whose stack contains one of ignore is not counted: for a leak inside a
// third-party library that the code under test cannot end (name it, and
// why, where Run is called).
func Run(m *testing.M, ignore ...string) int {
	before := goroutines()
	code := m.Run()
	if code != 0 {
		return code // the failures already say what is wrong
	}
	deadline := time.Now().Add(Grace)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		leaked := Leaked(before, ignore...)
		if len(leaked) == 0 {
			return code
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "leakcheck: %d goroutine(s) still running %v after the tests:\n\n%s\n",
				len(leaked), Grace, strings.Join(leaked, "\n\n"))
			return 1
		}
		<-tick.C
	}
}

// Leaked returns the stacks of the goroutines running now whose IDs are
// not in before, other than the caller's, the runtime's own and those
// whose stack contains one of ignore.
func Leaked(before map[string]bool, ignore ...string) []string {
	var out []string
stack:
	for id, stack := range stacks() {
		if before[id] || ignored(stack) {
			continue
		}
		for _, s := range ignore {
			if strings.Contains(stack, s) {
				continue stack
			}
		}
		out = append(out, stack)
	}
	return out
}

// Goroutines returns the IDs of the goroutines running now, for a test
// that checks with Leaked what it left running itself.
func Goroutines() map[string]bool { return goroutines() }

// goroutines returns the IDs of the goroutines running now.
func goroutines() map[string]bool {
	ids := map[string]bool{}
	for id := range stacks() {
		ids[id] = true
	}
	return ids
}

// stacks returns the stack of every goroutine but the caller's, by ID.
func stacks() map[string]string {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	out := map[string]string{}
	for i, g := range strings.Split(string(buf), "\n\n") {
		if i == 0 {
			continue // the caller's own goroutine comes first
		}
		// "goroutine 12 [chan receive]:"
		f := strings.Fields(g)
		if len(f) < 2 || f[0] != "goroutine" {
			continue
		}
		out[f[1]] = g
	}
	return out
}

// ignored reports whether a goroutine belongs to the runtime or the testing
// package rather than to the code under test.
func ignored(stack string) bool {
	for _, s := range []string{
		"testing.(*M).",
		"testing.tRunner(",
		"testing.runFuzzing(",
		"testing.(*F).",
		"os/signal.signal_recv",
		"runtime.ensureSigM",
		"runtime/trace.",
	} {
		if strings.Contains(stack, s) {
			return true
		}
	}
	return false
}
