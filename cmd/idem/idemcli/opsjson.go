package idemcli

import (
	"encoding/hex"
	"encoding/json"
	"io"
	"time"

	"github.com/idem-go/idem/idemdriver"
)

// writeJSON writes v as indented JSON and a newline.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// jsonTime is a time in RFC 3339 (UTC, nanoseconds), null when zero.
func jsonTime(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := t.UTC().Format(time.RFC3339Nano)
	return &s
}

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

func statsJSONOut(w io.Writer, stats []idemdriver.ConsumerStats) error {
	out := make([]statsJSON, 0, len(stats))
	for _, s := range stats {
		out = append(out, statsJSON{Consumer: s.Consumer, Records: s.Count, Oldest: jsonTime(s.Oldest), Newest: jsonTime(s.Newest)})
	}
	return writeJSON(w, out)
}
