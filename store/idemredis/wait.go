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
// EVALSHA through evalCmd, which puts WAIT after it on the same
// connection, in the same round trip, and turns a short count into an
// error matching ErrNotReplicated (loading the script on NOSCRIPT).
func (s *Store) run(ctx context.Context, script *redis.Script, keys []string, args ...any) *redis.Cmd {
	if s.wait == 0 {
		return script.Run(ctx, s.client, keys, args...)
	}
	words := make([]any, 0, 3+len(keys)+len(args))
	words = append(words, "evalsha", script.Hash(), len(keys))
	for _, k := range keys {
		words = append(words, k)
	}
	words = append(words, args...)
	cmd := s.evalCmd(ctx, len(keys), words)
	if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		if err := script.Load(ctx, s.client).Err(); err != nil {
			cmd.SetErr(err)
			return cmd
		}
		cmd = s.evalCmd(ctx, len(keys), words)
	}
	return cmd
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
