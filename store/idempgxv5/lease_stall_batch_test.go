package idempgxv5_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/faultproxy"
	"github.com/idem-go/idem/internal/leasebatch"
	"github.com/idem-go/idem/store/idempgxv5"
)

// stallingBatcher is the pgx store under leasebatch: the first
// CompleteBatch stalls every connection open (a fault proxy stops
// forwarding them and closes nothing) just before it goes out, and the
// first single Complete waits until every delivery's Complete has
// entered the batching layer (all), so that those after it go in one
// batch.
type stallingBatcher struct {
	idemdriver.LeaseBatcher
	proxy   *faultproxy.Proxy
	all     chan struct{}
	held    atomic.Bool
	stalled atomic.Bool

	mu  sync.Mutex
	ids []string // the messages of the stalled batch
}

func (s *stallingBatcher) Complete(ctx context.Context, p *idemdriver.CompleteParams) error {
	if !s.held.Swap(true) {
		select {
		case <-s.all:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return s.LeaseBatcher.Complete(ctx, p)
}

func (s *stallingBatcher) CompleteBatch(ctx context.Context, ps []*idemdriver.CompleteParams) ([]error, error) {
	if !s.stalled.Swap(true) {
		s.mu.Lock()
		for _, p := range ps {
			s.ids = append(s.ids, p.MessageID)
		}
		s.mu.Unlock()
		s.proxy.Stall()
	}
	return s.LeaseBatcher.CompleteBatch(ctx, ps)
}

// enteringStore is leasebatch's Store counting the Complete calls that
// enter it: all is closed when n have.
type enteringStore struct {
	*leasebatch.Store
	n       int64
	entered atomic.Int64
	all     chan struct{}
}

func (s *enteringStore) Complete(ctx context.Context, p *idemdriver.CompleteParams) error {
	if s.entered.Add(1) == s.n {
		close(s.all)
	}
	return s.Store.Complete(ctx, p)
}

// TestLeaseBatchStalledConnection: `idem consume`'s batched lease calls
// (internal/leasebatch over idempgxv5, through a fault proxy) for 8
// messages acquired at once; their Completes go as one alone and the rest
// in one batch, and the connections open (one or two: the calls go one
// batch at a time) stall as that batch goes out. The batch's context is the engine's, whose deadline is
// StoreTimeout from the call's start: the deliveries in it fail at the
// store timeout with ErrStoreTimeout (never acknowledged), their records
// are not completed (the batch never reached the server), and their
// redeliveries are processed on a new connection: a redelivery that
// takes a stalled idle connection fails at the store timeout too, and is
// redelivered again. (The pool holds a stalled connection's slot until
// pgx's close of it gives up waiting for the server's end of it, so the
// pool has room for more.) Every record ends completed, and each handler ran once per
// delivery that reached it.
func TestLeaseBatchStalledConnection(t *testing.T) {
	t.Parallel()
	const n, storeTimeout = 8, 2 * time.Second
	direct, proxy, store := proxiedStore(t)
	all := make(chan struct{})
	sb := &stallingBatcher{LeaseBatcher: store, proxy: proxy, all: all}
	lb := &enteringStore{Store: leasebatch.New(sb, 64), n: n, all: all}
	const consumer = "stall-batch"
	c, err := idem.NewLeaseConsumer(lb, idem.Config{Name: consumer, Lease: time.Minute, StoreTimeout: storeTimeout,
		PurgeInterval: -1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	ctx := t.Context()

	var calls atomic.Int64
	var inHandler sync.WaitGroup
	inHandler.Add(n)
	release := make(chan struct{})
	held := func(_ context.Context, a *idem.Attempt) (idem.Result, error) {
		calls.Add(1)
		inHandler.Done()
		<-release
		return idem.Result{Body: []byte("r-" + a.Message.ID)}, nil
	}
	type result struct {
		out  idem.Outcome
		err  error
		took time.Duration // from the handlers' release
	}
	ms := make([]idem.Message, n)
	res := make([]result, n)
	var released time.Time
	var wg sync.WaitGroup
	for i := range ms {
		ms[i] = idem.Message{ID: fmt.Sprintf("m-%d", i), Payload: []byte("p")}
		wg.Go(func() {
			out, err := c.Process(ctx, ms[i], held)
			res[i] = result{out, err, time.Since(released)}
		})
	}
	inHandler.Wait() // every message acquired (in batches), none completed
	released = time.Now()
	close(release)
	wg.Wait()

	sb.mu.Lock()
	stalled := map[string]bool{}
	for _, id := range sb.ids {
		stalled[id] = true
	}
	sb.mu.Unlock()
	if len(stalled) < 2 || proxy.Stalled() < 1 {
		t.Fatalf("the stall hit a batch of %d Completes on %d connections; want 2 or more", len(stalled), proxy.Stalled())
	}
	var failed []idem.Message
	for i, r := range res {
		id := ms[i].ID
		switch {
		case r.err == nil && r.out.Status == idem.Processed && !stalled[id]:
		case r.out.Status != idem.Failed || r.err == nil:
			t.Errorf("%s: %v, %v; want Processed, or Failed when its Complete stalled", id, r.out.Status, r.err)
		case !errors.Is(r.err, idem.ErrStore) || !errors.Is(r.err, idem.ErrStoreTimeout):
			t.Errorf("%s: %v; want an error matching ErrStore and ErrStoreTimeout", id, r.err)
		case r.took < storeTimeout || r.took > storeTimeout+5*time.Second:
			t.Errorf("%s: failed %v after its Complete was sent, want the store timeout (%v)", id, r.took, storeTimeout)
		default:
			failed = append(failed, ms[i])
		}
		if stalled[id] {
			t.Logf("%s, in the stalled batch: %v after the release: %v", id, r.took, r.err)
		}
	}
	if len(failed) < len(stalled) {
		t.Fatalf("%d deliveries failed at the store timeout, want at least the %d of the stalled batch", len(failed), len(stalled))
	}

	redeliverAfterStall(t, c, direct, proxy, consumer, ms, failed, &calls)
	t.Logf("%d messages, %d in the stalled batch, %d failed at the store timeout and were redelivered", n, len(stalled), len(failed))
}

// proxiedStore returns fresh tables (direct, on a pool of its own) and a
// store over them whose pool (4 connections) goes through proxy.
func proxiedStore(t *testing.T) (*bundle, *faultproxy.Proxy, *idempgxv5.Store) {
	t.Helper()
	direct := setup(t, poolOpts{})
	proxy, url := faultproxy.URL(t, testURL(t))
	pool := newPool(t, poolOpts{url: url, maxConns: 4})
	t.Cleanup(proxy.Close) // before pool.Close: no connection left stalled
	store, err := idempgxv5.New(pool, &idempgxv5.Config{Table: direct.table})
	if err != nil {
		t.Fatal(err)
	}
	return direct, proxy, store
}

// recordState reads the record of id past the proxy (on direct's pool).
func recordState(t *testing.T, direct *bundle, consumer, id string) idemdriver.AcquireResult {
	t.Helper()
	r, err := direct.store.Acquire(t.Context(), &idemdriver.AcquireParams{Consumer: consumer, MessageID: id, Fingerprint: fingerprintOf(t, "p"), Lease: time.Minute})
	if err != nil || r.Acquired {
		t.Fatalf("Acquire %s past the proxy: %+v, %v; want its record as it is", id, r, err)
	}
	return r
}

// redeliverAfterStall checks the deliveries of ms that failed at a stall
// through proxy (held, payload "p", result "r-" and the message's ID):
// their records are in progress, not completed (read past the proxy);
// once their abandoned leases end, their redeliveries are processed by
// attempt 2 on a new connection (one that takes a stalled idle
// connection fails at the store timeout and is redelivered again); then
// every record of ms is completed, and the handlers ran once per message
// and once more per failed one (calls, which counts them, counts the
// redeliveries' too).
func redeliverAfterStall(t *testing.T, c *idem.LeaseConsumer, direct *bundle, proxy *faultproxy.Proxy, consumer string, ms, failed []idem.Message, calls *atomic.Int64) {
	t.Helper()
	ctx := t.Context()
	for _, m := range failed {
		if r := recordState(t, direct, consumer, m.ID); r.State != idemdriver.StateInProgress {
			t.Errorf("%s, failed at the stall: record %v, want in_progress (not completed)", m.ID, r.State)
		}
	}
	ok := func(_ context.Context, a *idem.Attempt) (idem.Result, error) {
		calls.Add(1)
		return idem.Result{Body: []byte("r-" + a.Message.ID)}, nil
	}
	for _, m := range failed {
		if err := direct.expireLease(ctx, consumer, m.ID); err != nil {
			t.Fatal(err)
		}
		for try := 1; ; try++ {
			out, err := c.Process(ctx, m, ok)
			if err == nil {
				if out.Status != idem.Processed || out.Attempt != 2 {
					t.Errorf("%s, redelivered after the stall: %v (attempt %d); want processed by attempt 2", m.ID, out.Status, out.Attempt)
				}
				break
			}
			if !errors.Is(err, idem.ErrStoreTimeout) || try > proxy.Stalled() {
				t.Fatalf("%s, redelivery %d after the stall: %v; want processed (or, on a stalled idle connection, ErrStoreTimeout)", m.ID, try, err)
			}
			t.Logf("%s, redelivery %d after the stall, on a stalled idle connection: %v", m.ID, try, err)
		}
	}
	for _, m := range ms {
		if r := recordState(t, direct, consumer, m.ID); r.State != idemdriver.StateCompleted || string(r.Result) != "r-"+m.ID {
			t.Errorf("%s: record %v with result %q, want completed with %q", m.ID, r.State, r.Result, "r-"+m.ID)
		}
	}
	if got := direct.countRecords(t, consumer); got != len(ms) {
		t.Errorf("%d records, want %d", got, len(ms))
	}
	if got, want := calls.Load(), int64(len(ms)+len(failed)); got != want {
		t.Errorf("handlers ran %d times, want %d (once per message, once more per redelivery)", got, want)
	}
}

// fingerprintOf is the LeaseConsumer's default fingerprint of payload.
func fingerprintOf(t *testing.T, payload string) []byte {
	t.Helper()
	fp, err := idem.SHA256Fingerprint([]byte(payload))
	if err != nil {
		t.Fatal(err)
	}
	return fp
}
