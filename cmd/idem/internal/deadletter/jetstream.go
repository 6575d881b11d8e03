package deadletter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem/broker/idemnats"
	"github.com/idem-go/idem/cmd/idem/internal/console"
)

// JetStream reads dead letters from the streams that capture the
// dead-letter subjects idemnats publishes to.
type JetStream struct {
	js    jetstream.JetStream
	where string
	now   func() time.Time
}

// NewJetStream returns the dead letters of js; where names the server
// without credentials; now is the clock compared with the duplicate
// windows (nil: time.Now).
func NewJetStream(js jetstream.JetStream, where string, now func() time.Time) *JetStream {
	if now == nil {
		now = time.Now
	}
	return &JetStream{js: js, where: where, now: now}
}

// Where names the server.
func (j *JetStream) Where() string { return j.where }

// stream returns the stream capturing subject, or an error matching
// console.ErrNoDeadLetters.
func (j *JetStream) stream(ctx context.Context, subject string) (jetstream.Stream, error) {
	name, err := j.js.StreamNameBySubject(ctx, subject)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("%w: no JetStream stream captures subject %q", console.ErrNoDeadLetters, subject)
	}
	if err != nil {
		return nil, err
	}
	return j.js.Stream(ctx, name)
}

// scanFactor bounds the sequences one Newest call reads, per dead letter
// asked for, in a stream that holds other subjects too.
const scanFactor = 4

// Newest reads the window of at most scanFactor*n+100 sequences (n when
// the stream captures dest alone) below before (exclusive; the last
// sequence when "") with an ordered consumer
// filtered on dest (an ephemeral consumer: nothing is acknowledged or
// taken), and returns its newest n messages on dest; a page may be short
// and still have a next one.
func (j *JetStream) Newest(ctx context.Context, dest, before string, n int) ([]console.DeadLetter, string, error) {
	s, err := j.stream(ctx, dest)
	if err != nil {
		return nil, "", err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, "", err
	}
	hi, first := info.State.LastSeq, max(info.State.FirstSeq, 1)
	if before != "" {
		b, err := strconv.ParseUint(before, 10, 64)
		if err != nil || b == 0 {
			return nil, "", fmt.Errorf("%w: position %q is not a stream sequence", console.ErrBadAction, before)
		}
		hi = min(hi, b-1)
	}
	if hi < first || n <= 0 {
		return nil, "", nil
	}
	span := uint64(scanFactor*n + 100)
	if len(info.Config.Subjects) == 1 && info.Config.Subjects[0] == dest {
		span = uint64(n) // every message of the stream is a dead letter
	}
	lo := first
	if hi-first+1 > span {
		lo = hi - span + 1
	}
	window, err := j.window(ctx, s, dest, lo, hi)
	if err != nil {
		return nil, "", err
	}
	next := ""
	if len(window) > n {
		window = window[len(window)-n:]
		next = window[0].Position
	} else if lo > first {
		next = strconv.FormatUint(lo, 10)
	}
	out := make([]console.DeadLetter, 0, len(window))
	for i := len(window) - 1; i >= 0; i-- {
		out = append(out, window[i])
	}
	return out, next, nil
}

// window returns the messages on subject with sequences in [lo, hi], oldest
// first, read by an ordered consumer in batches.
func (j *JetStream) window(ctx context.Context, s jetstream.Stream, subject string, lo, hi uint64) ([]console.DeadLetter, error) {
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject},
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: lo, InactiveThreshold: 5 * time.Second})
	if err != nil {
		return nil, err
	}
	var out []console.DeadLetter
	for {
		batch, err := cons.FetchNoWait(int(min(hi-lo+1, 1000)))
		if err != nil {
			return nil, err
		}
		got := 0
		for m := range batch.Messages() {
			got++
			md, err := m.Metadata()
			if err != nil {
				return nil, err
			}
			if md.Sequence.Stream > hi {
				return out, nil
			}
			out = append(out, letter(subject, &jetstream.RawStreamMsg{Subject: m.Subject(), Sequence: md.Sequence.Stream,
				Header: m.Headers(), Data: m.Data(), Time: md.Timestamp}))
			if md.Sequence.Stream == hi {
				return out, nil
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, err
		}
		if got == 0 {
			return out, nil // nothing more on subject up to the stream's end
		}
	}
}

// Get reads the message at sequence pos of dest's stream.
func (j *JetStream) Get(ctx context.Context, dest, pos string) (console.DeadLetter, error) {
	seq, err := strconv.ParseUint(pos, 10, 64)
	if err != nil || seq == 0 {
		return console.DeadLetter{}, fmt.Errorf("%w: position %q is not a stream sequence", console.ErrBadAction, pos)
	}
	s, err := j.stream(ctx, dest)
	if err != nil {
		return console.DeadLetter{}, err
	}
	m, err := s.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) || err == nil && m.Subject != dest {
		return console.DeadLetter{}, fmt.Errorf("%w: %s has no dead letter at sequence %d", console.ErrNoDeadLetter, dest, seq)
	}
	if err != nil {
		return console.DeadLetter{}, err
	}
	return letter(dest, m), nil
}

// letter is the dead letter m of dest.
func letter(dest string, m *jetstream.RawStreamMsg) console.DeadLetter {
	h := map[string]string{}
	for k, vs := range m.Header {
		if len(vs) > 0 {
			h[k] = vs[0]
		}
	}
	dl := console.DeadLetter{Position: strconv.FormatUint(m.Sequence, 10), Destination: dest, At: m.Time, Payload: m.Data,
		Source: m.Header.Get(idemnats.HeaderOriginalSubject)}
	if st, sq := m.Header.Get(idemnats.HeaderOriginalStream), m.Header.Get(idemnats.HeaderOriginalSequence); st != "" && sq != "" {
		dl.Original = st + "/" + sq
	}
	console.FromHeaders(&dl, h)
	return dl
}

// Replayable refuses a replay within the duplicate window of the source's
// stream counted from the original's publish, when the original is still
// in its stream and carried the message ID in Nats-Msg-Id: JetStream
// would drop the copy, whose Nats-Msg-Id is the same. (The server forgets
// an ID a little after the window; a copy it drops then is caught by
// Republish.)
func (j *JetStream) Replayable(ctx context.Context, dl console.DeadLetter) error {
	s, err := j.stream(ctx, dl.Source)
	if err != nil {
		return fmt.Errorf("%w: the source %q: %w", console.ErrNotReplayable, dl.Source, err)
	}
	window := s.CachedInfo().Config.Duplicates
	stream, sq, ok := strings.Cut(dl.Original, "/")
	seq, err := strconv.ParseUint(sq, 10, 64)
	if !ok || err != nil || stream != s.CachedInfo().Config.Name || window <= 0 {
		return nil
	}
	orig, err := s.GetMsg(ctx, seq)
	if err != nil || orig.Header.Get(jetstream.MsgIDHeader) != dl.MessageID {
		return nil // gone (retention), or not deduplicated by its ID: the publish ack says
	}
	if until := orig.Time.Add(window); j.now().Before(until) {
		return fmt.Errorf("%w: stream %s saw message ID %q at %s and drops a copy with that Nats-Msg-Id within its duplicate window (%s): replay after %s; nothing changed",
			console.ErrReplayDropped, stream, dl.MessageID, orig.Time.UTC().Format(time.RFC3339), window, until.UTC().Format(time.RFC3339))
	}
	return nil
}

// Republish publishes dl to its source subject with Nats-Msg-Id set to its
// message ID and the original's other headers, and checks the ack: a
// copy the server took for a duplicate is an error matching
// console.ErrReplayDropped.
func (j *JetStream) Republish(ctx context.Context, dl console.DeadLetter) (string, error) {
	m := nats.NewMsg(dl.Source)
	m.Data = dl.Payload
	for k, v := range dl.Headers {
		if !strings.HasPrefix(k, "Nats-") {
			m.Header.Set(k, v)
		}
	}
	ack, err := j.js.PublishMsg(ctx, m, jetstream.WithMsgID(dl.MessageID))
	if err != nil {
		return "", err
	}
	if ack.Duplicate {
		return "", fmt.Errorf("%w: stream %s dropped the copy as a duplicate of message ID %q within its duplicate window", console.ErrReplayDropped, ack.Stream, dl.MessageID)
	}
	return fmt.Sprintf("stream %s sequence %d", ack.Stream, ack.Sequence), nil
}
