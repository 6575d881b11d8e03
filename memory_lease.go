package idem

import (
	"context"
	"github.com/idem-go/idem/idemdriver"
	"maps"
	"slices"
	"time"
)

// MemoryStore implements idemdriver.LeaseStore too, with its clock as the lease clock.
// A consumer name should use one mode: a transactional claim sees any
// record, in progress or not, as a duplicate.
var _ idemdriver.StepRecorder = (*MemoryStore)(nil)

// RecordsSteps implements idemdriver.StepRecorder: Acquire and Release
// save the points of AcquireParams.StepPrefix and ReleaseParams.Step under
// the store's lock, with the acquisition or the release.
func (*MemoryStore) RecordsSteps() bool { return true }

// Acquire implements idemdriver.LeaseStore.
func (s *MemoryStore) Acquire(ctx context.Context, p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
	if err := ctx.Err(); err != nil {
		return idemdriver.AcquireResult{}, err
	}
	if err := idemdriver.ValidateAcquireParams(p); err != nil {
		return idemdriver.AcquireResult{}, err
	}
	k := memKey{p.Consumer, p.MessageID}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, busy := s.pending[k]; busy {
		// A transactional claim in flight: the record does not exist yet
		// for anyone, but it is being processed.
		return idemdriver.AcquireResult{State: idemdriver.StateInProgress, Fingerprint: slices.Clone(p.Fingerprint), LeaseRemaining: minRetryAfter}, nil
	}
	now := s.now()
	r, ok := s.records[k]
	if !ok {
		r := memRecord{
			fingerprint: slices.Clone(p.Fingerprint), at: now, state: idemdriver.StateInProgress,
			token: 1, attempt: 1, leaseUntil: now.Add(p.Lease),
		}
		r.saveStep(stepOf(p, 1))
		s.records[k] = r
		return idemdriver.AcquireResult{Acquired: true, Token: 1, Attempt: 1, Steps: map[string][]byte{}}, nil
	}
	state := r.state
	if state == 0 {
		state = idemdriver.StateCompleted
	}
	if state == idemdriver.StateInProgress && !now.Before(r.leaseUntil) && string(r.fingerprint) == string(p.Fingerprint) {
		r.token++
		r.attempt++
		r.released = false
		r.leaseUntil = now.Add(p.Lease)
		r.at = now
		steps := cloneSteps(r.steps)
		r.saveStep(stepOf(p, r.token))
		s.records[k] = r
		return idemdriver.AcquireResult{Acquired: true, Token: r.token, Attempt: r.attempt, Steps: steps}, nil
	}
	res := idemdriver.AcquireResult{
		State: state, Attempt: r.attempt, Fingerprint: slices.Clone(r.fingerprint),
		Result: slices.Clone(r.result), ContentType: r.contentType, Error: r.errText,
	}
	if state == idemdriver.StateInProgress && now.Before(r.leaseUntil) {
		res.LeaseRemaining = r.leaseUntil.Sub(now)
	}
	return res, nil
}

// owned returns the record k if token owns it: in progress, same token,
// and not released. An expired lease is still owned until a takeover.
func (s *MemoryStore) owned(k memKey, token int64) (memRecord, bool) {
	r, ok := s.records[k]
	return r, ok && r.state == idemdriver.StateInProgress && r.token == token && !r.released
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

// Renew implements idemdriver.LeaseStore.
func (s *MemoryStore) Renew(ctx context.Context, p *idemdriver.RenewParams) error {
	if err := idemdriver.ValidateRenewParams(p); err != nil {
		return err
	}
	return s.fenced(ctx, p.Consumer, p.MessageID, p.Token, func(r *memRecord, now time.Time) {
		r.leaseUntil = now.Add(p.Lease)
	})
}

// Complete implements idemdriver.LeaseStore.
func (s *MemoryStore) Complete(ctx context.Context, p *idemdriver.CompleteParams) error {
	if err := idemdriver.ValidateCompleteParams(p); err != nil {
		return err
	}
	return s.fenced(ctx, p.Consumer, p.MessageID, p.Token, func(r *memRecord, now time.Time) {
		r.state, r.result, r.contentType, r.at, r.leaseUntil = idemdriver.StateCompleted, slices.Clone(p.Result), p.ContentType, now, now
		if r.result == nil {
			r.result = []byte{}
		}
	})
}

// Release implements idemdriver.LeaseStore.
func (s *MemoryStore) Release(ctx context.Context, p *idemdriver.ReleaseParams) error {
	if err := idemdriver.ValidateReleaseParams(p); err != nil {
		return err
	}
	return s.fenced(ctx, p.Consumer, p.MessageID, p.Token, func(r *memRecord, now time.Time) {
		r.saveStep(p.Step, nil)
		r.errText, r.at, r.leaseUntil, r.released = p.Error, now, now, true
		if p.Terminal {
			r.state = idemdriver.StateFailed
		}
	})
}

// SaveStep implements idemdriver.LeaseStore.
func (s *MemoryStore) SaveStep(ctx context.Context, p *idemdriver.StepParams) error {
	if err := idemdriver.ValidateStepParams(p); err != nil {
		return err
	}
	return s.fenced(ctx, p.Consumer, p.MessageID, p.Token, func(r *memRecord, _ time.Time) {
		r.saveStep(p.Step, p.Result)
	})
}

// stepOf returns the name of the point p.StepPrefix asks for under
// token, and a nil result; "" when p names none.
func stepOf(p *idemdriver.AcquireParams, token int64) (string, []byte) {
	if p.StepPrefix == "" {
		return "", nil
	}
	return idemdriver.PrefixStep(p.StepPrefix, token), nil
}

// saveStep saves the step name (none when "") with a copy of result,
// unless it exists.
func (r *memRecord) saveStep(name string, result []byte) {
	if name == "" {
		return
	}
	if r.steps == nil {
		r.steps = map[string][]byte{}
	}
	if _, done := r.steps[name]; !done {
		r.steps[name] = append([]byte{}, result...)
	}
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
