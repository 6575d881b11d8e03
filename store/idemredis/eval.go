package idemredis

import (
	"context"

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
func (s *Store) eval(ctx context.Context, sc *evalScript, nkeys int, keysAndArgs ...any) (any, error) {
	args := make([]any, 3+len(keysAndArgs))
	args[0], args[1], args[2] = "evalsha", sc.sha, nkeys
	copy(args[3:], keysAndArgs)
	cmd := s.evalCmd(ctx, nkeys, args)
	// HasErrorPrefix allocates even for a nil error: ask only on an error.
	if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		args[0], args[1] = "eval", sc.src
		cmd = s.evalCmd(ctx, nkeys, args)
	}
	return cmd.Result()
}

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
