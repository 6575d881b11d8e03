package idemredis

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// evalScript is a script of the lease-mode hot path (one call per
// message), run by Store.eval: its hash and source are boxed once, as
// EVALSHA and EVAL arguments.
type evalScript struct {
	sha, src any
}

func newEvalScript(s *redis.Script, src string) *evalScript {
	return &evalScript{sha: s.Hash(), src: src}
}

// eval runs sc as redis.Script.Run does (EVALSHA, then EVAL when the
// server does not have the script), building the command's arguments in
// one slice: keysAndArgs holds nkeys keys, then the script's arguments.
// Script.Run copies its keys and arguments into a new slice of its own
// and boxes the hash again on every call, which cost a message three
// allocations of each of its two scripts.
//
// The command's argument slice comes from a pool and goes back to it,
// cleared, once the reply was read: go-redis keeps no reference to a
// command's arguments after Process returns.
func (s *Store) eval(ctx context.Context, sc *evalScript, nkeys int, keysAndArgs ...any) (any, error) {
	ap := evalArgs.Get().(*[]any)
	args := append((*ap)[:0], "evalsha", sc.sha, nkeys)
	args = append(args, keysAndArgs...)
	cmd := s.evalCmd(ctx, nkeys, args)
	// HasErrorPrefix allocates even for a nil error: ask only on an error.
	if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		args[0], args[1] = "eval", sc.src
		cmd = s.evalCmd(ctx, nkeys, args)
	}
	v, err := cmd.Result()
	clear(args)
	*ap = args[:0]
	evalArgs.Put(ap)
	return v, err
}

// evalArgs is eval's pool of argument slices.
var evalArgs = sync.Pool{New: func() any { s := make([]any, 0, 10); return &s }}

// evalCmd sends the EVALSHA or EVAL command args, whose keys (nkeys of
// them) start at its fourth word, as redis.Client.Eval sends it, so that
// a Cluster client routes it by its first key; with Config.WaitReplicas,
// followed by WAIT in the same pipeline (ErrNotReplicated when short).
func (s *Store) evalCmd(ctx context.Context, nkeys int, args []any) *redis.Cmd {
	cmd := redis.NewCmd(ctx, args...)
	if nkeys > 0 {
		cmd.SetFirstKeyPos(3)
	}
	if s.wait == 0 {
		_ = s.client.Process(ctx, cmd)
		return cmd
	}
	// Config.WaitReplicas: WAIT in the same round trip, as Store.run sends it.
	var key string
	if nkeys > 0 {
		key, _ = args[3].(string)
	}
	c, err := s.waitClient(ctx, key)
	if err != nil {
		cmd.SetErr(err)
		return cmd
	}
	pl := c.Pipeline()
	_ = pl.Process(ctx, cmd)
	w := pl.Do(ctx, "WAIT", s.wait, s.waitMS)
	_, _ = pl.Exec(ctx)
	if err := cmd.Err(); err != nil {
		s.reroute(ctx, err)
	} else if err := s.waited(w); err != nil {
		cmd.SetErr(err)
	}
	return cmd
}
