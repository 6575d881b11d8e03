package deadletter

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem/broker/idemkafka"
	"github.com/idem-go/idem/cmd/idem/internal/console"
)

// Kafka reads dead letters from the dead-letter topics idemkafka produces
// to, with a client of no consumer group reading partitions from given
// offsets (nothing is committed, nothing is taken), and republishes with
// cl.
type Kafka struct {
	cl    *kgo.Client
	adm   *kadm.Client
	opts  []kgo.Opt
	where string
}

// readTimeout bounds one read of a topic's partitions.
const readTimeout = 10 * time.Second

// NewKafka returns the dead letters behind cl (a client of no group, used
// to list offsets and to produce replays); opts are the options of the
// reading clients (the seed brokers, TLS, SASL); where names the cluster
// without credentials.
func NewKafka(cl *kgo.Client, where string, opts ...kgo.Opt) *Kafka {
	return &Kafka{cl: cl, adm: kadm.NewClient(cl), opts: opts, where: where}
}

// Where names the cluster.
func (k *Kafka) Where() string { return k.where }

// bounds returns each partition's start and end offsets of topic, or an
// error matching console.ErrNoDeadLetters when the topic does not exist.
func (k *Kafka) bounds(ctx context.Context, topic string) (start, end map[int32]int64, err error) {
	starts, err := k.adm.ListStartOffsets(ctx, topic)
	if err != nil {
		return nil, nil, err
	}
	ends, err := k.adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, nil, err
	}
	if len(ends[topic]) == 0 {
		return nil, nil, fmt.Errorf("%w: Kafka has no topic %q", console.ErrNoDeadLetters, topic)
	}
	start, end = map[int32]int64{}, map[int32]int64{}
	var lerr error
	starts.Each(func(o kadm.ListedOffset) { start[o.Partition] = o.Offset; lerr = errors.Join(lerr, o.Err) })
	ends.Each(func(o kadm.ListedOffset) { end[o.Partition] = o.Offset; lerr = errors.Join(lerr, o.Err) })
	return start, end, lerr
}

// read returns the records of topic in [from[p], to[p]) of each
// partition p, reading with a client of no group.
func (k *Kafka) read(ctx context.Context, topic string, from, to map[int32]int64) ([]*kgo.Record, error) {
	want := map[int32]kgo.Offset{}
	for p, lo := range from {
		if lo < to[p] {
			want[p] = kgo.NewOffset().At(lo)
		}
	}
	if len(want) == 0 {
		return nil, nil
	}
	cl, err := kgo.NewClient(append(append([]kgo.Opt(nil), k.opts...), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: want}))...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	var out []*kgo.Record
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("reading %s: %w", topic, err)
		}
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) { ferr = errors.Join(ferr, err) })
		if ferr != nil {
			return nil, ferr
		}
		fs.EachRecord(func(r *kgo.Record) {
			if _, ok := want[r.Partition]; !ok || r.Offset >= to[r.Partition] {
				return
			}
			out = append(out, r)
			if r.Offset >= to[r.Partition]-1 {
				delete(want, r.Partition)
			}
		})
	}
	return out, nil
}

// Newest reads, from each partition, at most n records below the cursor
// before (each partition's end offset when ""), and returns the n newest
// of them by timestamp. The cursor is each partition's offset to continue
// below: "p:offset,...".
func (k *Kafka) Newest(ctx context.Context, dest, before string, n int) ([]console.DeadLetter, string, error) {
	start, end, err := k.bounds(ctx, dest)
	if err != nil {
		return nil, "", err
	}
	if before != "" {
		if end, err = parseCursor(before, end); err != nil {
			return nil, "", err
		}
	}
	from := map[int32]int64{}
	for p, hi := range end {
		from[p] = max(start[p], hi-int64(n))
	}
	recs, err := k.read(ctx, dest, from, end)
	if err != nil {
		return nil, "", err
	}
	sort.Slice(recs, func(i, j int) bool {
		if !recs[i].Timestamp.Equal(recs[j].Timestamp) {
			return recs[i].Timestamp.After(recs[j].Timestamp)
		}
		if recs[i].Partition != recs[j].Partition {
			return recs[i].Partition < recs[j].Partition
		}
		return recs[i].Offset > recs[j].Offset
	})
	if len(recs) > n {
		recs = recs[:n]
	}
	out := make([]console.DeadLetter, 0, len(recs))
	next := map[int32]int64{}
	for p, hi := range end {
		next[p] = hi
	}
	for _, r := range recs {
		out = append(out, kafkaLetter(dest, r))
		next[r.Partition] = min(next[r.Partition], r.Offset)
	}
	more := false
	parts := make([]string, 0, len(next))
	for p, o := range next {
		more = more || o > start[p]
		parts = append(parts, fmt.Sprintf("%d:%d", p, o))
	}
	if !more || len(recs) < n {
		return out, "", nil
	}
	sort.Strings(parts)
	return out, strings.Join(parts, ","), nil
}

// parseCursor reads a Newest cursor; partitions it does not name keep
// their offsets in end.
func parseCursor(c string, end map[int32]int64) (map[int32]int64, error) {
	out := map[int32]int64{}
	for p, o := range end {
		out[p] = o
	}
	for part := range strings.SplitSeq(c, ",") {
		ps, os, ok := strings.Cut(part, ":")
		p, err1 := strconv.ParseInt(ps, 10, 32)
		o, err2 := strconv.ParseInt(os, 10, 64)
		if !ok || err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%w: cursor %q is not one a page printed", console.ErrBadAction, c)
		}
		if _, known := out[int32(p)]; known {
			out[int32(p)] = min(out[int32(p)], o)
		}
	}
	return out, nil
}

// Get reads the record at position "partition/offset" of dest.
func (k *Kafka) Get(ctx context.Context, dest, pos string) (console.DeadLetter, error) {
	ps, os, ok := strings.Cut(pos, "/")
	p, err1 := strconv.ParseInt(ps, 10, 32)
	o, err2 := strconv.ParseInt(os, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return console.DeadLetter{}, fmt.Errorf("%w: position %q is not PARTITION/OFFSET", console.ErrBadAction, pos)
	}
	start, end, err := k.bounds(ctx, dest)
	if err != nil {
		return console.DeadLetter{}, err
	}
	hi, known := end[int32(p)]
	if !known || o < start[int32(p)] || o >= hi {
		return console.DeadLetter{}, fmt.Errorf("%w: %s has no record at partition %d offset %d", console.ErrNoDeadLetter, dest, p, o)
	}
	recs, err := k.read(ctx, dest, map[int32]int64{int32(p): o}, map[int32]int64{int32(p): o + 1})
	if err != nil {
		return console.DeadLetter{}, err
	}
	if len(recs) != 1 || recs[0].Offset != o {
		return console.DeadLetter{}, fmt.Errorf("%w: %s has no record at partition %d offset %d", console.ErrNoDeadLetter, dest, p, o)
	}
	return kafkaLetter(dest, recs[0]), nil
}

// kafkaLetter is the dead letter r of dest.
func kafkaLetter(dest string, r *kgo.Record) console.DeadLetter {
	dl := console.DeadLetter{Position: fmt.Sprintf("%d/%d", r.Partition, r.Offset), Destination: dest, At: r.Timestamp, Payload: r.Value, Key: r.Key}
	h := map[string]string{}
	var part, off string
	for _, hd := range r.Headers {
		switch hd.Key {
		case idemkafka.HeaderOriginalTopic:
			dl.Source = string(hd.Value)
		case idemkafka.HeaderOriginalPartition:
			part = string(hd.Value)
		case idemkafka.HeaderOriginalOffset:
			off = string(hd.Value)
		}
		h[hd.Key] = string(hd.Value)
	}
	if dl.Source != "" && part != "" && off != "" {
		dl.Original = dl.Source + "/" + part + "/" + off
	}
	console.FromHeaders(&dl, h)
	return dl
}

// Replayable is always nil: a topic keeps every record produced.
func (k *Kafka) Replayable(context.Context, console.DeadLetter) error { return nil }

// Republish produces the original's key, value and headers (its message
// ID header among them) to the source topic, synchronously.
func (k *Kafka) Republish(ctx context.Context, dl console.DeadLetter) (string, error) {
	r := &kgo.Record{Topic: dl.Source, Key: dl.Key, Value: dl.Payload}
	for key, v := range dl.Headers {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: key, Value: []byte(v)})
	}
	sort.Slice(r.Headers, func(i, j int) bool { return r.Headers[i].Key < r.Headers[j].Key })
	res := k.cl.ProduceSync(ctx, r)
	if err := res.FirstErr(); err != nil {
		return "", err
	}
	return fmt.Sprintf("partition %d offset %d", res[0].Record.Partition, res[0].Record.Offset), nil
}
