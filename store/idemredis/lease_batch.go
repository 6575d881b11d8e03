package idemredis

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/idemdriver"
)

var _ idemdriver.LeaseBatcher = (*Store)(nil)

// AcquireBatch implements [idemdriver.LeaseBatcher]: the script of Acquire
// for each element, sent in one pipeline (one round trip per server; a
// Cluster client splits it by node), each script atomic on its own and
// run in the order given; through a Cluster client with
// Config.WaitReplicas, one script and its WAIT per element, in order (a
// WAIT must follow the writes of its own master's connection). An element
// whose lease WAIT reports short is given back, as in Acquire. A script
// the server does not know yet is run again on its own. Every error, the network's included, is an element's
// (errs); err is only that of an ended ctx or a batch over
// idemdriver.MaxLeaseBatch.
func (s *Store) AcquireBatch(ctx context.Context, ps []*idemdriver.AcquireParams) ([]idemdriver.AcquireResult, []error, error) {
	if err := idemdriver.ValidateBatchSize(len(ps)); err != nil {
		return nil, nil, err
	}
	if err := ctx.Err(); err != nil || len(ps) == 0 {
		return nil, nil, err
	}
	res := make([]idemdriver.AcquireResult, len(ps))
	errs := s.pipeline(ctx, acquireScript, len(ps), func(i int) ([]string, []any, error) {
		p := ps[i]
		if err := idemdriver.ValidateAcquireParams(p); err != nil {
			return nil, nil, err
		}
		rk, sk := s.recordAndStepsKeys(p.Consumer, p.MessageID)
		return []string{rk, sk}, []any{p.Fingerprint, s.leaseArg(p.Lease), p.StepPrefix}, nil
	}, func(i int, v any, err error) error {
		res[i], err = s.acquired(ctx, ps[i], v, err)
		return err
	})
	return res, errs, nil
}

// CompleteBatch implements [idemdriver.LeaseBatcher]. On a single server
// the fenced script of Complete (with its retention index) for each
// element goes in one pipeline, as in AcquireBatch; through a Cluster
// client, whose Complete indexes first with a command of its own, it is
// one Complete per element, in order. Every error is an element's.
func (s *Store) CompleteBatch(ctx context.Context, ps []*idemdriver.CompleteParams) ([]error, error) {
	if err := idemdriver.ValidateBatchSize(len(ps)); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil || len(ps) == 0 {
		return nil, err
	}
	if !s.single {
		errs := make([]error, len(ps))
		for i, p := range ps {
			errs[i] = s.Complete(ctx, p)
		}
		return errs, nil
	}
	return s.pipeline(ctx, completeIndexScript, len(ps), func(i int) ([]string, []any, error) {
		p := ps[i]
		if err := idemdriver.ValidateCompleteParams(p); err != nil {
			return nil, nil, err
		}
		return []string{s.recordKey(p.Consumer, p.MessageID), s.consumerKey(p.Consumer, doneSuffix)},
			[]any{p.Token, p.Result, p.ContentType, p.MessageID}, nil
	}, func(i int, v any, err error) error {
		p := ps[i]
		return s.fenced("complete", p.Consumer, p.MessageID, p.Token, v, err)
	}), nil
}

// pipeline runs script for elements 0..n-1 in one pipeline: args gives an
// element's keys and arguments (or its error, and the element is left
// out), and read turns its reply into its error. An element whose script
// the server did not know is run again on its own.
func (s *Store) pipeline(ctx context.Context, script *redis.Script, n int,
	args func(i int) ([]string, []any, error), read func(i int, v any, err error) error) []error {
	errs := make([]error, n)
	if s.cluster != nil && s.wait > 0 {
		for i := range n {
			keys, a, err := args(i)
			if errs[i] = err; err == nil {
				v, err := s.run(ctx, script, keys, a...).Result()
				errs[i] = read(i, v, err)
			}
		}
		return errs
	}
	cmds := make([]*redis.Cmd, n)
	var wait *redis.Cmd
	_, _ = s.client.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for i := range n {
			keys, a, err := args(i)
			if errs[i] = err; err == nil {
				cmds[i] = script.EvalSha(ctx, pl, keys, a...)
			}
		}
		if s.wait > 0 {
			// One WAIT after every write of the pipeline's connection.
			wait = pl.Do(ctx, "WAIT", s.wait, s.waitMS)
		}
		return nil
	})
	var waitErr error
	if wait != nil {
		waitErr = s.waited(wait)
	}
	for i, c := range cmds {
		if c == nil {
			continue
		}
		v, err := c.Result()
		if redis.HasErrorPrefix(err, "NOSCRIPT") {
			keys, a, _ := args(i)
			v, err = s.run(ctx, script, keys, a...).Result()
		} else if err == nil && waitErr != nil {
			err = waitErr
		}
		errs[i] = read(i, v, err)
	}
	return errs
}
