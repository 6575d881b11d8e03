package idem_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/idem-go/idem/idemdriver"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// recorder is a hook that implements every Hook* interface and records
// each event as one line ("kind id detail") and as the event value.
type recorder struct {
	mu       sync.Mutex
	lines    []string
	outcomes []idem.OutcomeEvent
	claims   []idem.ClaimEvent
	leases   []idem.LeaseEvent
	purges   []idem.PurgeEvent
	storeErr []idem.StoreErrorEvent
	ends     []idem.ProcessEndEvent
	renewed  chan struct{}
}

type ctxKey struct{}

func newRecorder() *recorder { return &recorder{renewed: make(chan struct{}, 100)} }

func (r *recorder) add(line string) {
	r.mu.Lock()
	r.lines = append(r.lines, line)
	r.mu.Unlock()
}

func (r *recorder) OnProcessStart(ctx context.Context, e idem.ProcessStartEvent) context.Context {
	r.add(fmt.Sprintf("start %s %d", e.MessageID, e.BatchSize))
	return context.WithValue(ctx, ctxKey{}, "from-start-hook")
}

func (r *recorder) OnProcessEnd(ctx context.Context, e idem.ProcessEndEvent) {
	r.mu.Lock()
	r.ends = append(r.ends, e)
	r.mu.Unlock()
	r.add(fmt.Sprintf("end %s %v ctx=%v", e.MessageID, e.Err != nil, ctx.Value(ctxKey{})))
}

func (r *recorder) OnClaim(_ context.Context, e idem.ClaimEvent) {
	r.mu.Lock()
	r.claims = append(r.claims, e)
	r.mu.Unlock()
	r.add(fmt.Sprintf("claim %s %d", e.MessageID, e.Attempt))
}

func (r *recorder) OnOutcome(_ context.Context, e idem.OutcomeEvent) {
	r.mu.Lock()
	r.outcomes = append(r.outcomes, e)
	r.mu.Unlock()
	r.add(fmt.Sprintf("outcome %s %v reason=%s claimed=%v released=%v poison=%v", e.Outcome.MessageID, e.Outcome.Status, e.Reason, e.Claimed, e.Released, e.Outcome.Poison))
}

func (r *recorder) lease(kind string, e idem.LeaseEvent) {
	r.mu.Lock()
	r.leases = append(r.leases, e)
	r.mu.Unlock()
	r.add(fmt.Sprintf("%s %s %d %s", kind, e.MessageID, e.Attempt, e.Op))
}

func (r *recorder) OnLeaseRenewed(_ context.Context, e idem.LeaseEvent) {
	r.lease("renewed", e)
	select {
	case r.renewed <- struct{}{}:
	default:
	}
}
func (r *recorder) OnLeaseTakenOver(_ context.Context, e idem.LeaseEvent) { r.lease("takeover", e) }
func (r *recorder) OnLeaseLost(_ context.Context, e idem.LeaseEvent)      { r.lease("lost", e) }

func (r *recorder) OnPurge(_ context.Context, e idem.PurgeEvent) {
	r.mu.Lock()
	r.purges = append(r.purges, e)
	r.mu.Unlock()
	r.add(fmt.Sprintf("purge %d", e.Result.Deleted))
}

func (r *recorder) OnStoreError(_ context.Context, e idem.StoreErrorEvent) {
	r.mu.Lock()
	r.storeErr = append(r.storeErr, e)
	r.mu.Unlock()
	r.add(fmt.Sprintf("store-error %s %s", e.MessageID, e.Op))
}

// take returns the lines recorded so far and forgets them.
func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.lines
	r.lines = nil
	return l
}

func expectLines(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s: events\n\t%s\nwant\n\t%s", what, strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
	}
}

type hookBundle struct {
	store *idem.MemoryStore
	rec   *recorder
}

func setupHooks(t *testing.T) *hookBundle {
	t.Helper()
	return &hookBundle{store: idem.NewMemoryStore(nil), rec: newRecorder()}
}

func (b *hookBundle) consumer(t *testing.T, cfg idem.Config) *idem.Consumer[*idem.MemoryTx] {
	t.Helper()
	cfg.Name, cfg.PurgeInterval = "c", -1
	cfg.Hooks = append(cfg.Hooks, b.rec)
	c, err := idem.NewConsumer[*idem.MemoryTx](b.store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func (b *hookBundle) leaseConsumer(t *testing.T, cfg idem.Config) *idem.LeaseConsumer {
	t.Helper()
	cfg.Name, cfg.PurgeInterval = "c", -1
	cfg.Hooks = append(cfg.Hooks, b.rec)
	c, err := idem.NewLeaseConsumer(b.store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Every path of a transactional consumer fires its events, in order, and
// the context returned by the start hook reaches the handler and the end.
func TestHooksTransactional(t *testing.T) {
	t.Parallel()
	b := setupHooks(t)
	c := b.consumer(t, idem.Config{})
	ctx := t.Context()
	var handlerCtx any
	ok := func(ctx context.Context, _ *idem.MemoryTx, _ idem.Message) error {
		handlerCtx = ctx.Value(ctxKey{})
		return nil
	}
	boom := errors.New("boom")

	steps := []struct {
		name    string
		msg     idem.Message
		handler idem.Handler[*idem.MemoryTx]
		want    []string
	}{
		{"processed", idem.Message{ID: "m1", Payload: []byte("p")}, ok, []string{
			"start m1 0", "claim m1 0", "outcome m1 Processed reason= claimed=true released=false poison=false", "end m1 false ctx=from-start-hook"}},
		{"duplicate", idem.Message{ID: "m1", Payload: []byte("p")}, ok, []string{
			"start m1 0", "outcome m1 Duplicate reason=completed claimed=false released=false poison=false", "end m1 false ctx=from-start-hook"}},
		{"mismatch", idem.Message{ID: "m1", Payload: []byte("other")}, ok, []string{
			"start m1 0", "outcome m1 FingerprintMismatch reason=fingerprint_mismatch claimed=false released=false poison=false", "end m1 true ctx=from-start-hook"}},
		{"handler error", idem.Message{ID: "m2", Payload: []byte("p")}, func(context.Context, *idem.MemoryTx, idem.Message) error { return boom }, []string{
			"start m2 0", "claim m2 0", "outcome m2 Failed reason= claimed=true released=true poison=false", "end m2 true ctx=from-start-hook"}},
		{"rejected", idem.Message{ID: "", Payload: []byte("p")}, ok, []string{
			"start  0", "outcome  Rejected reason= claimed=false released=false poison=false", "end  true ctx=from-start-hook"}},
	}
	for _, s := range steps {
		_, _ = c.Process(ctx, s.msg, s.handler)
		expectLines(t, s.name, b.rec.take(), s.want)
	}
	if handlerCtx != "from-start-hook" {
		t.Errorf("handler context value %v, want the start hook's", handlerCtx)
	}
	for _, e := range b.rec.outcomes {
		if e.Consumer != "c" || e.Mode != idem.ModeTransactional || e.Latency <= 0 {
			t.Errorf("outcome event %+v: want consumer c, transactional mode, a latency", e)
		}
	}
	if !errors.Is(b.rec.outcomes[3].Outcome.Err, boom) || !errors.Is(b.rec.ends[3].Err, boom) {
		t.Errorf("failed outcome and end carry %v, %v; want the handler's error", b.rec.outcomes[3].Outcome.Err, b.rec.ends[3].Err)
	}
	if len(b.rec.claims) != 2 || b.rec.claims[0].Latency <= 0 {
		t.Errorf("claims %+v, want 2 with a latency", b.rec.claims)
	}

	// ProcessTx: the same events inside the caller's transaction.
	tx, err := b.store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = c.ProcessTx(ctx, tx, idem.Message{ID: "m3", Payload: []byte("p")}, ok)
	_, _ = c.ProcessTx(ctx, tx, idem.Message{ID: "m1", Payload: []byte("p")}, ok)
	if err := b.store.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	expectLines(t, "ProcessTx", b.rec.take(), []string{
		"start m3 0", "claim m3 0", "outcome m3 Processed reason= claimed=true released=false poison=false", "end m3 false ctx=from-start-hook",
		"start m1 0", "outcome m1 Duplicate reason=completed claimed=false released=false poison=false", "end m1 false ctx=from-start-hook",
	})

	// AcceptMismatchAsDuplicate: a Duplicate whose reason is the mismatch.
	c2 := b.consumer(t, idem.Config{MismatchPolicy: idem.AcceptMismatchAsDuplicate})
	_, _ = c2.Process(ctx, idem.Message{ID: "m1", Payload: []byte("other")}, ok)
	expectLines(t, "accepted mismatch", b.rec.take(), []string{
		"start m1 0", "outcome m1 Duplicate reason=fingerprint_mismatch claimed=false released=false poison=false", "end m1 false ctx=from-start-hook"})
}

// A batch has one start and one end, a claim per new message, and an
// outcome per message in delivery order.
func TestHooksBatch(t *testing.T) {
	t.Parallel()
	b := setupHooks(t)
	c := b.consumer(t, idem.Config{})
	ctx := t.Context()
	ok := func(context.Context, *idem.MemoryTx, []idem.Message) error { return nil }
	if _, err := c.ProcessBatch(ctx, []idem.Message{{ID: "old", Payload: []byte("p")}}, ok); err != nil {
		t.Fatal(err)
	}
	b.rec.take()
	batch := []idem.Message{{ID: "b", Payload: []byte("p")}, {ID: "old", Payload: []byte("p")}, {ID: "a", Payload: []byte("p")}, {ID: ""}, {ID: "b", Payload: []byte("p")}}
	_, _ = c.ProcessBatch(ctx, batch, ok)
	expectLines(t, "batch", b.rec.take(), []string{
		"start  5",
		"claim a 0", "claim b 0", // claimed in ID order
		"outcome b Processed reason= claimed=true released=false poison=false",
		"outcome old Duplicate reason=completed claimed=false released=false poison=false",
		"outcome a Processed reason= claimed=true released=false poison=false",
		"outcome  Rejected reason= claimed=false released=false poison=false",
		"outcome b Duplicate reason=completed claimed=false released=false poison=false",
		"end  true ctx=from-start-hook",
	})
	for _, e := range b.rec.outcomes[1:] {
		if e.BatchSize != 5 {
			t.Errorf("outcome %q batch size %d, want 5", e.Outcome.MessageID, e.BatchSize)
		}
	}

	// A failing handler fails and releases every new message.
	_, _ = c.ProcessBatch(ctx, []idem.Message{{ID: "x", Payload: []byte("p")}, {ID: "a", Payload: []byte("p")}},
		func(context.Context, *idem.MemoryTx, []idem.Message) error { return errors.New("boom") })
	expectLines(t, "failed batch", b.rec.take(), []string{
		"start  2", "claim x 0",
		"outcome x Failed reason= claimed=true released=true poison=false",
		"outcome a Duplicate reason=completed claimed=false released=false poison=false",
		"end  true ctx=from-start-hook",
	})
}

// failingStore fails Begin and Acquire with a store error.
type failingStore struct {
	*idem.MemoryStore
	err error
}

func (s *failingStore) Begin(context.Context) (*idem.MemoryTx, error) { return nil, s.err }
func (s *failingStore) Acquire(context.Context, *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
	return idemdriver.AcquireResult{}, s.err
}
func (s *failingStore) BeginPurge(context.Context, *idemdriver.BeginPurgeParams) (idemdriver.PurgeSession, error) {
	return nil, s.err
}

// Store errors reach the store error hook with the operation, and the
// outcome is a Failed delivery that claimed nothing.
func TestHooksStoreErrors(t *testing.T) {
	t.Parallel()
	rec := newRecorder()
	down := errors.New("connection refused")
	st := &failingStore{MemoryStore: idem.NewMemoryStore(nil), err: down}
	c, err := idem.NewConsumer[*idem.MemoryTx](st, idem.Config{Name: "c", PurgeInterval: -1, Hooks: []idem.Hook{rec}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	lc, err := idem.NewLeaseConsumer(st, idem.Config{Name: "c", PurgeInterval: -1, Hooks: []idem.Hook{rec}})
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	msg := idem.Message{ID: "m", Payload: []byte("p")}
	_, _ = c.Process(t.Context(), msg, func(context.Context, *idem.MemoryTx, idem.Message) error { return nil })
	_, _ = lc.Process(t.Context(), msg, func(context.Context, *idem.Attempt) (idem.Result, error) { return idem.Result{}, nil })
	_, _ = c.Purge(t.Context())
	expectLines(t, "store errors", rec.take(), []string{
		"start m 0", "store-error m begin", "outcome m Failed reason= claimed=false released=false poison=false", "end m true ctx=from-start-hook",
		"start m 0", "store-error m acquire", "outcome m Failed reason= claimed=false released=false poison=false", "end m true ctx=from-start-hook",
		"store-error  purge", "purge 0",
	})
	for _, e := range rec.storeErr {
		if !errors.Is(e.Err, idem.ErrStore) || !errors.Is(e.Err, down) {
			t.Errorf("store error event %s: %v, want ErrStore wrapping the driver's error", e.Op, e.Err)
		}
	}
	if rec.storeErr[1].Mode != idem.ModeLease {
		t.Errorf("acquire error mode %v, want lease", rec.storeErr[1].Mode)
	}
	if !errors.Is(rec.purges[0].Err, down) {
		t.Errorf("purge event error %v", rec.purges[0].Err)
	}

	// A call whose context has ended fails, but that is the caller's
	// cancellation, not a store error.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, _ = c.Process(ctx, msg, func(context.Context, *idem.MemoryTx, idem.Message) error { return nil })
	expectLines(t, "cancelled", rec.take(), []string{
		"start m 0", "outcome m Failed reason= claimed=false released=false poison=false", "end m true ctx=from-start-hook",
	})
}

// Lease mode: processed, duplicate, in progress, released on error, a
// retry's takeover, poison and the poison record's redelivery, renewals,
// and a stale completion rejected after another attempt took over.
func TestHooksLease(t *testing.T) {
	t.Parallel()
	b := setupHooks(t)
	c := b.leaseConsumer(t, idem.Config{Lease: 30 * time.Second, MaxAttempts: 2})
	ctx := t.Context()
	done := func(context.Context, *idem.Attempt) (idem.Result, error) { return idem.Result{Body: []byte("r")}, nil }
	fail := func(context.Context, *idem.Attempt) (idem.Result, error) { return idem.Result{}, errors.New("flaky") }
	m := func(id string) idem.Message { return idem.Message{ID: id, Payload: []byte("p")} }

	_, _ = c.Process(ctx, m("m1"), done)
	_, _ = c.Process(ctx, m("m1"), done)
	expectLines(t, "processed, duplicate", b.rec.take(), []string{
		"start m1 0", "claim m1 1", "outcome m1 Processed reason= claimed=true released=false poison=false", "end m1 false ctx=from-start-hook",
		"start m1 0", "outcome m1 Duplicate reason=completed claimed=false released=false poison=false", "end m1 false ctx=from-start-hook",
	})

	_, _ = c.Process(ctx, m("m2"), fail)
	_, _ = c.Process(ctx, m("m2"), fail)
	_, _ = c.Process(ctx, m("m2"), done)
	expectLines(t, "released, takeover, poison", b.rec.take(), []string{
		"start m2 0", "claim m2 1", "outcome m2 Failed reason= claimed=true released=true poison=false", "end m2 true ctx=from-start-hook",
		"start m2 0", "claim m2 2", "takeover m2 2 ", "outcome m2 Failed reason= claimed=true released=false poison=true", "end m2 true ctx=from-start-hook",
		"start m2 0", "outcome m2 Failed reason=poison claimed=false released=false poison=true", "end m2 true ctx=from-start-hook",
	})

	// In progress, and renewals: the first attempt holds the lease until
	// the second delivery has been turned away and a renewal was seen.
	short := b.leaseConsumer(t, idem.Config{Lease: 300 * time.Millisecond})
	inside, release := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = short.Process(ctx, m("m3"), func(context.Context, *idem.Attempt) (idem.Result, error) {
			close(inside)
			<-release
			return idem.Result{}, nil
		})
	}()
	<-inside
	out, _ := short.Process(ctx, m("m3"), done)
	if out.Status != idem.InProgress {
		t.Fatalf("second delivery %v, want InProgress", out.Status)
	}
	select {
	case <-b.rec.renewed:
	case <-time.After(10 * time.Second):
		t.Fatal("no renewal event within 10s")
	}
	close(release)
	wg.Wait()
	var got []string
	for _, l := range b.rec.take() {
		if !strings.HasPrefix(l, "renewed") { // their number depends on the scheduler
			got = append(got, l)
		}
	}
	slices.Sort(got) // the two deliveries interleave
	want := []string{
		"claim m3 1", "end m3 false ctx=from-start-hook", "end m3 true ctx=from-start-hook",
		"outcome m3 InProgress reason=in_progress claimed=false released=false poison=false",
		"outcome m3 Processed reason= claimed=true released=false poison=false",
		"start m3 0", "start m3 0",
	}
	expectLines(t, "in progress", got, want)
	b.rec.mu.Lock()
	var renewal *idem.LeaseEvent
	for i, e := range b.rec.leases {
		if e.MessageID == "m3" {
			renewal = &b.rec.leases[i]
		}
	}
	b.rec.mu.Unlock()
	if renewal == nil || renewal.Attempt != 1 || renewal.Token == 0 || renewal.Consumer != "c" {
		t.Errorf("renewal event %+v", renewal)
	}

	// A stale completion: the lease of m4 is expired while its handler
	// runs, another attempt takes over and completes, then the first
	// attempt's Complete is rejected.
	inside, release = make(chan struct{}), make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		out, _ := c.Process(ctx, m("m4"), func(context.Context, *idem.Attempt) (idem.Result, error) {
			close(inside)
			<-release
			return idem.Result{Body: []byte("late")}, nil
		})
		if out.Status != idem.Failed || !errors.Is(out.Err, idem.ErrLeaseLost) {
			t.Errorf("stale attempt: %v %v, want Failed with ErrLeaseLost", out.Status, out.Err)
		}
	}()
	<-inside
	if !idem.ExpireLease(b.store, "c", "m4") {
		t.Fatal("ExpireLease found no lease")
	}
	_, _ = c.Process(ctx, m("m4"), done)
	close(release)
	wg.Wait()
	got = b.rec.take()
	want = []string{
		"start m4 0", "claim m4 1", // first attempt
		"start m4 0", "claim m4 2", "takeover m4 2 ", "outcome m4 Processed reason= claimed=true released=false poison=false", "end m4 false ctx=from-start-hook",
		"lost m4 1 complete", "outcome m4 Failed reason= claimed=true released=false poison=false", "end m4 true ctx=from-start-hook",
	}
	expectLines(t, "stale completion", got, want)
	lost := b.rec.leases[len(b.rec.leases)-1]
	if lost.Op != "complete" || !errors.Is(lost.Err, idem.ErrLeaseLost) || lost.Latency <= 0 || lost.Latency > time.Minute {
		t.Errorf("stale completion event %+v", lost)
	}
}

// A consumer whose only hook watches lost leases still gets their latency.
type lostOnly struct{ got chan idem.LeaseEvent }

func (l lostOnly) OnLeaseLost(_ context.Context, e idem.LeaseEvent) { l.got <- e }

func TestHookLeaseLostAlone(t *testing.T) {
	t.Parallel()
	store := idem.NewMemoryStore(nil)
	hook := lostOnly{make(chan idem.LeaseEvent, 1)}
	c, err := idem.NewLeaseConsumer(store, idem.Config{Name: "c", PurgeInterval: -1, Lease: 30 * time.Second, Hooks: []idem.Hook{hook}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msg := idem.Message{ID: "m", Payload: []byte("p")}
	_, err = c.Process(t.Context(), msg, func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
		idem.ExpireLease(store, "c", "m")
		if _, err := c.Process(ctx, msg, func(context.Context, *idem.Attempt) (idem.Result, error) { return idem.Result{}, nil }); err != nil {
			return idem.Result{}, err
		}
		return idem.Result{}, nil
	})
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("stale attempt: %v, want ErrLeaseLost", err)
	}
	e := <-hook.got
	if e.Op != "complete" || e.Latency <= 0 || e.Latency > time.Minute {
		t.Errorf("event %+v: want a stale completion with a latency", e)
	}
}

// The purge hook gets the rows deleted, the horizon and the lag.
func TestHooksPurge(t *testing.T) {
	t.Parallel()
	b := setupHooks(t)
	c := b.consumer(t, idem.Config{RetentionWindow: time.Hour})
	ok := func(context.Context, *idem.MemoryTx, idem.Message) error { return nil }
	for _, id := range []string{"a", "b"} {
		if _, err := c.Process(t.Context(), idem.Message{ID: id, Payload: []byte("p")}, ok); err != nil {
			t.Fatal(err)
		}
	}
	// The consumer ran for three hours after a and b, then was down for
	// two: the horizon is three hours back, a lag of about two hours.
	_ = c.Close()
	if err := b.store.MarkRunning(t.Context(), &idemdriver.MarkRunningParams{Consumer: "c"}); err != nil {
		t.Fatal(err)
	}
	idem.Shift(b.store, "c", 3*time.Hour)
	if err := b.store.MarkRunning(t.Context(), &idemdriver.MarkRunningParams{Consumer: "c", MaxGap: 4 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	idem.Shift(b.store, "c", 2*time.Hour)
	c = b.consumer(t, idem.Config{RetentionWindow: time.Hour})
	b.rec.take()
	res, err := c.Purge(t.Context())
	if err != nil || res.Deleted != 2 {
		t.Fatalf("Purge: %+v, %v; want 2 deleted", res, err)
	}
	expectLines(t, "purge", b.rec.take(), []string{"purge 2"})
	e := b.rec.purges[0]
	if e.Consumer != "c" || e.RetentionWindow != time.Hour || e.Result.Deleted != 2 || e.Latency <= 0 || e.Err != nil {
		t.Errorf("purge event %+v", e)
	}
	if e.Lag < 2*time.Hour-time.Minute || e.Lag > 2*time.Hour+time.Minute {
		t.Errorf("purge lag %v, want about 2h (the downtime inside the horizon's span)", e.Lag)
	}
}

// panicky panics in every hook it implements.
type panicky struct{}

func (panicky) OnOutcome(context.Context, idem.OutcomeEvent) { panic("hook bug") }
func (panicky) OnProcessStart(context.Context, idem.ProcessStartEvent) context.Context {
	return nil //nolint:staticcheck // a nil context must be ignored
}

// A hook that panics, or returns a nil context, changes nothing: the
// outcome is the same, the panic is logged at error level, and the other
// hooks still run.
func TestHookPanicIsRecovered(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	rec := newRecorder()
	c, err := idem.NewConsumer[*idem.MemoryTx](idem.NewMemoryStore(nil), idem.Config{
		Name: "c", PurgeInterval: -1, Hooks: []idem.Hook{panicky{}, rec},
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	out, err := c.Process(t.Context(), idem.Message{ID: "m", Payload: []byte("p")},
		func(ctx context.Context, _ *idem.MemoryTx, _ idem.Message) error {
			if ctx == nil || ctx.Value(ctxKey{}) != "from-start-hook" {
				return errors.New("handler context lost")
			}
			return nil
		})
	if err != nil || out.Status != idem.Processed {
		t.Fatalf("Process: %v %v, want Processed", out.Status, err)
	}
	if len(rec.outcomes) != 1 {
		t.Errorf("the recorder after the panicking hook saw %d outcomes, want 1", len(rec.outcomes))
	}
	if s := logs.String(); !strings.Contains(s, "level=ERROR") || !strings.Contains(s, "hook bug") || !strings.Contains(s, "idem_test.panicky") {
		t.Errorf("log %q lacks the hook's panic at error level", s)
	}
}

func TestHooksInvalid(t *testing.T) {
	t.Parallel()
	for _, hs := range [][]idem.Hook{{42}, {nil}, {newRecorder(), struct{}{}}} {
		_, err := idem.NewConsumer[*idem.MemoryTx](idem.NewMemoryStore(nil), idem.Config{Name: "c", PurgeInterval: -1, Hooks: hs})
		if !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("hooks %v: error %v, want ErrInvalidConfig", hs, err)
		}
		_, err = idem.NewLeaseConsumer(idem.NewMemoryStore(nil), idem.Config{Name: "c", PurgeInterval: -1, Hooks: hs})
		if !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("lease, hooks %v: error %v, want ErrInvalidConfig", hs, err)
		}
	}
}

// LogHook writes duplicates at debug level only, and dead-letter outcomes
// at warn.
func TestLogHookLevels(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		level slog.Level
		want  []string // the status of each line
	}{
		{slog.LevelDebug, []string{"Processed", "Duplicate", "FingerprintMismatch"}},
		{slog.LevelInfo, []string{"FingerprintMismatch"}},
	} {
		var logs bytes.Buffer
		l := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: tt.level}))
		c, err := idem.NewConsumer[*idem.MemoryTx](idem.NewMemoryStore(nil), idem.Config{Name: "c", PurgeInterval: -1, Hooks: []idem.Hook{idem.LogHook(l)}})
		if err != nil {
			t.Fatal(err)
		}
		ok := func(context.Context, *idem.MemoryTx, idem.Message) error { return nil }
		for _, p := range []string{"p", "p", "q"} {
			_, _ = c.Process(t.Context(), idem.Message{ID: "m", Payload: []byte(p)}, ok)
		}
		c.Close()
		var got []string
		for line := range strings.Lines(logs.String()) {
			_, after, _ := strings.Cut(line, "status=")
			status, _, _ := strings.Cut(after, " ")
			got = append(got, status)
			if status == "Duplicate" && !strings.Contains(line, "level=DEBUG") || status == "FingerprintMismatch" && !strings.Contains(line, "level=WARN") {
				t.Errorf("level %v: line %q at the wrong level", tt.level, line)
			}
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("level %v: logged %q, want %q", tt.level, got, tt.want)
		}
	}
}

// BenchmarkProcessDuplicateHooks measures the duplicate path without
// hooks, with a hook that implements nothing used on it, and with LogHook
// (debug disabled).
func BenchmarkProcessDuplicateHooks(b *testing.B) {
	for _, bb := range []struct {
		name  string
		hooks []idem.Hook
	}{
		{"none", nil},
		{"purge-only", []idem.Hook{purgeOnly{}}},
		{"loghook", []idem.Hook{idem.LogHook(slog.New(slog.DiscardHandler))}},
	} {
		b.Run(bb.name, func(b *testing.B) {
			c, err := idem.NewConsumer[*idem.MemoryTx](idem.NewMemoryStore(nil), idem.Config{Name: "c", PurgeInterval: -1, Hooks: bb.hooks})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			ok := func(context.Context, *idem.MemoryTx, idem.Message) error { return nil }
			msg := idem.Message{ID: "m", Payload: []byte("p")}
			ctx := context.Background()
			_, _ = c.Process(ctx, msg, ok)
			b.ReportAllocs()
			for b.Loop() {
				_, _ = c.Process(ctx, msg, ok)
			}
		})
	}
}

type purgeOnly struct{}

func (purgeOnly) OnPurge(context.Context, idem.PurgeEvent) {}

// dupCounter is a hook that counts deliveries by duplicate reason.
type dupCounter struct {
	mu sync.Mutex
	n  map[idem.DuplicateReason]int
}

func (d *dupCounter) OnOutcome(_ context.Context, e idem.OutcomeEvent) {
	d.mu.Lock()
	d.n[e.Reason]++
	d.mu.Unlock()
}

// A hook implements only the Hook* interfaces it needs; this one counts
// outcomes by duplicate reason.
func ExampleHook() {
	counter := &dupCounter{n: map[idem.DuplicateReason]int{}}
	c, err := idem.NewConsumer[*idem.MemoryTx](idem.NewMemoryStore(nil), idem.Config{
		Name: "payments", PurgeInterval: -1, Hooks: []idem.Hook{counter},
	})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	charge := func(context.Context, *idem.MemoryTx, idem.Message) error { return nil }
	for _, m := range []idem.Message{
		{ID: "pay-1", Payload: []byte(`{"cents":100}`)},
		{ID: "pay-1", Payload: []byte(`{"cents":100}`)}, // a redelivery
		{ID: "pay-1", Payload: []byte(`{"cents":999}`)}, // a producer bug
		{ID: "pay-2", Payload: []byte(`{"cents":200}`)},
	} {
		_, _ = c.Process(context.Background(), m, charge)
	}
	fmt.Println("new:", counter.n[idem.NotDuplicate])
	fmt.Println("completed:", counter.n[idem.DuplicateCompleted])
	fmt.Println("fingerprint_mismatch:", counter.n[idem.DuplicateFingerprintMismatch])
	// Output:
	// new: 2
	// completed: 1
	// fingerprint_mismatch: 1
}

// panicCommitStore's Commit panics, like a driver bug would.
type panicCommitStore struct{ *idem.MemoryStore }

func (s panicCommitStore) Commit(ctx context.Context, tx *idem.MemoryTx) error {
	_ = s.MemoryStore.Rollback(ctx, tx)
	panic("driver bug")
}

// A panic that escapes Process (a store or a Retryable that panics: only
// the handler's panics are recovered) still ends the call for the hooks:
// the start is paired with an end, and the claim with an outcome, so a
// tracer's span ends and a claims-in-progress gauge comes back down.
func TestHooksPairedWhenProcessPanics(t *testing.T) {
	t.Parallel()
	rec := newRecorder()
	mustPanic := func(what string, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s: no panic reached the caller", what)
			}
		}()
		f()
	}
	c, err := idem.NewConsumer[*idem.MemoryTx](panicCommitStore{idem.NewMemoryStore(nil)}, idem.Config{Name: "c", PurgeInterval: -1, Hooks: []idem.Hook{rec}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ok := func(context.Context, *idem.MemoryTx, idem.Message) error { return nil }
	mustPanic("Process", func() { _, _ = c.Process(t.Context(), idem.Message{ID: "m", Payload: []byte("p")}, ok) })
	expectLines(t, "Process", rec.take(), []string{
		"start m 0", "claim m 0", "outcome m Failed reason= claimed=true released=true poison=false", "end m true ctx=from-start-hook"})
	mustPanic("ProcessBatch", func() {
		_, _ = c.ProcessBatch(t.Context(), []idem.Message{{ID: "b", Payload: []byte("p")}},
			func(context.Context, *idem.MemoryTx, []idem.Message) error { return nil })
	})
	expectLines(t, "ProcessBatch", rec.take(), []string{
		"start  1", "claim b 0", "outcome b Failed reason= claimed=true released=true poison=false", "end  true ctx=from-start-hook"})

	lc, err := idem.NewLeaseConsumer(idem.NewMemoryStore(nil), idem.Config{Name: "c", PurgeInterval: -1, Hooks: []idem.Hook{rec},
		Retryable: func(error) bool { panic("classifier bug") }})
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	mustPanic("LeaseConsumer.Process", func() {
		_, _ = lc.Process(t.Context(), idem.Message{ID: "l", Payload: []byte("p")},
			func(context.Context, *idem.Attempt) (idem.Result, error) { return idem.Result{}, errors.New("flaky") })
	})
	expectLines(t, "LeaseConsumer.Process", rec.take(), []string{
		"start l 0", "claim l 1", "outcome l Failed reason= claimed=true released=false poison=false", "end l true ctx=from-start-hook"})
	for _, e := range rec.ends {
		if e.Err == nil || !strings.Contains(e.Err.Error(), "panic") {
			t.Errorf("end event error %v, want one that says the call panicked", e.Err)
		}
	}
}

// countHook counts events with atomics, for the concurrency test.
type countHook struct {
	starts, ends, claims, outcomes, claimedOutcomes, renewals atomic.Int64
}

func (h *countHook) OnProcessStart(ctx context.Context, _ idem.ProcessStartEvent) context.Context {
	h.starts.Add(1)
	return ctx
}
func (h *countHook) OnProcessEnd(context.Context, idem.ProcessEndEvent) { h.ends.Add(1) }
func (h *countHook) OnClaim(context.Context, idem.ClaimEvent)           { h.claims.Add(1) }
func (h *countHook) OnOutcome(_ context.Context, e idem.OutcomeEvent) {
	h.outcomes.Add(1)
	if e.Claimed {
		h.claimedOutcomes.Add(1)
	}
}
func (h *countHook) OnLeaseRenewed(context.Context, idem.LeaseEvent) { h.renewals.Add(1) }

// Many goroutines deliver overlapping IDs to both kinds of consumer, with
// LogHook and a counting hook: every call has one start, one end and one
// outcome, every claim one claimed outcome, and each ID is claimed once.
func TestHooksConcurrent(t *testing.T) {
	t.Parallel()
	const workers, perWorker, ids = 16, 60, 40
	for _, lease := range []bool{false, true} {
		h := &countHook{}
		hooks := []idem.Hook{h, idem.LogHook(slog.New(slog.DiscardHandler))}
		store := idem.NewMemoryStore(nil)
		var process func(ctx context.Context, msg idem.Message) (idem.Outcome, error)
		if lease {
			lc, err := idem.NewLeaseConsumer(store, idem.Config{Name: "c", PurgeInterval: -1, Hooks: hooks, Lease: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer lc.Close()
			process = func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
				return lc.Process(ctx, msg, func(context.Context, *idem.Attempt) (idem.Result, error) {
					time.Sleep(time.Millisecond)
					return idem.Result{}, nil
				})
			}
		} else {
			c, err := idem.NewConsumer[*idem.MemoryTx](store, idem.Config{Name: "c", PurgeInterval: -1, Hooks: hooks})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			process = func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
				return c.Process(ctx, msg, func(context.Context, *idem.MemoryTx, idem.Message) error { return nil })
			}
		}
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := range perWorker {
					_, _ = process(t.Context(), idem.Message{ID: fmt.Sprintf("m%d", (w*7+i)%ids), Payload: []byte("p")})
				}
			})
		}
		wg.Wait()
		const calls = workers * perWorker
		if h.starts.Load() != calls || h.ends.Load() != calls || h.outcomes.Load() != calls {
			t.Errorf("lease=%v: %d starts, %d ends, %d outcomes; want %d each", lease, h.starts.Load(), h.ends.Load(), h.outcomes.Load(), calls)
		}
		if h.claims.Load() != h.claimedOutcomes.Load() || h.claims.Load() != ids {
			t.Errorf("lease=%v: %d claims, %d claimed outcomes; want %d each", lease, h.claims.Load(), h.claimedOutcomes.Load(), ids)
		}
	}
}
