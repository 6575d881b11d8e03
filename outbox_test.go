package idem_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemtest"
)

// TestOutgoingIDStable pins OutgoingID: the IDs rows already carry must
// never change with a new version of idem.
func TestOutgoingIDStable(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		seq  int
		want string
	}{
		{"charged", 0, idem.DeriveKey("payments", "m-1", "outbox:name:charged")},
		{"", 2, idem.DeriveKey("payments", "m-1", "outbox:seq:2")},
	} {
		if got := idem.OutgoingID("payments", "m-1", tt.name, tt.seq); got != tt.want {
			t.Errorf("OutgoingID(%q, %d) = %q, want %q", tt.name, tt.seq, got, tt.want)
		}
	}
	if got, want := idem.OutgoingID("payments", "m-1", "charged", 0), "idem-"; got[:5] != want || len(got) != 69 {
		t.Errorf("OutgoingID = %q, want idem- and 64 hex digits", got)
	}
	if idem.OutgoingID("c", "m", "", 1) == idem.OutgoingID("c", "m", "1", 0) {
		t.Error("a named emission and a numbered one share an ID")
	}
}

// fakeOutbox is an in-memory OutboxStore for the relay engine's tests.
type fakeOutbox struct {
	mu                sync.Mutex
	rows              []idemdriver.OutgoingRecord
	sent              map[string]bool
	failed            map[string]bool
	retries           map[string]time.Duration
	leased            map[string]bool // claimed and not yet marked, when lease is set
	lease             bool
	claimErr, markErr error
}

func (f *fakeOutbox) ClaimOutgoing(ctx context.Context, p *idemdriver.ClaimOutgoingParams) ([]idemdriver.OutgoingRecord, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.claimErr != nil {
		return nil, f.claimErr
	}
	var out []idemdriver.OutgoingRecord
	for i := range f.rows {
		r := &f.rows[i]
		if !f.sent[r.ID] && !f.failed[r.ID] && !f.leased[r.ID] && len(out) < p.Limit {
			r.Attempts++
			out = append(out, *r)
			if f.lease {
				f.leased[r.ID] = true
			}
		}
	}
	slices.Reverse(out) // the relay sorts by Seq
	return out, nil
}

func (f *fakeOutbox) MarkSent(ctx context.Context, p *idemdriver.MarkSentParams) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.markErr != nil {
		return f.markErr
	}
	for _, id := range p.IDs {
		f.sent[id] = true
	}
	return nil
}

func (f *fakeOutbox) MarkFailed(ctx context.Context, p *idemdriver.MarkFailedParams) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range p.Rows {
		if r.Permanent {
			f.failed[r.ID] = true
		}
		f.retries[r.ID] = r.RetryAfter
	}
	return nil
}

func (f *fakeOutbox) PurgeOutbox(context.Context, *idemdriver.PurgeOutboxParams) (int64, error) {
	return 0, nil
}
func (f *fakeOutbox) OutboxStats(context.Context) (idemdriver.OutboxStats, error) {
	return idemdriver.OutboxStats{}, nil
}

func newFake(ids ...string) *fakeOutbox {
	f := &fakeOutbox{sent: map[string]bool{}, failed: map[string]bool{}, retries: map[string]time.Duration{}, leased: map[string]bool{}}
	for i, id := range ids {
		f.rows = append(f.rows, idemdriver.OutgoingRecord{ID: id, Destination: "d", Seq: int64(i + 1)})
	}
	return f
}

// TestRelayRunOnce checks the engine's decisions: publish in sequence
// order, mark the confirmed, back off the retryable (doubling, capped),
// fail the permanent, and treat a panic or a short result as retryable.
func TestRelayRunOnce(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := newFake("a", "b", "c", "d")
	var order []string
	pub := idem.PublisherFunc(func(ctx context.Context, msgs []idem.Outgoing) []error {
		errs := make([]error, len(msgs))
		for i, m := range msgs {
			order = append(order, m.ID)
			switch m.ID {
			case "b":
				errs[i] = errors.New("broker down")
			case "c":
				errs[i] = idem.Permanent(errors.New("too large"))
			}
		}
		return errs
	})
	r, err := idem.NewRelay(idem.RelayConfig{Store: f, Publisher: pub, MinRetry: time.Second, MaxRetry: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.RunOnce(ctx)
	if err != nil || res != (idem.RelayResult{Claimed: 4, Sent: 2, Retried: 1, Failed: 1}) {
		t.Fatalf("RunOnce = %+v, %v; want 4 claimed, 2 sent, 1 retried, 1 failed", res, err)
	}
	if !slices.Equal(order, []string{"a", "b", "c", "d"}) {
		t.Errorf("published in the order %q, want by Seq", order)
	}
	if !f.sent["a"] || !f.sent["d"] || f.sent["b"] || !f.failed["c"] {
		t.Errorf("sent %v, failed %v; want a and d sent, c failed", f.sent, f.failed)
	}
	var backoffs []time.Duration
	for range 3 {
		if _, err := r.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		backoffs = append(backoffs, f.retries["b"])
	}
	if want := []time.Duration{2 * time.Second, 3 * time.Second, 3 * time.Second}; !slices.Equal(backoffs, want) {
		t.Errorf("backoffs of b after attempts 2..4 = %v, want %v", backoffs, want)
	}

	for name, p := range map[string]idem.Publisher{
		"panic": idem.PublisherFunc(func(context.Context, []idem.Outgoing) []error { panic("boom") }),
		"short": idem.PublisherFunc(func(context.Context, []idem.Outgoing) []error { return nil }),
	} {
		f := newFake("x")
		r, _ := idem.NewRelay(idem.RelayConfig{Store: f, Publisher: p})
		if res, err := r.RunOnce(ctx); err != nil || res.Retried != 1 || f.sent["x"] {
			t.Errorf("%s publisher: RunOnce = %+v, %v; want the message retried, not sent", name, res, err)
		}
	}

	f = newFake("x")
	f.markErr = errors.New("connection lost")
	r, _ = idem.NewRelay(idem.RelayConfig{Store: f, Publisher: idem.PublisherFunc(func(_ context.Context, m []idem.Outgoing) []error { return make([]error, len(m)) })})
	if _, err := r.RunOnce(ctx); !errors.Is(err, idem.ErrStore) {
		t.Errorf("RunOnce with a failed mark: %v, want ErrStore", err)
	}
}

// TestRelayConfig checks that NewRelay refuses what cannot work.
func TestRelayConfig(t *testing.T) {
	t.Parallel()
	pub := idem.PublisherFunc(func(context.Context, []idem.Outgoing) []error { return nil })
	for name, cfg := range map[string]idem.RelayConfig{
		"no store":     {Publisher: pub},
		"no publisher": {Store: newFake()},
		"short lease":  {Store: newFake(), Publisher: pub, Lease: time.Millisecond},
		"poll order":   {Store: newFake(), Publisher: pub, MinPoll: time.Second, MaxPoll: time.Millisecond},
		"no workers":   {Store: newFake(), Publisher: pub, Workers: -1},
		"too many":     {Store: newFake(), Publisher: pub, Workers: idem.MaxRelayWorkers + 1},
		"batch size":   {Store: newFake(), Publisher: pub, BatchSize: -5},
	} {
		if _, err := idem.NewRelay(cfg); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("%s: NewRelay err = %v, want ErrInvalidConfig", name, err)
		}
	}
}

// TestRelayRunCancelledStartsNoRound: Run under a context that has ended
// returns without starting its rounds, however many Workers it has.
func TestRelayRunCancelledStartsNoRound(t *testing.T) {
	t.Parallel()
	store := countingOutbox{newFake(), make(chan time.Time, idem.MaxRelayWorkers)}
	r, err := idem.NewRelay(idem.RelayConfig{Store: store, Workers: idem.MaxRelayWorkers, Retention: -1,
		Publisher: idem.PublisherFunc(func(context.Context, []idem.Outgoing) []error { return nil })})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := r.Run(ctx); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	if n := len(store.claims); n != 0 {
		t.Errorf("Run under an ended context claimed %d times, want 0", n)
	}
}

// txOnly is a store without the outbox capability.
type txOnly struct {
	idemdriver.TxStore[*idem.MemoryTx]
}

// TestEmitWithoutOutbox: Emit on a store without an outbox says so, and
// the delivery fails rather than losing the message.
func TestEmitWithoutOutbox(t *testing.T) {
	t.Parallel()
	c, err := idem.NewConsumer[*idem.MemoryTx](txOnly{idem.NewMemoryStore(nil)}, idem.Config{Name: "c", PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var emitErr error
	out, _ := c.Process(t.Context(), idem.Message{ID: "m", Payload: []byte("p")}, func(ctx context.Context, tx *idem.MemoryTx, msg idem.Message) error {
		_, emitErr = idem.Emit(ctx, idem.OutgoingMessage{Destination: "d"})
		return emitErr
	})
	if !errors.Is(emitErr, idem.ErrNoOutbox) || out.Status != idem.Failed {
		t.Errorf("Emit without an outbox: %v (outcome %v), want ErrNoOutbox and Failed", emitErr, out.Status)
	}
}

// TestMemoryStoreOutboxConformance runs the outbox suite on the memory
// store, on the real clock (the suite waits for leases and backoffs).
func TestMemoryStoreOutboxConformance(t *testing.T) {
	t.Parallel()
	idemtest.RunOutbox(t, idemtest.Harness[*idem.MemoryTx]{New: func(t *testing.T) *idemtest.Setup[*idem.MemoryTx] {
		_, s := newMemorySetupOn(idem.NewMemoryStore(nil))
		return s
	}})
}

// countingOutbox counts claims.
type countingOutbox struct {
	*fakeOutbox
	claims chan time.Time
}

func (c countingOutbox) ClaimOutgoing(ctx context.Context, p *idemdriver.ClaimOutgoingParams) ([]idemdriver.OutgoingRecord, error) {
	c.claims <- time.Now()
	return c.fakeOutbox.ClaimOutgoing(ctx, p)
}

// TestRelayRunPollsAndWakes: an idle Run of one round at a time polls
// from MinPoll doubling to MaxPoll, a Wake makes it claim at once, and
// cancelling its context stops it.
func TestRelayRunPollsAndWakes(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		store := countingOutbox{newFake(), make(chan time.Time, 100)}
		r, err := idem.NewRelay(idem.RelayConfig{Store: store, Publisher: idem.PublisherFunc(func(context.Context, []idem.Outgoing) []error { return nil }),
			Workers: 1, MinPoll: time.Second, MaxPoll: 4 * time.Second, Retention: -1})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		start := time.Now()
		go func() { done <- r.Run(ctx) }()
		var gaps []time.Duration
		last := start
		for range 5 {
			at := <-store.claims
			gaps = append(gaps, at.Sub(last))
			last = at
		}
		if want := []time.Duration{0, 2 * time.Second, 4 * time.Second, 4 * time.Second, 4 * time.Second}; !slices.Equal(gaps, want) {
			t.Errorf("idle claims came after %v, want %v", gaps, want)
		}
		synctest.Wait()
		r.Wake()
		if at := <-store.claims; at != last {
			t.Errorf("claim after Wake came %v after the previous one, want at once", at.Sub(last))
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v, want nil after cancel", err)
		}
	})
}

// TestRelayWorkers: Run keeps Workers rounds in flight at once, on
// disjoint rows, and sends every row once.
func TestRelayWorkers(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := newFake("a", "b", "c", "d", "e", "f")
		f.lease = true
		release := make(chan struct{})
		var mu sync.Mutex
		inflight, most := 0, 0
		published := map[string]int{}
		pub := idem.PublisherFunc(func(ctx context.Context, msgs []idem.Outgoing) []error {
			mu.Lock()
			inflight++
			most = max(most, inflight)
			for _, m := range msgs {
				published[m.ID]++
			}
			mu.Unlock()
			select {
			case <-release:
			case <-ctx.Done():
			}
			mu.Lock()
			inflight--
			mu.Unlock()
			return make([]error, len(msgs))
		})
		r, err := idem.NewRelay(idem.RelayConfig{Store: f, Publisher: pub, BatchSize: 1, Workers: 3, Retention: -1})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- r.Run(ctx) }()
		synctest.Wait()
		close(release)
		synctest.Wait() // every row sent; the workers wait for their polls
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
		if most != 3 {
			t.Errorf("at most %d publishes in flight, want 3 (Workers)", most)
		}
		for _, id := range []string{"a", "b", "c", "d", "e", "f"} {
			if published[id] != 1 || !f.sent[id] {
				t.Errorf("row %q published %d times (sent %v), want once", id, published[id], f.sent[id])
			}
		}
	})
}

// TestOutboxHeaders: Config.OutboxHeaders adds headers from the handler's
// context to every emitted message (replacing a header of the same name,
// leaving the caller's map as it was), and the relay publishes them.
func TestOutboxHeaders(t *testing.T) {
	t.Parallel()
	type traceKey struct{}
	store := idem.NewMemoryStore(nil)
	c, err := idem.NewConsumer(store, idem.Config{Name: "c", PurgeInterval: -1,
		OutboxHeaders: func(ctx context.Context, set func(k, v string)) {
			if v, ok := ctx.Value(traceKey{}).(string); ok {
				set("traceparent", v)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	own := map[string]string{"kind": "receipt", "traceparent": "stale"}
	ctx := context.WithValue(t.Context(), traceKey{}, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	out, err := c.Process(ctx, idem.Message{ID: "m", Payload: []byte("p")}, func(ctx context.Context, tx *idem.MemoryTx, msg idem.Message) error {
		if _, err := idem.Emit(ctx, idem.OutgoingMessage{Destination: "d", Name: "a", Headers: own}); err != nil {
			return err
		}
		_, err := idem.Emit(context.WithValue(ctx, traceKey{}, nil), idem.OutgoingMessage{Destination: "d", Name: "b"})
		return err
	})
	if err != nil || out.Status != idem.Processed {
		t.Fatalf("Process = %v, %v", out.Status, err)
	}
	if own["traceparent"] != "stale" || len(own) != 2 {
		t.Errorf("the handler's Headers map was modified: %v", own)
	}
	var got []idem.Outgoing
	r, err := idem.NewRelay(idem.RelayConfig{Store: store, Retention: -1, Publisher: idem.PublisherFunc(func(_ context.Context, msgs []idem.Outgoing) []error {
		got = append(got, msgs...)
		return make([]error, len(msgs))
	})})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("relay published %d messages, want 2", len(got))
	}
	want := map[string]string{"kind": "receipt", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	if !maps.Equal(got[0].Headers, want) {
		t.Errorf("first message's headers %v, want %v", got[0].Headers, want)
	}
	if len(got[1].Headers) != 0 {
		t.Errorf("second message's headers %v, want none (the injector wrote nothing)", got[1].Headers)
	}
}

// slowMarks is a fakeOutbox whose marks each take delay (a SQLite writer
// waiting its turn) and record their order; MarkFailed fails with failErr,
// when set, after the delay.
type slowMarks struct {
	*fakeOutbox
	delay   time.Duration
	failErr error
	calls   []string // "sent N" or "failed N": the call and its count of rows
}

func (s *slowMarks) MarkSent(ctx context.Context, p *idemdriver.MarkSentParams) error {
	s.calls = append(s.calls, fmt.Sprintf("sent %d", len(p.IDs)))
	if err := sleepCtx(ctx, s.delay); err != nil {
		return err
	}
	return s.fakeOutbox.MarkSent(ctx, p)
}

func (s *slowMarks) MarkFailed(ctx context.Context, p *idemdriver.MarkFailedParams) error {
	s.calls = append(s.calls, fmt.Sprintf("failed %d", len(p.Rows)))
	if err := sleepCtx(ctx, s.delay); err != nil {
		return err
	}
	if s.failErr != nil {
		return s.failErr
	}
	return s.fakeOutbox.MarkFailed(ctx, p)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// runRefusingFrom runs one round of a relay on store whose publisher
// confirms the first n messages of the batch and refuses the others.
func runRefusingFrom(t *testing.T, store idemdriver.OutboxStore, n int) (idem.RelayResult, error) {
	t.Helper()
	pub := idem.PublisherFunc(func(ctx context.Context, msgs []idem.Outgoing) []error {
		errs := make([]error, len(msgs))
		for i := n; i < len(msgs); i++ {
			errs[i] = errors.New("broker refused")
		}
		return errs
	})
	r, err := idem.NewRelay(idem.RelayConfig{Store: store, Publisher: pub, Retention: -1})
	if err != nil {
		t.Fatal(err)
	}
	return r.RunOnce(t.Context())
}

// TestRelayMarksSlowStore: a round marks its rows with two calls, the
// confirmed rows first, then every failed row at once, each call with its
// own bound: a store whose every mark takes 6s (together past the 10s any
// one call may take) still records every outcome.
func TestRelayMarksSlowStore(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ids := make([]string, 40)
		for i := range ids {
			ids[i] = fmt.Sprintf("r-%02d", i)
		}
		store := &slowMarks{fakeOutbox: newFake(ids...), delay: 6 * time.Second}
		res, err := runRefusingFrom(t, store, 10)
		if err != nil {
			t.Fatalf("RunOnce: %v", err)
		}
		if res.Sent != 10 || res.Retried != 30 {
			t.Errorf("RunOnce = %+v, want 10 sent and 30 retried", res)
		}
		if len(store.sent) != 10 || len(store.retries) != 30 {
			t.Errorf("store has %d rows sent and %d marked for retry, want 10 and 30", len(store.sent), len(store.retries))
		}
		if want := []string{"sent 10", "failed 30"}; !slices.Equal(store.calls, want) {
			t.Errorf("mark calls %q, want %q", store.calls, want)
		}
	})
}

// TestRelayMarkFailedError: when the failure mark fails (the store is
// down), the round's error matches ErrStore and counts the rows left
// unmarked, which stay claimed until their lease ends; none is counted
// as retried.
func TestRelayMarkFailedError(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		store := &slowMarks{fakeOutbox: newFake("a", "b", "c", "d"), failErr: errors.New("connection refused")}
		res, err := runRefusingFrom(t, store, 0)
		if !errors.Is(err, idem.ErrStore) || !strings.Contains(err.Error(), "4 failed rows not known to be marked") {
			t.Errorf("RunOnce error = %v, want ErrStore counting 4 rows left unmarked", err)
		}
		if want := []string{"failed 4"}; res.Retried != 0 || !slices.Equal(store.calls, want) {
			t.Errorf("RunOnce = %+v after mark calls %q, want none retried after %q", res, store.calls, want)
		}
	})
}
