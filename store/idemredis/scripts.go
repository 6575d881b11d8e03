package idemredis

import "github.com/redis/go-redis/v9"

// The Lua scripts. Each runs atomically on the Redis server and touches
// only keys of one hash slot: a record's hash and its steps hash, or one
// of a consumer's keys (its index, its runs, its purge lock). Times are milliseconds since the Unix epoch
// by the server's clock (TIME), the one unit of every stored time and of
// every duration passed in; expiries are compared with >=, so a lease that
// ends at now has run out.
//
// Record fields: state (1 in_progress, 2 completed, 3 failed, as
// idemdriver.RecordState), fingerprint, token, attempt, lease_until_ms,
// released (present once the attempt holding token has released),
// result, content_type, last_error, created_ms, updated_ms, finished_ms,
// and v, the layout: a record that acquireScript created since v was
// introduced has v = 2 and keeps its recovery points in its own hash, as
// fields stepField .. name; a record without v (written by an earlier
// version) keeps them in its steps hash, name -> result, and is left so.
// A steps hash beside a record with v is never read: it can only be a
// leftover of an earlier record of the same key deleted by hand.
//
// A fenced script (renew, complete, release, step) answers {1, ...} (the
// complete scripts a plain 1) when the token owns the record, and otherwise {0, state, token, released}
// (state 0: no record), which the Go side turns into idemdriver.ErrLeaseLost.
//
// The scripts of a message's two round trips (acquireScript and the
// complete scripts) are written for the server's time per call, which
// grows with every redis.call and with every field read or written: no
// helper functions; a new record is created by TIME, EXISTS and one HSET
// of its fields and its run point, with no other key and no updated_ms
// (a record's updated_ms is its last takeover or release; readers fall
// back to created_ms); a completion is HMGET, TIME, the index's ZADD and
// one HSET of four fields. Numbers go to redis.call as strings where
// that is cheap, because Redis formats every Lua number argument with
// "%.17g", about 1,000 server instructions each: the constants are
// written as strings, and the time in milliseconds that is written as
// it is (created_ms, finished_ms, the index's score) is TIME's seconds
// followed by its milliseconds as three digits, the digits the number
// would have. string.format('%d') of the whole time would be a little
// cheaper, but it formats a C long, 32 bits on some platforms. The two
// scripts of a message went from 163k to 147k server instructions
// (callgrind, docs/benchmarks.md, stop 42). Reading numbers costs too: Lua
// turns a string into a number with the C library's strtod, and each
// conversion is hundreds of instructions, so acquireScript converts
// TIME's microseconds once, and the complete scripts convert nothing on
// the way to a completion: their time is TIME's seconds followed by the
// thousands digits of its microseconds (TIME writes them in decimal
// without leading zeros, below 1,000,000, so the three digits before the
// last three of the microseconds padded to six are the milliseconds
// '%03d' would write), and they test ownership by comparing the stored
// state and token with '1' and the caller's token as strings (a token is
// written in decimal, as the caller sends it), converting them to numbers
// only when the strings differ: an equal string settles it, and a
// different one is compared as a number as before. That took 6.5k of the
// 135k server instructions of a new message (docs/benchmarks.md, stop 45).

// stepField starts the field of a recovery point in a record hash of
// layout 2 (v = 2); no other record field starts with it.
const stepField = "s:"

// luaPrelude defines what the other scripts share.
const luaPrelude = `
local function now_ms()
	local t = redis.call('TIME')
	return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- owns reports whether token owns the record at key: in progress, same
-- token, not released. An expired lease is still owned until a takeover.
-- When it does, its second value is the record's v (nil: layout 1).
local function owns(key, token)
	local r = redis.call('HMGET', key, 'state', 'token', 'released', 'v')
	if not r[1] then
		return false, {0, 0, 0, 0}
	end
	local state, tok = tonumber(r[1]), tonumber(r[2])
	if state ~= 1 or tok ~= token or r[3] then
		return false, {0, state, tok, r[3] and 1 or 0}
	end
	return true, r[4]
end
-- save_step saves the step name with result unless it exists (HSETNX):
-- in the record hash KEYS[1] when v is set, else in the steps hash KEYS[2].
local function save_step(v, name, result)
	if v then
		redis.call('HSETNX', KEYS[1], '` + stepField + `' .. name, result)
	else
		redis.call('HSETNX', KEYS[2], name, result)
	end
end
`

// acquireScript: KEYS record, steps; ARGV fingerprint, lease (ms), step
// prefix ("" for none). Creates the record (token 1, attempt 1, layout 2,
// with the point prefix..1 and an empty result when a prefix is given):
// 1, a plain integer, the cheapest reply to send and read; or takes over
// an in_progress record whose lease ended and whose fingerprint matches
// (token and attempt + 1, its steps returned, as they were before this
// script, and with a prefix the point prefix..token saved unless it
// exists): {1, token, attempt, steps}. Otherwise reports the record: {0,
// state, attempt, fingerprint, lease remaining (ms), result, content
// type, last error}.
var acquireScript = redis.NewScript(acquireLua)

const acquireLua = `
local t = redis.call('TIME')
local ms = math.floor(t[2] / 1000)
local now = t[1] * 1000 + ms
if redis.call('EXISTS', KEYS[1]) == 0 then
	local now_ms = t[1] .. string.format('%03d', ms)
	if ARGV[3] == '' then
		redis.call('HSET', KEYS[1], 'state', '1', 'fingerprint', ARGV[1], 'token', '1', 'attempt', '1',
			'lease_until_ms', now + ARGV[2], 'created_ms', now_ms, 'v', '2')
	else
		redis.call('HSET', KEYS[1], 'state', '1', 'fingerprint', ARGV[1], 'token', '1', 'attempt', '1',
			'lease_until_ms', now + ARGV[2], 'created_ms', now_ms, 'v', '2',
			'` + stepField + `' .. ARGV[3] .. '1', '')
	end
	return 1
end
local r = redis.call('HMGET', KEYS[1], 'state', 'fingerprint', 'token', 'attempt',
	'lease_until_ms', 'result', 'content_type', 'last_error', 'v')
local state = tonumber(r[1])
local lease_until = tonumber(r[5]) or 0
if state == 1 and now >= lease_until and r[2] == ARGV[1] then
	local token = tonumber(r[3]) + 1
	local attempt = tonumber(r[4]) + 1
	redis.call('HSET', KEYS[1], 'token', token, 'attempt', attempt,
		'lease_until_ms', now + ARGV[2], 'updated_ms', now)
	redis.call('HDEL', KEYS[1], 'released')
	local point = ARGV[3] .. string.format('%d', token)
	local steps
	if r[9] then
		steps = {}
		local h = redis.call('HGETALL', KEYS[1])
		for i = 1, #h, 2 do
			if string.sub(h[i], 1, 2) == '` + stepField + `' then
				steps[#steps + 1] = string.sub(h[i], 3)
				steps[#steps + 1] = h[i + 1]
			end
		end
		if ARGV[3] ~= '' then redis.call('HSETNX', KEYS[1], '` + stepField + `' .. point, '') end
	else
		steps = redis.call('HGETALL', KEYS[2])
		if ARGV[3] ~= '' then redis.call('HSETNX', KEYS[2], point, '') end
	end
	return {1, token, attempt, steps}
end
local remaining = 0
if state == 1 and lease_until > now then
	remaining = lease_until - now
end
return {0, state, tonumber(r[4]) or 0, r[2] or '', remaining, r[6] or '', r[7] or '', r[8] or ''}
`

// giveBackScript: KEYS record, steps; ARGV token, step prefix ("" for
// none). Undoes the acquire that issued token, when the record is still
// in progress under that token and not released (otherwise it changes
// nothing: another holder may have taken the record since): a record that
// acquire created (token 1) is deleted with its steps; a takeover's lease
// ends now, released, its attempt count goes back by one, and its point
// prefix..token is deleted, from whichever hash of either layout holds it
// (the token is not issued again: the next takeover gets token + 1).
// Returns 1 when it gave back, 0 otherwise.
var giveBackScript = redis.NewScript(luaPrelude + `
local r = redis.call('HMGET', KEYS[1], 'state', 'token', 'released', 'attempt')
if not r[1] or tonumber(r[1]) ~= 1 or tonumber(r[2]) ~= tonumber(ARGV[1]) or r[3] then return 0 end
if tonumber(r[2]) == 1 then
	redis.call('DEL', KEYS[1], KEYS[2])
	return 1
end
if ARGV[2] ~= '' then
	redis.call('HDEL', KEYS[1], '` + stepField + `' .. ARGV[2] .. ARGV[1])
	redis.call('HDEL', KEYS[2], ARGV[2] .. ARGV[1])
end
local now = now_ms()
redis.call('HSET', KEYS[1], 'attempt', math.max(0, (tonumber(r[4]) or 1) - 1),
	'lease_until_ms', now, 'updated_ms', now, 'released', 1)
return 1
`)

// renewScript: KEYS record; ARGV token, lease (ms). The lease ends lease
// after now.
var renewScript = redis.NewScript(renewLua)

var renewLua = luaPrelude + `
local ok, lost = owns(KEYS[1], tonumber(ARGV[1]))
if not ok then return lost end
redis.call('HSET', KEYS[1], 'lease_until_ms', now_ms() + tonumber(ARGV[2]))
return {1}
`

// completeScript: KEYS record; ARGV token, result, content type. Updates
// fields (the fingerprint, attempt and steps stay): 1, a plain integer.
// The same completion repeated by the token that completed the record
// (its reply was lost) answers 1 too and changes nothing.
var completeScript = redis.NewScript(completeLua(""))

// completeIndexScript is completeScript and indexScript in one script,
// for a single Redis server (no Cluster), where a script may touch keys
// of any slot: KEYS record, consumer index; ARGV token, result, content
// type, message ID. The ID is indexed, at the completion's now, only when
// the token owns the record: 1.
var completeIndexScript = redis.NewScript(completeIndexLua)

var completeIndexLua = completeLua(`redis.call('ZADD', KEYS[2], now, ARGV[4])`)

// acquireEval and completeIndexEval are acquireScript and
// completeIndexScript for Store.eval and the batches: one call of each
// per message; renewEval is renewScript for RenewBatch.
var (
	acquireEval       = newEvalScript(acquireScript, acquireLua)
	completeIndexEval = newEvalScript(completeIndexScript, completeIndexLua)
	renewEval         = newEvalScript(renewScript, renewLua)
)

// millisDigitsLua is Lua for the three digits of the milliseconds of t,
// a reply of TIME: the thousands digits of its microseconds, t[2], which
// TIME writes in decimal without leading zeros and below 1,000,000
// ("5023" is "005"), without converting them to a number.
const millisDigitsLua = `string.sub('00000' .. t[2], -6, -4)`

// completeLua is the body of the complete scripts: also runs index (Lua,
// with now set: the server's time in milliseconds, as a string) when the
// token owns the record, before completing it.
// The ownership test is owns's, written out, with the strings compared
// first (see the top of this file); a record that is completed
// by this token with this very result and content type is a Complete
// repeated because the reply of the one that landed was lost (a cut
// connection), and answers 1. Only state, result, content_type and
// finished_ms are written: a completed record has no lease, and its time
// is finished_ms.
func completeLua(index string) string {
	return `
local r = redis.call('HMGET', KEYS[1], 'state', 'token', 'released')
if r[1] ~= '1' or r[2] ~= ARGV[1] or r[3] then
	local token = tonumber(ARGV[1])
	local state, tok = tonumber(r[1]), tonumber(r[2])
	if state ~= 1 or tok ~= token or r[3] then
		if not r[1] then return {0, 0, 0, 0} end
		if state == 2 and tok == token then
			local d = redis.call('HMGET', KEYS[1], 'result', 'content_type')
			if d[1] == ARGV[2] and d[2] == ARGV[3] then return 1 end
		end
		return {0, state, tok, r[3] and 1 or 0}
	end
end
local t = redis.call('TIME')
local now = t[1] .. ` + millisDigitsLua + `
` + index + `
redis.call('HSET', KEYS[1], 'state', '2', 'result', ARGV[2], 'content_type', ARGV[3], 'finished_ms', now)
return 1
`
}

// releaseScript: KEYS record, steps; ARGV token, error text, terminal ("1"
// or "0"), step ("" for none). Ends the lease now and keeps the error;
// terminal makes the record failed; a step is saved (empty result) unless
// it exists: {1, now}.
var releaseScript = redis.NewScript(luaPrelude + `
local ok, v = owns(KEYS[1], tonumber(ARGV[1]))
if not ok then return v end
if ARGV[4] ~= '' then save_step(v, ARGV[4], '') end
local now = now_ms()
redis.call('HSET', KEYS[1], 'last_error', ARGV[2], 'lease_until_ms', now, 'updated_ms', now, 'released', 1)
if ARGV[3] == '1' then
	redis.call('HSET', KEYS[1], 'state', 3, 'finished_ms', now)
end
return {1, now}
`)

// stepScript: KEYS record, steps; ARGV token, step name, result. A step
// already saved keeps its first result: {1}.
var stepScript = redis.NewScript(luaPrelude + `
local ok, v = owns(KEYS[1], tonumber(ARGV[1]))
if not ok then return v end
save_step(v, ARGV[2], ARGV[3])
return {1}
`)

// indexScript: KEYS consumer index; ARGV message ID. Scores the ID with
// the index server's now, before its record is completed or failed, and
// returns that time.
var indexScript = redis.NewScript(luaPrelude + `
local now = now_ms()
redis.call('ZADD', KEYS[1], now, ARGV[1])
return now
`)

// purgeRecordScript: KEYS record, steps; ARGV horizon (ms), "1" to
// delete or "0" to only look. Returns 0 when there is no record, 1 when it
// is completed or failed and was written before the horizon (and, with
// "1", was deleted with its steps), 2 when it stays: in progress, however
// old, or written at or after the horizon. A record's time is finished_ms,
// the time of the Complete or terminal Release that settled it.
var purgeRecordScript = redis.NewScript(`
local r = redis.call('HMGET', KEYS[1], 'state', 'finished_ms', 'updated_ms', 'created_ms')
local state = tonumber(r[1])
if not state then return 0 end
local at = tonumber(r[2]) or tonumber(r[3]) or tonumber(r[4]) or 0
if (state == 2 or state == 3) and at < tonumber(ARGV[1]) then
	if ARGV[2] == '1' then redis.call('UNLINK', KEYS[1], KEYS[2]) end
	return 1
end
return 2
`)

// unindexScript: KEYS consumer index; ARGV id1, score1, id2, score2, ...
// Removes each ID whose score is still the one given (an ID completed
// again since keeps its new entry) and returns how many it removed.
var unindexScript = redis.NewScript(`
local n = 0
for i = 1, #ARGV, 2 do
	local s = redis.call('ZSCORE', KEYS[1], ARGV[i])
	if s and tonumber(s) == tonumber(ARGV[i + 1]) then
		redis.call('ZREM', KEYS[1], ARGV[i])
		n = n + 1
	end
end
return n
`)

// lockRefreshScript: KEYS lock; ARGV holder, ttl (ms). Extends the lock
// if holder holds it, or takes it again if it expired and nobody else
// took it: 1; when another holder has it: 0.
var lockRefreshScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
	redis.call('PEXPIRE', KEYS[1], ARGV[2])
	return 1
end
if not v then
	redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
	return 1
end
return 0
`)

// unlockScript: KEYS lock; ARGV holder. Deletes the lock if holder holds it.
var unlockScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
	return redis.call('DEL', KEYS[1])
end
return 0
`)

// markRunningScript: KEYS consumer runs; ARGV max gap (µs, 0 for none).
// The runs are a sorted set whose members are "start:end" in microseconds
// (TIME's resolution, so that marks in one millisecond still make distinct
// runs) scored by end, so the newest run is the last. If it ended no more
// than the max gap before now it is extended to now (1); otherwise, and
// always with a max gap of 0, a run [now, now] is added (2). Numbers are
// written with %.0f: Lua's default format would round 16 digits.
var markRunningScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function us(x) return string.format('%.0f', x) end
local gap = tonumber(ARGV[1])
if gap > 0 then
	local last = redis.call('ZRANGE', KEYS[1], -1, -1)[1]
	if last then
		local s, e = string.match(last, '^(%-?%d+):(%-?%d+)$')
		e = tonumber(e)
		if e and now <= e + gap then
			if now > e then
				redis.call('ZREM', KEYS[1], last)
				redis.call('ZADD', KEYS[1], us(now), s .. ':' .. us(now))
			end
			return 1
		end
	end
end
redis.call('ZADD', KEYS[1], us(now), us(now) .. ':' .. us(now))
return 2
`)
