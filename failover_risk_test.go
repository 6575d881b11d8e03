package idem_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/idem-go/idem"
)

// riskyStore is a MemoryStore that reports a failover risk, or fails to.
type riskyStore struct {
	*idem.MemoryStore
	risk  string
	err   error
	calls int
	mu    sync.Mutex
}

func (s *riskyStore) FailoverRisk(context.Context) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	return s.risk, s.err
}

// syncBuffer is a bytes.Buffer safe for the consumer's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestFailoverRiskWarning starts consumers of both modes on stores that
// report a failover risk, none, or an error: the risk is asked once at
// start and logged as one warning line naming the consumer and the risk;
// no risk logs nothing; an error logs nothing at warn.
func TestFailoverRiskWarning(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, risk string
		err        error
		wantWarn   bool
	}{
		{"risk", "synchronous_commit is off", nil, true},
		{"none", "", nil, false},
		{"error", "", errors.New("permission denied"), false},
	} {
		for _, lease := range []bool{false, true} {
			t.Run(tt.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					store := &riskyStore{MemoryStore: idem.NewMemoryStore(nil), risk: tt.risk, err: tt.err}
					var logs syncBuffer
					cfg := idem.Config{Name: "payments", PurgeInterval: -1, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
					var closer interface{ Close() error }
					var err error
					if lease {
						closer, err = idem.NewLeaseConsumer(store, cfg)
					} else {
						closer, err = idem.NewConsumer(store, cfg)
					}
					if err != nil {
						t.Fatal(err)
					}
					synctest.Wait()
					closer.Close()
					out := logs.String()
					warns := strings.Count(out, "level=WARN")
					if store.calls != 1 {
						t.Errorf("FailoverRisk called %d times, want once", store.calls)
					}
					if tt.wantWarn {
						if warns != 1 || !strings.Contains(out, `consumer=payments`) || !strings.Contains(out, `risk="synchronous_commit is off"`) {
							t.Errorf("want one warning naming the consumer and the risk, got:\n%s", out)
						}
					} else if warns != 0 {
						t.Errorf("want no warning, got:\n%s", out)
					}
				})
			})
		}
	}
}
