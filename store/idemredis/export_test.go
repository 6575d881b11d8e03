package idemredis

// Test hooks, compiled only into this package's tests: they reach into the
// key layout, which is not part of the API.

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// RecordKey, ConsumerKey and the suffixes expose the key layout.
func (s *Store) RecordKey(consumer, id string) string { return s.recordKey(consumer, id) }

// ConsumerKey returns prefix{consumer}suffix.
func (s *Store) ConsumerKey(consumer, suffix string) string { return s.consumerKey(consumer, suffix) }

const (
	StepsSuffix = stepsSuffix
	DoneSuffix  = doneSuffix
	RunsSuffix  = runsSuffix
	PurgeSuffix = purgeSuffix
)

// MillisDigitsLua exposes the complete scripts' milliseconds of a TIME reply.
const MillisDigitsLua = millisDigitsLua

// CeilMillis exposes the rounding of leases.
func CeilMillis(d time.Duration) int64 { return ceilMillis(d) }

// CeilUnixMilli exposes the rounding of purge horizons.
func CeilUnixMilli(t time.Time) int64 { return ceilUnixMilli(t) }

var expireScript = redis.NewScript(luaPrelude + `
local r = redis.call('HMGET', KEYS[1], 'state', 'lease_until_ms')
if tonumber(r[1]) ~= 1 then return 0 end
local now = now_ms()
if tonumber(r[2]) > now then
	redis.call('HSET', KEYS[1], 'lease_until_ms', now)
end
return 1
`)

// ExpireLease ends the live lease of consumer's in_progress record id now
// by the server's clock, changing nothing else, as the idemtest hook must.
func (s *Store) ExpireLease(ctx context.Context, consumer, id string) error {
	n, err := expireScript.Run(ctx, s.client, []string{s.recordKey(consumer, id)}).Int64()
	if err != nil {
		return err
	}
	if n != 1 {
		return fmt.Errorf("no in_progress record %q of consumer %q", id, consumer)
	}
	return nil
}

var ageRecordScript = redis.NewScript(`
local d = tonumber(ARGV[1])
for _, f in ipairs({'created_ms', 'updated_ms', 'finished_ms'}) do
	local v = redis.call('HGET', KEYS[1], f)
	if v then redis.call('HSET', KEYS[1], f, tonumber(v) - d) end
end
return 1
`)

var ageIndexScript = redis.NewScript(`
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if s then redis.call('ZADD', KEYS[1], tonumber(s) - tonumber(ARGV[2]), ARGV[1]) end
return 1
`)

// AgeRecords moves the times of consumer's records ids (created, updated,
// finished, and their retention index scores) back by d.
func (s *Store) AgeRecords(ctx context.Context, consumer string, ids []string, d time.Duration) error {
	ms := d.Milliseconds()
	for _, id := range ids {
		if err := ageRecordScript.Run(ctx, s.client, []string{s.recordKey(consumer, id)}, ms).Err(); err != nil {
			return err
		}
		if err := ageIndexScript.Run(ctx, s.client, []string{s.consumerKey(consumer, doneSuffix)}, id, ms).Err(); err != nil {
			return err
		}
	}
	return nil
}

var shiftRecordScript = redis.NewScript(`
local d = tonumber(ARGV[1])
for _, f in ipairs({'created_ms', 'updated_ms', 'finished_ms', 'lease_until_ms'}) do
	local v = redis.call('HGET', KEYS[1], f)
	if v then redis.call('HSET', KEYS[1], f, tonumber(v) - d) end
end
return 1
`)

var shiftIndexScript = redis.NewScript(`
local d = tonumber(ARGV[1])
local z = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #z, 2 do
	redis.call('ZADD', KEYS[1], tonumber(z[i + 1]) - d, z[i])
end
return #z / 2
`)

var shiftRunsScript = redis.NewScript(`
local d = tonumber(ARGV[1])
local function us(x) return string.format('%.0f', x) end
local runs = redis.call('ZRANGE', KEYS[1], 0, -1)
redis.call('DEL', KEYS[1])
for _, m in ipairs(runs) do
	local s, e = string.match(m, '^(%-?%d+):(%-?%d+)$')
	s, e = tonumber(s) - d, tonumber(e) - d
	redis.call('ZADD', KEYS[1], us(e), us(s) .. ':' .. us(e))
end
return #runs
`)

// Shift moves every time recorded for consumer back by d (whole
// milliseconds for records, microseconds for runs): its records' created,
// updated, finished and lease times, their retention index scores, and its
// runs, as if all of it had happened d earlier and the consumer had not
// run since: the idemtest Shift hook.
func (s *Store) Shift(ctx context.Context, consumer string, d time.Duration) error {
	ms := d.Milliseconds()
	keys, err := s.recordKeys(ctx, consumer)
	if err != nil {
		return err
	}
	for _, k := range keys {
		if err := shiftRecordScript.Run(ctx, s.client, []string{k}, ms).Err(); err != nil {
			return err
		}
	}
	if err := shiftIndexScript.Run(ctx, s.client, []string{s.consumerKey(consumer, doneSuffix)}, ms).Err(); err != nil {
		return err
	}
	return shiftRunsScript.Run(ctx, s.client, []string{s.consumerKey(consumer, runsSuffix)}, d.Microseconds()).Err()
}

// AddRun records a run of consumer from start to end (microseconds), as
// MarkRunning calls would have.
func (s *Store) AddRun(ctx context.Context, consumer string, start, end time.Time) error {
	m := fmt.Sprintf("%d:%d", start.UnixMicro(), end.UnixMicro())
	return s.client.ZAdd(ctx, s.consumerKey(consumer, runsSuffix), redis.Z{Score: float64(end.UnixMicro()), Member: m}).Err()
}

// CountRecords counts consumer's record hashes, whatever their state, by
// scanning every primary for prefix{consumer␟*}.
func (s *Store) CountRecords(ctx context.Context, consumer string) (int, error) {
	keys, err := s.recordKeys(ctx, consumer)
	return len(keys), err
}

// recordKeys returns the keys of consumer's record hashes, scanning every
// primary for prefix{consumer␟*}.
func (s *Store) recordKeys(ctx context.Context, consumer string) ([]string, error) {
	pattern := globEscape(s.prefix+"{"+string(appendEscaped(nil, consumer))+string(idSeparator)) + "*}"
	var mu sync.Mutex
	var keys []string
	err := s.forEachPrimary(ctx, func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for iter.Next(ctx) {
			mu.Lock()
			keys = append(keys, iter.Val())
			mu.Unlock()
		}
		return iter.Err()
	})
	return keys, err
}

// Keys returns every key under the Store's prefix.
func (s *Store) Keys(ctx context.Context) ([]string, error) {
	var mu sync.Mutex
	var keys []string
	err := s.forEachPrimary(ctx, func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, globEscape(s.prefix)+"*", 1000).Iterator()
		for iter.Next(ctx) {
			mu.Lock()
			keys = append(keys, iter.Val())
			mu.Unlock()
		}
		return iter.Err()
	})
	return keys, err
}

// DeleteAll deletes every key under the Store's prefix: one UNLINK per
// key (keys of any slot), pipelined 1,000 at a time.
func (s *Store) DeleteAll(ctx context.Context) error {
	keys, err := s.Keys(ctx)
	if err != nil {
		return err
	}
	for len(keys) > 0 {
		n := min(len(keys), 1000)
		if _, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, k := range keys[:n] {
				p.Unlink(ctx, k)
			}
			return nil
		}); err != nil {
			return err
		}
		keys = keys[n:]
	}
	return nil
}

func (s *Store) forEachPrimary(ctx context.Context, fn func(context.Context, *redis.Client) error) error {
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, fn)
	case *redis.Client:
		return fn(ctx, c)
	}
	return fmt.Errorf("test hooks support *redis.Client and *redis.ClusterClient, not %T", s.client)
}

// globEscape escapes the glob metacharacters of SCAN MATCH.
func globEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ConnectedReplicas exposes the INFO replication parser of FailoverRisk.
var ConnectedReplicas = connectedReplicas

// GiveBack runs the give-back of the acquire of consumer's id that issued
// token (step prefix prefix), as an acquire whose WAIT fell short does,
// and returns whether it changed the record.
func (s *Store) GiveBack(ctx context.Context, consumer, id string, token int64, prefix string) (bool, error) {
	rk, sk := s.recordAndStepsKeys(consumer, id)
	n, err := giveBackScript.Run(ctx, s.client, []string{rk, sk}, token, prefix).Int64()
	return n == 1, err
}
