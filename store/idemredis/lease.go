package idemredis

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem/idemdriver"
)

// ceilMillis converts a positive duration (a lease) to whole
// milliseconds, rounding up, so that a lease shorter than a millisecond is
// one millisecond: a lease stored as zero would have run out at once, and
// no lease may ever mean "no expiry".
func ceilMillis(d time.Duration) int64 {
	ms := int64(d / time.Millisecond)
	if d%time.Millisecond > 0 {
		ms++
	}
	return ms
}

// RecordsSteps implements [idemdriver.StepRecorder]: the scripts of
// Acquire and Release save the points of
// [idemdriver.AcquireParams].StepPrefix and [idemdriver.ReleaseParams].Step
// among the record's fields (in the steps hash beside a record written
// before layout 2), within the one script.
func (*Store) RecordsSteps() bool { return true }

// Acquire implements [idemdriver.LeaseStore]: one script that creates the
// record, takes over an in_progress record whose lease ended (expired or
// released) when the fingerprint matches, or reports the record as it is;
// with p.StepPrefix, the same script saves the acquiring attempt's point.
// Invalid parameters are refused before any command, with the errors of
// [idemdriver.ValidateAcquireParams] (a lease that is not positive matches
// [idemdriver.ErrInvalidConfig]); a lease is kept in whole milliseconds,
// rounded up.
func (s *Store) Acquire(ctx context.Context, p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
	var res idemdriver.AcquireResult
	if err := idemdriver.ValidateAcquireParams(p); err != nil {
		return res, err
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	f := getFrame()
	rk := f.buf()
	rk.b = s.appendRecordKey(rk.b, p.Consumer, p.MessageID, "")
	sk := f.buf()
	sk.b = append(append(sk.b, rk.b...), stepsSuffix...)
	v, err := s.eval(ctx, acquireEval, 2, rk, sk, f.bytes(p.Fingerprint), s.leaseArg(p.Lease), p.StepPrefix)
	f.release()
	return s.acquired(ctx, p, v, err)
}

// acquired reads the reply v of acquireScript for p, as acquireResult
// does, except after a lease issued by a write that WAIT reports short
// (err matching ErrNotReplicated): then the lease and its run point are
// given back (giveBack) and the error is returned, without the lease.
func (s *Store) acquired(ctx context.Context, p *idemdriver.AcquireParams, v any, err error) (idemdriver.AcquireResult, error) {
	if err != nil && errors.Is(err, ErrNotReplicated) {
		if res, rerr := acquireResult(v, nil); rerr == nil && res.Acquired {
			return idemdriver.AcquireResult{}, s.giveBack(ctx, p, res.Token, err)
		}
	}
	return acquireResult(v, err)
}

// giveBackTimeout bounds the give-back of a lease whose WAIT fell short;
// it runs even when the acquire's context has ended.
const giveBackTimeout = 5 * time.Second

// giveBack undoes what the acquire of p that issued token wrote, with
// giveBackScript (fenced by token, without WAIT), and returns notRepl (the
// acquire's ErrNotReplicated), joined with the give-back's own error when
// it failed: the lease then stays held until it runs out, and its run
// point stays, as before the give-back existed.
func (s *Store) giveBack(ctx context.Context, p *idemdriver.AcquireParams, token int64, notRepl error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), giveBackTimeout)
	defer cancel()
	rk, sk := s.recordAndStepsKeys(p.Consumer, p.MessageID)
	if err := giveBackScript.Run(ctx, s.client, []string{rk, sk}, token, p.StepPrefix).Err(); err != nil {
		return fmt.Errorf("idemredis: acquire: %w; the lease (token %d) could not be given back and is held until it runs out: %w", notRepl, token, err)
	}
	return fmt.Errorf("idemredis: acquire: %w; the lease (token %d) was given back", notRepl, token)
}

// acquireResult reads the reply of acquireScript.
func acquireResult(v any, err error) (idemdriver.AcquireResult, error) {
	var res idemdriver.AcquireResult
	if err != nil {
		return res, fmt.Errorf("idemredis: acquire: %w", err)
	}
	if n, ok := v.(int64); ok && n == 1 {
		// Created: token 1, attempt 1, no steps.
		res.Acquired, res.Token, res.Attempt = true, 1, 1
		return res, nil
	}
	r := reply{op: "acquire", v: v}
	if r.int(0) == 1 {
		res.Acquired = true
		res.Token = r.int(1)
		res.Attempt = int(r.int(2))
		res.Steps = r.steps(3)
		return res, r.err
	}
	res.State = idemdriver.RecordState(r.int(1))
	res.Attempt = int(r.int(2))
	res.Fingerprint = r.bytes(3)
	res.LeaseRemaining = time.Duration(r.int(4)) * time.Millisecond
	if res.State == idemdriver.StateCompleted {
		res.Result = r.bytes(5)
		res.ContentType = r.str(6)
	}
	res.Error = r.str(7)
	if r.err == nil && (res.State < idemdriver.StateInProgress || res.State > idemdriver.StateFailed) {
		r.err = fmt.Errorf("idemredis: acquire: record in unknown state %d", res.State)
	}
	return res, r.err
}

// Renew implements [idemdriver.LeaseStore]: the lease of the attempt holding
// p.Token ends p.Lease (rounded up to a millisecond) after the server's
// now. Invalid parameters are refused before any command, with the errors
// of [idemdriver.ValidateRenewParams].
func (s *Store) Renew(ctx context.Context, p *idemdriver.RenewParams) error {
	if err := idemdriver.ValidateRenewParams(p); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	rk := s.recordKey(p.Consumer, p.MessageID)
	v, err := s.run(ctx, renewScript, []string{rk}, p.Token, s.leaseArg(p.Lease)).Result()
	return s.fenced("renew", p.Consumer, p.MessageID, p.Token, v, err)
}

// Complete implements [idemdriver.LeaseStore]: a fenced script sets the
// record's state, result and content type field by field (the
// fingerprint, attempt count and recovery points stay) and the message is
// scored in the consumer's retention index. On a single Redis server (a
// *redis.Client, Sentinel's failover client included) both are one
// script, one round trip, which indexes only a completion that owned the
// record. Through a Redis Cluster client the index lives in another hash
// slot, so it is scored first, with a command of its own, then the record
// is completed: a completed record is therefore always in the index, and
// a Complete that fails after indexing leaves an entry that the purge
// skips while the record is in progress. A Complete repeated by the
// attempt that completed the record, with the same result and content
// type, succeeds and changes nothing: the reply of the one that landed
// was lost, and the core retries its final write after a store error. Any
// other Complete of a record no longer held fails with
// idemdriver.ErrLeaseLost. Invalid parameters are refused before any
// command, with the errors of [idemdriver.ValidateCompleteParams].
func (s *Store) Complete(ctx context.Context, p *idemdriver.CompleteParams) error {
	if err := idemdriver.ValidateCompleteParams(p); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.single {
		f := getFrame()
		rk := f.buf()
		rk.b = s.appendRecordKey(rk.b, p.Consumer, p.MessageID, "")
		v, err := s.eval(ctx, completeIndexEval, 2, rk, s.doneKeyArg(p.Consumer), p.Token, f.bytes(p.Result), f.str(p.ContentType), f.str(p.MessageID))
		f.release()
		return s.fenced("complete", p.Consumer, p.MessageID, p.Token, v, err)
	}
	rk := s.recordKey(p.Consumer, p.MessageID)
	if err := s.index(ctx, "complete", p.Consumer, p.MessageID); err != nil {
		return err
	}
	v, err := s.run(ctx, completeScript, []string{rk}, p.Token, p.Result, p.ContentType).Result()
	return s.fenced("complete", p.Consumer, p.MessageID, p.Token, v, err)
}

// Release implements [idemdriver.LeaseStore]: the lease ends now by the
// server's clock and p.Error is kept; with p.Terminal the record becomes
// failed, and is indexed for retention first, as in Complete; p.Step is
// saved by the same script. Invalid
// parameters are refused before any command, with the errors of
// [idemdriver.ValidateReleaseParams].
func (s *Store) Release(ctx context.Context, p *idemdriver.ReleaseParams) error {
	if err := idemdriver.ValidateReleaseParams(p); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	terminal := "0"
	if p.Terminal {
		terminal = "1"
		if err := s.index(ctx, "release", p.Consumer, p.MessageID); err != nil {
			return err
		}
	}
	rk, sk := s.recordAndStepsKeys(p.Consumer, p.MessageID)
	v, err := s.run(ctx, releaseScript, []string{rk, sk}, p.Token, p.Error, terminal, p.Step).Result()
	return s.fenced("release", p.Consumer, p.MessageID, p.Token, v, err)
}

// SaveStep implements [idemdriver.LeaseStore]: HSETNX on the record's steps
// hash, fenced by the token in the same script. Invalid parameters are
// refused before any command, with the errors of
// [idemdriver.ValidateStepParams].
func (s *Store) SaveStep(ctx context.Context, p *idemdriver.StepParams) error {
	if err := idemdriver.ValidateStepParams(p); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	rk, sk := s.recordAndStepsKeys(p.Consumer, p.MessageID)
	v, err := s.run(ctx, stepScript, []string{rk, sk}, p.Token, p.Step, p.Result).Result()
	return s.fenced("save step", p.Consumer, p.MessageID, p.Token, v, err)
}

// index scores id in consumer's retention index with the server's now.
func (s *Store) index(ctx context.Context, op, consumer, id string) error {
	if err := s.run(ctx, indexScript, []string{s.consumerKey(consumer, doneSuffix)}, id).Err(); err != nil {
		return fmt.Errorf("idemredis: %s: retention index: %w", op, err)
	}
	return nil
}

// fenced turns the reply of a fenced script into nil, an error matching
// idemdriver.ErrLeaseLost that says why, or a store error.
func (s *Store) fenced(op, consumer, id string, token int64, v any, err error) error {
	if err != nil {
		return fmt.Errorf("idemredis: %s: %w", op, err)
	}
	if n, ok := v.(int64); ok && n == 1 {
		return nil // complete's reply
	}
	r := reply{op: op, v: v}
	if r.int(0) == 1 {
		return r.err
	}
	state, current, released := idemdriver.RecordState(r.int(1)), r.int(2), r.int(3) == 1
	if r.err != nil {
		return r.err
	}
	var why string
	switch {
	case state == 0:
		why = "the record no longer exists"
	case state != idemdriver.StateInProgress:
		why = "the record is " + state.String()
	case current != token:
		why = fmt.Sprintf("attempt with token %d took over", current)
	case released:
		why = "the attempt was released"
	}
	return fmt.Errorf("%w: idemredis: %s of message %q (consumer %q) with token %d: %s",
		idemdriver.ErrLeaseLost, op, id, consumer, token, why)
}

// reply reads a script's array reply; the first malformed element sets
// err, after which every accessor returns a zero value.
type reply struct {
	op  string
	v   any
	err error
}

func (r *reply) elem(i int) any {
	if r.err != nil {
		return nil
	}
	a, ok := r.v.([]any)
	if !ok || i >= len(a) {
		r.err = fmt.Errorf("idemredis: %s: malformed script reply %T (want an array with element %d)", r.op, r.v, i)
		return nil
	}
	return a[i]
}

func (r *reply) int(i int) int64 {
	e := r.elem(i)
	if r.err != nil {
		return 0
	}
	n, ok := e.(int64)
	if !ok {
		r.err = fmt.Errorf("idemredis: %s: malformed script reply: element %d is %T, want an integer", r.op, i, e)
	}
	return n
}

func (r *reply) str(i int) string {
	e := r.elem(i)
	if r.err != nil {
		return ""
	}
	s, ok := e.(string)
	if !ok {
		r.err = fmt.Errorf("idemredis: %s: malformed script reply: element %d is %T, want a string", r.op, i, e)
	}
	return s
}

// bytes returns element i as a new, non-nil byte slice.
func (r *reply) bytes(i int) []byte {
	s := r.str(i)
	if r.err != nil {
		return nil
	}
	return []byte(s)
}

// steps reads element i, a flattened HGETALL (name, result, ...).
func (r *reply) steps(i int) map[string][]byte {
	e := r.elem(i)
	if r.err != nil {
		return nil
	}
	a, ok := e.([]any)
	if !ok || len(a)%2 != 0 {
		r.err = fmt.Errorf("idemredis: %s: malformed script reply: element %d is %T, want name/result pairs", r.op, i, e)
		return nil
	}
	if len(a) == 0 {
		return nil // no recovery points: no map
	}
	steps := make(map[string][]byte, len(a)/2)
	for j := 0; j < len(a); j += 2 {
		name, ok1 := a[j].(string)
		res, ok2 := a[j+1].(string)
		if !ok1 || !ok2 {
			r.err = fmt.Errorf("idemredis: %s: malformed script reply: step %d is %T/%T, want strings", r.op, j/2, a[j], a[j+1])
			return steps
		}
		steps[name] = []byte(res)
	}
	return steps
}
