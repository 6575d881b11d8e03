package sqlstore

import (
	"database/sql"
	"fmt"
	"slices"
	"strings"

	"github.com/idem-go/idem/idemdriver"
)

// State is the record state of a scanned state column: NULL or 0 (a read
// without the lease columns, or a table from before them) is a completed
// record.
func State(v sql.NullInt64) idemdriver.RecordState {
	if !v.Valid || v.Int64 == 0 {
		return idemdriver.StateCompleted
	}
	return idemdriver.RecordState(v.Int64)
}

// Existing is the result of a claim that found a committed record with
// fingerprint fp and state.
func Existing(fp []byte, state sql.NullInt64) idemdriver.ClaimResult {
	return idemdriver.ClaimResult{Fingerprint: fp, State: State(state)}
}

// Claimed is the result of a claim that inserted the record.
var Claimed = idemdriver.ClaimResult{Claimed: true}

// AllClaimed returns n results Claimed: those of a batch claim that
// inserted every message.
func AllClaimed(n int) []idemdriver.ClaimResult {
	out := make([]idemdriver.ClaimResult, n)
	for i := range out {
		out[i] = Claimed
	}
	return out
}

// Sorted returns the messages of p in byte order of their IDs, the order
// in which every batch claim inserts, so that two batches sharing IDs take
// their row locks in the same order and cannot deadlock. The result is
// p.Messages itself when they are in that order already; callers only
// read it.
func Sorted(p *idemdriver.ClaimBatchParams) []idemdriver.ClaimMessage {
	byID := func(a, b idemdriver.ClaimMessage) int { return strings.Compare(a.MessageID, b.MessageID) }
	if slices.IsSortedFunc(p.Messages, byID) { // as idem.Consumer sends them: no copy
		return p.Messages
	}
	sorted := slices.Clone(p.Messages)
	slices.SortFunc(sorted, byID)
	return sorted
}

// InOrder returns the results in got (by message ID) in the order of
// p.Messages, or an error naming a message without one.
func InOrder(p *idemdriver.ClaimBatchParams, got map[string]idemdriver.ClaimResult) ([]idemdriver.ClaimResult, error) {
	out := make([]idemdriver.ClaimResult, len(p.Messages))
	for i, m := range p.Messages {
		r, ok := got[m.MessageID]
		if !ok {
			return nil, fmt.Errorf("idem: batch claim of consumer %q settled no result for message ID %q", p.Consumer, m.MessageID)
		}
		out[i] = r
	}
	return out, nil
}

// Unsettled returns the messages of msgs that have no result in got.
func Unsettled(msgs []idemdriver.ClaimMessage, got map[string]idemdriver.ClaimResult) []idemdriver.ClaimMessage {
	var out []idemdriver.ClaimMessage
	for _, m := range msgs {
		if _, ok := got[m.MessageID]; !ok {
			out = append(out, m)
		}
	}
	return out
}

// IDs returns the message IDs of msgs.
func IDs(msgs []idemdriver.ClaimMessage) []string {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.MessageID
	}
	return ids
}

// ReadExisting reads (message_id, fingerprint, state) rows, the result of
// a Query that returned err, and records each in got as a committed
// record.
func ReadExisting(rows Rows, err error, got map[string]idemdriver.ClaimResult) error {
	if err != nil {
		return err
	}
	return ForEach(rows, func(r Row) error {
		var (
			id    string
			fp    []byte
			state sql.NullInt64
		)
		if err := r.Scan(&id, &fp, &state); err != nil {
			return err
		}
		got[id] = Existing(fp, state)
		return nil
	})
}

// ErrUnsettled is the error of a claim whose record kept vanishing after
// conflicts for MaxClaimAttempts attempts.
func ErrUnsettled(what, consumer string) error {
	return fmt.Errorf("idem: %s of consumer %q did not settle after %d attempts: the conflicting records kept vanishing", what, consumer, MaxClaimAttempts)
}
