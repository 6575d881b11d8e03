package idemredis

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/idemdriver"
)

var (
	_ idemdriver.Operator   = (*Store)(nil)
	_ idemdriver.StepReader = (*Store)(nil)
)

// retryScript: KEYS record. A failed record becomes retryable (in
// progress, released, attempt 0, token + 1, its lease ended now): 1; an
// in-progress one is left as it is: 2; a completed one: 3; none: 0.
var retryScript = redis.NewScript(luaPrelude + `
local state = tonumber(redis.call('HGET', KEYS[1], 'state'))
if not state then return 0 end
if state ~= 3 then return state == 1 and 2 or 3 end
local now = now_ms()
redis.call('HINCRBY', KEYS[1], 'token', 1)
redis.call('HSET', KEYS[1], 'state', 1, 'attempt', 0, 'released', 1, 'lease_until_ms', now, 'updated_ms', now)
return 1
`)

// releaseLeaseScript: KEYS record; ARGV token. Releases the attempt
// holding token, as its own release would (without an error text): 1;
// otherwise 0, changing nothing.
var releaseLeaseScript = redis.NewScript(luaPrelude + `
local ok = owns(KEYS[1], tonumber(ARGV[1]))
if not ok then return 0 end
local now = now_ms()
redis.call('HSET', KEYS[1], 'lease_until_ms', now, 'updated_ms', now, 'released', 1)
return 1
`)

// ListRecords implements [idemdriver.Operator] for failed records: it
// walks the consumer's retention index (where every completed or failed
// record is scored by its finish time) from the cursor down, examines at
// most p.Scan entries and reads their records in one pipeline. A record's
// ProcessedAt is its index score (millisecond precision). Redis keeps no
// index of the records in progress, so listing them is refused with an
// error matching [idemdriver.ErrUnsupported]: read one with its ID.
func (s *Store) ListRecords(ctx context.Context, p *idemdriver.ListRecordsParams) (idemdriver.RecordPage, error) {
	pos, err := idemdriver.ValidateListRecordsParams(p)
	if err != nil {
		return idemdriver.RecordPage{}, err
	}
	if p.State == idemdriver.StateInProgress {
		return idemdriver.RecordPage{}, fmt.Errorf("%w: idemredis keeps no index of the records in progress; inspect one by its ID", idemdriver.ErrUnsupported)
	}
	// Entries at the position's own millisecond may come before it (a
	// larger ID): ask for a few more than Scan, and drop them.
	const slack = 1000
	max := strconv.FormatInt(pos.At.UnixMilli(), 10)
	if pos.Key == "" {
		max = "+inf"
	}
	entries, err := s.client.ZRevRangeByScoreWithScores(ctx, s.consumerKey(p.Consumer, doneSuffix), &redis.ZRangeBy{
		Max: max, Min: "-inf", Count: int64(p.Scan + slack),
	}).Result()
	if err != nil {
		return idemdriver.RecordPage{}, err
	}
	var (
		window []redis.Z
		before int // entries after the position
	)
	for _, e := range entries {
		id, _ := e.Member.(string)
		if !pos.Before(time.UnixMilli(int64(e.Score)).UTC(), id) {
			continue
		}
		if before++; len(window) < p.Scan {
			window = append(window, e)
		}
	}
	// More entries follow the window when some were left out of it, or
	// when the read was cut at its count.
	more := before > len(window) || len(entries) == p.Scan+slack
	pipe := s.client.Pipeline()
	cmds := make([]*redis.MapStringStringCmd, len(window))
	for i, e := range window {
		cmds[i] = pipe.HGetAll(ctx, s.recordKey(p.Consumer, e.Member.(string)))
	}
	if len(window) > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return idemdriver.RecordPage{}, err
		}
	}
	recs := make([]idemdriver.Record, 0, len(window))
	for i, e := range window {
		r := recordOf(p.Consumer, e.Member.(string), cmds[i].Val())
		r.ProcessedAt = time.UnixMilli(int64(e.Score)).UTC()
		recs = append(recs, r)
	}
	return idemdriver.PageRecords(recs, p, more), nil
}

// recordOf reads a record hash (empty: a vanished record, state 0).
func recordOf(consumer, id string, h map[string]string) idemdriver.Record {
	n := func(k string) int64 { v, _ := strconv.ParseInt(h[k], 10, 64); return v }
	r := idemdriver.Record{
		Consumer: consumer, MessageID: id, Fingerprint: []byte(h["fingerprint"]),
		State: idemdriver.RecordState(n("state")), Token: n("token"), Attempt: int(n("attempt")), Error: h["last_error"],
	}
	at := n("finished_ms")
	if r.State == idemdriver.StateInProgress || at == 0 {
		// Its last takeover or release, else its creation (a record
		// acquired once has no updated_ms).
		at = cmp.Or(n("updated_ms"), n("created_ms"))
	}
	r.ProcessedAt = time.UnixMilli(at).UTC()
	if r.State == idemdriver.StateInProgress {
		r.LeaseExpiresAt = time.UnixMilli(n("lease_until_ms")).UTC()
	}
	if r.State == idemdriver.StateCompleted {
		r.Result, r.ContentType = []byte(h["result"]), h["content_type"]
	}
	return r
}

// read returns the record, or an error matching idemdriver.ErrNotFound.
func (s *Store) read(ctx context.Context, consumer, id string) (idemdriver.Record, error) {
	h, err := s.client.HGetAll(ctx, s.recordKey(consumer, id)).Result()
	if err != nil {
		return idemdriver.Record{}, err
	}
	if len(h) == 0 {
		return idemdriver.Record{}, fmt.Errorf("%w: consumer %q, message ID %q", idemdriver.ErrNotFound, consumer, id)
	}
	return recordOf(consumer, id, h), nil
}

// RetryRecord implements [idemdriver.Operator]: one script on the record.
func (s *Store) RetryRecord(ctx context.Context, consumer, messageID string) (idemdriver.ActionResult, error) {
	if err := idemdriver.ValidateKey(consumer, messageID); err != nil {
		return idemdriver.ActionResult{}, err
	}
	v, err := retryScript.Run(ctx, s.client, []string{s.recordKey(consumer, messageID)}).Int64()
	if err != nil {
		return idemdriver.ActionResult{}, err
	}
	if v == 0 {
		return idemdriver.ActionResult{}, fmt.Errorf("%w: consumer %q, message ID %q", idemdriver.ErrNotFound, consumer, messageID)
	}
	rec, err := s.read(ctx, consumer, messageID)
	if err != nil {
		return idemdriver.ActionResult{}, err
	}
	if v == 3 {
		return idemdriver.ActionResult{}, fmt.Errorf("%w: consumer %q, message ID %q is %s; only a failed record can be retried", idemdriver.ErrWrongState, consumer, messageID, rec.State)
	}
	return idemdriver.ActionResult{Changed: v == 1, Record: rec}, nil
}

// ReleaseLease implements [idemdriver.Operator]: one script on the
// record, fenced by the token as the holder's own release is.
func (s *Store) ReleaseLease(ctx context.Context, p *idemdriver.ReleaseLeaseParams) (idemdriver.ActionResult, error) {
	if err := idemdriver.ValidateReleaseLeaseParams(p); err != nil {
		return idemdriver.ActionResult{}, err
	}
	v, err := releaseLeaseScript.Run(ctx, s.client, []string{s.recordKey(p.Consumer, p.MessageID)}, p.Token).Int64()
	if err != nil {
		return idemdriver.ActionResult{}, err
	}
	rec, err := s.read(ctx, p.Consumer, p.MessageID)
	if err != nil {
		return idemdriver.ActionResult{}, err
	}
	if v == 0 {
		if err := idemdriver.CheckRelease(rec, p.Token); err != nil {
			return idemdriver.ActionResult{}, err
		}
	}
	return idemdriver.ActionResult{Changed: v == 1, Record: rec}, nil
}

// Steps implements [idemdriver.StepReader]: HGETALL of the record's hash
// and of its steps hash, in one pipeline; the steps are the record's own
// stepField fields when it has a layout (v), and otherwise, as an earlier
// version wrote them, its steps hash.
func (s *Store) Steps(ctx context.Context, consumer, messageID string) ([]idemdriver.Step, error) {
	if err := idemdriver.ValidateKey(consumer, messageID); err != nil {
		return nil, err
	}
	rk, sk := s.recordAndStepsKeys(consumer, messageID)
	var rec, legacy *redis.MapStringStringCmd
	if _, err := s.client.Pipelined(ctx, func(pl redis.Pipeliner) error {
		rec, legacy = pl.HGetAll(ctx, rk), pl.HGetAll(ctx, sk)
		return nil
	}); err != nil {
		return nil, err
	}
	h := legacy.Val()
	if r := rec.Val(); r["v"] != "" {
		h = make(map[string]string)
		for f, v := range r {
			if name, ok := strings.CutPrefix(f, stepField); ok {
				h[name] = v
			}
		}
	}
	out := make([]idemdriver.Step, 0, len(h))
	for _, name := range slices.Sorted(maps.Keys(h)) {
		out = append(out, idemdriver.Step{Name: name, Result: []byte(h[name])})
	}
	return out, nil
}
