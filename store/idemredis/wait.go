package idemredis

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// ErrNotReplicated is returned, wrapped, by a lease write that fewer than
// Config.WaitReplicas replicas acknowledged within Config.WaitTimeout.
// The write happened on the master; a failover before the replicas get
// it may lose it.
var ErrNotReplicated = errors.New("idemredis: write not acknowledged by enough replicas")

// run runs script, as script.Run does; with Config.WaitReplicas it sends
// WAIT after it on the same connection, in the same round trip, and turns
// a short count into an error matching ErrNotReplicated.
func (s *Store) run(ctx context.Context, script *redis.Script, keys []string, args ...any) *redis.Cmd {
	if s.wait == 0 {
		return script.Run(ctx, s.client, keys, args...)
	}
	var cmd *redis.Cmd
	for loaded := false; ; loaded = true {
		pl := s.client.Pipeline()
		cmd = script.EvalSha(ctx, pl, keys, args...)
		w := pl.Do(ctx, "WAIT", s.wait, s.waitMS)
		_, _ = pl.Exec(ctx)
		if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") && !loaded {
			if err := script.Load(ctx, s.client).Err(); err != nil {
				cmd.SetErr(err)
				return cmd
			}
			continue
		}
		if cmd.Err() == nil {
			if err := s.waited(w); err != nil {
				cmd.SetErr(err)
			}
		}
		return cmd
	}
}

// waited reads WAIT's reply: nil when enough replicas acknowledged.
func (s *Store) waited(w *redis.Cmd) error {
	n, err := w.Int64()
	if err != nil {
		return fmt.Errorf("%w: WAIT: %w", ErrNotReplicated, err)
	}
	if n < int64(s.wait) {
		return fmt.Errorf("%w: %d of %d replicas within %d ms", ErrNotReplicated, n, s.wait, s.waitMS)
	}
	return nil
}
