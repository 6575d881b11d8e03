package idemdriver

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// ErrWrongState means an operator action found its record (or outbox
// row) in a state the action does not apply to: a retry of a completed
// record, a release of a record no attempt holds, a retry of a sent
// outbox row. The action changed nothing.
var ErrWrongState = errors.New("idem: record in the wrong state for the action")

// ErrInvalidCursor means a page cursor was not one a list call returned
// (it was cut short, edited, or came from another list). It also matches
// ErrInvalidConfig.
var ErrInvalidCursor = fmt.Errorf("%w: invalid page cursor", ErrInvalidConfig)

// Limits of the operator lists.
const (
	// MaxPageSize is the most items one list call returns.
	MaxPageSize = 500
	// DefaultPageSize is the page size when a list call's Limit is 0.
	DefaultPageSize = 50
	// DefaultScanLimit is how many records of the consumer, newest first,
	// a ListRecords call examines at most when its Scan is 0.
	DefaultScanLimit = 10_000
	// MaxScanLimit is the largest Scan a ListRecords call accepts.
	MaxScanLimit = 1_000_000
)

// Operator is an optional capability of a lease store, for the people on
// call (the idem command's failed, retry and release, and its console):
// list the records that need them, make a failed record retryable, end a
// stuck lease. Each action is idempotent: a second call with the same
// arguments changes nothing and reports Changed false; an action that
// does not apply to the record's state returns an error matching
// ErrWrongState, one on a missing record an error matching ErrNotFound,
// and changes nothing either way.
type Operator interface {
	// ListRecords returns a page of consumer's records in p.State, newest
	// (by ProcessedAt) first. It walks the (consumer, processed_at) index
	// backwards from p.Cursor and examines at most p.Scan records, so a
	// page costs the same on a table of any size; it may therefore return
	// fewer than p.Limit records, even none, with a Next cursor to go on
	// from. Next is empty when no record older than the page is left. A
	// store that keeps no index of a state returns an error matching
	// ErrUnsupported for it.
	ListRecords(ctx context.Context, p *ListRecordsParams) (RecordPage, error)
	// RetryRecord makes a failed (poisoned) record retryable: in
	// progress, its lease ended and no attempt holding it, its attempt
	// count 0 (the next delivery is attempt 1 of a fresh round), a new
	// fencing token; its fingerprint, error text and recovery points are
	// kept, so the next attempt resumes after the last completed step.
	// The record is processed when the message is delivered again (a
	// broker redelivery or a replay). A record already in progress
	// reports Changed false; a completed one is ErrWrongState.
	RetryRecord(ctx context.Context, consumer, messageID string) (ActionResult, error)
	// ReleaseLease ends the lease of the attempt holding p.Token (live or
	// expired), as that attempt's own non-terminal Release would: the
	// record stays in progress, available to the next delivery, and the
	// holder's later writes fail with ErrLeaseLost. The attempt count and
	// error text are kept. When p.Token no longer holds the record (an
	// earlier release, or a takeover since) it reports Changed false; a
	// token the record never had, or a record that is not in progress, is
	// ErrWrongState.
	ReleaseLease(ctx context.Context, p *ReleaseLeaseParams) (ActionResult, error)
}

// ConsumerLister is an optional capability of a store, for the operator
// console's first page at any table size: the consumers with records and
// the times of their oldest and newest records, found through the
// (consumer, processed_at) index (a skip scan: a few index probes per
// consumer), without counting records as Inspector.Stats does.
type ConsumerLister interface {
	// Consumers returns one entry per consumer with records, by name,
	// Count left 0.
	Consumers(ctx context.Context) ([]ConsumerStats, error)
}

// StepReader is an optional capability of a lease store, for the
// operator console's message page: the recovery points (LeaseStore.SaveStep)
// of one record.
type StepReader interface {
	// Steps returns the record's saved steps, by name (byte order); none
	// (and no error) when it has none or does not exist. Invalid names
	// are refused (ValidateKey).
	Steps(ctx context.Context, consumer, messageID string) ([]Step, error)
}

// Step is one saved recovery point.
type Step struct {
	Name   string
	Result []byte
}

// OutboxOperator is an optional capability of an [OutboxStore], for the
// people on call: the outbox rows failed for good, grouped by cause and
// one by one, and a retry of one. RetryOutgoing has the idempotency and
// errors of [Operator]'s actions.
type OutboxOperator interface {
	// OutboxFailures groups the failed rows by error text: at most limit
	// groups (1 to MaxPageSize), the most recent failure first. It reads
	// the failed rows alone (through the index on failed_at), which
	// retention bounds.
	OutboxFailures(ctx context.Context, limit int) ([]FailureGroup, error)
	// ListFailedOutgoing returns a page of failed rows, the most recently
	// failed first, optionally of one error text.
	ListFailedOutgoing(ctx context.Context, p *ListOutgoingParams) (OutgoingPage, error)
	// RetryOutgoing makes the failed row id pending again, available now:
	// the relay claims it in its sequence order (a row with an ordering
	// key then holds back the later pending rows of its key until it is
	// sent). Its attempt count and last error are kept. A row already
	// pending reports Changed false; a sent row is ErrWrongState, a
	// missing one ErrNotFound.
	RetryOutgoing(ctx context.Context, id string) (ActionResult, error)
	// OutboxBacklog is OutboxStore.OutboxStats read through the indexes
	// of the pending and the failed rows alone (where the dialect has
	// them), so its cost follows the backlog, not the sent rows that
	// retention keeps.
	OutboxBacklog(ctx context.Context) (OutboxStats, error)
}

// ListRecordsParams select a page of records.
type ListRecordsParams struct {
	// Consumer is the consumer whose records are listed.
	Consumer string
	// State is StateFailed or StateInProgress.
	State RecordState
	// Limit is the most records returned: 0 for DefaultPageSize, at most
	// MaxPageSize.
	Limit int
	// Scan is the most records examined: 0 for DefaultScanLimit, at most
	// MaxScanLimit, at least Limit.
	Scan int
	// Cursor is the Next of the previous page; empty for the newest.
	Cursor string
}

// RecordPage is one page of records.
type RecordPage struct {
	// Records are newest first.
	Records []Record
	// Next is the cursor of the following page; empty when there is none.
	Next string
}

// ReleaseLeaseParams name the attempt whose lease to end.
type ReleaseLeaseParams struct {
	// Consumer and MessageID identify the record.
	Consumer, MessageID string
	// Token is the holder's fencing token, as listed or inspected; the
	// action applies only while that token holds the record, so a repeat
	// never ends a later attempt's lease. Positive.
	Token int64
}

// ActionResult is what an operator action did.
type ActionResult struct {
	// Changed is true when this call changed the record; false when an
	// earlier call (or the consumer) had already done it.
	Changed bool
	// Record is the record (or, for an outbox row, nothing but its
	// identity) after the call.
	Record Record
}

// FailureGroup is the failed outbox rows that share an error text.
type FailureGroup struct {
	// Error is the rows' error text.
	Error string
	// Count is the number of rows.
	Count int64
	// Newest and Oldest are the latest and earliest failure times.
	Newest, Oldest time.Time
}

// ListOutgoingParams select a page of failed outbox rows.
type ListOutgoingParams struct {
	// Error, when set, keeps the rows with this error text only.
	Error string
	// Limit is the most rows returned: 0 for DefaultPageSize, at most
	// MaxPageSize.
	Limit int
	// Cursor is the Next of the previous page; empty for the newest.
	Cursor string
}

// FailedOutgoing is one failed outbox row.
type FailedOutgoing struct {
	OutgoingRecord
	// FailedAt is when the row was marked failed for good.
	FailedAt time.Time
	// Error is the last publish error.
	Error string
}

// OutgoingPage is one page of failed outbox rows.
type OutgoingPage struct {
	// Rows are the most recently failed first.
	Rows []FailedOutgoing
	// Next is the cursor of the following page; empty when there is none.
	Next string
}

// farFuture is the position before every record: the first page's cursor.
var farFuture = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)

// ValidateListRecordsParams checks p and fills in its defaults: a valid
// consumer name, State StateFailed or StateInProgress, Limit and Scan in
// range, a Cursor a list returned. It returns the cursor's position (the
// far future for the first page). Errors match ErrInvalidConsumerName,
// ErrInvalidConfig or ErrInvalidCursor.
func ValidateListRecordsParams(p *ListRecordsParams) (Position, error) {
	if err := ValidateConsumerName(p.Consumer); err != nil {
		return Position{}, err
	}
	if p.State != StateFailed && p.State != StateInProgress {
		return Position{}, fmt.Errorf("%w: list state %d, want failed (%d) or in progress (%d)", ErrInvalidConfig, p.State, StateFailed, StateInProgress)
	}
	if err := pageLimit(&p.Limit); err != nil {
		return Position{}, err
	}
	if p.Scan == 0 {
		p.Scan = max(DefaultScanLimit, p.Limit)
	}
	if p.Scan < p.Limit || p.Scan > MaxScanLimit {
		return Position{}, fmt.Errorf("%w: scan %d, want %d to %d", ErrInvalidConfig, p.Scan, p.Limit, MaxScanLimit)
	}
	return DecodeCursor(p.Cursor)
}

// ValidateListOutgoingParams checks p and fills in its default Limit,
// returning the cursor's position (the far future for the first page;
// Key is then a row ID). Errors match ErrInvalidConfig or
// ErrInvalidCursor.
func ValidateListOutgoingParams(p *ListOutgoingParams) (Position, error) {
	if err := pageLimit(&p.Limit); err != nil {
		return Position{}, err
	}
	if !utf8.ValidString(p.Error) || strings.IndexByte(p.Error, 0) >= 0 {
		return Position{}, fmt.Errorf("%w: the error text to list is not UTF-8 text without NUL bytes, which no store holds", ErrInvalidConfig)
	}
	return DecodeCursor(p.Cursor)
}

// ValidatePageLimit checks a group or page limit: 1 to MaxPageSize.
// Errors match ErrInvalidConfig.
func ValidatePageLimit(limit int) error {
	if limit < 1 || limit > MaxPageSize {
		return fmt.Errorf("%w: limit %d, want 1 to %d", ErrInvalidConfig, limit, MaxPageSize)
	}
	return nil
}

func pageLimit(limit *int) error {
	if *limit == 0 {
		*limit = DefaultPageSize
	}
	return ValidatePageLimit(*limit)
}

// ValidateReleaseLeaseParams checks a valid key and a positive token.
// Errors match ErrInvalidConsumerName, ErrInvalidMessageID,
// ErrMissingMessageID or ErrInvalidConfig.
func ValidateReleaseLeaseParams(p *ReleaseLeaseParams) error {
	return validateKeyToken(p.Consumer, p.MessageID, p.Token, "release of token %d, want the holder's (>= 1)")
}

// validateKeyToken checks a valid key and a positive token; format
// describes a bad token.
func validateKeyToken(consumer, messageID string, token int64, format string) error {
	if err := ValidateKey(consumer, messageID); err != nil {
		return err
	}
	if token < 1 {
		return fmt.Errorf("%w: "+format, ErrInvalidConfig, token)
	}
	return nil
}

// Position is a place in a list, newest first: the items strictly older
// than At, or as old and with a smaller Key (message ID or row ID, byte
// order), come after it.
type Position struct {
	At  time.Time
	Key string
}

// Before reports whether an item at (at, key) comes after the position
// in a newest-first list.
func (p Position) Before(at time.Time, key string) bool {
	return at.Before(p.At) || at.Equal(p.At) && key < p.Key
}

// EncodeCursor returns the opaque cursor of the position after the item
// at (at, key): URL-safe text, which DecodeCursor reads back.
func EncodeCursor(at time.Time, key string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(at.UnixMicro(), 10) + "." + key))
}

// DecodeCursor reads a cursor of EncodeCursor (microsecond precision);
// the empty cursor is the position before every item. A cursor whose
// time is before 1970 or after the first page's position (9999-01-01),
// or whose key is not a valid ID (ValidateMessageID, DefaultMaxIDLength),
// is no list's: the stores could not even compare it. Errors match
// ErrInvalidCursor.
func DecodeCursor(c string) (Position, error) {
	if c == "" {
		return Position{At: farFuture}, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return Position{}, ErrInvalidCursor
	}
	us, key, ok := strings.Cut(string(b), ".")
	n, err := strconv.ParseInt(us, 10, 64)
	if !ok || err != nil || n < 0 || n > farFuture.UnixMicro() || ValidateMessageID(key, 0) != nil {
		return Position{}, ErrInvalidCursor
	}
	return Position{At: time.UnixMicro(n).UTC(), Key: key}, nil
}

// PageRecords makes a page of window, the records a list examined
// (newest first, at most p.Scan, or any subsequence of them that holds
// every record in p.State and the last one examined): the first p.Limit
// in p.State, and the cursor after the last one returned when more
// matched, or after the window's last record when the window was cut at
// p.Scan (more: records older than the window exist, or may). A helper
// for stores that implement [Operator].
func PageRecords(window []Record, p *ListRecordsParams, more bool) RecordPage {
	var page RecordPage
	for _, r := range window {
		if r.State != p.State {
			continue
		}
		if len(page.Records) == p.Limit {
			last := page.Records[len(page.Records)-1]
			page.Next = EncodeCursor(last.ProcessedAt, last.MessageID)
			return page
		}
		page.Records = append(page.Records, r)
	}
	if more && len(window) > 0 {
		last := window[len(window)-1]
		page.Next = EncodeCursor(last.ProcessedAt, last.MessageID)
	}
	return page
}

// CheckRelease refuses a ReleaseLease of token on rec when rec is not in
// progress, or never had token, with an error matching ErrWrongState. A
// helper for stores that implement [Operator].
func CheckRelease(rec Record, token int64) error {
	if rec.State != StateInProgress {
		return fmt.Errorf("%w: consumer %q, message ID %q is %s; only an in-progress record has a lease to release", ErrWrongState, rec.Consumer, rec.MessageID, rec.State)
	}
	if token > rec.Token {
		return fmt.Errorf("%w: consumer %q, message ID %q: token %d never held the record (its token is %d)", ErrWrongState, rec.Consumer, rec.MessageID, token, rec.Token)
	}
	return nil
}

// ErrUnsupported means a store cannot answer an operator request without
// reading all of its keys: store/idemredis keeps no index of the records
// in progress, so it cannot list them (read one by ID instead). It wraps
// the standard library's errors.ErrUnsupported, which it also matches.
var ErrUnsupported = fmt.Errorf("idem: not supported by this store: %w", errors.ErrUnsupported)
