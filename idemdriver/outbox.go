package idemdriver

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrInvalidOutgoing means an outgoing message breaks the outbox rules of
// [ValidateOutgoing] (destination, ordering key, ID or header names).
// Package idem re-exports it as idem.ErrInvalidOutgoing. Permanent: the
// same message fails the same way every time.
var ErrInvalidOutgoing = errors.New("idem: invalid outgoing message")

// Limits on outbox rows.
const (
	// MaxDestinationLength is the longest destination (a subject, topic,
	// exchange or stream name), in bytes.
	MaxDestinationLength = 255
	// MaxOrderingKeyLength is the longest ordering key, in bytes.
	MaxOrderingKeyLength = 255
)

// OutboxTx is an optional capability of a [TxStore]: write outgoing
// messages to the store's outbox table inside tx, the transaction that
// holds the incoming message's claim and the handler's effects, so that
// they commit or roll back together. The core calls it once per
// processed message (or batch) that emitted, after the handler returned
// and before commit. Rows are inserted in the order given; the table's
// sequence column (assigned at insert) is the emission order the relay
// keeps per destination and ordering key.
//
// A row whose ID exists already is left as it is and raises no error (an
// ID is derived from the incoming message, so the row is the same message
// emitted by an earlier processing whose inbox record was since purged):
// tx stays usable. p is checked with [ValidateEmitParams] before any
// statement runs.
type OutboxTx[TTx any] interface {
	EmitTx(ctx context.Context, tx TTx, p *EmitParams) error
}

// OutboxCommitter is an optional capability of an [OutboxTx] store: write
// outgoing rows into tx and commit tx in one step, with fewer round trips
// than EmitTx followed by [TxStore.Commit] (store/idempgxv5 sends the
// INSERT and the COMMIT together). The core calls it instead of those two
// for a transaction it began through the store and whose handler emitted
// rows; never for a caller's own transaction (ProcessTx), which the core
// does not commit.
//
// p is checked with [ValidateEmitParams] before any statement is sent
// (tx then stays open and usable). A nil error means the rows committed
// with everything else in tx. On an error nothing of tx committed, except
// when the commit itself failed with its outcome unknown (a connection
// lost while it was in flight), as for Commit; either way the caller rolls
// tx back, which must be a no-op when tx already ended.
type OutboxCommitter[TTx any] interface {
	EmitCommit(ctx context.Context, tx TTx, p *EmitParams) error
}

// OutboxStore is what the relay needs of a store: claim pending outgoing
// rows with a lease, end the rows whose send was confirmed (deleted, or
// kept marked sent), mark failed ones, purge failed (and kept sent) rows,
// and report the backlog. Every method runs in its own short transaction
// (or statement); times are the store's clock.
//
// Contract:
//   - ClaimOutgoing takes up to Limit pending rows (not sent, not failed
//     for good, available by their retry time, not under a live lease), in
//     sequence order, and leases them for Lease: another ClaimOutgoing
//     skips a leased row until its lease ends, so relays side by side
//     never send one row at once while its lease lasts. A row with a
//     non-empty ordering key is taken only when no earlier pending row of
//     the same destination and key exists (leased or not), so one claim
//     holds at most one row per (destination, key) and the keys' order is
//     kept across relays; rows with an empty key are not ordered. It
//     increments each row's attempt count. Concurrent claims must not
//     wait on each other's rows (FOR UPDATE SKIP LOCKED, or a single
//     writer).
//   - MarkSent ends the rows a publisher confirmed, whoever holds their
//     lease: without Keep it deletes them, with one statement (or one per
//     few hundred IDs where the driver has no arrays), whether they are
//     pending, leased, failed or kept sent; with Keep it marks them sent
//     and ends their lease, and a row that was sent stays sent until
//     PurgeOutbox deletes it. Deleting is the default because a sent row
//     guards nothing: the processed-messages record is what stops a
//     redelivered incoming message from emitting again, and the relay
//     never claims a row that is gone. IDs of no row are ignored. With
//     Seqs it ends a row only while its seq is the one claimed, so the
//     late mark of a relay whose lease ran out leaves a row written
//     again with the same ID (after another relay sent and deleted the
//     first) to be sent.
//   - MarkFailed ends the leases of the rows of one round whose publish
//     failed, and either makes each available again after its RetryAfter
//     (retryable) or marks it failed for good, which unblocks the later
//     rows of its key. A row kept sent is left sent (a deleted one is
//     gone). The rows are marked with one statement (or a few, for many
//     rows), not one transaction per row: when a broker is down every row
//     of every round fails, and a durable store would otherwise flush once
//     per row. Each
//     row is fenced by its attempt: it is changed only while its attempt
//     count is still Attempt, the count the caller's claim returned. A
//     relay whose lease ran out while it published, and whose row another
//     relay claimed since, marks nothing: it must not end the
//     other relay's lease (a third would send the row while the second
//     still does) nor fail a row the second may be sending. MarkSent needs
//     no fence: a confirmed message was sent, whoever holds the row.
//   - PurgeOutbox deletes at most Limit rows failed for good (or kept
//     sent, see MarkSentParams.Keep) more than Retention ago, skipping
//     rows another transaction has locked (every relay purges, so relays
//     side by side purge at once): it never waits for a row lock, and
//     returns fewer than Limit when it skipped some.
type OutboxStore interface {
	ClaimOutgoing(ctx context.Context, p *ClaimOutgoingParams) ([]OutgoingRecord, error)
	MarkSent(ctx context.Context, p *MarkSentParams) error
	MarkFailed(ctx context.Context, p *MarkFailedParams) error
	PurgeOutbox(ctx context.Context, p *PurgeOutboxParams) (int64, error)
	OutboxStats(ctx context.Context) (OutboxStats, error)
}

// OutboxSentClaimer is an optional capability of an [OutboxStore]: end
// the rows a publisher confirmed and claim the next batch in one call,
// with one round trip and one transaction where MarkSent and then
// ClaimOutgoing take two of each. [idem.Relay.Run] uses it to end a
// round's confirmed rows together with its next claim, which follows at
// once; RunOnce does not.
//
// MarkSentClaim(ctx, sent, claim) is MarkSent(ctx, sent) followed by
// ClaimOutgoing(ctx, claim), atomically: with a nil error both happened,
// and the claim saw the ended rows gone (a key whose row was just ended
// has its next row claimable in this very claim); with an error neither
// did (or, when the commit's outcome is unknown, both or neither), and
// the confirmed rows are sent again once their lease ends. sent and claim
// are checked as the two methods check them, before anything is sent.
type OutboxSentClaimer interface {
	MarkSentClaim(ctx context.Context, sent *MarkSentParams, claim *ClaimOutgoingParams) ([]OutgoingRecord, error)
}

// OutboxNotifier is an optional capability of an [OutboxStore]: learn
// when new outbox rows may have committed (PostgreSQL LISTEN/NOTIFY: the
// outbox table's insert trigger notifies), so the relay need not poll
// tightly. WatchOutgoing blocks until ctx ends or the watch fails,
// calling notify once when it starts listening (rows may have come while
// nobody listened) and then after every commit that inserted rows; it
// returns ctx's error or the failure. notify must not block. Without it
// the relay polls with backoff.
type OutboxNotifier interface {
	WatchOutgoing(ctx context.Context, notify func()) error
}

// OutgoingRecord is one row of the outbox table.
type OutgoingRecord struct {
	// ID is the outgoing message ID, 1 to DefaultMaxIDLength bytes by the
	// message ID rules. Publishers carry it where the destination's
	// consumers read a message ID, so a re-send is deduplicated downstream.
	ID string
	// Consumer is the consumer that emitted the row; empty for rows written
	// by other programs.
	Consumer string
	// SourceID is the ID of the incoming message whose processing emitted
	// the row; empty for rows written by other programs.
	SourceID string
	// Destination is where the message goes: a subject, topic, exchange or
	// stream name, as the publisher reads it. 1 to MaxDestinationLength bytes.
	Destination string
	// Key is the ordering key: rows with one destination and one non-empty
	// key go out in sequence order. For Kafka it is the record key. 0 to
	// MaxOrderingKeyLength bytes.
	Key string
	// Payload is the message body.
	Payload []byte
	// Headers are the message headers (the publisher adds the message ID
	// header itself). Nil and empty are the same.
	Headers map[string]string
	// Seq is the row's sequence number, assigned by the store at insert;
	// ignored by EmitTx.
	Seq int64
	// Attempts counts the claims of the row, this one included; ignored by
	// EmitTx.
	Attempts int
	// CreatedAt is when the row was inserted, by the store's clock;
	// ignored by EmitTx.
	CreatedAt time.Time
}

// EmitParams are the rows one processing emits.
type EmitParams struct {
	// Consumer is the emitting consumer's name.
	Consumer string
	// Messages are the rows, in emission order, with distinct IDs.
	// Consumer and SourceID of each are written as given.
	Messages []OutgoingRecord
	// RelayWoken says that the caller wakes a relay of its own process
	// for these rows once their transaction commits (idem's Consumer
	// does when its Config.Relay is set), so that relay sends them at
	// once. A store that wakes relays after a commit by a message of its
	// own (store/idempgxv5's pg_notify after the commit of a transaction
	// it began) may then leave that message out: relays of other
	// processes find the rows at their next poll, if the woken relay has
	// not sent them already. Stores that write the rows alike either way
	// ignore it.
	RelayWoken bool
}

// ClaimOutgoingParams bound one relay claim.
type ClaimOutgoingParams struct {
	// Limit is the most rows to claim, at least 1.
	Limit int
	// Lease is how long the claimed rows stay leased, at least a millisecond.
	Lease time.Duration
}

// MarkSentParams names the rows a publisher confirmed.
type MarkSentParams struct {
	// IDs are the rows' IDs; an ID may come twice, or name no row.
	IDs []string
	// Seqs, when set, are the rows' sequence numbers as claimed
	// (OutgoingRecord.Seq), one per ID: a row is ended only while its
	// seq is the one its ID came with. A row deleted once sent and
	// written again with the same ID has a new seq, so the late mark of
	// a relay whose lease ran out while it published (another relay sent
	// and deleted the row meanwhile) leaves the new row to be sent.
	// Empty: the rows are named by ID alone.
	Seqs []int64
	// Keep keeps the rows in the outbox table, marked sent (sent_at set,
	// lease ended), until PurgeOutbox deletes them once their retention
	// has passed: for audit, or to replay what was sent. False, the
	// default, deletes them at once.
	Keep bool
}

// MarkFailedParams are the rows of one relay round whose publish failed.
type MarkFailedParams struct {
	// Rows are the rows, at least one, each named once.
	Rows []FailedRow
}

// FailedRow is one row whose publish failed.
type FailedRow struct {
	// ID is the row's ID.
	ID string
	// Attempt is the row's attempt count as the claim returned it
	// (OutgoingRecord.Attempts), at least 1: the mark applies only if no
	// claim took the row since.
	Attempt int
	// Seq, when not 0, is the row's sequence number as claimed
	// (OutgoingRecord.Seq): the mark applies only to that row. A row
	// deleted once sent and written again with the same ID has a new seq
	// and its own attempt count, which may equal Attempt: a relay whose
	// lease ran out while it published must not fail it or end the lease
	// of the relay sending it.
	Seq int64
	// Permanent marks the row failed for good: it is never sent and no
	// longer holds back its key.
	Permanent bool
	// RetryAfter is how long a retryable row waits before it may be
	// claimed again (>= 0).
	RetryAfter time.Duration
	// Error is the failure's text, kept on the row for operators (the
	// store may cut it short).
	Error string
}

// PurgeOutboxParams bound one purge of done rows.
type PurgeOutboxParams struct {
	// Retention is how long failed rows, and sent rows kept by
	// MarkSentParams.Keep, are kept, > 0.
	Retention time.Duration
	// Limit is the most rows deleted, at least 1.
	Limit int
}

// OutboxStats is the outbox backlog.
type OutboxStats struct {
	// Pending counts the rows neither sent nor failed.
	Pending int64
	// Failed counts the rows failed for good (until purged).
	Failed int64
	// OldestPending is the age of the oldest pending row by the store's
	// clock (the relay lag); 0 when nothing is pending.
	OldestPending time.Duration
}

// ValidateOutgoing checks one outgoing row as EmitTx writes it: the ID by
// the message ID rules; Consumer empty or a valid consumer name; SourceID
// empty or a valid message ID; Destination 1 to MaxDestinationLength
// bytes and Key at most MaxOrderingKeyLength bytes, both text by the
// message ID rules; header names non-empty text by the same rules, values
// valid UTF-8 text. Errors match ErrInvalidOutgoing (ErrInvalidMessageID
// or ErrMissingMessageID for the ID).
func ValidateOutgoing(m *OutgoingRecord) error {
	if err := ValidateMessageID(m.ID, 0); err != nil {
		return fmt.Errorf("%w: ID: %w", ErrInvalidOutgoing, err)
	}
	if m.Consumer != "" {
		if err := ValidateConsumerName(m.Consumer); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidOutgoing, err)
		}
	}
	if m.SourceID != "" {
		if err := ValidateMessageID(m.SourceID, 0); err != nil {
			return fmt.Errorf("%w: source ID: %w", ErrInvalidOutgoing, err)
		}
	}
	if m.Destination == "" {
		return fmt.Errorf("%w: message %q: empty destination", ErrInvalidOutgoing, m.ID)
	}
	if r := checkText(m.Destination, MaxDestinationLength); r != "" {
		return fmt.Errorf("%w: message %q: destination: %s", ErrInvalidOutgoing, m.ID, r)
	}
	if m.Key != "" {
		if r := checkText(m.Key, MaxOrderingKeyLength); r != "" {
			return fmt.Errorf("%w: message %q: ordering key: %s", ErrInvalidOutgoing, m.ID, r)
		}
	}
	for k, v := range m.Headers {
		if k == "" {
			return fmt.Errorf("%w: message %q: empty header name", ErrInvalidOutgoing, m.ID)
		}
		if r := checkText(k, 1024); r != "" {
			return fmt.Errorf("%w: message %q: header name: %s", ErrInvalidOutgoing, m.ID, r)
		}
		if r := checkHeaderValue(v); r != "" {
			return fmt.Errorf("%w: message %q: header %q: %s", ErrInvalidOutgoing, m.ID, k, r)
		}
	}
	return nil
}

// checkHeaderValue allows any valid UTF-8 (tabs included) without NUL.
func checkHeaderValue(v string) string {
	for i, r := range v {
		if r == 0 {
			return fmt.Sprintf("NUL byte at %d", i)
		}
		if r == '\uFFFD' && !validRuneAt(v, i) {
			return fmt.Sprintf("invalid UTF-8 at byte %d", i)
		}
	}
	return ""
}

// ValidateEmitParams checks p: a valid consumer name, at least one
// message, each valid by [ValidateOutgoing], IDs distinct. Errors match
// ErrInvalidConsumerName or ErrInvalidOutgoing.
func ValidateEmitParams(p *EmitParams) error {
	if err := ValidateConsumerName(p.Consumer); err != nil {
		return err
	}
	if len(p.Messages) == 0 {
		return fmt.Errorf("%w: no messages to emit", ErrInvalidOutgoing)
	}
	seen := make(map[string]struct{}, len(p.Messages))
	for i := range p.Messages {
		if err := ValidateOutgoing(&p.Messages[i]); err != nil {
			return err
		}
		if _, dup := seen[p.Messages[i].ID]; dup {
			return fmt.Errorf("%w: ID %q emitted twice", ErrInvalidOutgoing, p.Messages[i].ID)
		}
		seen[p.Messages[i].ID] = struct{}{}
	}
	return nil
}

// ValidateClaimOutgoingParams checks Limit >= 1 and Lease >= 1ms. Errors
// match ErrInvalidConfig.
func ValidateClaimOutgoingParams(p *ClaimOutgoingParams) error {
	if p.Limit < 1 {
		return fmt.Errorf("%w: claim limit %d, want >= 1", ErrInvalidConfig, p.Limit)
	}
	if p.Lease < time.Millisecond {
		return fmt.Errorf("%w: outbox lease %v, want >= 1ms", ErrInvalidConfig, p.Lease)
	}
	return nil
}

// ValidateMarkSentParams checks that p's Seqs, when set, has one seq per
// ID. Errors match ErrInvalidConfig.
func ValidateMarkSentParams(p *MarkSentParams) error {
	if len(p.Seqs) != 0 && len(p.Seqs) != len(p.IDs) {
		return fmt.Errorf("%w: MarkSent of %d IDs with %d seqs, want one seq per ID (or none)", ErrInvalidConfig, len(p.IDs), len(p.Seqs))
	}
	return nil
}

// ValidateMarkFailedParams checks that there is at least one row, that no
// ID comes twice, and Attempt >= 1 and RetryAfter >= 0 for each. Errors
// match ErrInvalidConfig. The IDs are not checked: they are claimed
// rows', as read, and a row whose ID a producer in another language wrote
// with bytes the broker adapters refuse (a control character, or an empty
// ID on MariaDB) must still be marked failed, or it would be claimed
// forever and hold back every later row of its key.
func ValidateMarkFailedParams(p *MarkFailedParams) error {
	if len(p.Rows) == 0 {
		return fmt.Errorf("%w: mark of no failed rows", ErrInvalidConfig)
	}
	seen := make(map[string]struct{}, len(p.Rows))
	for _, r := range p.Rows {
		if _, dup := seen[r.ID]; dup {
			return fmt.Errorf("%w: mark of %q: the row comes twice", ErrInvalidConfig, r.ID)
		}
		seen[r.ID] = struct{}{}
		if r.Attempt < 1 {
			return fmt.Errorf("%w: mark of %q: attempt %d, want the claim's (>= 1)", ErrInvalidConfig, r.ID, r.Attempt)
		}
		if r.RetryAfter < 0 {
			return fmt.Errorf("%w: mark of %q: negative RetryAfter %v", ErrInvalidConfig, r.ID, r.RetryAfter)
		}
	}
	return nil
}

// ValidatePurgeOutboxParams checks Retention > 0 and Limit >= 1. Errors
// match ErrInvalidConfig.
func ValidatePurgeOutboxParams(p *PurgeOutboxParams) error {
	if p.Retention <= 0 || p.Limit < 1 {
		return fmt.Errorf("%w: outbox purge retention %v, limit %d (want > 0 and >= 1)", ErrInvalidConfig, p.Retention, p.Limit)
	}
	return nil
}
