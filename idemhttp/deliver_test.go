package idemhttp

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// fakeService answers deliveries in process (no network, so the tests run
// in a synctest bubble): answer decides each call's response from the
// call number (1 for the first) and the request; it counts calls per
// message ID.
type fakeService struct {
	mu     sync.Mutex
	calls  map[string]int
	last   *http.Request
	body   string
	answer func(n int, r *http.Request) (*http.Response, error)
}

func (f *fakeService) RoundTrip(r *http.Request) (*http.Response, error) {
	b, _ := io.ReadAll(r.Body)
	if tr := httptrace.ContextClientTrace(r.Context()); tr != nil && tr.WroteHeaders != nil {
		tr.WroteHeaders()
	}
	f.mu.Lock()
	f.calls[r.Header.Get(HeaderMessageID)]++
	n := f.calls[r.Header.Get(HeaderMessageID)]
	f.last, f.body = r, string(b)
	f.mu.Unlock()
	return f.answer(n, r)
}

func (f *fakeService) count(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[id]
}

func response(status int, h http.Header, body string) *http.Response {
	if h == nil {
		h = http.Header{}
	}
	return &http.Response{StatusCode: status, Header: h, Body: io.NopCloser(strings.NewReader(body))}
}

type deliverBundle struct {
	lc    *idem.LeaseConsumer
	store *idem.MemoryStore
	svc   *fakeService
	d     *Deliverer
}

// setupDeliver builds a Deliverer over a memory store, with a 1s lease,
// whose service answers with answer.
func setupDeliver(t *testing.T, cfg idem.Config, o DelivererOptions, answer func(n int, r *http.Request) (*http.Response, error)) *deliverBundle {
	t.Helper()
	return setupDeliverOn(t, func(s *idem.MemoryStore) idemdriver.LeaseStore { return s }, cfg, o, answer)
}

// setupDeliverOn is setupDeliver with the lease consumer over wrap(the
// memory store).
func setupDeliverOn(t *testing.T, wrap func(*idem.MemoryStore) idemdriver.LeaseStore, cfg idem.Config, o DelivererOptions, answer func(n int, r *http.Request) (*http.Response, error)) *deliverBundle {
	t.Helper()
	cfg.Name = "deliver-test"
	if cfg.Lease == 0 {
		cfg.Lease = time.Second
	}
	cfg.PurgeInterval = -1
	store := idem.NewMemoryStore(nil)
	lc, err := idem.NewLeaseConsumer(wrap(store), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lc.Close() })
	svc := &fakeService{calls: map[string]int{}, answer: answer}
	if o.Target == nil {
		o.Target, _ = url.Parse("http://service.test/messages")
	}
	if o.Transport == nil {
		o.Transport = svc
	}
	o.Logger = slog.New(slog.DiscardHandler)
	d, err := NewDeliverer(lc, o)
	if err != nil {
		t.Fatal(err)
	}
	return &deliverBundle{lc: lc, store: store, svc: svc, d: d}
}

// settle runs msg through the Deliverer as an adapter does.
func (b *deliverBundle) settle(msg idem.Message) idem.Settlement {
	return idem.Guard(context.Background(), b.d, msg).Settle(0)
}

func TestDeliverSuccessThenReplay(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setupDeliver(t, idem.Config{}, DelivererOptions{Timeout: 10 * time.Second}, func(int, *http.Request) (*http.Response, error) {
			return response(201, nil, `{"ok":true}`), nil
		})
		msg := idem.Message{ID: "order-1", Payload: []byte(`{"n":1}`), Headers: map[string][]string{
			"trace-id": {"abc"}, "content-type": {"application/json"}, "bad name": {"x"}, "ctl": {"a\nb"},
		}}
		s := b.settle(msg)
		if s.Action != idem.Ack || s.Reason != idem.ReasonProcessed {
			t.Fatalf("first delivery: %v %s (%v), want Ack processed", s.Action, s.Reason, s.Err)
		}
		r := b.svc.last
		want := map[string]string{
			HeaderMessageID: "order-1", HeaderAttempt: "1",
			"Content-Type": "application/json", "Idem-Header-Trace-Id": "abc",
		}
		for k, v := range want {
			if got := r.Header.Get(k); got != v {
				t.Errorf("header %s = %q, want %q", k, got, v)
			}
		}
		// Sent under its lowercase name, so net/http never re-sends it
		// on its own (noInternalRetry).
		if got := r.Header["idempotency-key"]; len(got) != 1 || got[0] != "order-1" {
			t.Errorf("Idempotency-Key %q, want order-1", got)
		}
		if r.Method != http.MethodPost || r.URL.String() != "http://service.test/messages" || b.svc.body != `{"n":1}` {
			t.Errorf("request %s %s body %q", r.Method, r.URL, b.svc.body)
		}
		if dl, err := time.Parse(time.RFC3339, r.Header.Get(HeaderDeadline)); err != nil || !dl.Equal(time.Now().Add(10*time.Second)) {
			t.Errorf("%s = %q (%v), want now + 10s", HeaderDeadline, r.Header.Get(HeaderDeadline), err)
		}
		if _, ok := r.Header["Idem-Header-Ctl"]; ok {
			t.Error("a header value with a newline was sent")
		}
		if len(r.Header) != 7 { // the five above, the deadline, Idem-Header-Content-Type
			t.Errorf("headers sent: %v", r.Header)
		}

		s = b.settle(msg)
		if s.Action != idem.Ack || s.Reason != idem.ReasonDuplicate {
			t.Fatalf("redelivery: %v %s, want Ack duplicate", s.Action, s.Reason)
		}
		if n := b.svc.count("order-1"); n != 1 {
			t.Fatalf("service called %d times, want 1", n)
		}
		if st := b.d.Stats(); st.Delivered != 1 || st.Replayed != 1 || st.Calls != 1 {
			t.Errorf("stats %+v", st)
		}
	})
}

func TestDeliverRetryableAnswers(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		status    int
		header    http.Header
		wantDelay time.Duration // at least
	}{
		{http.StatusServiceUnavailable, http.Header{"Retry-After": {"7"}}, 7 * time.Second},
		{http.StatusTooManyRequests, http.Header{"Retry-After": {"120"}}, 120 * time.Second},
		{http.StatusConflict, nil, 50 * time.Millisecond},
		{http.StatusInternalServerError, nil, 50 * time.Millisecond},
	} {
		t.Run(strconv.Itoa(tt.status), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				b := setupDeliver(t, idem.Config{}, DelivererOptions{RetryBase: 100 * time.Millisecond}, func(n int, r *http.Request) (*http.Response, error) {
					if n == 1 {
						return response(tt.status, tt.header, "busy"), nil
					}
					if got := r.Header.Get(HeaderAttempt); got != "2" {
						t.Errorf("second call: %s %q, want 2", HeaderAttempt, got)
					}
					return response(200, nil, "done"), nil
				})
				msg := idem.Message{ID: "m", Payload: []byte("p")}
				s := b.settle(msg)
				if s.Action != idem.Redeliver || s.Delay < tt.wantDelay || s.Delay > max(tt.wantDelay, 100*time.Millisecond) {
					t.Fatalf("after %d: %v after %v, want Redeliver after %v", tt.status, s.Action, s.Delay, tt.wantDelay)
				}
				var se *ServiceAnswerError
				if !errors.As(s.Err, &se) || se.Status != tt.status || errors.Is(s.Err, ErrServiceRefused) {
					t.Fatalf("error %v: want a retryable *ServiceAnswerError %d", s.Err, tt.status)
				}
				if s = b.settle(msg); s.Action != idem.Ack {
					t.Fatalf("retry: %v (%v), want Ack", s.Action, s.Err)
				}
			})
		})
	}
}

func TestDeliverBackoffGrowsAndPoisonAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setupDeliver(t, idem.Config{MaxAttempts: 3}, DelivererOptions{RetryBase: time.Second, RetryMax: 3 * time.Second},
			func(int, *http.Request) (*http.Response, error) { return response(502, nil, "bad gateway"), nil })
		msg := idem.Message{ID: "m", Payload: []byte("p")}
		for i, ceil := range []time.Duration{time.Second, 2 * time.Second} {
			s := b.settle(msg)
			if s.Action != idem.Redeliver || s.Delay < ceil/2 || s.Delay > ceil {
				t.Fatalf("attempt %d: %v after %v, want Redeliver within [%v, %v]", i+1, s.Action, s.Delay, ceil/2, ceil)
			}
		}
		s := b.settle(msg)
		if s.Action != idem.DeadLetter || s.Reason != idem.ReasonPoison {
			t.Fatalf("attempt 3: %v %s, want DeadLetter poison", s.Action, s.Reason)
		}
		if n := b.svc.count("m"); n != 3 {
			t.Fatalf("service called %d times, want 3", n)
		}
		if s = b.settle(msg); s.Action != idem.DeadLetter || b.svc.count("m") != 3 {
			t.Fatalf("redelivery of a poison message: %v, %d calls", s.Action, b.svc.count("m"))
		}
	})
}

func TestDeliverRefusedIsDeadLetteredWithTheAnswer(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setupDeliver(t, idem.Config{}, DelivererOptions{}, func(int, *http.Request) (*http.Response, error) {
			return response(422, nil, `{"error":"amount must be positive"}`), nil
		})
		msg := idem.Message{ID: "m", Payload: []byte("p")}
		for i := range 2 {
			s := b.settle(msg)
			if s.Action != idem.DeadLetter || s.Reason != idem.ReasonPermanent || !errors.Is(s.Err, ErrServiceRefused) ||
				!strings.Contains(s.Err.Error(), `422 Unprocessable Entity: {"error":"amount must be positive"}`) {
				t.Fatalf("delivery %d: %v %s %v, want DeadLetter permanent with the answer", i+1, s.Action, s.Reason, s.Err)
			}
		}
		if n := b.svc.count("m"); n != 1 {
			t.Fatalf("service called %d times, want 1 (the refusal is recorded)", n)
		}
	})
}

func TestDeliverNotSentIsRetried(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		refused := true
		b := setupDeliver(t, idem.Config{}, DelivererOptions{}, nil)
		b.d.rt = noInternalRetry{roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if refused {
				return nil, &net.OpError{Op: "dial", Err: errors.New("connection refused")}
			}
			return b.svc.RoundTrip(r)
		})}
		b.svc.answer = func(int, *http.Request) (*http.Response, error) { return response(200, nil, ""), nil }
		msg := idem.Message{ID: "m", Payload: []byte("p")}
		if s := b.settle(msg); s.Action != idem.Redeliver {
			t.Fatalf("refused connection: %v (%v), want Redeliver", s.Action, s.Err)
		}
		refused = false
		if s := b.settle(msg); s.Action != idem.Ack {
			t.Fatalf("retry: %v (%v), want Ack", s.Action, s.Err)
		}
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// crashAfterSend leaves msg as a process that died after sending it
// leaves it: a send point without a settled point, and a lease that runs
// out.
func crashAfterSend(t *testing.T, lc *idem.LeaseConsumer, msg idem.Message) {
	t.Helper()
	a, _, err := lc.Acquire(context.Background(), msg, idem.AcquireOptions{})
	if err != nil || a == nil {
		t.Fatalf("Acquire: %v", err)
	}
	if err := a.SaveStep(context.Background(), deliverPoints+":run:"+strconv.FormatInt(a.Token, 10), nil); err != nil {
		t.Fatal(err)
	}
	_, _ = a.Abandon(context.Background(), errors.New("killed"))
	time.Sleep(2 * time.Second) // the lease (1s) runs out
}

func TestDeliverAfterCrashIsOutcomeUnknown(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setupDeliver(t, idem.Config{}, DelivererOptions{}, func(int, *http.Request) (*http.Response, error) {
			return response(200, nil, ""), nil
		})
		msg := idem.Message{ID: "m", Payload: []byte("p")}
		crashAfterSend(t, b.lc, msg)
		for i := range 2 {
			s := b.settle(msg)
			if s.Action != idem.DeadLetter || s.Reason != idem.ReasonOutcomeUnknown || !errors.Is(s.Err, idem.ErrOutcomeUnknown) {
				t.Fatalf("delivery %d after the crash: %v %s %v, want DeadLetter outcome-unknown", i+1, s.Action, s.Reason, s.Err)
			}
		}
		if n := b.svc.count("m"); n != 0 {
			t.Fatalf("service called %d times after the crash, want 0", n)
		}
	})
}

func TestDeliverAfterCrashAtLeastOnce(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setupDeliver(t, idem.Config{}, DelivererOptions{AtLeastOnce: true}, func(_ int, r *http.Request) (*http.Response, error) {
			if got := r.Header.Get(HeaderAttempt); got != "2" {
				t.Errorf("%s %q, want 2", HeaderAttempt, got)
			}
			return response(200, nil, ""), nil
		})
		msg := idem.Message{ID: "m", Payload: []byte("p")}
		crashAfterSend(t, b.lc, msg)
		if s := b.settle(msg); s.Action != idem.Ack || b.svc.count("m") != 1 {
			t.Fatalf("after the crash: %v (%v), %d calls; want Ack after 1 call", s.Action, s.Err, b.svc.count("m"))
		}
	})
}

// TestDeliverBrokenAnswerIsOutcomeUnknown runs on a real server that
// reads the request and closes the connection without an answer: the
// message was sent and its outcome is unknown, so it is dead-lettered
// and never sent again.
func TestDeliverBrokenAnswerIsOutcomeUnknown(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	calls := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls++
		mu.Unlock()
		_, _ = io.ReadAll(r.Body)
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	}))
	t.Cleanup(srv.Close)
	target, _ := url.Parse(srv.URL + "/in")
	b := setupDeliver(t, idem.Config{}, DelivererOptions{Target: target, Transport: srv.Client().Transport}, nil)
	msg := idem.Message{ID: "m", Payload: []byte("p")}
	for i := range 2 {
		s := b.settle(msg)
		if s.Action != idem.DeadLetter || s.Reason != idem.ReasonOutcomeUnknown {
			t.Fatalf("delivery %d: %v %s (%v), want DeadLetter outcome-unknown", i+1, s.Action, s.Reason, s.Err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if calls != 1 {
		t.Fatalf("service called %d times, want 1", calls)
	}
	if st := b.d.Stats(); st.Unknown != 2 || st.Calls != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestNewDelivererErrors(t *testing.T) {
	t.Parallel()
	lc, err := idem.NewLeaseConsumer(idem.NewMemoryStore(nil), idem.Config{Name: "x", PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	ok, _ := url.Parse("http://127.0.0.1:1/")
	rel, _ := url.Parse("/relative")
	for name, o := range map[string]DelivererOptions{
		"no target":         {},
		"relative target":   {Target: rel},
		"negative timeout":  {Target: ok, Timeout: -1},
		"negative MaxCalls": {Target: ok, MaxCalls: -1},
	} {
		if _, err := NewDeliverer(lc, o); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := NewDeliverer(nil, DelivererOptions{Target: ok}); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("nil consumer: %v", err)
	}
}
