package idem_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemtest"
)

// mutant is a deliberately broken store: a decorator over the memory store
// with one classic idempotency bug. The suite must fail against each, in
// the case named by wantFail.
type mutant struct {
	name     string
	run      string // -test.run pattern below TestMutant
	wantFail string // subtest that must fail
	wrap     func(*idem.MemoryStore) idemdriver.TxStore[*idem.MemoryTx]
}

var mutants = []mutant{
	{"FoldsCase", "IDs/ComparedByteForByte", "IDs/ComparedByteForByte",
		func(s *idem.MemoryStore) idemdriver.TxStore[*idem.MemoryTx] { return &mapIDs{s, strings.ToLower} }},
	{"TrimsTrailingSpace", "IDs/ComparedByteForByte", "IDs/ComparedByteForByte",
		func(s *idem.MemoryStore) idemdriver.TxStore[*idem.MemoryTx] {
			return &mapIDs{s, func(id string) string { return strings.TrimRight(id, " ") }}
		}},
	{"TruncatesIDs", "IDs/MaxLength", "IDs/MaxLength",
		func(s *idem.MemoryStore) idemdriver.TxStore[*idem.MemoryTx] {
			return &mapIDs{s, func(id string) string { return id[:min(len(id), 250)] }}
		}},
	{"IgnoresConsumer", "Consumers/TwoConsumersSameMessage", "Consumers/TwoConsumersSameMessage",
		func(s *idem.MemoryStore) idemdriver.TxStore[*idem.MemoryTx] { return &oneConsumer{s} }},
	{"ForgetsFingerprint", "Fingerprint/MismatchAfterCommit", "Fingerprint/MismatchAfterCommit",
		func(s *idem.MemoryStore) idemdriver.TxStore[*idem.MemoryTx] { return &echoFingerprint{s} }},
	{"TruncatesFingerprint", "Fingerprint/StoredExactly", "Fingerprint/StoredExactly",
		func(s *idem.MemoryStore) idemdriver.TxStore[*idem.MemoryTx] { return &shortFingerprint{s} }},
	{"ClaimsOutsideTx", "Process/HandlerErrorRollsBack", "Process/HandlerErrorRollsBack",
		func(s *idem.MemoryStore) idemdriver.TxStore[*idem.MemoryTx] { return &claimOutsideTx{MemoryStore: s} }},
	{"CountsDowntimeAsRunning", "Purge/DowntimeSafe", "Purge/DowntimeSafe",
		func(s *idem.MemoryStore) idemdriver.TxStore[*idem.MemoryTx] { return &wallClockRuns{s} }},
	{"ExtendsRunsAcrossRestarts", "Purge/DowntimeSafe", "Purge/DowntimeSafe",
		func(s *idem.MemoryStore) idemdriver.TxStore[*idem.MemoryTx] { return &alwaysExtend{s} }},
	{"PurgesUnbounded", "Purge/Window", "Purge/Window",
		func(s *idem.MemoryStore) idemdriver.TxStore[*idem.MemoryTx] { return &unboundedPurge{s} }},
	{"PurgesAllConsumers", "Purge/PerConsumer", "Purge/PerConsumer",
		func(s *idem.MemoryStore) idemdriver.TxStore[*idem.MemoryTx] { return &purgeEveryone{MemoryStore: s} }},
}

// TestSuiteCatchesBrokenStores runs the suite against each mutant in a
// child process and requires the expected case to fail.
func TestSuiteCatchesBrokenStores(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs the suite in child processes")
	}
	for _, m := range mutants {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			wantChildFails(t, "TestMutant", "IDEMTEST_MUTANT", m.name, m.run, m.wantFail)
		})
	}
}

// wantChildFails runs the cases run of test in a child test process with
// the environment variable env set to the mutant's name, and requires the
// case wantFail to fail there.
func wantChildFails(t *testing.T, test, env, name, run, wantFail string) {
	t.Helper()
	pattern := "^" + test + "$/^" + strings.ReplaceAll(run, "/", "$/^") + "$"
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run="+pattern, "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), env+"="+name)
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Errorf("%s passed against a store that %s; want %s to fail\n%s", test, name, wantFail, out)
		return
	}
	if !strings.Contains(string(out), "--- FAIL: "+test+"/"+wantFail) {
		t.Errorf("against a store that %s, %s did not fail:\n%s", name, wantFail, out)
	}
}

// TestMutant runs the suite against the mutant named by IDEMTEST_MUTANT;
// TestSuiteCatchesBrokenStores starts it.
func TestMutant(t *testing.T) {
	name := os.Getenv("IDEMTEST_MUTANT")
	if name == "" {
		t.Skip("run by TestSuiteCatchesBrokenStores")
	}
	var m *mutant
	for i := range mutants {
		if mutants[i].name == name {
			m = &mutants[i]
		}
	}
	if m == nil {
		t.Fatalf("unknown mutant %q", name)
	}
	idemtest.Run(t, idemtest.Harness[*idem.MemoryTx]{New: func(t *testing.T) *idemtest.Setup[*idem.MemoryTx] {
		store := idem.NewMemoryStore(nil)
		s := memorySetup(store)
		s.Store = m.wrap(store)
		return s
	}})
}

// memorySetup is a Setup over store whose effects live in a map.
func memorySetup(store *idem.MemoryStore) *idemtest.Setup[*idem.MemoryTx] {
	var mu sync.Mutex
	effects := map[string]int{}
	return &idemtest.Setup[*idem.MemoryTx]{
		Store: store,
		WriteEffect: func(_ context.Context, tx *idem.MemoryTx, key string) error {
			tx.OnCommit(func() {
				mu.Lock()
				effects[key]++
				mu.Unlock()
			})
			return nil
		},
		CountEffects: func(_ context.Context, key string) (int, error) {
			mu.Lock()
			defer mu.Unlock()
			return effects[key], nil
		},
		CountRecords: func(_ context.Context, consumer string) (int, error) { return idem.CountRecords(store, consumer), nil },
		Shift: func(_ context.Context, consumer string, d time.Duration) error {
			idem.Shift(store, consumer, d)
			return nil
		},
	}
}

// mapIDs rewrites message IDs before they reach the store, as a collation
// or a column type would.
type mapIDs struct {
	*idem.MemoryStore
	f func(string) string
}

func (s *mapIDs) ClaimTx(ctx context.Context, tx *idem.MemoryTx, p *idemdriver.ClaimParams) (idemdriver.ClaimResult, error) {
	q := *p
	q.MessageID = s.f(q.MessageID)
	return s.MemoryStore.ClaimTx(ctx, tx, &q)
}

func (s *mapIDs) ClaimBatchTx(ctx context.Context, tx *idem.MemoryTx, p *idemdriver.ClaimBatchParams) ([]idemdriver.ClaimResult, error) {
	out := make([]idemdriver.ClaimResult, len(p.Messages))
	for i, m := range p.Messages {
		r, err := s.ClaimTx(ctx, tx, &idemdriver.ClaimParams{Consumer: p.Consumer, MessageID: m.MessageID, Fingerprint: m.Fingerprint})
		if err != nil {
			return nil, err
		}
		out[i] = r
	}
	return out, nil
}

// oneConsumer keys records by message ID only (field case C14).
type oneConsumer struct{ *idem.MemoryStore }

func (s *oneConsumer) ClaimTx(ctx context.Context, tx *idem.MemoryTx, p *idemdriver.ClaimParams) (idemdriver.ClaimResult, error) {
	q := *p
	q.Consumer = "everyone"
	return s.MemoryStore.ClaimTx(ctx, tx, &q)
}

func (s *oneConsumer) ClaimBatchTx(ctx context.Context, tx *idem.MemoryTx, p *idemdriver.ClaimBatchParams) ([]idemdriver.ClaimResult, error) {
	q := *p
	q.Consumer = "everyone"
	return s.MemoryStore.ClaimBatchTx(ctx, tx, &q)
}

// echoFingerprint reports the caller's fingerprint on duplicates instead of
// the stored one (field case C12).
type echoFingerprint struct{ *idem.MemoryStore }

func (s *echoFingerprint) ClaimTx(ctx context.Context, tx *idem.MemoryTx, p *idemdriver.ClaimParams) (idemdriver.ClaimResult, error) {
	r, err := s.MemoryStore.ClaimTx(ctx, tx, p)
	if err == nil && !r.Claimed {
		r.Fingerprint = p.Fingerprint
	}
	return r, err
}

// shortFingerprint keeps only the first 32 bytes of a fingerprint.
type shortFingerprint struct{ *idem.MemoryStore }

func (s *shortFingerprint) ClaimTx(ctx context.Context, tx *idem.MemoryTx, p *idemdriver.ClaimParams) (idemdriver.ClaimResult, error) {
	q := *p
	q.Fingerprint = q.Fingerprint[:min(len(q.Fingerprint), 32)]
	r, err := s.MemoryStore.ClaimTx(ctx, tx, &q)
	if err == nil && !r.Claimed && len(p.Fingerprint) > 32 && string(r.Fingerprint) == string(p.Fingerprint[:32]) {
		r.Fingerprint = p.Fingerprint // "equal": the stored prefix matches
	}
	return r, err
}

// claimOutsideTx commits each claim at once in its own transaction, as a
// store that records the key before the handler's effects would: a failed
// handler leaves the key behind.
type claimOutsideTx struct{ *idem.MemoryStore }

func (s *claimOutsideTx) ClaimTx(ctx context.Context, _ *idem.MemoryTx, p *idemdriver.ClaimParams) (idemdriver.ClaimResult, error) {
	own, err := s.Begin(ctx)
	if err != nil {
		return idemdriver.ClaimResult{}, err
	}
	r, err := s.MemoryStore.ClaimTx(ctx, own, p)
	if err != nil {
		_ = s.Rollback(ctx, own)
		return r, err
	}
	return r, s.Commit(ctx, own)
}

// wallClockRuns reports the consumer as always running, as a store that
// counted retention by the wall clock would.
type wallClockRuns struct{ *idem.MemoryStore }

func (s *wallClockRuns) BeginPurge(ctx context.Context, p *idemdriver.BeginPurgeParams) (idemdriver.PurgeSession, error) {
	ps, err := s.MemoryStore.BeginPurge(ctx, p)
	if err != nil {
		return nil, err
	}
	return &fakeRuns{ps}, nil
}

type fakeRuns struct{ idemdriver.PurgeSession }

func (f *fakeRuns) Runs(context.Context) ([]idemdriver.Run, error) {
	now := time.Now()
	return []idemdriver.Run{{Start: now.Add(-100 * 365 * 24 * time.Hour), End: now}}, nil
}

// alwaysExtend extends the newest run whatever MaxGap says, so a restart
// after a downtime counts the downtime as running.
type alwaysExtend struct{ *idem.MemoryStore }

func (s *alwaysExtend) MarkRunning(ctx context.Context, p *idemdriver.MarkRunningParams) error {
	q := *p
	q.MaxGap = 100 * 365 * 24 * time.Hour
	return s.MemoryStore.MarkRunning(ctx, &q)
}

// unboundedPurge ignores the batch limit.
type unboundedPurge struct{ *idem.MemoryStore }

func (s *unboundedPurge) BeginPurge(ctx context.Context, p *idemdriver.BeginPurgeParams) (idemdriver.PurgeSession, error) {
	ps, err := s.MemoryStore.BeginPurge(ctx, p)
	if err != nil {
		return nil, err
	}
	return &unboundedSession{ps}, nil
}

type unboundedSession struct{ idemdriver.PurgeSession }

func (u *unboundedSession) DeleteBatch(ctx context.Context, p *idemdriver.PurgeBatchParams) (int64, error) {
	q := *p
	q.Limit = 1 << 30
	return u.PurgeSession.DeleteBatch(ctx, &q)
}

// purgeEveryone deletes the other consumers' records that the test bundle
// created too, as a DELETE that forgot its consumer condition would.
type purgeEveryone struct {
	*idem.MemoryStore
	mu   sync.Mutex
	seen map[string]bool
}

func (s *purgeEveryone) ClaimBatchTx(ctx context.Context, tx *idem.MemoryTx, p *idemdriver.ClaimBatchParams) ([]idemdriver.ClaimResult, error) {
	s.mu.Lock()
	if s.seen == nil {
		s.seen = map[string]bool{}
	}
	s.seen[p.Consumer] = true
	s.mu.Unlock()
	return s.MemoryStore.ClaimBatchTx(ctx, tx, p)
}

func (s *purgeEveryone) BeginPurge(ctx context.Context, p *idemdriver.BeginPurgeParams) (idemdriver.PurgeSession, error) {
	ps, err := s.MemoryStore.BeginPurge(ctx, p)
	if err != nil {
		return nil, err
	}
	return &everyoneSession{PurgeSession: ps, s: s, own: p.Consumer}, nil
}

type everyoneSession struct {
	idemdriver.PurgeSession
	s   *purgeEveryone
	own string
}

func (e *everyoneSession) DeleteBatch(ctx context.Context, p *idemdriver.PurgeBatchParams) (int64, error) {
	e.s.mu.Lock()
	var others []string
	for n := range e.s.seen {
		if n != e.own {
			others = append(others, n)
		}
	}
	e.s.mu.Unlock()
	for _, n := range others {
		if ps, err := e.s.MemoryStore.BeginPurge(ctx, &idemdriver.BeginPurgeParams{Consumer: n}); err == nil {
			_, _ = ps.DeleteBatch(ctx, p)
			_ = ps.Close(ctx)
		}
	}
	return e.PurgeSession.DeleteBatch(ctx, p)
}
