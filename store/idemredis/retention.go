package idemredis

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/redis/go-redis/v9"
)

// purgeLockTTL is how long the purge lock outlives a cleaner that died
// holding it. A live session extends it at the start of every call and
// between the chunks of a long one.
const purgeLockTTL = 30 * time.Second

// countChunk is how many index entries CountBefore reads per command.
const countChunk = 1000

// errSessionClosed is returned by a purge session used after Close.
var errSessionClosed = errors.New("idemredis: purge session already closed")

// MarkRunning implements [idemdriver.Retainer], by the Redis server's
// clock (TIME inside the script): the consumer's newest run is extended to
// now when it ended no more than p.MaxGap (rounded up to a microsecond)
// ago, and otherwise a new run [now, now] is added; a MaxGap of zero
// always adds one. The runs are a sorted set under the consumer's hash
// tag, in microseconds (see the package doc); two runs [now, now] of one
// microsecond are one. Invalid parameters are refused before any
// command, with the errors of [idemdriver.ValidateMarkRunningParams].
func (s *Store) MarkRunning(ctx context.Context, p *idemdriver.MarkRunningParams) error {
	if err := idemdriver.ValidateMarkRunningParams(p); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	err := markRunningScript.Run(ctx, s.client, []string{s.consumerKey(p.Consumer, runsSuffix)}, ceilMicros(p.MaxGap)).Err()
	if err != nil {
		return fmt.Errorf("idemredis: mark running: %w", err)
	}
	return nil
}

// BeginPurge implements [idemdriver.Retainer]: it takes the purge lock of
// (key prefix, p.Consumer), a key set with SET NX PX to a random holder
// value and a TTL of 30 seconds, or returns [idemdriver.ErrPurgeInProgress]
// at once when another session holds it. The session extends the lock at
// the start of each call (and between the chunks of a long one), taking it
// again if it expired meanwhile and nobody else took it; its Close deletes
// it, by holder only (compare and delete in one script). A cleaner that
// dies leaves the lock to expire within 30 seconds. Invalid parameters are
// refused before any command, with the errors of
// [idemdriver.ValidateBeginPurgeParams].
func (s *Store) BeginPurge(ctx context.Context, p *idemdriver.BeginPurgeParams) (idemdriver.PurgeSession, error) {
	if err := idemdriver.ValidateBeginPurgeParams(p); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	ps := &purgeSession{
		s:        s,
		consumer: p.Consumer,
		lock:     s.consumerKey(p.Consumer, purgeSuffix),
		holder:   hex.EncodeToString(b[:]),
		done:     s.consumerKey(p.Consumer, doneSuffix),
		runs:     s.consumerKey(p.Consumer, runsSuffix),
	}
	// SET NX PX, spelled out: go-redis's SetNX sends EX for whole seconds.
	err := s.client.Do(ctx, "SET", ps.lock, ps.holder, "NX", "PX", purgeLockTTL.Milliseconds()).Err()
	switch {
	case errors.Is(err, redis.Nil):
		return nil, fmt.Errorf("%w: idemredis: consumer %q", idemdriver.ErrPurgeInProgress, p.Consumer)
	case err != nil:
		return nil, fmt.Errorf("idemredis: purge lock: %w", err)
	}
	return ps, nil
}

// purgeSession is a Store's [idemdriver.PurgeSession]: the holder of one
// consumer's purge lock. It is used by one goroutine.
type purgeSession struct {
	s        *Store
	consumer string
	lock     string // the lock's key
	holder   string // the random value that holds it
	done     string // the consumer's retention index
	runs     string // the consumer's runs
	closed   bool

	// horizon (ms) and skipped are DeleteBatch's place in the index: the
	// first skipped entries before horizon are records it keeps (in
	// progress, or settled at or after the horizon), so the next batch
	// reads after them.
	horizon int64
	skipped int64
}

var _ idemdriver.PurgeSession = (*purgeSession)(nil)

// refresh extends the purge lock before a command of the session, or
// fails when the session is closed or another holder took the lock.
func (ps *purgeSession) refresh(ctx context.Context) error {
	if ps.closed {
		return errSessionClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	n, err := lockRefreshScript.Run(ctx, ps.s.client, []string{ps.lock}, ps.holder, purgeLockTTL.Milliseconds()).Int64()
	switch {
	case err != nil:
		return fmt.Errorf("idemredis: purge: extend lock: %w", err)
	case n != 1:
		return fmt.Errorf("%w: idemredis: the purge lock of consumer %q expired and another cleaner took it", idemdriver.ErrPurgeInProgress, ps.consumer)
	}
	return nil
}

// Runs implements [idemdriver.PurgeSession]: the consumer's runs, by the
// server's clock in microseconds, oldest start first.
func (ps *purgeSession) Runs(ctx context.Context) ([]idemdriver.Run, error) {
	if err := ps.refresh(ctx); err != nil {
		return nil, err
	}
	members, err := ps.s.client.ZRange(ctx, ps.runs, 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("idemredis: purge: read runs: %w", err)
	}
	runs := make([]idemdriver.Run, 0, len(members))
	for _, m := range members {
		start, end, ok := parseRun(m)
		if !ok {
			return nil, fmt.Errorf("idemredis: purge: malformed run %q in %s", m, ps.runs)
		}
		runs = append(runs, idemdriver.Run{Start: time.UnixMicro(start).UTC(), End: time.UnixMicro(end).UTC()})
	}
	slices.SortStableFunc(runs, func(a, b idemdriver.Run) int {
		return cmp.Or(a.Start.Compare(b.Start), a.End.Compare(b.End))
	})
	return runs, nil
}

// parseRun reads a runs member, "start:end" in microseconds.
func parseRun(m string) (start, end int64, ok bool) {
	a, b, found := strings.Cut(m, ":")
	if !found {
		return 0, 0, false
	}
	start, err1 := strconv.ParseInt(a, 10, 64)
	end, err2 := strconv.ParseInt(b, 10, 64)
	return start, end, err1 == nil && err2 == nil
}

// CountBefore implements [idemdriver.PurgeSession]: it walks the
// consumer's index entries scored before horizon, countChunk at a time,
// and counts those whose records are completed or failed and were written
// before horizon; in_progress records are never counted. It changes
// nothing. A horizon that is not set is refused with an error matching
// [idemdriver.ErrInvalidConfig].
func (ps *purgeSession) CountBefore(ctx context.Context, horizon time.Time) (int64, error) {
	if err := idemdriver.ValidateHorizon(horizon); err != nil {
		return 0, err
	}
	h := ceilUnixMilli(horizon)
	var n, offset int64
	for {
		if err := ps.refresh(ctx); err != nil {
			return n, err
		}
		entries, err := ps.entries(ctx, h, offset, countChunk)
		if err != nil {
			return n, err
		}
		states, err := ps.purgeRecords(ctx, entries, h, false)
		if err != nil {
			return n, err
		}
		for _, st := range states {
			if st == recordDue {
				n++
			}
		}
		if len(entries) < countChunk {
			return n, nil
		}
		offset += int64(len(entries))
	}
}

// DeleteBatch implements [idemdriver.PurgeSession]: it deletes at most
// p.Limit of the consumer's completed and failed records written before
// p.Horizon, oldest first by their index score, each with its recovery
// points. Each chunk reads at most the remaining limit of index entries
// (one bounded ZRANGE), runs one short script per record, pipelined,
// that deletes it only if it is settled and was written before the
// horizon, then removes the entries of deleted records and of records
// that no longer exist (each only if its score has not changed since it
// was read). in_progress records are never deleted, however old: their
// entries stay, and the session reads past them in later chunks and
// batches. So no command blocks Redis for longer than one chunk of
// p.Limit records. Invalid parameters are refused with the errors of
// [idemdriver.ValidatePurgeBatchParams].
func (ps *purgeSession) DeleteBatch(ctx context.Context, p *idemdriver.PurgeBatchParams) (int64, error) {
	if err := idemdriver.ValidatePurgeBatchParams(p); err != nil {
		return 0, err
	}
	h := ceilUnixMilli(p.Horizon)
	if h != ps.horizon {
		ps.horizon, ps.skipped = h, 0
	}
	var deleted int64
	for deleted < int64(p.Limit) {
		if err := ps.refresh(ctx); err != nil {
			return deleted, err
		}
		want := int64(p.Limit) - deleted
		entries, err := ps.entries(ctx, h, ps.skipped, want)
		if err != nil {
			return deleted, err
		}
		if len(entries) == 0 {
			break
		}
		states, err := ps.purgeRecords(ctx, entries, h, true)
		if err != nil {
			return deleted, err
		}
		var unindex []any
		for i, st := range states {
			switch st {
			case recordDue:
				deleted++
			case recordKept:
				ps.skipped++
				continue
			}
			// Deleted, or a dangling entry whose record is gone.
			unindex = append(unindex, entries[i].Member, strconv.FormatInt(int64(entries[i].Score), 10))
		}
		if len(unindex) > 0 {
			if err := unindexScript.Run(ctx, ps.s.client, []string{ps.done}, unindex...).Err(); err != nil {
				return deleted, fmt.Errorf("idemredis: purge: update index: %w", err)
			}
		}
		if int64(len(entries)) < want {
			break
		}
	}
	return deleted, nil
}

// PruneRuns implements [idemdriver.PurgeSession]: one ZREMRANGEBYSCORE of
// the runs that ended before t. A t that is not set is refused with an
// error matching [idemdriver.ErrInvalidConfig].
func (ps *purgeSession) PruneRuns(ctx context.Context, t time.Time) error {
	if err := idemdriver.ValidateHorizon(t); err != nil {
		return err
	}
	if err := ps.refresh(ctx); err != nil {
		return err
	}
	// End < t in nanoseconds is end_us < ceil(t in µs), ends being whole
	// microseconds.
	max := "(" + strconv.FormatInt(ceilUnixMicro(t), 10)
	if err := ps.s.client.ZRemRangeByScore(ctx, ps.runs, "-inf", max).Err(); err != nil {
		return fmt.Errorf("idemredis: purge: prune runs: %w", err)
	}
	return nil
}

// Close implements [idemdriver.PurgeSession]: it deletes the purge lock if
// the session still holds it. It is safe to call more than once; a lock it
// fails to delete expires within 30 seconds.
func (ps *purgeSession) Close(ctx context.Context) error {
	if ps.closed {
		return nil
	}
	ps.closed = true
	if err := unlockScript.Run(ctx, ps.s.client, []string{ps.lock}, ps.holder).Err(); err != nil {
		return fmt.Errorf("idemredis: purge: release lock: %w", err)
	}
	return nil
}

// entries reads at most count of the index entries scored before horizon
// (ms), from offset, lowest score first.
func (ps *purgeSession) entries(ctx context.Context, horizon, offset, count int64) ([]redis.Z, error) {
	entries, err := ps.s.client.ZRangeByScoreWithScores(ctx, ps.done, &redis.ZRangeBy{
		Min: "-inf", Max: "(" + strconv.FormatInt(horizon, 10), Offset: offset, Count: count,
	}).Result()
	if err != nil {
		return nil, fmt.Errorf("idemredis: purge: read index: %w", err)
	}
	return entries, nil
}

// The states purgeRecordScript reports.
const (
	recordGone = 0 // no record: a dangling index entry
	recordDue  = 1 // settled before the horizon (deleted, unless only looking)
	recordKept = 2 // in progress, or settled at or after the horizon
)

// purgeRecords runs purgeRecordScript on the records of entries in one
// pipeline and returns the states it reported, deleting the due records
// when del is set.
func (ps *purgeSession) purgeRecords(ctx context.Context, entries []redis.Z, horizon int64, del bool) ([]int64, error) {
	if len(entries) == 0 {
		return nil, nil
	}
	arg := "0"
	if del {
		arg = "1"
	}
	h := strconv.FormatInt(horizon, 10)
	keys := make([][]string, len(entries))
	for i, e := range entries {
		id, ok := e.Member.(string)
		if !ok {
			return nil, fmt.Errorf("idemredis: purge: index member %T, want a string", e.Member)
		}
		rk := ps.s.recordKey(ps.consumer, id)
		keys[i] = []string{rk, rk + stepsSuffix}
	}
	cmds, err := ps.s.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, k := range keys {
			purgeRecordScript.EvalSha(ctx, pipe, k, h, arg)
		}
		return nil
	})
	if err != nil {
		// A script not cached on a server yet (or flushed) fails with
		// NOSCRIPT; Run sends it, for those records only.
		for i, c := range cmds {
			if redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
				cmds[i] = purgeRecordScript.Run(ctx, ps.s.client, keys[i], h, arg)
			}
		}
		if err = firstErr(cmds); err != nil {
			return nil, fmt.Errorf("idemredis: purge: delete records: %w", err)
		}
	}
	states := make([]int64, len(cmds))
	for i, c := range cmds {
		n, err := c.(*redis.Cmd).Int64()
		if err != nil || n < recordGone || n > recordKept {
			return nil, fmt.Errorf("idemredis: purge: delete records: reply %d, %v", n, err)
		}
		states[i] = n
	}
	return states, nil
}

// ceilUnixMilli returns t in milliseconds since the Unix epoch, rounded
// up, so that for a time in whole milliseconds x, x < ceilUnixMilli(t)
// exactly when x is before t.
func ceilUnixMilli(t time.Time) int64 {
	ms := t.UnixMilli()
	if time.UnixMilli(ms).Before(t) {
		ms++
	}
	return ms
}

// ceilUnixMicro is ceilUnixMilli in microseconds, for runs.
func ceilUnixMicro(t time.Time) int64 {
	us := t.UnixMicro()
	if time.UnixMicro(us).Before(t) {
		us++
	}
	return us
}

// ceilMicros converts a duration that is not negative (a MaxGap) to whole
// microseconds, rounding up.
func ceilMicros(d time.Duration) int64 {
	us := int64(d / time.Microsecond)
	if d%time.Microsecond > 0 {
		us++
	}
	return us
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
