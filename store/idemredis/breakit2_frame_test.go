package idemredis_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/idemredis"
	"github.com/redis/go-redis/v9"
)

// newOptions returns the options of a new client on the test Redis.
func newOptions(t *testing.T) *redis.Options {
	t.Helper()
	opts, err := redis.ParseURL(testenv.URL(t, testenv.RedisEnv, "redis://127.0.0.1:6379/0"))
	if err != nil {
		t.Fatal(err)
	}
	return opts
}

// failingConn fails the first write made while *fail is set (io.EOF, a
// retryable error for go-redis), writing nothing.
type failingConn struct {
	net.Conn
	fail   *atomic.Bool
	failed *atomic.Int64
}

func (c *failingConn) Write(b []byte) (int, error) {
	if c.fail.CompareAndSwap(true, false) {
		c.failed.Add(1)
		return 0, io.EOF
	}
	return c.Conn.Write(b)
}

// failOnceHook sets fail before each EVALSHA or EVAL it sees, so that its
// first write fails and go-redis writes the same command again on a new
// connection (its retry writes the pooled frame's arguments a second
// time).
type failOnceHook struct{ fail *atomic.Bool }

func (failOnceHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h failOnceHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n == "evalsha" || n == "eval" {
			h.fail.Store(true)
		}
		return next(ctx, cmd)
	}
}
func (failOnceHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Acquire and Complete whose first write fails are retried by go-redis
// with the same command: the pooled frame's keys and arguments are
// written again unchanged, and the record lands under its own key with
// its own fingerprint, result and content type.
func TestBreakit2FrameRetriedWrite(t *testing.T) {
	base := newClient(t)
	opts := newOptions(t)
	var fail atomic.Bool
	var failed atomic.Int64
	d := &net.Dialer{Timeout: 5 * time.Second}
	opts.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &failingConn{Conn: c, fail: &fail, failed: &failed}, nil
	}
	opts.MaxRetries = 3
	client := redis.NewClient(opts)
	t.Cleanup(func() { _ = client.Close() })
	client.AddHook(failOnceHook{fail: &fail})
	bb := setup(t, client)
	const consumer, n = "frame-retry", 20
	for i := range n {
		id := fmt.Sprintf("m-%d-%s", i, strings.Repeat("x", i*7))
		fp := []byte(fmt.Sprintf("fp-%d", i))
		res, err := bb.store.Acquire(bb.ctx, &idemdriver.AcquireParams{Consumer: consumer, MessageID: id, Fingerprint: fp, Lease: time.Minute})
		if err != nil || !res.Acquired {
			t.Fatalf("Acquire %s: %+v %v", id, res, err)
		}
		if err := bb.store.Complete(bb.ctx, &idemdriver.CompleteParams{Consumer: consumer, MessageID: id, Token: res.Token, Result: []byte("r-" + id), ContentType: "ct/" + id}); err != nil {
			t.Fatalf("Complete %s: %v", id, err)
		}
	}
	fail.Store(false)
	if got := failed.Load(); got < 2*n {
		t.Fatalf("%d failed writes, want at least %d (one per Acquire and Complete)", got, 2*n)
	}
	plain, err := idemredis.New(base, &idemredis.Config{Prefix: bb.prefix})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		id := fmt.Sprintf("m-%d-%s", i, strings.Repeat("x", i*7))
		res, err := plain.Acquire(bb.ctx, &idemdriver.AcquireParams{Consumer: consumer, MessageID: id, Fingerprint: []byte(fmt.Sprintf("fp-%d", i)), Lease: time.Minute})
		if err != nil || res.Acquired || res.State != idemdriver.StateCompleted {
			t.Fatalf("Acquire %s after its retried Complete: %+v %v; want completed", id, res, err)
		}
		if !bytes.Equal(res.Fingerprint, []byte(fmt.Sprintf("fp-%d", i))) || string(res.Result) != "r-"+id || res.ContentType != "ct/"+id {
			t.Fatalf("%s stored fingerprint %q result %q content type %q", id, res.Fingerprint, res.Result, res.ContentType)
		}
	}
}

// argsHook checks, inside Process (as a tracing hook that prints the
// command does), that every Acquire and Complete command names the
// message its caller passed (ctx value), and counts them.
type argsHook struct {
	seen *atomic.Int64
	bad  *atomic.Int64
}

type idKey struct{}

func (argsHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h argsHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		id, _ := ctx.Value(idKey{}).(string)
		before := cmd.String()
		err := next(ctx, cmd)
		if n := cmd.Name(); id != "" && (n == "evalsha" || n == "eval") {
			h.seen.Add(1)
			if !strings.Contains(before, id) || !strings.Contains(cmd.String(), id) {
				h.bad.Add(1)
			}
		}
		return err
	}
}
func (argsHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Acquire and Complete on many goroutines at once, their frames taken
// from and given back to the pool concurrently, under -race: each
// command shows its own message while it runs, and each record is stored
// with its own fingerprint, result and content type.
func TestBreakit2FrameConcurrent(t *testing.T) {
	opts := newOptions(t)
	opts.PoolSize = 16
	client := redis.NewClient(opts)
	t.Cleanup(func() { _ = client.Close() })
	var seen, bad atomic.Int64
	client.AddHook(argsHook{seen: &seen, bad: &bad})
	bb := setup(t, client)
	const consumer, workers, per = "frame-conc", 16, 40
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				id := fmt.Sprintf("w%d-m%d-%s", w, i, strings.Repeat("y", (w*per+i)%50))
				ctx := context.WithValue(bb.ctx, idKey{}, id)
				res, err := bb.store.Acquire(ctx, &idemdriver.AcquireParams{Consumer: consumer, MessageID: id, Fingerprint: []byte("fp-" + id), Lease: time.Minute})
				if err != nil || !res.Acquired {
					errc <- fmt.Errorf("Acquire %s: %+v %v", id, res, err)
					return
				}
				if err := bb.store.Complete(ctx, &idemdriver.CompleteParams{Consumer: consumer, MessageID: id, Token: res.Token, Result: []byte("r-" + id), ContentType: "ct/" + id}); err != nil {
					errc <- fmt.Errorf("Complete %s: %v", id, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if seen.Load() < 2*workers*per || bad.Load() != 0 {
		t.Fatalf("hook saw %d script commands, %d not naming their message; want at least %d, none", seen.Load(), bad.Load(), 2*workers*per)
	}
	for w := range workers {
		for i := range per {
			id := fmt.Sprintf("w%d-m%d-%s", w, i, strings.Repeat("y", (w*per+i)%50))
			res, err := bb.store.Acquire(bb.ctx, &idemdriver.AcquireParams{Consumer: consumer, MessageID: id, Fingerprint: []byte("fp-" + id), Lease: time.Minute})
			if err != nil || res.Acquired || res.State != idemdriver.StateCompleted || string(res.Fingerprint) != "fp-"+id || string(res.Result) != "r-"+id || res.ContentType != "ct/"+id {
				t.Fatalf("%s: %+v %v; want completed with its own fingerprint, result and content type", id, res, err)
			}
		}
	}
}

// keepHook keeps every script command it sees, as a hook that logs or
// traces commands after Process returned (on another goroutine, in a
// batch) would.
type keepHook struct {
	mu   *sync.Mutex
	cmds *[]redis.Cmder
}

func (keepHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h keepHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if n := cmd.Name(); n == "evalsha" || n == "eval" {
			h.mu.Lock()
			*h.cmds = append(*h.cmds, cmd)
			h.mu.Unlock()
		}
		return err
	}
}
func (keepHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A command a hook keeps after Process returned still shows its own
// arguments for go-redis's own commands; Acquire's and Complete's are
// cleared (the pooled argument slice) and their keys rewritten by later
// calls (the pooled frame). Known: run with IDEM_BREAKIT_KNOWN=1.
func TestBreakit2FrameKeptCommand(t *testing.T) {
	if os.Getenv("IDEM_BREAKIT_KNOWN") != "1" {
		t.Skip("known: a script command kept by a hook after Process returned loses its arguments (IDEM_BREAKIT_KNOWN=1 runs it)")
	}
	client := redis.NewClient(newOptions(t))
	t.Cleanup(func() { _ = client.Close() })
	var mu sync.Mutex
	var cmds []redis.Cmder
	client.AddHook(keepHook{mu: &mu, cmds: &cmds})
	bb := setup(t, client)
	ids := []string{"first", "second"}
	for _, id := range ids {
		if _, err := bb.store.Acquire(bb.ctx, &idemdriver.AcquireParams{Consumer: "kept", MessageID: id, Fingerprint: []byte("fp"), Lease: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(cmds) != len(ids) {
		t.Fatalf("%d commands kept, want %d", len(cmds), len(ids))
	}
	for i, c := range cmds {
		if s := c.String(); !strings.Contains(s, ids[i]) {
			t.Errorf("kept command %d of Acquire(%q) reads %q", i, ids[i], s)
		}
	}
}
