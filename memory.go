package idem

import (
	"context"
	"errors"
	"fmt"
	"github.com/idem-go/idem/idemdriver"
	"slices"
	"sync"
	"time"
)

// MemoryStore is an in-memory idemdriver.TxStore with the same semantics as the SQL
// stores, for tests and examples: claims made in a *MemoryTx become visible
// at Commit, a concurrent claim of the same key waits for the first
// transaction to end (as a unique index does), and Rollback forgets them.
// Side effects join the transaction through MemoryTx.OnCommit.
//
// It passes the idemtest conformance suites, the outbox's included (see
// EmitTx: outgoing rows join the outbox at Commit). Its records live as
// long as the value; it is not durable across restarts.
type MemoryStore struct {
	now func() time.Time

	mu      sync.Mutex
	records map[memKey]memRecord
	pending map[memKey]*MemoryTx // keys claimed by an open transaction
	purging map[string]bool      // consumers with a purge session open
	runs    map[string][]idemdriver.Run

	outbox memOutbox // the outbox table (memory_outbox.go)
}

type memKey struct{ consumer, id string }

type memRecord struct {
	fingerprint []byte
	at          time.Time // written (and, in lease mode, last updated)

	// Lease mode; a zero state is a transactional-mode (completed) record.
	state       idemdriver.RecordState
	token       int64
	attempt     int
	leaseUntil  time.Time
	result      []byte
	contentType string
	errText     string
	steps       map[string][]byte
	// released: the attempt holding token ended with Release, so the token
	// no longer owns the record although no other attempt has taken over.
	released bool
}

// MemoryTx is a transaction of a MemoryStore. It is used by one goroutine.
type MemoryTx struct {
	s        *MemoryStore
	claims   map[memKey][]byte
	onCommit []func()
	done     chan struct{} // closed when the transaction ends
	ended    bool
}

// ErrTxDone is returned by MemoryStore when a MemoryTx is used after Commit
// or Rollback.
var ErrTxDone = errors.New("idem: transaction already committed or rolled back")

// NewMemoryStore returns an empty MemoryStore. now is its clock, used for the
// record times that purging compares; nil means time.Now.
func NewMemoryStore(now func() time.Time) *MemoryStore {
	if now == nil {
		now = time.Now
	}
	return &MemoryStore{
		now:     now,
		records: map[memKey]memRecord{},
		pending: map[memKey]*MemoryTx{},
		purging: map[string]bool{},
		runs:    map[string][]idemdriver.Run{},
	}
}

// OnCommit registers fn to run when tx commits, atomically with its claims
// (under the store's lock, so fn must not call the store). A rolled-back
// transaction never runs it. This is how tests and examples write a side
// effect in the same transaction as the claim.
func (tx *MemoryTx) OnCommit(fn func()) { tx.onCommit = append(tx.onCommit, fn) }

// Begin implements idemdriver.TxStore.
func (s *MemoryStore) Begin(ctx context.Context) (*MemoryTx, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return &MemoryTx{s: s, claims: map[memKey][]byte{}, done: make(chan struct{})}, nil
}

// ClaimTx implements idemdriver.TxStore.
func (s *MemoryStore) ClaimTx(ctx context.Context, tx *MemoryTx, p *idemdriver.ClaimParams) (idemdriver.ClaimResult, error) {
	if err := idemdriver.ValidateClaimParams(p); err != nil {
		return idemdriver.ClaimResult{}, err
	}
	res, err := s.ClaimBatchTx(ctx, tx, &idemdriver.ClaimBatchParams{
		Consumer: p.Consumer,
		Messages: []idemdriver.ClaimMessage{{MessageID: p.MessageID, Fingerprint: p.Fingerprint}},
	})
	if err != nil {
		return idemdriver.ClaimResult{}, err
	}
	return res[0], nil
}

// ClaimBatchTx implements idemdriver.BatchClaimer. Like a SQL statement, it fails at once
// with ctx's error when ctx has already ended.
func (s *MemoryStore) ClaimBatchTx(ctx context.Context, tx *MemoryTx, p *idemdriver.ClaimBatchParams) ([]idemdriver.ClaimResult, error) {
	if err := idemdriver.ValidateClaimBatchParams(p); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := make([]idemdriver.ClaimResult, len(p.Messages))
	for i, m := range p.Messages {
		k := memKey{p.Consumer, m.MessageID}
		for {
			s.mu.Lock()
			if tx.ended {
				s.mu.Unlock()
				return nil, ErrTxDone
			}
			if fp, ok := tx.claims[k]; ok {
				s.mu.Unlock()
				out[i] = idemdriver.ClaimResult{Fingerprint: slices.Clone(fp), State: idemdriver.StateCompleted}
				break
			}
			if rec, ok := s.records[k]; ok {
				s.mu.Unlock()
				st := rec.state
				if st == 0 {
					st = idemdriver.StateCompleted // a transactional-mode record
				}
				out[i] = idemdriver.ClaimResult{Fingerprint: slices.Clone(rec.fingerprint), State: st}
				break
			}
			other, busy := s.pending[k]
			if !busy {
				s.pending[k] = tx
				tx.claims[k] = slices.Clone(m.Fingerprint)
				s.mu.Unlock()
				out[i] = idemdriver.ClaimResult{Claimed: true}
				break
			}
			s.mu.Unlock()
			// Wait for the other transaction, as a unique index would, for
			// at most the lock timeout.
			if err := waitTx(ctx, other, p.LockTimeout); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// waitTx waits for tx to end, for at most lockTimeout when it is
// positive (then an error matching idemdriver.ErrLockTimeout), or until
// ctx ends.
func waitTx(ctx context.Context, tx *MemoryTx, lockTimeout time.Duration) error {
	var timeout <-chan time.Time
	if lockTimeout > 0 {
		tm := time.NewTimer(lockTimeout)
		defer tm.Stop()
		timeout = tm.C
	}
	select {
	case <-tx.done:
		return nil
	case <-timeout:
		return fmt.Errorf("%w: waited %v for another transaction holding the record", idemdriver.ErrLockTimeout, lockTimeout)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Commit implements idemdriver.TxStore.
func (s *MemoryStore) Commit(ctx context.Context, tx *MemoryTx) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if tx.ended {
		return ErrTxDone
	}
	now := s.now()
	for k, fp := range tx.claims {
		s.records[k] = memRecord{fingerprint: fp, at: now}
	}
	for _, fn := range tx.onCommit {
		fn()
	}
	s.endLocked(tx)
	return nil
}

// Rollback implements idemdriver.TxStore. Rolling back an ended transaction is a no-op.
func (s *MemoryStore) Rollback(ctx context.Context, tx *MemoryTx) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !tx.ended {
		s.endLocked(tx)
	}
	return nil
}

func (s *MemoryStore) endLocked(tx *MemoryTx) {
	for k := range tx.claims {
		delete(s.pending, k)
	}
	tx.ended = true
	close(tx.done)
}

// MarkRunning implements idemdriver.Retainer, by the store's clock.
func (s *MemoryStore) MarkRunning(ctx context.Context, p *idemdriver.MarkRunningParams) error {
	if err := idemdriver.ValidateMarkRunningParams(p); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	runs := s.runs[p.Consumer]
	if n := len(runs); n > 0 && p.MaxGap > 0 && !now.After(runs[n-1].End.Add(p.MaxGap)) {
		if now.After(runs[n-1].End) {
			runs[n-1].End = now
		}
		return nil
	}
	s.runs[p.Consumer] = append(runs, idemdriver.Run{Start: now, End: now})
	return nil
}

// BeginPurge implements idemdriver.Retainer. One purge session per
// consumer is open at a time; a second gets ErrPurgeInProgress.
func (s *MemoryStore) BeginPurge(ctx context.Context, p *idemdriver.BeginPurgeParams) (idemdriver.PurgeSession, error) {
	if err := idemdriver.ValidateBeginPurgeParams(p); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.purging[p.Consumer] {
		return nil, ErrPurgeInProgress
	}
	s.purging[p.Consumer] = true
	return &memPurge{s: s, consumer: p.Consumer}, nil
}

// memPurge is a MemoryStore's purge session.
type memPurge struct {
	s        *MemoryStore
	consumer string
	closed   bool
}

func (m *memPurge) Runs(ctx context.Context) ([]idemdriver.Run, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.s.mu.Lock()
	defer m.s.mu.Unlock()
	return slices.Clone(m.s.runs[m.consumer]), nil
}

func (m *memPurge) CountBefore(ctx context.Context, horizon time.Time) (int64, error) {
	if err := idemdriver.ValidateHorizon(horizon); err != nil {
		return 0, err
	}
	return m.sweep(ctx, horizon, -1)
}

func (m *memPurge) DeleteBatch(ctx context.Context, p *idemdriver.PurgeBatchParams) (int64, error) {
	if err := idemdriver.ValidatePurgeBatchParams(p); err != nil {
		return 0, err
	}
	return m.sweep(ctx, p.Horizon, p.Limit)
}

// sweep deletes up to limit of the consumer's settled records written
// before horizon, oldest first, or with a negative limit counts them all.
func (m *memPurge) sweep(ctx context.Context, horizon time.Time, limit int) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	m.s.mu.Lock()
	defer m.s.mu.Unlock()
	var due []memKey
	for k, r := range m.s.records {
		if k.consumer == m.consumer && r.at.Before(horizon) && r.state != idemdriver.StateInProgress {
			due = append(due, k)
		}
	}
	if limit < 0 {
		return int64(len(due)), nil
	}
	slices.SortFunc(due, func(a, b memKey) int { return m.s.records[a].at.Compare(m.s.records[b].at) })
	due = due[:min(limit, len(due))]
	for _, k := range due {
		delete(m.s.records, k)
	}
	return int64(len(due)), nil
}

func (m *memPurge) PruneRuns(ctx context.Context, t time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.s.mu.Lock()
	defer m.s.mu.Unlock()
	m.s.runs[m.consumer] = slices.DeleteFunc(m.s.runs[m.consumer], func(r idemdriver.Run) bool { return r.End.Before(t) })
	return nil
}

func (m *memPurge) Close(context.Context) error {
	m.s.mu.Lock()
	defer m.s.mu.Unlock()
	if !m.closed {
		m.closed = true
		delete(m.s.purging, m.consumer)
	}
	return nil
}

// shift moves every time recorded for consumer (its records, their leases
// and its runs) back by d, as if all of it had happened d earlier and the
// consumer had not run since: the memory store's idemtest Setup.
func (s *MemoryStore) shift(consumer string, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, r := range s.records {
		if k.consumer == consumer {
			r.at = r.at.Add(-d)
			if !r.leaseUntil.IsZero() {
				r.leaseUntil = r.leaseUntil.Add(-d)
			}
			s.records[k] = r
		}
	}
	for i := range s.runs[consumer] {
		s.runs[consumer][i].Start = s.runs[consumer][i].Start.Add(-d)
		s.runs[consumer][i].End = s.runs[consumer][i].End.Add(-d)
	}
}

// countRecords returns the number of committed records of consumer, for
// the memory store's idemtest Setup.
func (s *MemoryStore) countRecords(consumer string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k := range s.records {
		if k.consumer == consumer {
			n++
		}
	}
	return n
}

// expireLease ends the lease of consumer's in_progress record id now, by
// the store's clock, as if it had run out, and reports whether there was
// such a record: the memory store's idemtest LeaseSetup.
func (s *MemoryStore) expireLease(consumer, id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := memKey{consumer, id}
	r, ok := s.records[k]
	if !ok || r.state != idemdriver.StateInProgress {
		return false
	}
	if now := s.now(); r.leaseUntil.After(now) {
		r.leaseUntil = now
		s.records[k] = r
	}
	return true
}
