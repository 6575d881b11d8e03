package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idem-go/idem/idemdriver"
)

// Limits of the lease-mode text columns, the same on every dialect.
const (
	// MaxContentTypeLength is the longest content type Complete stores,
	// in bytes. Content types are also valid UTF-8 without NUL bytes.
	MaxContentTypeLength = 1024
	// MaxErrorTextLength is the longest error text Release stores, in
	// bytes; a longer one is cut at a character boundary.
	MaxErrorTextLength = 64 << 10
)

// LeaseRecord is an existing record as every dialect's record read
// returns it, in the order of ScanArgs: state, token, attempt,
// fingerprint, the remaining lease in microseconds (0 unless in_progress
// with a live lease), result, content type, last error, and whether the
// caller could take it over now (in_progress, lease ended, same
// fingerprint as the caller's, by the server's clock at the read).
type LeaseRecord struct {
	State       int64
	Token       int64
	Attempt     int64
	Fingerprint []byte
	RemainingUS int64
	Result      []byte
	ContentType sql.NullString
	LastError   sql.NullString
	Acquirable  bool
}

// ScanArgs are the scan destinations of r's columns, in order, after
// those of the columns before them (first), in one slice.
func (r *LeaseRecord) ScanArgs(first ...any) []any {
	return append(append(make([]any, 0, len(first)+9), first...),
		&r.State, &r.Token, &r.Attempt, &r.Fingerprint, &r.RemainingUS, &r.Result, &r.ContentType, &r.LastError, &r.Acquirable)
}

// NotAcquired reports r to a caller that did not acquire it: the state,
// attempts, fingerprint and error text, the remaining lease of a live
// in_progress record and the stored result of a completed one.
func (r *LeaseRecord) NotAcquired() idemdriver.AcquireResult {
	res := idemdriver.AcquireResult{
		State:       idemdriver.RecordState(r.State),
		Attempt:     int(r.Attempt),
		Fingerprint: r.Fingerprint,
		Error:       r.LastError.String,
	}
	if res.State == idemdriver.StateInProgress && r.RemainingUS > 0 {
		res.LeaseRemaining = time.Duration(r.RemainingUS) * time.Microsecond
	}
	if res.State == idemdriver.StateCompleted {
		res.Result, res.ContentType = r.Result, r.ContentType.String
	}
	return res
}

// Acquired is the result of an Acquire that holds the lease now; nil
// steps are none.
func Acquired(token, attempt int64, steps map[string][]byte) idemdriver.AcquireResult {
	if steps == nil {
		steps = map[string][]byte{}
	}
	return idemdriver.AcquireResult{Acquired: true, Token: token, Attempt: int(attempt), Steps: steps}
}

// ErrAcquireUnsettled is the error of an Acquire whose record kept
// vanishing between statements and was never seen.
func ErrAcquireUnsettled(p *idemdriver.AcquireParams) error {
	return fmt.Errorf("idem: acquire of consumer %q, message ID %q did not settle after %d attempts", p.Consumer, p.MessageID, MaxClaimAttempts)
}

// ReadSteps runs query (consumer, message ID -> step, result) and returns
// the recovery points byte for byte (an empty result is an empty, non-nil
// slice, copied out of the driver's buffer).
func ReadSteps(ctx context.Context, db Querier, query, consumer, id string) (map[string][]byte, error) {
	rows, err := db.Query(ctx, query, consumer, id)
	if err != nil {
		return nil, err
	}
	steps := map[string][]byte{}
	err = ForEach(rows, func(r Row) error {
		var (
			name string
			res  []byte
		)
		if err := r.Scan(&name, &res); err != nil {
			return err
		}
		steps[name] = append([]byte{}, res...)
		return nil
	})
	return steps, err
}

// LeaseLost is the error of a fenced write (op: "renew", "complete",
// "release", "save step") whose token owns nothing. It matches
// idemdriver.ErrLeaseLost.
func LeaseLost(op, consumer, id string, token int64) error {
	return fmt.Errorf("%w: %s of message %q (consumer %q): token %d does not own the record (another attempt took over, or the attempt ended)",
		idemdriver.ErrLeaseLost, op, id, consumer, token)
}

// Fenced runs one conditional write whose WHERE holds only while token
// owns the record, and judges it by rows affected: 0 is LeaseLost.
func Fenced(ctx context.Context, db Querier, op, consumer, id string, token int64, query string, args ...any) error {
	n, err := db.Exec(ctx, query, args...)
	if err != nil {
		return err
	}
	if n == 0 {
		return LeaseLost(op, consumer, id, token)
	}
	return nil
}

// CheckContentType checks a content type as Complete stores it: at most
// MaxContentTypeLength bytes of valid UTF-8 without NUL bytes (PostgreSQL
// text holds nothing else). The error matches idemdriver.ErrInvalidConfig.
func CheckContentType(s string) error {
	switch {
	case len(s) > MaxContentTypeLength:
		return fmt.Errorf("%w: content type of %d bytes, over the maximum of %d", idemdriver.ErrInvalidConfig, len(s), MaxContentTypeLength)
	case !utf8.ValidString(s):
		return fmt.Errorf("%w: content type %q is not valid UTF-8", idemdriver.ErrInvalidConfig, s)
	case strings.IndexByte(s, 0) >= 0:
		return fmt.Errorf("%w: content type %q contains a NUL byte", idemdriver.ErrInvalidConfig, s)
	}
	return nil
}

// ErrorText makes s storable as text on every dialect: invalid UTF-8 and
// NUL bytes become U+FFFD, and the text is cut to at most
// MaxErrorTextLength bytes at a character boundary, so that a failure
// never fails to be recorded.
func ErrorText(s string) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	if len(s) > MaxErrorTextLength {
		cut := MaxErrorTextLength
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
	return s
}

// NonNil returns b, or an empty slice for nil: results are stored byte for
// byte and never NULL, which means "a transactional record".
func NonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
