package console

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem"
)

// DeadLetter is one dead letter as an idem broker adapter wrote it: the
// original message's payload and headers (or fields), with the reason
// headers every adapter adds (idem.HeaderDeadLetterReason and the others).
type DeadLetter struct {
	// Position locates the dead letter in its destination: a JetStream
	// stream sequence, a Redis Streams entry ID, a Kafka
	// "partition/offset". Positions grow with time.
	Position string
	// Destination is the dead-letter destination it was read from.
	Destination string
	// Source is where the original was read from (a subject, a stream, a
	// topic): where a replay publishes it.
	Source string
	// Original locates the original in its broker, as its adapter's
	// Idem-Original-* headers say: "STREAM/SEQUENCE" on JetStream,
	// "STREAM/ENTRY" on Redis Streams; empty when unknown.
	Original string
	// MessageID is the original's message ID (idem.HeaderOriginalMessageID),
	// empty when it had none.
	MessageID string
	// Reason, Error and Status are the dead letter's
	// idem.HeaderDeadLetterReason, idem.HeaderDeadLetterError and
	// idem.HeaderDeadLetterStatus.
	Reason, Error, Status string
	// At is when the broker stored the dead letter.
	At time.Time
	// Payload is the original's payload, byte for byte.
	Payload []byte
	// Key is the original's record key (Kafka), which a replay keeps so
	// that the copy goes to the original's partition.
	Key []byte
	// Headers are the original's other headers (or fields), without the
	// ones idem added to the dead letter. A replay publishes them.
	Headers map[string]string
}

// DeadLetters reads a broker's dead-letter destinations without
// consuming them, and republishes a dead letter to its source.
type DeadLetters interface {
	// Where names the broker, without credentials.
	Where() string
	// Newest returns at most n dead letters of dest older than the
	// position before ("" for the newest), newest first, and the position
	// to continue from ("" at the end). An unknown dest is an error
	// matching ErrNoDeadLetters.
	Newest(ctx context.Context, dest, before string, n int) ([]DeadLetter, string, error)
	// Get returns the dead letter at position pos of dest, or an error
	// matching ErrNoDeadLetter.
	Get(ctx context.Context, dest, pos string) (DeadLetter, error)
	// Replayable returns nil when a republish of dl now would reach its
	// consumer, and an error matching ErrReplayDropped when the broker
	// would drop it (a JetStream duplicate window that still holds its
	// message ID), saying until when.
	Replayable(ctx context.Context, dl DeadLetter) error
	// Republish publishes dl's payload and headers to dl.Source with
	// message ID dl.MessageID, and returns where it landed. Its error
	// matches ErrReplayDropped when the broker accepted the publish but
	// dropped it as a duplicate.
	Republish(ctx context.Context, dl DeadLetter) (string, error)
}

// Errors of the dead letters.
var (
	// ErrNoBroker means dead letters were asked of a console or command
	// without --broker.
	ErrNoBroker = errors.New("no broker: give --broker URL to read dead letters")
	// ErrNoDeadLetters means the broker has no such dead-letter
	// destination, or cannot list it.
	ErrNoDeadLetters = errors.New("no dead letters there")
	// ErrNoDeadLetter means no dead letter is at that position.
	ErrNoDeadLetter = errors.New("no dead letter at that position")
	// ErrReplayDropped means the broker dropped (or would drop) the
	// replay as a duplicate of a message with the same ID.
	ErrReplayDropped = errors.New("the broker drops the replay as a duplicate")
	// ErrNotReplayable means the dead letter or its record is in no state
	// to be replayed: nothing was published.
	ErrNotReplayable = errors.New("not replayed")
	// ErrForceable marks a replay refused (or dropped) with its record
	// retryable, which a forced replay publishes anyway.
	ErrForceable = errors.New("a forced replay publishes it")
	// ErrRecordedOutcome marks a replay refused because the dead letter's
	// outcome is its record's result (idem consume records a service's
	// final 4xx or 3xx answer, and an unknown outcome:
	// idemhttp.DeadLetterAnswer) and the store cannot reopen a completed
	// record (it is no idemdriver.Reopener), so a copy would be
	// dead-lettered again without running. Every store of idem reopens
	// records; this is for others. It also matches ErrNotReplayable;
	// force does not apply.
	ErrRecordedOutcome = errors.New("the dead letter's outcome is its record's result")
)

// IdemHeader reports whether a header (or field) name is one idem's
// adapters add to a dead letter (Idem-Dead-Letter-*, Idem-Original-*),
// which a replay leaves out.
func IdemHeader(name string) bool {
	n := strings.ToLower(name)
	return strings.HasPrefix(n, "idem-dead-letter-") || strings.HasPrefix(n, "idem-original-")
}

// FromHeaders fills dl's idem fields from a dead letter's headers h (one
// value each) and keeps the others in dl.Headers.
func FromHeaders(dl *DeadLetter, h map[string]string) {
	dl.Headers = map[string]string{}
	for k, v := range h {
		switch {
		case strings.EqualFold(k, idem.HeaderOriginalMessageID):
			dl.MessageID = v
		case strings.EqualFold(k, idem.HeaderDeadLetterReason):
			dl.Reason = v
		case strings.EqualFold(k, idem.HeaderDeadLetterError):
			dl.Error = v
		case strings.EqualFold(k, idem.HeaderDeadLetterStatus):
			dl.Status = v
		case !IdemHeader(k):
			dl.Headers[k] = v
		}
	}
}

// Cause is err with the message ID id replaced by "<id>" (quoted, and,
// when it is 4 bytes or longer, bare), so that the dead letters of one
// cause group together although their errors name their messages.
func Cause(err, id string) string {
	if id == "" {
		return err
	}
	err = strings.ReplaceAll(err, strconv.Quote(id), `"<id>"`)
	if len(id) >= 4 {
		err = strings.ReplaceAll(err, id, "<id>")
	}
	return err
}

// DefaultDeadLetterScan is how many of the newest dead letters the
// groups of the dead-letters page count.
const DefaultDeadLetterScan = 1000

// MaxDeadLetterScan is the largest scan ReadDeadLetters accepts: each
// dead letter scanned is read whole, payload included.
const MaxDeadLetterScan = 10_000

// DeadLetterGroup is the dead letters of one cause: a reason and an
// error text with the message ID left out (Cause).
type DeadLetterGroup struct {
	Reason string  `json:"reason"`
	Error  string  `json:"error"`
	Count  int     `json:"count"`
	Newest *string `json:"newest"`
}

// DeadLetterView is one dead letter as the pages show it; the payload and
// the headers only with ShowPayloads.
type DeadLetterView struct {
	Position    string            `json:"position"`
	Source      string            `json:"source"`
	MessageID   string            `json:"message_id"`
	Reason      string            `json:"reason"`
	Error       string            `json:"error"`
	Status      string            `json:"status"`
	At          *string           `json:"at"`
	PayloadSize int               `json:"payload_bytes"`
	Payload     *string           `json:"payload,omitempty"`
	Headers     map[string]string `json:"headers,omitempty"`
}

// DeadLettersView is the dead-letters page: the causes of the newest
// Scanned dead letters with their counts, then a page of dead letters,
// newest first.
type DeadLettersView struct {
	Destination string            `json:"destination"`
	Consumer    string            `json:"consumer,omitempty"`
	Broker      string            `json:"broker"`
	Scanned     int               `json:"scanned"`
	Groups      []DeadLetterGroup `json:"groups"`
	Letters     []DeadLetterView  `json:"dead_letters"`
	// Next is the position to continue from (cursor), empty at the end.
	Next string `json:"next,omitempty"`
}

// NewDeadLetterView is dl's view.
func NewDeadLetterView(dl DeadLetter, showPayloads bool) DeadLetterView {
	v := DeadLetterView{Position: dl.Position, Source: dl.Source, MessageID: dl.MessageID, Reason: dl.Reason,
		Error: dl.Error, Status: dl.Status, At: Time(dl.At), PayloadSize: len(dl.Payload)}
	if showPayloads {
		p := string(dl.Payload)
		v.Payload, v.Headers = &p, dl.Headers
	}
	return v
}

// ReadDeadLetters reads the groups of the newest scan dead letters of
// dest and a page of at most limit from cursor. Errors match ErrNoBroker
// (dls is nil), ErrBadAction (no dest, a scan above MaxDeadLetterScan),
// ErrNoDeadLetters, or the broker's.
func ReadDeadLetters(ctx context.Context, dls DeadLetters, dest, consumer, cursor string, limit, scan int, showPayloads bool) (DeadLettersView, error) {
	if dls == nil {
		return DeadLettersView{}, ErrNoBroker
	}
	if dest == "" {
		return DeadLettersView{}, fmt.Errorf("%w: name the dead-letter destination (dest)", ErrBadAction)
	}
	if limit <= 0 || limit > 500 {
		limit = 50
	}
	switch {
	case scan <= 0:
		scan = DefaultDeadLetterScan
	case scan > MaxDeadLetterScan:
		return DeadLettersView{}, fmt.Errorf("%w: scan %d, want at most %d", ErrBadAction, scan, MaxDeadLetterScan)
	}
	v := DeadLettersView{Destination: dest, Consumer: consumer, Broker: dls.Where(), Groups: []DeadLetterGroup{}, Letters: []DeadLetterView{}}
	newest, _, err := dls.Newest(ctx, dest, "", scan)
	if err != nil {
		return DeadLettersView{}, err
	}
	v.Scanned = len(newest)
	idx := map[[2]string]int{}
	for _, dl := range newest {
		k := [2]string{dl.Reason, Cause(dl.Error, dl.MessageID)}
		i, ok := idx[k]
		if !ok {
			i = len(v.Groups)
			idx[k] = i
			v.Groups = append(v.Groups, DeadLetterGroup{Reason: dl.Reason, Error: k[1], Newest: Time(dl.At)})
		}
		v.Groups[i].Count++
	}
	sort.SliceStable(v.Groups, func(i, j int) bool { return v.Groups[i].Count > v.Groups[j].Count })
	page, next := newest, ""
	if cursor != "" || len(newest) > limit || len(newest) == scan {
		if page, next, err = dls.Newest(ctx, dest, cursor, limit); err != nil {
			return DeadLettersView{}, err
		}
	}
	for _, dl := range page {
		v.Letters = append(v.Letters, NewDeadLetterView(dl, showPayloads))
	}
	v.Next = next
	return v, nil
}
