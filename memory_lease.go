package idem

import (
	"context"
	"maps"
	"slices"
	"time"
)

// MemoryStore implements LeaseStore too, with its clock as the lease clock.
// A consumer name should use one mode: a transactional claim sees any
// record, in progress or not, as a duplicate.
var _ LeaseStore = (*MemoryStore)(nil)

// Acquire implements LeaseStore.
func (s *MemoryStore) Acquire(ctx context.Context, p *AcquireParams) (AcquireResult, error) {
	if err := ctx.Err(); err != nil {
		return AcquireResult{}, err
	}
	if err := ValidateAcquireParams(p); err != nil {
		return AcquireResult{}, err
	}
	k := memKey{p.Consumer, p.MessageID}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, busy := s.pending[k]; busy {
		// A transactional claim in flight: the record does not exist yet
		// for anyone, but it is being processed.
		return AcquireResult{State: StateInProgress, Fingerprint: slices.Clone(p.Fingerprint), LeaseRemaining: minRetryAfter}, nil
	}
	now := s.now()
	r, ok := s.records[k]
	if !ok {
		s.records[k] = memRecord{
			fingerprint: slices.Clone(p.Fingerprint), at: now, state: StateInProgress,
			token: 1, attempt: 1, leaseUntil: now.Add(p.Lease),
		}
		return AcquireResult{Acquired: true, Token: 1, Attempt: 1, Steps: map[string][]byte{}}, nil
	}
	state := r.state
	if state == 0 {
		state = StateCompleted
	}
	if state == StateInProgress && !now.Before(r.leaseUntil) && string(r.fingerprint) == string(p.Fingerprint) {
		r.token++
		r.attempt++
		r.released = false
		r.leaseUntil = now.Add(p.Lease)
		r.at = now
		s.records[k] = r
		return AcquireResult{Acquired: true, Token: r.token, Attempt: r.attempt, Steps: cloneSteps(r.steps)}, nil
	}
	res := AcquireResult{
		State: state, Attempt: r.attempt, Fingerprint: slices.Clone(r.fingerprint),
		Result: slices.Clone(r.result), ContentType: r.contentType, Error: r.errText,
	}
	if state == StateInProgress && now.Before(r.leaseUntil) {
		res.LeaseRemaining = r.leaseUntil.Sub(now)
	}
	return res, nil
}

// owned returns the record k if token owns it: in progress, same token,
// and not released. An expired lease is still owned until a takeover.
func (s *MemoryStore) owned(k memKey, token int64) (memRecord, bool) {
	r, ok := s.records[k]
	return r, ok && r.state == StateInProgress && r.token == token && !r.released
}

// fenced runs update on the record (consumer, id) while token owns it,
// under the store's lock, and stores the result; ErrLeaseLost otherwise.
// Every lease-mode write after Acquire goes through it.
func (s *MemoryStore) fenced(ctx context.Context, consumer, id string, token int64, update func(r *memRecord, now time.Time)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	k := memKey{consumer, id}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.owned(k, token)
	if !ok {
		return ErrLeaseLost
	}
	update(&r, s.now())
	s.records[k] = r
	return nil
}

// Renew implements LeaseStore.
func (s *MemoryStore) Renew(ctx context.Context, p *RenewParams) error {
	return s.fenced(ctx, p.Consumer, p.MessageID, p.Token, func(r *memRecord, now time.Time) {
		r.leaseUntil = now.Add(p.Lease)
	})
}

// Complete implements LeaseStore.
func (s *MemoryStore) Complete(ctx context.Context, p *CompleteParams) error {
	return s.fenced(ctx, p.Consumer, p.MessageID, p.Token, func(r *memRecord, now time.Time) {
		r.state, r.result, r.contentType, r.at, r.leaseUntil = StateCompleted, slices.Clone(p.Result), p.ContentType, now, now
		if r.result == nil {
			r.result = []byte{}
		}
	})
}

// Release implements LeaseStore.
func (s *MemoryStore) Release(ctx context.Context, p *ReleaseParams) error {
	return s.fenced(ctx, p.Consumer, p.MessageID, p.Token, func(r *memRecord, now time.Time) {
		r.errText, r.at, r.leaseUntil, r.released = p.Error, now, now, true
		if p.Terminal {
			r.state = StateFailed
		}
	})
}

// SaveStep implements LeaseStore.
func (s *MemoryStore) SaveStep(ctx context.Context, p *StepParams) error {
	return s.fenced(ctx, p.Consumer, p.MessageID, p.Token, func(r *memRecord, _ time.Time) {
		if r.steps == nil {
			r.steps = map[string][]byte{}
		}
		if _, done := r.steps[p.Step]; !done {
			r.steps[p.Step] = append([]byte{}, p.Result...)
		}
	})
}

func cloneSteps(m map[string][]byte) map[string][]byte {
	out := maps.Clone(m)
	if out == nil {
		out = map[string][]byte{}
	}
	for k, v := range out {
		out[k] = slices.Clone(v)
	}
	return out
}
