package idemredis

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/idemdriver"
)

var _ idemdriver.Reopener = (*Store)(nil)

// reopenScript: KEYS record, steps; ARGV token. A record completed by
// token becomes retryable (in progress, released, attempt 0, token + 1,
// its lease ended now, its result and completion time gone) and its steps
// are deleted, of either layout (the record's own stepField fields and
// its steps hash): 1. Otherwise nothing changes: 2, or 0 when there is no
// record. Its entry in the consumer's retention index stays, as a retried
// record's does: retention never deletes a record in progress, and the
// next completion scores the entry again.
var reopenScript = redis.NewScript(luaPrelude + `
local r = redis.call('HMGET', KEYS[1], 'state', 'token')
if not r[1] then return 0 end
if tonumber(r[1]) ~= 2 or tonumber(r[2]) ~= tonumber(ARGV[1]) then return 2 end
local now = now_ms()
redis.call('HINCRBY', KEYS[1], 'token', 1)
redis.call('HSET', KEYS[1], 'state', 1, 'attempt', 0, 'released', 1, 'lease_until_ms', now, 'updated_ms', now)
local gone = {'result', 'content_type', 'finished_ms'}
for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
	if string.sub(f, 1, 2) == '` + stepField + `' then gone[#gone + 1] = f end
end
redis.call('HDEL', KEYS[1], unpack(gone))
redis.call('DEL', KEYS[2])
return 1
`)

// ReopenRecord implements [idemdriver.Reopener]: one script on the
// record and its steps (one hash slot), then a read of the record.
func (s *Store) ReopenRecord(ctx context.Context, p *idemdriver.ReopenRecordParams) (idemdriver.ActionResult, error) {
	if err := idemdriver.ValidateReopenRecordParams(p); err != nil {
		return idemdriver.ActionResult{}, err
	}
	rk, sk := s.recordAndStepsKeys(p.Consumer, p.MessageID)
	v, err := s.run(ctx, reopenScript, []string{rk, sk}, p.Token).Int64()
	if err != nil {
		return idemdriver.ActionResult{}, err
	}
	if v == 0 {
		return idemdriver.ActionResult{}, fmt.Errorf("%w: consumer %q, message ID %q", idemdriver.ErrNotFound, p.Consumer, p.MessageID)
	}
	rec, err := s.read(ctx, p.Consumer, p.MessageID)
	if err != nil {
		return idemdriver.ActionResult{}, err
	}
	if v != 1 {
		if err := idemdriver.CheckReopen(rec, p.Token); err != nil {
			return idemdriver.ActionResult{}, err
		}
	}
	return idemdriver.ActionResult{Changed: v == 1, Record: rec}, nil
}
