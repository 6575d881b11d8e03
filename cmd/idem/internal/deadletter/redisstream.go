package deadletter

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/broker/idemredisstream"
	"github.com/idem-go/idem/cmd/idem/internal/console"
)

// RedisStreams reads dead letters from the dead-letter streams
// idemredisstream adds them to.
type RedisStreams struct {
	rdb          redis.UniversalClient
	where        string
	payloadField string
}

// NewRedisStreams returns the dead letters of rdb; where names the server
// without credentials. The payload is the field
// idemredisstream.DefaultPayloadField; the other fields are headers.
func NewRedisStreams(rdb redis.UniversalClient, where string) *RedisStreams {
	return &RedisStreams{rdb: rdb, where: where, payloadField: idemredisstream.DefaultPayloadField}
}

// Where names the server.
func (r *RedisStreams) Where() string { return r.where }

// exists returns an error matching console.ErrNoDeadLetters when dest is
// no stream.
func (r *RedisStreams) exists(ctx context.Context, dest string) error {
	t, err := r.rdb.Type(ctx, dest).Result()
	if err != nil {
		return err
	}
	switch t {
	case "stream":
		return nil
	case "none":
		return fmt.Errorf("%w: Redis has no stream %q (no dead letter yet, or another name)", console.ErrNoDeadLetters, dest)
	}
	return fmt.Errorf("%w: Redis key %q is a %s, not a stream", console.ErrNoDeadLetters, dest, t)
}

// Newest is one XREVRANGE from before (exclusive).
func (r *RedisStreams) Newest(ctx context.Context, dest, before string, n int) ([]console.DeadLetter, string, error) {
	if err := r.exists(ctx, dest); err != nil {
		return nil, "", err
	}
	end := "+"
	if before != "" {
		if _, _, ok := strings.Cut(before, "-"); !ok {
			return nil, "", fmt.Errorf("%w: position %q is not a stream entry ID", console.ErrBadAction, before)
		}
		end = "(" + before
	}
	ms, err := r.rdb.XRevRangeN(ctx, dest, end, "-", int64(n)).Result()
	if err != nil {
		return nil, "", err
	}
	out := make([]console.DeadLetter, 0, len(ms))
	for _, m := range ms {
		out = append(out, r.letter(dest, m))
	}
	next := ""
	if len(ms) == n && n > 0 {
		next = ms[len(ms)-1].ID
	}
	return out, next, nil
}

// Get is one XRANGE of the entry pos.
func (r *RedisStreams) Get(ctx context.Context, dest, pos string) (console.DeadLetter, error) {
	if _, _, ok := strings.Cut(pos, "-"); !ok {
		return console.DeadLetter{}, fmt.Errorf("%w: position %q is not a stream entry ID", console.ErrBadAction, pos)
	}
	if err := r.exists(ctx, dest); err != nil {
		return console.DeadLetter{}, err
	}
	ms, err := r.rdb.XRange(ctx, dest, pos, pos).Result()
	if err != nil {
		return console.DeadLetter{}, err
	}
	if len(ms) == 0 {
		return console.DeadLetter{}, fmt.Errorf("%w: %s has no entry %s", console.ErrNoDeadLetter, dest, pos)
	}
	return r.letter(dest, ms[0]), nil
}

// letter is the dead letter m of dest: its ID's milliseconds are when it
// was added.
func (r *RedisStreams) letter(dest string, m redis.XMessage) console.DeadLetter {
	dl := console.DeadLetter{Position: m.ID, Destination: dest}
	if ms, _, ok := strings.Cut(m.ID, "-"); ok {
		if n, err := strconv.ParseInt(ms, 10, 64); err == nil {
			dl.At = time.UnixMilli(n)
		}
	}
	h := map[string]string{}
	for k, v := range m.Values {
		s := fmt.Sprint(v)
		switch k {
		case r.payloadField:
			dl.Payload = []byte(s)
		case idemredisstream.FieldOriginalStream:
			dl.Source = s
		default:
			h[k] = s
		}
	}
	if e, ok := h[idemredisstream.FieldOriginalEntry]; ok && dl.Source != "" {
		dl.Original = dl.Source + "/" + e
	}
	console.FromHeaders(&dl, h)
	return dl
}

// Replayable is always nil: a stream keeps every entry added.
func (r *RedisStreams) Replayable(context.Context, console.DeadLetter) error { return nil }

// Republish adds the original's fields (its message ID field among them,
// as the original had it) to the source stream.
func (r *RedisStreams) Republish(ctx context.Context, dl console.DeadLetter) (string, error) {
	if t, err := r.rdb.Type(ctx, dl.Source).Result(); err == nil && t != "stream" && t != "none" {
		return "", fmt.Errorf("%w: the source %q is no stream (%s)", console.ErrNotReplayable, dl.Source, t)
	}
	values := make([]any, 0, 2*len(dl.Headers)+2)
	for k, v := range dl.Headers {
		values = append(values, k, v)
	}
	values = append(values, r.payloadField, string(dl.Payload))
	id, err := r.rdb.XAdd(ctx, &redis.XAddArgs{Stream: dl.Source, Values: values}).Result()
	if err != nil {
		return "", err
	}
	return "entry " + id, nil
}
