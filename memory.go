package idem

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// MemoryStore is an in-memory TxStore with the same semantics as the SQL
// stores, for tests and examples: claims made in a *MemoryTx become visible
// at Commit, a concurrent claim of the same key waits for the first
// transaction to end (as a unique index does), and Rollback forgets them.
// Side effects join the transaction through MemoryTx.OnCommit.
//
// It passes the idemtest conformance suite. Its records live as long as the
// value; it is not durable across restarts.
type MemoryStore struct {
	now func() time.Time

	mu      sync.Mutex
	records map[memKey]memRecord
	pending map[memKey]*MemoryTx // keys claimed by an open transaction
	purging map[string]bool      // consumers with a purge running
}

type memKey struct{ consumer, id string }

type memRecord struct {
	fingerprint []byte
	at          time.Time // written (and, in lease mode, last updated)

	// Lease mode; a zero state is a transactional-mode (completed) record.
	state       RecordState
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
	}
}

// OnCommit registers fn to run when tx commits, atomically with its claims
// (under the store's lock, so fn must not call the store). A rolled-back
// transaction never runs it. This is how tests and examples write a side
// effect in the same transaction as the claim.
func (tx *MemoryTx) OnCommit(fn func()) { tx.onCommit = append(tx.onCommit, fn) }

// Begin implements TxStore.
func (s *MemoryStore) Begin(ctx context.Context) (*MemoryTx, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return &MemoryTx{s: s, claims: map[memKey][]byte{}, done: make(chan struct{})}, nil
}

// ClaimTx implements TxStore.
func (s *MemoryStore) ClaimTx(ctx context.Context, tx *MemoryTx, p *ClaimParams) (ClaimResult, error) {
	res, err := s.ClaimBatchTx(ctx, tx, &ClaimBatchParams{
		Consumer: p.Consumer,
		Messages: []ClaimMessage{{MessageID: p.MessageID, Fingerprint: p.Fingerprint}},
	})
	if err != nil {
		return ClaimResult{}, err
	}
	return res[0], nil
}

// ClaimBatchTx implements TxStore. Like a SQL statement, it fails at once
// with ctx's error when ctx has already ended.
func (s *MemoryStore) ClaimBatchTx(ctx context.Context, tx *MemoryTx, p *ClaimBatchParams) ([]ClaimResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := make([]ClaimResult, len(p.Messages))
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
				out[i] = ClaimResult{Fingerprint: slices.Clone(fp), State: StateCompleted}
				break
			}
			if rec, ok := s.records[k]; ok {
				s.mu.Unlock()
				st := rec.state
				if st == 0 {
					st = StateCompleted // a transactional-mode record
				}
				out[i] = ClaimResult{Fingerprint: slices.Clone(rec.fingerprint), State: st}
				break
			}
			other, busy := s.pending[k]
			if !busy {
				s.pending[k] = tx
				tx.claims[k] = slices.Clone(m.Fingerprint)
				s.mu.Unlock()
				out[i] = ClaimResult{Claimed: true}
				break
			}
			s.mu.Unlock()
			// Wait for the other transaction, as a unique index would.
			select {
			case <-other.done:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
	return out, nil
}

// Commit implements TxStore.
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

// Rollback implements TxStore. Rolling back an ended transaction is a no-op.
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

// Purge implements TxStore. Only one purge per consumer runs at a time; a
// second gets ErrPurgeInProgress.
func (s *MemoryStore) Purge(ctx context.Context, p *PurgeParams) (PurgeResult, error) {
	if err := ValidatePurgeParams(p); err != nil {
		return PurgeResult{}, err
	}
	s.mu.Lock()
	if s.purging[p.Consumer] {
		s.mu.Unlock()
		return PurgeResult{}, ErrPurgeInProgress
	}
	s.purging[p.Consumer] = true
	var newest time.Time
	for k, r := range s.records {
		if k.consumer == p.Consumer && r.at.After(newest) {
			newest = r.at
		}
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.purging, p.Consumer)
		s.mu.Unlock()
	}()

	var res PurgeResult
	if newest.IsZero() {
		return res, nil
	}
	res.Horizon = newest.Add(-p.RetentionWindow)
	for {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		s.mu.Lock()
		n := 0
		for k, r := range s.records {
			if n == p.BatchSize && !p.DryRun {
				break
			}
			if k.consumer == p.Consumer && r.at.Before(res.Horizon) && r.state != StateInProgress {
				if !p.DryRun {
					delete(s.records, k)
				}
				n++
			}
		}
		s.mu.Unlock()
		res.Deleted += int64(n)
		if n > 0 {
			res.Batches++
			if p.OnBatch != nil {
				p.OnBatch(res.Deleted)
			}
		}
		if n < p.BatchSize || p.DryRun {
			return res, nil
		}
	}
}

// CountRecords returns the number of committed records of consumer. With
// AgeRecords it backs the idemtest Setup of the memory store, and lets tests
// and examples inspect the store.
func (s *MemoryStore) CountRecords(consumer string) int {
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

// AgeRecords is a test hook: it moves the recorded time of consumer's
// committed records with the given message IDs back by d, as if they had
// been written d earlier, and returns how many it moved. Records are
// otherwise stamped with the store's clock at commit; retention tests use
// this to build history without waiting. Production code has no use for it.
func (s *MemoryStore) AgeRecords(consumer string, ids []string, d time.Duration) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, id := range ids {
		k := memKey{consumer, id}
		if r, ok := s.records[k]; ok {
			r.at = r.at.Add(-d)
			s.records[k] = r
			n++
		}
	}
	return n
}

// ExpireLease is a test hook: it ends the lease of consumer's in_progress
// record id now, by the store's clock, as if it had run out, and reports
// whether there was such a record. The attempt that held the lease still
// owns the record (it may complete it) until another attempt takes over, as
// with a lease that expired on its own. The idemtest lease suite uses it to
// test expiry and takeover without waiting; production code has no use for it.
func (s *MemoryStore) ExpireLease(consumer, id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := memKey{consumer, id}
	r, ok := s.records[k]
	if !ok || r.state != StateInProgress {
		return false
	}
	if now := s.now(); r.leaseUntil.After(now) {
		r.leaseUntil = now
		s.records[k] = r
	}
	return true
}

// ValidatePurgeParams checks p as every store's Purge does: a valid consumer
// name, a retention window in 1ns..MaxRetentionWindow and a positive batch
// size. Errors match
// ErrInvalidConsumerName or ErrInvalidConfig. Store implementations call it.
func ValidatePurgeParams(p *PurgeParams) error {
	if err := ValidateConsumerName(p.Consumer); err != nil {
		return err
	}
	if p.RetentionWindow <= 0 || p.BatchSize <= 0 {
		return fmt.Errorf("%w: purge needs a positive RetentionWindow and BatchSize", ErrInvalidConfig)
	}
	if p.RetentionWindow > MaxRetentionWindow {
		return fmt.Errorf("%w: RetentionWindow %v is over MaxRetentionWindow (%v)", ErrInvalidConfig, p.RetentionWindow, MaxRetentionWindow)
	}
	return nil
}
