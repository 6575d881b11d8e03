package idemredis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/redis/go-redis/v9"
)

// purgeLockTTL is how long the purge lock outlives a cleaner that died
// holding it. A live cleaner extends it after every batch.
const purgeLockTTL = 30 * time.Second

// unlockTimeout bounds the release of the purge lock after the caller's
// context has ended.
const unlockTimeout = 5 * time.Second

// Purge implements [idemdriver.LeaseStore]: it deletes p.Consumer's completed
// and failed records finished before the horizon, the consumer's newest
// completion or failure minus p.RetentionWindow (rounded up to a
// millisecond), both by the Redis server's clock. The horizon follows the
// consumer's last activity, not the clock, so a consumer that was down for
// longer than the window keeps its history. A consumer with nothing
// finished has nothing to purge (zero Horizon). In_progress records are
// never deleted.
//
// One cleaner runs at a time per (prefix, consumer): the lock is a key set
// with SET NX PX, extended after each batch and deleted at the end by its
// holder only; when another cleaner holds it, Purge returns
// [idem.ErrPurgeInProgress] at once. A cleaner that dies leaves the lock
// to expire within 30 seconds.
//
// Each batch reads at most p.BatchSize of the oldest entries before the
// horizon from the consumer's retention index, deletes their records (one
// script per record, pipelined) unless they are in progress, then removes
// the entries. p.OnBatch is called after each batch that deleted records.
// With p.DryRun the same walk counts the records a purge would delete now,
// reported as one batch when there are any, and deletes nothing.
// Cancelling ctx stops between batches; the batches already run stay
// deleted and are counted in the result.
func (s *Store) Purge(ctx context.Context, p *idem.PurgeParams) (idem.PurgeResult, error) {
	var res idem.PurgeResult
	if err := idemdriver.ValidatePurgeParams(p); err != nil {
		return res, err
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	lock, holder, err := s.lockPurge(ctx, p.Consumer)
	if err != nil {
		return res, err
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unlockTimeout)
		defer cancel()
		_ = unlockScript.Run(uctx, s.client, []string{lock}, holder).Err()
	}()

	done := s.consumerKey(p.Consumer, doneSuffix)
	newest, err := s.client.ZRangeWithScores(ctx, done, -1, -1).Result()
	if err != nil {
		return res, fmt.Errorf("idemredis: purge: newest record: %w", err)
	}
	if len(newest) == 0 {
		return res, nil
	}
	horizon := int64(newest[0].Score) - ceilMillis(p.RetentionWindow)
	res.Horizon = time.UnixMilli(horizon).UTC()

	// skipped counts the entries before the horizon that this walk keeps
	// (records in progress; with DryRun, every one): they stay first in
	// the index's order, so the next batch starts after them.
	skipped := int64(0)
	for {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		entries, err := s.client.ZRangeByScoreWithScores(ctx, done, &redis.ZRangeBy{
			Min: "-inf", Max: "(" + strconv.FormatInt(horizon, 10), Offset: skipped, Count: int64(p.BatchSize),
		}).Result()
		if err != nil {
			return res, fmt.Errorf("idemredis: purge: read index: %w", err)
		}
		if len(entries) == 0 {
			break
		}
		states, err := s.purgeRecords(ctx, p.Consumer, entries, !p.DryRun)
		if err != nil {
			return res, err
		}
		var finished int64
		var unindex []any
		for i, st := range states {
			if st == 1 {
				finished++
			}
			if p.DryRun || st == 2 {
				skipped++
				continue
			}
			// Deleted, or a dangling entry whose record is gone.
			unindex = append(unindex, entries[i].Member, strconv.FormatInt(int64(entries[i].Score), 10))
		}
		if len(unindex) > 0 {
			if err := unindexScript.Run(ctx, s.client, []string{done}, unindex...).Err(); err != nil {
				return res, fmt.Errorf("idemredis: purge: update index: %w", err)
			}
		}
		res.Deleted += finished
		if !p.DryRun && finished > 0 {
			res.Batches++
			if p.OnBatch != nil {
				p.OnBatch(res.Deleted)
			}
		}
		if len(entries) < p.BatchSize {
			break
		}
		if err := lockRefreshScript.Run(ctx, s.client, []string{lock}, holder, purgeLockTTL.Milliseconds()).Err(); err != nil {
			return res, fmt.Errorf("idemredis: purge: extend lock: %w", err)
		}
	}
	if p.DryRun && res.Deleted > 0 {
		res.Batches = 1
		if p.OnBatch != nil {
			p.OnBatch(res.Deleted)
		}
	}
	return res, nil
}

// lockPurge takes consumer's purge lock, returning its key and the random
// holder value that releases it, or idem.ErrPurgeInProgress.
func (s *Store) lockPurge(ctx context.Context, consumer string) (key, holder string, err error) {
	var b [16]byte
	_, _ = rand.Read(b[:])
	key, holder = s.consumerKey(consumer, purgeSuffix), hex.EncodeToString(b[:])
	// SET NX PX, spelled out: go-redis's SetNX sends EX for whole seconds.
	err = s.client.Do(ctx, "SET", key, holder, "NX", "PX", purgeLockTTL.Milliseconds()).Err()
	switch {
	case errors.Is(err, redis.Nil):
		return "", "", idem.ErrPurgeInProgress
	case err != nil:
		return "", "", fmt.Errorf("idemredis: purge: lock: %w", err)
	}
	return key, holder, nil
}

// purgeRecords runs purgeRecordScript on the records of entries in one
// pipeline and returns the states it reported (0 gone, 1 finished, 2 in
// progress), deleting finished records when del is set.
func (s *Store) purgeRecords(ctx context.Context, consumer string, entries []redis.Z, del bool) ([]int64, error) {
	arg := "0"
	if del {
		arg = "1"
	}
	keys := make([][]string, len(entries))
	for i, e := range entries {
		id, ok := e.Member.(string)
		if !ok {
			return nil, fmt.Errorf("idemredis: purge: index member %T, want a string", e.Member)
		}
		rk := s.recordKey(consumer, id)
		keys[i] = []string{rk, rk + stepsSuffix}
	}
	cmds, err := s.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, k := range keys {
			purgeRecordScript.EvalSha(ctx, pipe, k, arg)
		}
		return nil
	})
	if err != nil {
		// A script not cached on a server yet (or flushed) fails with
		// NOSCRIPT; Run sends it, for those records only.
		for i, c := range cmds {
			if redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
				cmds[i] = purgeRecordScript.Run(ctx, s.client, keys[i], arg)
			}
		}
		if err = firstErr(cmds); err != nil {
			return nil, fmt.Errorf("idemredis: purge: delete records: %w", err)
		}
	}
	states := make([]int64, len(cmds))
	for i, c := range cmds {
		n, err := c.(*redis.Cmd).Int64()
		if err != nil || n < 0 || n > 2 {
			return nil, fmt.Errorf("idemredis: purge: delete records: reply %d, %v", n, err)
		}
		states[i] = n
	}
	return states, nil
}

// firstErr returns the first error among cmds.
func firstErr(cmds []redis.Cmder) error {
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			return err
		}
	}
	return nil
}
