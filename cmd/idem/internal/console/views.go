// Package console is the operator's side of the idem command: the views
// of a store's records and outbox rows that `idem failed`, `idem retry`,
// `idem release` print as JSON, and the web console (`idem console`) that
// shows them and runs the same actions. Every read and action is one call
// to the store's idemdriver.Operator, idemdriver.OutboxOperator and
// idemdriver.Inspector capabilities.
package console

import (
	"encoding/hex"
	"time"

	"github.com/idem-go/idem/idemdriver"
)

// Store is what the console and the operator commands need of a store.
// OutboxOperator and OutboxStore are optional: a store without an outbox
// table has no outbox pages.
type Store interface {
	idemdriver.Inspector
	idemdriver.Operator
}

// outboxOf returns st's outbox capabilities, or false.
func outboxOf(st Store) (idemdriver.OutboxOperator, idemdriver.OutboxStore, bool) {
	op, ok1 := st.(idemdriver.OutboxOperator)
	os, ok2 := st.(idemdriver.OutboxStore)
	return op, os, ok1 && ok2
}

// Time is a time in RFC 3339 (UTC, nanoseconds), null when zero.
func Time(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := t.UTC().Format(time.RFC3339Nano)
	return &s
}

// RecordView is a record as the operator commands and the console show it.
// AgeS is how long ago the record was written or last updated (for an
// in-progress record: since its attempt began or was released), by the
// caller's clock.
type RecordView struct {
	Consumer       string  `json:"consumer"`
	MessageID      string  `json:"message_id"`
	State          string  `json:"state"`
	ProcessedAt    *string `json:"processed_at"`
	AgeS           float64 `json:"age_s"`
	Fingerprint    string  `json:"fingerprint"`
	Attempt        int     `json:"attempt"`
	Token          int64   `json:"fencing_token"`
	LeaseExpiresAt *string `json:"lease_expires_at,omitempty"`
	LeaseLive      bool    `json:"lease_live"`
	Error          string  `json:"last_error,omitempty"`
}

// NewRecordView is rec's view at now.
func NewRecordView(rec idemdriver.Record, now time.Time) RecordView {
	v := RecordView{
		Consumer: rec.Consumer, MessageID: rec.MessageID, State: rec.State.String(),
		ProcessedAt: Time(rec.ProcessedAt), AgeS: now.Sub(rec.ProcessedAt).Seconds(),
		Fingerprint: hex.EncodeToString(rec.Fingerprint), Attempt: rec.Attempt, Token: rec.Token, Error: rec.Error,
	}
	if rec.State == idemdriver.StateInProgress {
		v.LeaseExpiresAt, v.LeaseLive = Time(rec.LeaseExpiresAt), rec.LeaseExpiresAt.After(now)
	}
	return v
}

// RecordPageView is a page of records: `idem failed --json`.
type RecordPageView struct {
	Consumer string       `json:"consumer"`
	State    string       `json:"state"`
	Records  []RecordView `json:"records"`
	// Next is the cursor of the next page (--cursor), empty at the end.
	Next string `json:"next,omitempty"`
}

// NewRecordPageView is page's view at now.
func NewRecordPageView(consumer string, state idemdriver.RecordState, page idemdriver.RecordPage, now time.Time) RecordPageView {
	v := RecordPageView{Consumer: consumer, State: state.String(), Records: []RecordView{}, Next: page.Next}
	for _, r := range page.Records {
		v.Records = append(v.Records, NewRecordView(r, now))
	}
	return v
}

// GroupView is the failed outbox rows of one error text.
type GroupView struct {
	Error  string  `json:"error"`
	Count  int64   `json:"count"`
	Newest *string `json:"newest"`
	Oldest *string `json:"oldest"`
}

// OutgoingView is one failed outbox row. Payload and Headers are left
// out unless the caller shows payloads.
type OutgoingView struct {
	ID          string            `json:"id"`
	Consumer    string            `json:"consumer"`
	SourceID    string            `json:"source_id"`
	Destination string            `json:"destination"`
	Key         string            `json:"ordering_key,omitempty"`
	Attempts    int               `json:"attempts"`
	CreatedAt   *string           `json:"created_at"`
	FailedAt    *string           `json:"failed_at"`
	Error       string            `json:"error"`
	PayloadSize int               `json:"payload_bytes"`
	Payload     *string           `json:"payload,omitempty"`
	Headers     map[string]string `json:"headers,omitempty"`
}

// OutboxView is `idem failed --outbox --json`: the failed rows grouped by
// error text, and a page of them.
type OutboxView struct {
	Groups []GroupView     `json:"groups"`
	Rows   []OutgoingView  `json:"rows"`
	Next   string          `json:"next,omitempty"`
	Stats  *OutboxStatView `json:"backlog,omitempty"`
}

// OutboxStatView is the outbox backlog.
type OutboxStatView struct {
	Pending        int64   `json:"pending"`
	Failed         int64   `json:"failed"`
	OldestPendingS float64 `json:"oldest_pending_s"`
}

// NewOutboxView builds the view of groups and page; payloads are shown
// only with showPayloads.
func NewOutboxView(groups []idemdriver.FailureGroup, page idemdriver.OutgoingPage, showPayloads bool) OutboxView {
	v := OutboxView{Groups: []GroupView{}, Rows: []OutgoingView{}, Next: page.Next}
	for _, g := range groups {
		v.Groups = append(v.Groups, GroupView{Error: g.Error, Count: g.Count, Newest: Time(g.Newest), Oldest: Time(g.Oldest)})
	}
	for _, r := range page.Rows {
		o := OutgoingView{
			ID: r.ID, Consumer: r.Consumer, SourceID: r.SourceID, Destination: r.Destination, Key: r.Key,
			Attempts: r.Attempts, CreatedAt: Time(r.CreatedAt), FailedAt: Time(r.FailedAt), Error: r.Error, PayloadSize: len(r.Payload),
		}
		if showPayloads {
			p := string(r.Payload)
			o.Payload, o.Headers = &p, r.Headers
		}
		v.Rows = append(v.Rows, o)
	}
	return v
}

// ActionView is the result of an action: `idem retry --json`, `idem
// release --json`, and the console's.
type ActionView struct {
	Action    string `json:"action"`
	Consumer  string `json:"consumer,omitempty"`
	MessageID string `json:"message_id,omitempty"`
	OutboxID  string `json:"outbox_id,omitempty"`
	// DeadLetter and Position name a replayed dead letter, Replayed where
	// its copy landed in its source.
	DeadLetter string `json:"dead_letter,omitempty"`
	Position   string `json:"position,omitempty"`
	Replayed   string `json:"replayed_to,omitempty"`
	// Deleted is how many records a purge deleted.
	Deleted *int64 `json:"deleted,omitempty"`
	// Changed is false when an earlier call had done it already.
	Changed bool `json:"changed"`
	// Message says what happened, in a sentence.
	Message string      `json:"message"`
	Record  *RecordView `json:"record,omitempty"`
}
