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

// Newest reads the stream backwards by sequence from before (exclusive),
// one stream get per sequence, keeping the messages on dest; it reads at
// most scanFactor*n+100 sequences, so a page may be short and still have
// a next one.
func (j *JetStream) Newest(ctx context.Context, dest, before string, n int) ([]console.DeadLetter, string, error) {
	s, err := j.stream(ctx, dest)
	if err != nil {
		return nil, "", err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, "", err
	}
	seq := info.State.LastSeq
	if before != "" {
		b, err := strconv.ParseUint(before, 10, 64)
		if err != nil || b == 0 {
			return nil, "", fmt.Errorf("%w: position %q is not a stream sequence", console.ErrBadAction, before)
		}
		seq = min(seq, b-1)
	}
	var out []console.DeadLetter
	budget := scanFactor*n + 100
	for ; seq >= max(info.State.FirstSeq, 1) && len(out) < n && budget > 0; seq-- {
		budget--
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // deleted
		}
		if err != nil {
			return nil, "", err
		}
		if m.Subject == dest {
			out = append(out, letter(dest, m))
		}
	}
	next := ""
	if seq >= max(info.State.FirstSeq, 1) && seq > 0 {
		next = strconv.FormatUint(seq+1, 10)
	}
	return out, next, nil
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
