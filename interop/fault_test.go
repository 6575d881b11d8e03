package interop

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testenv"
)

// faultProxy forwards TCP connections to a store. Once tripped, and until
// its window ends, it lets every byte reach the store but closes a
// connection as soon as the store answers on it: the store applies the
// command (the final write included) and the proxy never learns it did.
type faultProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	until  time.Time
	conns  map[net.Conn]bool
	cuts   int
}

func newFaultProxy(t *testing.T, target string) *faultProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &faultProxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	t.Cleanup(func() {
		ln.Close()
		f.mu.Lock()
		for c := range f.conns {
			c.Close()
		}
		f.mu.Unlock()
	})
	go f.accept()
	return f
}

func (f *faultProxy) Addr() string { return f.ln.Addr().String() }

// trip starts a window of d during which every store answer cuts its connection.
func (f *faultProxy) trip(d time.Duration) {
	f.mu.Lock()
	f.until = time.Now().Add(d)
	f.mu.Unlock()
}

func (f *faultProxy) faulty() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return time.Now().Before(f.until)
}

func (f *faultProxy) Cuts() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cuts
}

func (f *faultProxy) accept() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", f.target)
		if err != nil {
			c.Close()
			continue
		}
		f.mu.Lock()
		f.conns[c], f.conns[s] = true, true
		f.mu.Unlock()
		closeBoth := func() {
			c.Close()
			s.Close()
			f.mu.Lock()
			delete(f.conns, c)
			delete(f.conns, s)
			f.mu.Unlock()
		}
		go func() { io.Copy(s, c); closeBoth() }()
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := s.Read(buf)
				if n > 0 {
					if f.faulty() {
						f.mu.Lock()
						f.cuts++
						f.mu.Unlock()
						break
					}
					if _, werr := c.Write(buf[:n]); werr != nil {
						break
					}
				}
				if err != nil {
					break
				}
			}
			closeBoth()
		}()
	}
}

// viaFault rewrites a store URL's host:port to the fault proxy's.
func viaFault(t *testing.T, raw string) (*faultProxy, string) {
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	f := newFaultProxy(t, u.Host)
	u.Host = f.Addr()
	return f, u.String()
}

// TestStoreCutAtFinalWrite cuts the proxy's store connections the moment
// the upstream answers, so the final write (Complete) reaches the store
// and its reply is lost, for a window shorter than the lease (the
// proxy's retried final write must succeed) and longer than it (the
// lease is lost). In both the upstream runs each key once and no retry
// is forwarded again.
func TestStoreCutAtFinalWrite(t *testing.T) {
	stores := []struct{ name, env, example string }{
		{"postgres", testenv.PostgresEnv, "postgres://idem:idem@127.0.0.1:5432/idem_test?sslmode=disable"},
		{"redis", testenv.RedisEnv, "redis://127.0.0.1:6379/0"},
	}
	windows := []struct {
		name                 string
		window               time.Duration
		wantFirst, wantRetry int // the first attempt's status and its retries'
	}{
		// The final write is retried while the lease is held and lands.
		{"short", 400 * time.Millisecond, http.StatusCreated, http.StatusCreated},
		// The lease ends first: 503 now, the stored outcome-unknown after.
		{"beyond-lease", 4 * time.Second, http.StatusServiceUnavailable, http.StatusBadGateway},
	}
	for _, st := range stores {
		for _, w := range windows {
			t.Run(st.name+"/"+w.name, func(t *testing.T) {
				f, storeURL := viaFault(t, testenv.URL(t, st.env, st.example))
				up := newUpstream(t)
				up.beforeAnswer = func(string) { f.trip(w.window) }
				args := []string{"--upstream", up.URL, "--store", storeURL, "--lease", "1500ms"}
				if st.name == "postgres" {
					args = append(args, "--table", "idem_interop_"+uniq())
				} else {
					args = append(args, "--redis-prefix", "idem:interop:"+uniq()+":")
				}
				p := startProxy(t, args...)

				key, body := "cut-"+uniq(), `{"amount":7}`
				c := &http.Client{Timeout: 30 * time.Second}
				first := post(context.Background(), c, p.URL, key, body)
				t.Logf("%s window %v: first attempt got %v; store connections cut: %d", st.name, w.window, first, f.Cuts())
				if f.Cuts() == 0 {
					t.Fatal("no store connection was cut")
				}
				for time.Now().Before(f.untilTime()) {
					time.Sleep(50 * time.Millisecond)
				}
				retry := postUntilFinal(t, p.URL, key, body, 20*time.Second)
				again := post(context.Background(), c, p.URL, key, body)
				t.Logf("%s window %v: retry got %v; next retry %v", st.name, w.window, retry, again)
				if retry.status != again.status || string(retry.body) != string(again.body) {
					t.Errorf("two retries got different answers: %v, then %v", retry, again)
				}
				switch retry.status {
				case http.StatusCreated:
					if retry.header.Get("Idempotent-Replayed") != "true" {
						t.Errorf("retry got a 201 that is not a replay: %v", retry)
					}
				case http.StatusBadGateway:
				default:
					t.Errorf("retry got %v, want the replayed 201 or the stored 502", retry)
				}
				if first.err != nil || first.status != w.wantFirst || retry.status != w.wantRetry {
					t.Errorf("first attempt %v, retry %v: want statuses %d then %d", first, retry, w.wantFirst, w.wantRetry)
				}
				reqs, execs := up.counts(key)
				t.Logf("%s window %v: upstream requests %d, executions %d", st.name, w.window, reqs, execs)
				if reqs != 1 || execs != 1 {
					t.Errorf("key reached the upstream %d times (%d executions), want once", reqs, execs)
				}
			})
		}
	}
}

func (f *faultProxy) untilTime() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.until
}
