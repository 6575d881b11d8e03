package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// handOpener returns how the hand-written sidecar opens its store for a
// run on the store named name at url: PostgreSQL in a table named after
// the run, Redis under a key prefix of the run's, SQLite in a file of the
// run's (STORE in url's path replaced by the run's tag); nil on another
// store.
func handOpener(name, url string) func(ctx context.Context, tag string) (handStore, error) {
	switch name {
	case "postgres":
		return func(ctx context.Context, tag string) (handStore, error) { return newHandPG(ctx, url, tag) }
	case "redis":
		return func(ctx context.Context, tag string) (handStore, error) { return newHandRedis(url, tag+":") }
	case "sqlite":
		return func(ctx context.Context, tag string) (handStore, error) {
			return newHandSQLite(ctx, strings.TrimPrefix(strings.ReplaceAll(url, "STORE", tag), "sqlite:"))
		}
	}
	return nil
}

// handRedis is handStore on Redis (go-redis): a hash per message at
// prefix + ID, with the fields fp (fingerprint), state, token, lease
// (the lease's end, in Unix milliseconds of the server's clock) and
// started (the recovery point: the token whose call may have started,
// "" for none). A claim and an outcome batch are one script each (one
// round trip; EVALSHA, EVAL once per connection when Redis lacks it),
// atomic on the server. Its durability is the server's (AOF settings).
type handRedis struct {
	rdb    *redis.Client
	prefix string
}

// newHandRedis connects to the Redis at url.
func newHandRedis(url, prefix string) (*handRedis, error) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	return &handRedis{rdb: redis.NewClient(opt), prefix: prefix}, nil
}

// handRedisClaim is claim's script: KEYS the records, ARGV[1] the lease
// (ms), ARGV[1+i] the fingerprint of KEYS[i]; one {acquired, token,
// state} per key, as the PostgreSQL claim judges it.
var handRedisClaim = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = now + tonumber(ARGV[1])
local out = {}
for i, k in ipairs(KEYS) do
	local fp = ARGV[i + 1]
	local r = redis.call('HMGET', k, 'fp', 'state', 'token', 'lease', 'started')
	if not r[1] then
		redis.call('HSET', k, 'fp', fp, 'state', 1, 'token', 1, 'lease', lease, 'started', 1)
		out[i] = {1, 1, 1}
	elseif r[1] ~= fp then
		out[i] = {0, tonumber(r[3]), 4}
	elseif r[2] == '1' and tonumber(r[4]) <= now then
		local tok = tonumber(r[3]) + 1
		if r[5] ~= '' then
			redis.call('HSET', k, 'state', 3, 'token', tok)
			out[i] = {0, tok, 3}
		else
			redis.call('HSET', k, 'token', tok, 'lease', lease, 'started', tok)
			out[i] = {1, tok, 1}
		end
	else
		out[i] = {0, tonumber(r[3]), tonumber(r[2])}
	end
end
return out`)

// handRedisFinish is finish's script: KEYS the records, ARGV[2i-1] and
// ARGV[2i] the token and the outcome's state of KEYS[i], the last ARGV
// the retention window (ms): a record finished for good expires after it
// (Redis's own purge); 1 per key recorded (its token owns it, held), 0
// per key refused.
var handRedisFinish = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i, k in ipairs(KEYS) do
	local r = redis.call('HMGET', k, 'state', 'token')
	if r[1] == '1' and r[2] == ARGV[2 * i - 1] then
		if ARGV[2 * i] == '1' then
			redis.call('HSET', k, 'lease', now, 'started', '')
		else
			redis.call('HSET', k, 'state', ARGV[2 * i], 'lease', now)
			redis.call('PEXPIRE', k, ARGV[2 * #KEYS + 1])
		end
		out[i] = 1
	else
		out[i] = 0
	end
end
return out`)

func (s *handRedis) claim(ctx context.Context, msgs []handMsg, lease time.Duration) (map[string]handClaim, error) {
	keys := make([]string, len(msgs))
	args := make([]any, 1, 1+len(msgs))
	args[0] = lease.Milliseconds()
	for i, m := range msgs {
		keys[i] = s.prefix + m.id
		args = append(args, m.fingerprint)
	}
	v, err := handRedisClaim.Run(ctx, s.rdb, keys, args...).Slice()
	if err != nil {
		return nil, err
	}
	got := make(map[string]handClaim, len(msgs))
	for i, x := range v {
		r, ok := x.([]any)
		if !ok || len(r) != 3 || i >= len(msgs) {
			return nil, fmt.Errorf("redis: claim answered %v", x)
		}
		acq, _ := r[0].(int64)
		tok, _ := r[1].(int64)
		st, _ := r[2].(int64)
		got[msgs[i].id] = handClaim{token: tok, state: int16(st), acquired: acq == 1}
	}
	return got, nil
}

func (s *handRedis) finish(ctx context.Context, outs []handOutcome) (map[string]bool, error) {
	keys := make([]string, len(outs))
	args := make([]any, 0, 2*len(outs))
	for i, o := range outs {
		keys[i] = s.prefix + o.id
		args = append(args, strconv.FormatInt(o.token, 10), strconv.Itoa(int(o.state)))
	}
	args = append(args, handRetention.Milliseconds())
	v, err := handRedisFinish.Run(ctx, s.rdb, keys, args...).Int64Slice()
	if err != nil {
		return nil, err
	}
	done := make(map[string]bool, len(outs))
	for i, x := range v {
		if x == 1 && i < len(outs) {
			done[outs[i].id] = true
		}
	}
	return done, nil
}

func (s *handRedis) close() { _ = s.rdb.Close() }
