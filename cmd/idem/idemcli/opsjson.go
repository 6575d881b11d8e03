package idemcli

import (
	"encoding/hex"
	"io"

	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/idemdriver"
)

// writeJSON writes v as indented JSON and a newline; jsonTime is a time
// in RFC 3339 (UTC, nanoseconds), null when zero. The operator commands
// share them (package console).
var (
	writeJSON = console.WriteJSON
	jsonTime  = console.Time
)

// recordJSON is `idem inspect --json`: the fields of the text output,
// under stable names. The fingerprint is hex, as in the text output.
type recordJSON struct {
	Consumer       string  `json:"consumer"`
	MessageID      string  `json:"message_id"`
	State          string  `json:"state"`
	ProcessedAt    *string `json:"processed_at"`
	Fingerprint    string  `json:"fingerprint"`
	Attempts       int     `json:"attempts"`
	Token          *int64  `json:"fencing_token,omitempty"`
	LeaseExpiresAt *string `json:"lease_expires_at,omitempty"`
	LastError      string  `json:"last_error,omitempty"`
}

func inspectJSON(w io.Writer, rec idemdriver.Record, lastError string) error {
	out := recordJSON{Consumer: rec.Consumer, MessageID: rec.MessageID, State: rec.State.String(),
		ProcessedAt: jsonTime(rec.ProcessedAt), Fingerprint: hex.EncodeToString(rec.Fingerprint), Attempts: rec.Attempt, LastError: lastError}
	if rec.State == idemdriver.StateInProgress {
		out.Token, out.LeaseExpiresAt = &rec.Token, jsonTime(rec.LeaseExpiresAt)
	}
	return writeJSON(w, out)
}

// statsJSON is one consumer of `idem stats --json`.
type statsJSON struct {
	Consumer string  `json:"consumer"`
	Records  int64   `json:"records"`
	Oldest   *string `json:"oldest"`
	Newest   *string `json:"newest"`
}

// outboxJSON is the outbox backlog of `idem stats --json`: rows pending,
// failed for good, and the age in seconds of the oldest pending row (the
// relay lag).
type outboxJSON struct {
	Pending        int64   `json:"pending"`
	Failed         int64   `json:"failed"`
	OldestPendingS float64 `json:"oldest_pending_s"`
}

// storeStatsJSON is `idem stats --json`: what the text output shows, the
// records per consumer and the outbox backlog (null when the store has no
// outbox table).
type storeStatsJSON struct {
	Consumers []statsJSON `json:"consumers"`
	Outbox    *outboxJSON `json:"outbox"`
}

func statsJSONOut(w io.Writer, stats []idemdriver.ConsumerStats, outbox *idemdriver.OutboxStats) error {
	out := storeStatsJSON{Consumers: make([]statsJSON, 0, len(stats))}
	for _, s := range stats {
		out.Consumers = append(out.Consumers, statsJSON{Consumer: s.Consumer, Records: s.Count, Oldest: jsonTime(s.Oldest), Newest: jsonTime(s.Newest)})
	}
	if outbox != nil {
		out.Outbox = &outboxJSON{Pending: outbox.Pending, Failed: outbox.Failed, OldestPendingS: outbox.OldestPending.Seconds()}
	}
	return writeJSON(w, out)
}
