package idemredis

import (
	"context"
	"sync"

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
	errs := make([]error, len(ps))
	b := getBatch(ctx, len(ps), acquireEval, 2, 3)
	for i, p := range ps {
		if errs[i] = idemdriver.ValidateAcquireParams(p); errs[i] != nil {
			continue
		}
		f, rk := s.keyFrame(b, i, p.Consumer, p.MessageID)
		sk := f.buf()
		sk.b = append(append(sk.b, rk.b...), stepsSuffix...)
		b.set(i, rk, sk, f.bytes(p.Fingerprint), s.leaseArg(p.Lease), p.StepPrefix)
	}
	s.sendBatch(ctx, b)
	for i, cmd := range b.cmds {
		if cmd != nil {
			v, err := cmd.Result()
			res[i], errs[i] = s.acquired(ctx, ps[i], v, err)
		}
	}
	b.release()
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
	errs := make([]error, len(ps))
	if !s.single {
		for i, p := range ps {
			errs[i] = s.Complete(ctx, p)
		}
		return errs, nil
	}
	b := getBatch(ctx, len(ps), completeIndexEval, 2, 4)
	for i, p := range ps {
		if errs[i] = idemdriver.ValidateCompleteParams(p); errs[i] != nil {
			continue
		}
		f, rk := s.keyFrame(b, i, p.Consumer, p.MessageID)
		b.set(i, rk, s.doneKeyArg(p.Consumer), p.Token, f.bytes(p.Result), f.str(p.ContentType), f.str(p.MessageID))
	}
	s.sendBatch(ctx, b)
	for i, cmd := range b.cmds {
		if cmd != nil {
			p := ps[i]
			v, err := cmd.Result()
			errs[i] = s.fenced("complete", p.Consumer, p.MessageID, p.Token, v, err)
		}
	}
	b.release()
	return errs, nil
}

// batch is the scratch of one batch call: the words of its commands (one
// slice for the whole batch; go-redis keeps no reference to a command's
// arguments once its reply was read), the evalFrame of each element's
// keys and arguments, and its commands (nil for an element left out).
// Taken with getBatch and given back by release, so that a batch
// allocates per element only what a single call does (its command, and
// the boxing of an integer or a string argument).
type batch struct {
	ctx    context.Context // the commands'
	sc     *evalScript
	nkeys  int
	m      int // words per element: EVALSHA, the hash, nkeys, keys, arguments
	words  []any
	frames []*evalFrame
	cmds   []*redis.Cmd
	queue  []redis.Cmder
}

var batches = sync.Pool{New: func() any { return new(batch) }}

// getBatch returns a batch of n elements of sc, each with nkeys keys and
// nargs arguments, for commands on ctx.
func getBatch(ctx context.Context, n int, sc *evalScript, nkeys, nargs int) *batch {
	b := batches.Get().(*batch)
	b.ctx, b.sc, b.nkeys, b.m = ctx, sc, nkeys, 3+nkeys+nargs
	b.words = grow(b.words, n*b.m)
	b.frames = grow(b.frames, n)
	b.cmds = grow(b.cmds, n)
	return b
}

// grow returns s resliced to n elements (zero: a batch clears what it
// used), reallocated when too short.
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// keyFrame returns element i's evalFrame and its first argument, the
// record key of (consumer, id).
func (s *Store) keyFrame(b *batch, i int, consumer, id string) (*evalFrame, *evalArg) {
	f := getFrame()
	b.frames[i] = f
	rk := f.buf()
	rk.b = s.appendRecordKey(rk.b, consumer, id, "")
	return f, rk
}

// set writes element i's command: EVALSHA of the batch's script, its keys
// and arguments (keysAndArgs, nkeys keys first).
func (b *batch) set(i int, keysAndArgs ...any) {
	w := b.element(i)
	w[0], w[1], w[2] = "evalsha", b.sc.sha, b.nkeys
	copy(w[3:], keysAndArgs)
	cmd := redis.NewCmd(b.ctx, w...)
	cmd.SetFirstKeyPos(3)
	b.cmds[i] = cmd
}

// element returns element i's words.
func (b *batch) element(i int) []any {
	return b.words[i*b.m : (i+1)*b.m : (i+1)*b.m]
}

// release gives the batch's frames back and the batch to the pool,
// without references to its callers' keys, arguments and replies.
func (b *batch) release() {
	for _, f := range b.frames {
		if f != nil {
			f.release()
		}
	}
	clear(b.words)
	clear(b.frames)
	clear(b.cmds)
	clear(b.queue[:cap(b.queue)])
	b.ctx, b.sc, b.queue = nil, nil, b.queue[:0]
	batches.Put(b)
}

// sendBatch sends b's commands in one pipeline, followed by one WAIT with
// Config.WaitReplicas (a write whose WAIT falls short gets an error
// matching ErrNotReplicated, its reply kept), or, through a Cluster client
// with Config.WaitReplicas, each with its own WAIT (evalCmd), in order. A
// command whose script the server did not know is sent again as EVAL, on
// its own. Each command's reply is in b.cmds when it returns.
func (s *Store) sendBatch(ctx context.Context, b *batch) {
	if s.cluster != nil && s.wait > 0 {
		for i, cmd := range b.cmds {
			if cmd != nil {
				b.cmds[i] = s.evalAgain(ctx, b, i, s.evalCmd(ctx, b.nkeys, b.element(i)))
			}
		}
		return
	}
	for _, cmd := range b.cmds {
		if cmd != nil {
			b.queue = append(b.queue, cmd)
		}
	}
	if len(b.queue) == 0 {
		return
	}
	pl, _ := s.pipes.Get().(redis.Pipeliner)
	if pl == nil {
		pl = s.client.Pipeline()
	}
	_ = pl.BatchProcess(ctx, b.queue...)
	var wait *redis.Cmd
	if s.wait > 0 {
		// One WAIT after every write of the pipeline's connection.
		wait = pl.Do(ctx, "WAIT", s.wait, s.waitMS)
	}
	_, _ = pl.Exec(ctx)
	s.pipes.Put(pl)
	var waitErr error
	if wait != nil {
		waitErr = s.waited(wait)
	}
	for i, cmd := range b.cmds {
		if cmd == nil {
			continue
		}
		if again := s.evalAgain(ctx, b, i, cmd); again != cmd {
			b.cmds[i] = again
		} else if waitErr != nil && cmd.Err() == nil {
			cmd.SetErr(waitErr) // its reply kept: the lease it issued is given back
		}
	}
}

// evalAgain returns cmd, or, when cmd's script was not known to the
// server (NOSCRIPT), element i sent again as EVAL with the script's
// source, on its own (evalCmd).
func (s *Store) evalAgain(ctx context.Context, b *batch, i int, cmd *redis.Cmd) *redis.Cmd {
	// HasErrorPrefix allocates even for a nil error: ask only on an error.
	if err := cmd.Err(); err == nil || !redis.HasErrorPrefix(err, "NOSCRIPT") {
		return cmd
	}
	w := b.element(i)
	w[0], w[1] = "eval", b.sc.src
	return s.evalCmd(ctx, b.nkeys, w)
}
