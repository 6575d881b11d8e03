package idem_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemtest"
)

// leaseMutant is a deliberately broken lease store: a decorator over the
// memory store (on the real clock) with one classic lease bug. RunLease
// must fail against each, in the case named by wantFail.
type leaseMutant struct {
	name     string
	wantFail string // Group/Case of RunLease that must fail
	wrap     func(*idem.MemoryStore) idemdriver.LeaseStore
}

var leaseMutants = []leaseMutant{
	{"LeaseInSeconds", "Expiry/TimeUnits",
		func(s *idem.MemoryStore) idemdriver.LeaseStore { return &secondsLease{s} }},
	{"IgnoresFencingToken", "Expiry/TakeoverFencesStaleOwner",
		func(s *idem.MemoryStore) idemdriver.LeaseStore { return &latestToken{MemoryStore: s} }},
	{"IgnoresLiveLease", "Process/ConcurrentSameMessage",
		func(s *idem.MemoryStore) idemdriver.LeaseStore { return &alwaysExpired{s} }},
	{"RenewDoesNothing", "Expiry/RenewalKeepsClaim",
		func(s *idem.MemoryStore) idemdriver.LeaseStore { return &noRenew{s} }},
	{"ReleaseForgetsAttempts", "Failure/PoisonAfterMaxAttempts",
		func(s *idem.MemoryStore) idemdriver.LeaseStore { return &forgetfulRelease{MemoryStore: s} }},
	{"EchoesFingerprint", "Fingerprint/MismatchOnEveryPath",
		func(s *idem.MemoryStore) idemdriver.LeaseStore { return &echoLeaseFingerprint{s} }},
	{"TruncatesResults", "Process/ClaimCompleteReplay", // a 64 KiB BLOB column
		func(s *idem.MemoryStore) idemdriver.LeaseStore { return &truncatedResults{s} }},
	{"IgnoresStepPrefix", "Steps/AcquireSavesRunPoint",
		func(s *idem.MemoryStore) idemdriver.LeaseStore { return &ignoresStepPrefix{s} }},
	{"ReportsOwnRunPoint", "Steps/AcquireSavesRunPoint",
		func(s *idem.MemoryStore) idemdriver.LeaseStore { return &ownRunPoint{s} }},
}

// ignoresStepPrefix says it records steps but drops AcquireParams.StepPrefix,
// as a store that claims the capability without the work would.
type ignoresStepPrefix struct{ *idem.MemoryStore }

func (s *ignoresStepPrefix) Acquire(ctx context.Context, p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
	q := *p
	q.StepPrefix = ""
	return s.MemoryStore.Acquire(ctx, &q)
}

// ownRunPoint reports the acquiring attempt's own point among its Steps,
// as a store that read them after saving it would.
type ownRunPoint struct{ *idem.MemoryStore }

func (s *ownRunPoint) Acquire(ctx context.Context, p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
	res, err := s.MemoryStore.Acquire(ctx, p)
	if err == nil && res.Acquired && p.StepPrefix != "" {
		res.Steps[idemdriver.PrefixStep(p.StepPrefix, res.Token)] = []byte{}
	}
	return res, err
}

// TestSuiteCatchesBrokenLeaseStores runs RunLease against each lease
// mutant in a child process and requires the expected case to fail.
func TestSuiteCatchesBrokenLeaseStores(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs the suite in child processes")
	}
	for _, m := range leaseMutants {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			wantChildFails(t, "TestLeaseMutant", "IDEMTEST_LEASE_MUTANT", m.name, m.wantFail, m.wantFail)
		})
	}
}

// TestLeaseMutant runs RunLease against the mutant named by
// IDEMTEST_LEASE_MUTANT; TestSuiteCatchesBrokenLeaseStores starts it.
func TestLeaseMutant(t *testing.T) {
	name := os.Getenv("IDEMTEST_LEASE_MUTANT")
	if name == "" {
		t.Skip("run by TestSuiteCatchesBrokenLeaseStores")
	}
	var m *leaseMutant
	for i := range leaseMutants {
		if leaseMutants[i].name == name {
			m = &leaseMutants[i]
		}
	}
	if m == nil {
		t.Fatalf("unknown lease mutant %q", name)
	}
	idemtest.RunLease(t, idemtest.LeaseHarness{New: func(t *testing.T) *idemtest.LeaseSetup {
		store := idem.NewMemoryStore(nil)
		return &idemtest.LeaseSetup{
			Store: m.wrap(store),
			ExpireLease: func(_ context.Context, consumer, id string) error {
				if !idem.ExpireLease(store, consumer, id) {
					return fmt.Errorf("no in_progress record %q of consumer %q", id, consumer)
				}
				return nil
			},
			CountRecords: func(_ context.Context, consumer string) (int, error) { return idem.CountRecords(store, consumer), nil },
			Shift: func(_ context.Context, consumer string, d time.Duration) error {
				idem.Shift(store, consumer, d)
				return nil
			},
		}
	}})
}

// secondsLease mixes units: it takes the lease's milliseconds for seconds.
type secondsLease struct{ *idem.MemoryStore }

func (s *secondsLease) Acquire(ctx context.Context, p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
	q := *p
	q.Lease = time.Duration(p.Lease.Milliseconds()) * time.Second
	return s.MemoryStore.Acquire(ctx, &q)
}

// latestToken completes, renews, releases and saves steps for whichever
// attempt holds the record now, whatever token the caller holds: no
// fencing.
type latestToken struct {
	*idem.MemoryStore
	mu     sync.Mutex
	tokens map[string]int64
}

func (s *latestToken) Acquire(ctx context.Context, p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
	res, err := s.MemoryStore.Acquire(ctx, p)
	if err == nil && res.Acquired {
		s.mu.Lock()
		if s.tokens == nil {
			s.tokens = map[string]int64{}
		}
		s.tokens[p.Consumer+"\x00"+p.MessageID] = res.Token
		s.mu.Unlock()
	}
	return res, err
}

func (s *latestToken) latest(consumer, id string, token int64) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.tokens[consumer+"\x00"+id]; ok {
		return t
	}
	return token
}

func (s *latestToken) Complete(ctx context.Context, p *idemdriver.CompleteParams) error {
	q := *p
	q.Token = s.latest(p.Consumer, p.MessageID, p.Token)
	return s.MemoryStore.Complete(ctx, &q)
}

func (s *latestToken) Renew(ctx context.Context, p *idemdriver.RenewParams) error {
	q := *p
	q.Token = s.latest(p.Consumer, p.MessageID, p.Token)
	return s.MemoryStore.Renew(ctx, &q)
}

// RenewsBatches is false: the scheduler sends its renewals one by one,
// through Renew above, not through the memory store's RenewBatch.
func (s *latestToken) RenewsBatches() bool { return false }

func (s *latestToken) Release(ctx context.Context, p *idemdriver.ReleaseParams) error {
	q := *p
	q.Token = s.latest(p.Consumer, p.MessageID, p.Token)
	return s.MemoryStore.Release(ctx, &q)
}

func (s *latestToken) SaveStep(ctx context.Context, p *idemdriver.StepParams) error {
	q := *p
	q.Token = s.latest(p.Consumer, p.MessageID, p.Token)
	return s.MemoryStore.SaveStep(ctx, &q)
}

// alwaysExpired treats every lease as run out: a claim that checks for a
// record but not for a live lease on it.
type alwaysExpired struct{ *idem.MemoryStore }

func (s *alwaysExpired) Acquire(ctx context.Context, p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
	idem.ExpireLease(s.MemoryStore, p.Consumer, p.MessageID)
	return s.MemoryStore.Acquire(ctx, p)
}

// AcquireBatch acquires element by element through Acquire: the
// LeaseConsumer coalesces concurrent acquires into batches, and the memory
// store's own batch path, which honours live leases, let the copies of
// ConcurrentSameMessage in a batch pass (the mutant went uncaught in 12 of
// 200 runs).
func (s *alwaysExpired) AcquireBatch(ctx context.Context, ps []*idemdriver.AcquireParams) ([]idemdriver.AcquireResult, []error, error) {
	res, errs := make([]idemdriver.AcquireResult, len(ps)), make([]error, len(ps))
	for i, p := range ps {
		res[i], errs[i] = s.Acquire(ctx, p)
	}
	return res, errs, nil
}

// noRenew reports renewals it never makes.
type noRenew struct{ *idem.MemoryStore }

func (s *noRenew) Renew(ctx context.Context, p *idemdriver.RenewParams) error { return ctx.Err() }

// forgetfulRelease loses the attempt count and the recovery points on a
// release, as a store that deletes the record would.
type forgetfulRelease struct {
	*idem.MemoryStore
	mu       sync.Mutex
	released map[string]bool
}

// RenewsBatches is false: the scheduler sends its renewals one by one,
// through Renew above, not through the memory store's RenewBatch.
func (s *noRenew) RenewsBatches() bool { return false }

func (s *forgetfulRelease) Release(ctx context.Context, p *idemdriver.ReleaseParams) error {
	err := s.MemoryStore.Release(ctx, p)
	if err == nil && !p.Terminal {
		s.mu.Lock()
		if s.released == nil {
			s.released = map[string]bool{}
		}
		s.released[p.Consumer+"\x00"+p.MessageID] = true
		s.mu.Unlock()
	}
	return err
}

func (s *forgetfulRelease) Acquire(ctx context.Context, p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
	res, err := s.MemoryStore.Acquire(ctx, p)
	s.mu.Lock()
	defer s.mu.Unlock()
	if k := p.Consumer + "\x00" + p.MessageID; err == nil && res.Acquired && s.released[k] {
		delete(s.released, k)
		res.Attempt, res.Steps = 1, map[string][]byte{}
	}
	return res, err
}

// echoLeaseFingerprint reports the caller's fingerprint for an existing
// record instead of the stored one.
type echoLeaseFingerprint struct{ *idem.MemoryStore }

func (s *echoLeaseFingerprint) Acquire(ctx context.Context, p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
	res, err := s.MemoryStore.Acquire(ctx, p)
	if err == nil && !res.Acquired {
		res.Fingerprint = p.Fingerprint
	}
	return res, err
}

// truncatedResults keeps the first 65535 bytes of a result, as a MariaDB
// BLOB column (rather than a LONGBLOB) would.
type truncatedResults struct{ *idem.MemoryStore }

func (s *truncatedResults) Complete(ctx context.Context, p *idemdriver.CompleteParams) error {
	q := *p
	q.Result = q.Result[:min(len(q.Result), 65535)]
	return s.MemoryStore.Complete(ctx, &q)
}
