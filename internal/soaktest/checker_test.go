package soaktest

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestCheckerCatchesBrokenConsumer runs the sqlite-kafka pipeline with a
// consumer broken on purpose (it acknowledges a message before its
// effect, which runs a second later) and kills its processes while
// messages flow: the soak's checker must report the messages acknowledged
// and never processed as losses. It needs no root (SQLite and kfake run
// here) and takes about 20 seconds.
func TestCheckerCatchesBrokenConsumer(t *testing.T) {
	dir := t.TempDir()
	p := startSQLiteKafka(t, dir)
	env := append(p.env(), brokenEnv+"=ack-first")
	var procs []*proc
	for m := range members {
		procs = append(procs, startProc(t, p.name(), env, filepath.Join(dir, p.name()+"-"+string(rune('a'+m))+".log")))
	}
	effects := func() int {
		var n int
		if err := p.db.QueryRowContext(t.Context(), `SELECT count(*) FROM soak_effects`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// progress waits until effects grow past n, and returns them.
	progress := func(n int) int {
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if e := effects(); e > n {
				return e
			}
		}
		t.Fatalf("no effect beyond %d in 30s", n)
		return 0
	}

	stop := make(chan struct{})
	var ids []string
	var wg sync.WaitGroup
	wg.Go(func() { ids = produce(p, stop, *soakRate) })
	// Three kills, each once effects are being made (so that some
	// messages are acknowledged and waiting for their effect).
	n := 0
	for k := range 3 {
		n = progress(n)
		time.Sleep(300 * time.Millisecond)
		if _, err := procs[k%members].kill(); err != nil {
			t.Fatal(err)
		}
	}
	progress(n)
	close(stop)
	wg.Wait()
	// Let what is left settle: effects that stopped growing for 3s.
	for last, since := effects(), time.Now(); time.Since(since) < 3*time.Second; time.Sleep(100 * time.Millisecond) {
		if e := effects(); e != last {
			last, since = e, time.Now()
		}
	}
	for _, pr := range procs {
		pr.stop()
	}
	r := &result{name: p.name(), published: len(ids)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p.check(ctx, ids, r)
	t.Logf("broken consumer: %s", r)
	if r.losses == 0 || r.counts["violations"] == 0 {
		t.Errorf("the checker reported no loss for a consumer that acknowledges before its effect: %s", r)
	}
}
