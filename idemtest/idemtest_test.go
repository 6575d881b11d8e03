package idemtest_test

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
	"github.com/idem-go/idem/internal/leakcheck"
)

func TestMain(m *testing.M) { os.Exit(leakcheck.Run(m)) }

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
	{"PurgesHalfTheWindow", "Purge/Window", "Purge/Window",
		func(s *idem.MemoryStore) idemdriver.TxStore[*idem.MemoryTx] {
			return &purgeWith{s, func(p *idem.PurgeParams) { p.RetentionWindow /= 2 }}
		}},
	{"PurgesUnbounded", "Purge/Window", "Purge/Window",
		func(s *idem.MemoryStore) idemdriver.TxStore[*idem.MemoryTx] {
			return &purgeWith{s, func(p *idem.PurgeParams) { p.BatchSize = 1 << 30 }}
		}},
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
		CountRecords: func(_ context.Context, consumer string) (int, error) { return store.CountRecords(consumer), nil },
		AgeRecords: func(_ context.Context, consumer string, ids []string, d time.Duration) error {
			store.AgeRecords(consumer, ids, d)
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

// purgeWith alters the purge parameters.
type purgeWith struct {
	*idem.MemoryStore
	f func(*idem.PurgeParams)
}

func (s *purgeWith) Purge(ctx context.Context, p *idem.PurgeParams) (idem.PurgeResult, error) {
	q := *p
	s.f(&q)
	return s.MemoryStore.Purge(ctx, &q)
}

// purgeEveryone purges the other consumers that the test bundle created,
// as a DELETE that forgot its consumer condition would.
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

func (s *purgeEveryone) Purge(ctx context.Context, p *idem.PurgeParams) (idem.PurgeResult, error) {
	s.mu.Lock()
	var names []string
	for n := range s.seen {
		names = append(names, n)
	}
	s.mu.Unlock()
	var total idem.PurgeResult
	for _, n := range names {
		q := *p
		q.Consumer = n
		r, err := s.MemoryStore.Purge(ctx, &q)
		if err != nil {
			return total, err
		}
		total.Deleted += r.Deleted
		total.Batches += r.Batches
		if n == p.Consumer {
			total.Horizon = r.Horizon
		}
	}
	return total, nil
}
