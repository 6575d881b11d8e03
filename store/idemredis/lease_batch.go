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
	errs := s.pipeline(ctx, acquireScript, len(ps), 2, 3, func(i int, w []any) error {
		p := ps[i]
		if err := idemdriver.ValidateAcquireParams(p); err != nil {
			return err
		}
		rk, sk := s.recordAndStepsKeys(p.Consumer, p.MessageID)
		w[0], w[1], w[2], w[3], w[4] = rk, sk, p.Fingerprint, s.leaseArg(p.Lease), p.StepPrefix
		return nil
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
	return s.pipeline(ctx, completeIndexScript, len(ps), 2, 4, func(i int, w []any) error {
		p := ps[i]
		if err := idemdriver.ValidateCompleteParams(p); err != nil {
			return err
		}
		w[0], w[1] = s.recordKey(p.Consumer, p.MessageID), s.consumerKey(p.Consumer, doneSuffix)
		w[2], w[3], w[4], w[5] = p.Token, p.Result, p.ContentType, p.MessageID
		return nil
	}, func(i int, v any, err error) error {
		p := ps[i]
		return s.fenced("complete", p.Consumer, p.MessageID, p.Token, v, err)
	}), nil
}

// pipeline runs script for elements 0..n-1 in one pipeline: args writes
// an element's nkeys keys (strings) then its nargs arguments into w, or
// returns its error (and the element is left out), and read turns its
// reply into its error. An element whose script the server did not know
// is run again on its own.
//
// The commands' words are written into one slice for the whole batch,
// not each into slices of its own (Script.EvalSha copies its keys and
// arguments into a new one, and boxes the hash again, per element):
// go-redis keeps no reference to a command's arguments once the
// pipeline's replies were read.
func (s *Store) pipeline(ctx context.Context, script *redis.Script, n, nkeys, nargs int,
	args func(i int, w []any) error, read func(i int, v any, err error) error) []error {
	errs := make([]error, n)
	m := 3 + nkeys + nargs
	words := make([]any, n*m)
	// element is element i's command words (EVALSHA, the hash, nkeys,
	// the keys, the arguments), keys and arguments written by args.
	sha := any(script.Hash())
	element := func(i int) ([]any, error) {
		w := words[i*m : (i+1)*m : (i+1)*m]
		w[0], w[1], w[2] = "evalsha", sha, nkeys
		return w, args(i, w[3:])
	}
	// runAlone runs element i's script on its own (Store.run: EVALSHA,
	// EVAL when the server does not know it).
	runAlone := func(i int, w []any) (any, error) {
		keys := make([]string, nkeys)
		for j := range keys {
			keys[j], _ = w[3+j].(string)
		}
		return s.run(ctx, script, keys, w[3+nkeys:]...).Result()
	}
	if s.cluster != nil && s.wait > 0 {
		for i := range n {
			w, err := element(i)
			if errs[i] = err; err == nil {
				v, err := runAlone(i, w)
				errs[i] = read(i, v, err)
			}
		}
		return errs
	}
	cmds := make([]*redis.Cmd, n)
	var wait *redis.Cmd
	_, _ = s.client.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for i := range n {
			w, err := element(i)
			if errs[i] = err; err == nil {
				// What Script.EvalSha queues: the keys from word 3 on.
				cmds[i] = redis.NewCmd(ctx, w...)
				cmds[i].SetFirstKeyPos(3)
				_ = pl.Process(ctx, cmds[i])
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
		// HasErrorPrefix allocates even for a nil error: ask only on an error.
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			v, err = runAlone(i, words[i*m:(i+1)*m])
		} else if err == nil && waitErr != nil {
			err = waitErr
		}
		errs[i] = read(i, v, err)
	}
	return errs
}
