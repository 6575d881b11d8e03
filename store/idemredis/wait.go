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
// it may lose it. An acquire reported so has given back the lease it
// issued, unless the error also says the give-back failed.
var ErrNotReplicated = errors.New("idemredis: write not acknowledged by enough replicas")

// run runs script, as script.Run does; with Config.WaitReplicas it sends
// EVALSHA through evalCmd, which puts WAIT after it on the same
// connection (through a Cluster client, one to the master of the first
// key's slot), in the same round trip, and turns a short count into an
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

// waitClient returns the client a write on key and its WAIT go through,
// on one connection: the Store's own, or through a Cluster client the
// client of the master that serves key's hash slot, as the Cluster
// client's slot map has it, so that WAIT counts the replicas of the
// server that ran the write. A write sent to a master that no longer
// serves the slot fails (MOVED): it is not followed here, the error is
// the write's, and reroute has the slot map read again for the next one.
func (s *Store) waitClient(ctx context.Context, key string) (redis.Cmdable, error) {
	if s.cluster == nil || key == "" {
		return s.client, nil
	}
	c, err := s.cluster.MasterForKey(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("idemredis: the master of %q: %w", key, err)
	}
	return c, nil
}

// reroute has a Cluster client read the cluster's slot map again (in the
// background, at most once at a time) after err, an error of a write sent
// through waitClient: a moved slot (MOVED, ASK), a cluster without a
// master for it (CLUSTERDOWN) or a master that stopped answering. Errors
// of the script itself change nothing.
func (s *Store) reroute(ctx context.Context, err error) {
	if s.cluster == nil || redis.HasErrorPrefix(err, "NOSCRIPT") || redis.HasErrorPrefix(err, "ERR") {
		return
	}
	s.cluster.ReloadState(ctx)
}
