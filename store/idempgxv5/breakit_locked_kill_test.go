package idempgxv5_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// lockedChildEnv carries a lockedChild, as JSON, to the helper process
// TestBreakLockedRelayChild.
const lockedChildEnv = "IDEM_BREAKIT_LOCKED_CHILD"

// lockedChild is what the helper process relays, and how.
type lockedChild struct {
	URL, Listen, Table, Log string
	// Free is how many rounds publish and return; every later round
	// blocks in its publish, its rows locked, until the process dies.
	Free int
	// Lease is the relay's Lease (the rounds' idle bound on the server).
	Lease time.Duration
}

// TestBreakLockedRelayChild is the relay process that
// TestBreakLockedRelayKilled kills: it does nothing unless started by
// it. It runs Relay.Run with LockedRounds (2 workers, 3 rows a round) on
// the table it is given; its publisher appends "<id> <attempts>" for
// each message to the log, each later round's lines after a "BLOCK"
// line, syncs the file, and blocks those rounds for good.
func TestBreakLockedRelayChild(t *testing.T) {
	spec := os.Getenv(lockedChildEnv)
	if spec == "" {
		return // only as TestBreakLockedRelayKilled's helper process
	}
	var c lockedChild
	if err := json.Unmarshal([]byte(spec), &c); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, c.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &idempgxv5.Config{Table: c.Table}
	if c.Listen != "" {
		if cfg.ListenConfig, err = pgx.ParseConfig(c.Listen); err != nil {
			t.Fatal(err)
		}
	}
	store, err := idempgxv5.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(c.Log, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu     sync.Mutex
		rounds int
	)
	r, err := idem.NewRelay(idem.RelayConfig{Store: store, Workers: 2, BatchSize: 3, Retention: -1, LockedRounds: true,
		Lease: c.Lease, MinPoll: 10 * time.Millisecond, MaxPoll: 50 * time.Millisecond,
		Publisher: idem.PublisherFunc(func(_ context.Context, m []idem.Outgoing) []error {
			mu.Lock()
			rounds++
			block := rounds > c.Free
			var b bytes.Buffer
			if block {
				b.WriteString("BLOCK\n")
			}
			for _, o := range m {
				fmt.Fprintf(&b, "%s %d\n", o.ID, o.Attempts)
			}
			_, werr := f.Write(b.Bytes())
			if werr == nil {
				werr = f.Sync()
			}
			mu.Unlock()
			if werr != nil {
				panic(werr)
			}
			if block {
				time.Sleep(time.Hour) // deaf to its context: killed here
			}
			return make([]error, len(m))
		})})
	if err != nil {
		t.Fatal(err)
	}
	_ = r.Run(ctx)
}

// childLog is the helper process's log, read back: the IDs its rounds
// published in order, and which of them were in rounds that blocked.
type childLog struct {
	ids     []string
	blocked map[string]bool
}

func readChildLog(t *testing.T, path string) childLog {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	l := childLog{blocked: map[string]bool{}}
	inBlock := false
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		if line == "BLOCK" {
			inBlock = true
			continue
		}
		id, attempts, ok := strings.Cut(line, " ")
		if !ok {
			continue // a line cut by the kill
		}
		if n, _ := strconv.Atoi(attempts); n != 1 {
			t.Errorf("the relay process published %s at attempt %s, want 1", id, attempts)
		}
		l.ids = append(l.ids, id)
		if inBlock {
			l.blocked[id] = true
		}
	}
	// A round's lines are written at once: a BLOCK line applies to the
	// lines up to the next round's, which the kill may have cut. The
	// rounds that blocked are the last ones written.
	return l
}

// TestBreakLockedRelayKilled: a relay process running Relay.Run with
// LockedRounds is SIGKILLed while its rounds hold rows locked in their
// publishes (after two rounds that completed). The rows of the killed
// rounds must be claimed again at once (the server, or PgBouncer, ends
// the dead client's transaction: not after the Lease, two minutes here),
// nothing is lost, each message of a killed round goes out exactly twice
// and every other one once, the killed rounds counted no attempt (the
// next relay publishes every row at attempt 1), per key the first
// publications are in seq order, and the outbox ends empty. Directly
// and through PgBouncer in transaction pooling (both exec modes).
func TestBreakLockedRelayKilled(t *testing.T) {
	t.Run("direct", func(t *testing.T) { lockedRelayKilled(t, poolOpts{maxConns: 4}, "") })
	for _, mode := range bouncerModes {
		t.Run(fmt.Sprintf("pgbouncer-%v", mode), func(t *testing.T) {
			lockedRelayKilled(t, poolOpts{maxConns: 4, mode: mode, url: bouncerURL(t)}, testURL(t))
		})
	}
}

func lockedRelayKilled(t *testing.T, o poolOpts, listen string) {
	ctx := context.Background()
	b := setup(t, o)
	const keys, perKey, lease = 4, 6, 2 * time.Minute
	rows := emitKeyed(t, b, keys, perKey)
	childURL := o.url
	if childURL == "" {
		childURL = testURL(t)
	}
	if o.mode != 0 {
		u, err := url.Parse(childURL)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Set("default_query_exec_mode", strings.ReplaceAll(o.mode.String(), " ", "_"))
		u.RawQuery = q.Encode()
		childURL = u.String()
	}
	logPath := filepath.Join(t.TempDir(), "published")
	spec, err := json.Marshal(lockedChild{URL: childURL, Listen: listen, Table: b.table, Log: logPath, Free: 2, Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd := exec.Command(os.Args[0], "-test.run=^TestBreakLockedRelayChild$", "-test.timeout=10m")
	cmd.Env = append(os.Environ(), lockedChildEnv+"="+string(spec))
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{}) // closed once the process was waited for
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // an error once it has exited
		<-exited
	})

	// Wait for a blocked round, and for the free rounds' commits: every
	// row published outside a blocked round is deleted.
	pending := func() int64 {
		st, err := b.store.OutboxStats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st.Pending
	}
	testenv.Eventually(t, 60*time.Second, "a blocked round, the free ones committed", func() bool {
		select {
		case <-exited:
			t.Fatalf("the relay process exited: %v\n%s", waitErr, out.String())
		default:
		}
		l := readChildLog(t, logPath)
		return len(l.blocked) > 0 && pending() == int64(len(rows)-(len(l.ids)-len(l.blocked)))
	}, func() string { return fmt.Sprintf("%d pending; log %+v", pending(), readChildLog(t, logPath)) })
	if err := cmd.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	<-exited
	killedAt := time.Now()
	child := readChildLog(t, logPath)
	t.Logf("the relay process published %d rows, %d of them in blocked rounds, before it was killed", len(child.ids), len(child.blocked))

	var (
		mu      sync.Mutex
		next    []string
		reclaim time.Duration // until the first killed round's row went out again
	)
	r, err := idem.NewRelay(idem.RelayConfig{Store: b.store, Workers: 1, BatchSize: 10, Retention: -1, LockedRounds: true, Lease: lease,
		Publisher: idem.PublisherFunc(func(_ context.Context, m []idem.Outgoing) []error {
			mu.Lock()
			defer mu.Unlock()
			for _, o := range m {
				next = append(next, o.ID)
				if o.Attempts != 1 {
					t.Errorf("%s published at attempt %d after the kill, want 1 (the killed round counted none)", o.ID, o.Attempts)
				}
				if child.blocked[o.ID] && reclaim == 0 {
					reclaim = time.Since(killedAt)
				}
			}
			return make([]error, len(m))
		})})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "the outbox drained after the kill", func() bool {
		if _, err := r.RunOnce(ctx); err != nil {
			t.Logf("RunOnce after the kill: %v", err)
		}
		return pending() == 0
	}, func() string { return fmt.Sprintf("%d pending", pending()) })
	t.Logf("the killed rounds' first row went out again %v after the kill; drained in %v", reclaim, time.Since(killedAt))

	count := map[string]int{}
	var log []idem.Outgoing
	for _, id := range append(child.ids, next...) {
		count[id]++
		key, _, _ := strings.Cut(id, "-")
		log = append(log, idem.Outgoing{ID: id, Key: key})
	}
	for _, row := range rows {
		want := 1
		if child.blocked[row.ID] {
			want = 2
		}
		if count[row.ID] != want {
			t.Errorf("%s published %d times, want %d (killed round: %v)", row.ID, count[row.ID], want, child.blocked[row.ID])
		}
	}
	firstsInKeyOrder(t, log)
	st, err := b.store.OutboxStats(ctx)
	if err != nil || st.Pending != 0 || st.Failed != 0 {
		t.Errorf("outbox at the end: %+v, %v; want none pending or failed", st, err)
	}
	checkPool(t, b.pool)
}
