package console

import (
	"context"
	"encoding/json"
	"io"

	"github.com/idem-go/idem/idemdriver"
)

// WriteJSON writes v as indented JSON and a newline.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// maxGroups is the most error groups shown.
const maxGroups = 50

// ReadOutbox reads the outbox's failure groups, a page of its failed rows
// (of error text errText, when set) and its backlog. Errors match
// ErrNoOutbox when st has no outbox, or the store's.
func ReadOutbox(ctx context.Context, st Store, errText string, limit int, cursor string, showPayloads bool) (OutboxView, error) {
	op, _, ok := outboxOf(st)
	if !ok {
		return OutboxView{}, ErrNoOutbox
	}
	p := idemdriver.ListOutgoingParams{Error: errText, Limit: limit, Cursor: cursor}
	page, err := op.ListFailedOutgoing(ctx, &p)
	if err != nil {
		return OutboxView{}, err
	}
	groups, err := op.OutboxFailures(ctx, maxGroups)
	if err != nil {
		return OutboxView{}, err
	}
	s, err := op.OutboxBacklog(ctx)
	if err != nil {
		return OutboxView{}, err
	}
	v := NewOutboxView(groups, page, showPayloads)
	v.Stats = &OutboxStatView{Pending: s.Pending, Failed: s.Failed, OldestPendingS: s.OldestPending.Seconds()}
	return v, nil
}
