package idem

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/idem-go/idem/idemdriver"
)

// The operator capabilities of the memory store.
var (
	_ idemdriver.Inspector      = (*MemoryStore)(nil)
	_ idemdriver.Operator       = (*MemoryStore)(nil)
	_ idemdriver.OutboxOperator = (*MemoryStore)(nil)
	_ idemdriver.ConsumerLister = (*MemoryStore)(nil)
	_ idemdriver.StepReader     = (*MemoryStore)(nil)
)

// ErrWrongState is idemdriver.ErrWrongState: an operator action (retry,
// release) found the record or outbox row in a state it does not apply
// to, and changed nothing.
var ErrWrongState = idemdriver.ErrWrongState

// ErrNotFound is idemdriver.ErrNotFound: an inspected record, or the
// target of an operator action, does not exist.
var ErrNotFound = idemdriver.ErrNotFound

// Inspect implements [idemdriver.Inspector] by the store's clock.
func (s *MemoryStore) Inspect(ctx context.Context, consumer, messageID string) (idemdriver.Record, error) {
	if err := idemdriver.ValidateKey(consumer, messageID); err != nil {
		return idemdriver.Record{}, err
	}
	if err := ctx.Err(); err != nil {
		return idemdriver.Record{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.records[memKey{consumer, messageID}]
	if !ok {
		return idemdriver.Record{}, fmt.Errorf("%w: consumer %q, message ID %q", ErrNotFound, consumer, messageID)
	}
	rec := r.public(consumer, messageID)
	if rec.State == idemdriver.StateCompleted && r.state != 0 {
		rec.Result, rec.ContentType = slices.Clone(r.result), r.contentType
	}
	return rec, nil
}

// Stats implements [idemdriver.Inspector]: one entry per consumer, by name.
func (s *MemoryStore) Stats(ctx context.Context) ([]idemdriver.ConsumerStats, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	by := map[string]*idemdriver.ConsumerStats{}
	for k, r := range s.records {
		c := by[k.consumer]
		if c == nil {
			c = &idemdriver.ConsumerStats{Consumer: k.consumer, Oldest: r.at, Newest: r.at}
			by[k.consumer] = c
		}
		c.Count++
		if r.at.Before(c.Oldest) {
			c.Oldest = r.at
		}
		if r.at.After(c.Newest) {
			c.Newest = r.at
		}
	}
	out := make([]idemdriver.ConsumerStats, 0, len(by))
	for _, name := range slices.Sorted(maps.Keys(by)) {
		c := *by[name]
		c.Oldest, c.Newest = c.Oldest.UTC(), c.Newest.UTC()
		out = append(out, c)
	}
	return out, nil
}

// Consumers implements [idemdriver.ConsumerLister]: Stats without the
// counts.
func (s *MemoryStore) Consumers(ctx context.Context) ([]idemdriver.ConsumerStats, error) {
	out, err := s.Stats(ctx)
	for i := range out {
		out[i].Count = 0
	}
	return out, err
}

// Steps implements [idemdriver.StepReader].
func (s *MemoryStore) Steps(ctx context.Context, consumer, messageID string) ([]idemdriver.Step, error) {
	if err := idemdriver.ValidateKey(consumer, messageID); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	steps := s.records[memKey{consumer, messageID}].steps
	out := make([]idemdriver.Step, 0, len(steps))
	for _, name := range slices.Sorted(maps.Keys(steps)) {
		out = append(out, idemdriver.Step{Name: name, Result: slices.Clone(steps[name])})
	}
	return out, nil
}

// OutboxBacklog implements [idemdriver.OutboxOperator]: OutboxStats.
func (s *MemoryStore) OutboxBacklog(ctx context.Context) (idemdriver.OutboxStats, error) {
	return s.OutboxStats(ctx)
}

// public is r as an idemdriver.Record, times in UTC at microsecond
// precision (the SQL stores' and cursors').
func (r memRecord) public(consumer, id string) idemdriver.Record {
	out := idemdriver.Record{
		Consumer: consumer, MessageID: id, Fingerprint: slices.Clone(r.fingerprint),
		ProcessedAt: r.at.UTC().Truncate(time.Microsecond), State: r.state,
		Token: r.token, Attempt: r.attempt, Error: r.errText,
	}
	if r.state == 0 {
		out.State, out.Attempt = idemdriver.StateCompleted, 1
	}
	if r.state == idemdriver.StateInProgress {
		out.LeaseExpiresAt = r.leaseUntil.UTC().Truncate(time.Microsecond)
	}
	return out
}

// ListRecords implements [idemdriver.Operator]. The memory store has no
// index: it sorts the consumer's records, then examines at most p.Scan of
// them after the cursor, as the SQL stores do.
func (s *MemoryStore) ListRecords(ctx context.Context, p *idemdriver.ListRecordsParams) (idemdriver.RecordPage, error) {
	pos, err := idemdriver.ValidateListRecordsParams(p)
	if err != nil {
		return idemdriver.RecordPage{}, err
	}
	if err := ctx.Err(); err != nil {
		return idemdriver.RecordPage{}, err
	}
	s.mu.Lock()
	var all []idemdriver.Record
	for k, r := range s.records {
		if k.consumer != p.Consumer {
			continue
		}
		if rec := r.public(k.consumer, k.id); pos.Before(rec.ProcessedAt, rec.MessageID) {
			all = append(all, rec)
		}
	}
	s.mu.Unlock()
	slices.SortFunc(all, func(a, b idemdriver.Record) int {
		return cmp.Or(b.ProcessedAt.Compare(a.ProcessedAt), cmp.Compare(b.MessageID, a.MessageID))
	})
	return idemdriver.PageRecords(all[:min(len(all), p.Scan)], p, len(all) > p.Scan), nil
}

// RetryRecord implements [idemdriver.Operator].
func (s *MemoryStore) RetryRecord(ctx context.Context, consumer, messageID string) (idemdriver.ActionResult, error) {
	return s.operate(ctx, consumer, messageID, func(r *memRecord, now time.Time) (bool, error) {
		switch r.state {
		case idemdriver.StateInProgress:
			return false, nil
		case idemdriver.StateFailed:
			r.state, r.token, r.attempt, r.released = idemdriver.StateInProgress, r.token+1, 0, true
			r.leaseUntil, r.at = now, now
			return true, nil
		}
		return false, fmt.Errorf("%w: consumer %q, message ID %q is completed; only a failed record can be retried", ErrWrongState, consumer, messageID)
	})
}

// ReleaseLease implements [idemdriver.Operator].
func (s *MemoryStore) ReleaseLease(ctx context.Context, p *idemdriver.ReleaseLeaseParams) (idemdriver.ActionResult, error) {
	if err := idemdriver.ValidateReleaseLeaseParams(p); err != nil {
		return idemdriver.ActionResult{}, err
	}
	return s.operate(ctx, p.Consumer, p.MessageID, func(r *memRecord, now time.Time) (bool, error) {
		if err := idemdriver.CheckRelease(r.public(p.Consumer, p.MessageID), p.Token); err != nil {
			return false, err
		}
		if r.token != p.Token || r.released {
			return false, nil
		}
		r.released, r.leaseUntil, r.at = true, now, now
		return true, nil
	})
}

// operate runs act on the record under the store's lock.
func (s *MemoryStore) operate(ctx context.Context, consumer, id string, act func(r *memRecord, now time.Time) (bool, error)) (idemdriver.ActionResult, error) {
	if err := idemdriver.ValidateKey(consumer, id); err != nil {
		return idemdriver.ActionResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return idemdriver.ActionResult{}, err
	}
	k := memKey{consumer, id}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.records[k]
	if !ok {
		return idemdriver.ActionResult{}, fmt.Errorf("%w: consumer %q, message ID %q", ErrNotFound, consumer, id)
	}
	if r.state == 0 {
		r.state = idemdriver.StateCompleted
	}
	changed, err := act(&r, s.now())
	if err != nil {
		return idemdriver.ActionResult{}, err
	}
	if changed {
		s.records[k] = r
	}
	return idemdriver.ActionResult{Changed: changed, Record: r.public(consumer, id)}, nil
}

// OutboxFailures implements [idemdriver.OutboxOperator].
func (s *MemoryStore) OutboxFailures(ctx context.Context, limit int) ([]idemdriver.FailureGroup, error) {
	if err := idemdriver.ValidatePageLimit(limit); err != nil {
		return nil, err
	}
	rows := s.failedRows("")
	by := map[string]*idemdriver.FailureGroup{}
	var out []idemdriver.FailureGroup
	for _, r := range rows {
		g := by[r.Error]
		if g == nil {
			g = &idemdriver.FailureGroup{Error: r.Error, Newest: r.FailedAt}
			by[r.Error] = g
		}
		g.Count++
		g.Oldest = r.FailedAt
	}
	for _, r := range rows { // newest failure first, as rows are
		if g := by[r.Error]; g != nil && len(out) < limit {
			out = append(out, *g)
			delete(by, r.Error)
		}
	}
	return out, nil
}

// ListFailedOutgoing implements [idemdriver.OutboxOperator].
func (s *MemoryStore) ListFailedOutgoing(ctx context.Context, p *idemdriver.ListOutgoingParams) (idemdriver.OutgoingPage, error) {
	pos, err := idemdriver.ValidateListOutgoingParams(p)
	if err != nil {
		return idemdriver.OutgoingPage{}, err
	}
	var page idemdriver.OutgoingPage
	for _, r := range s.failedRows(p.Error) {
		if !pos.Before(r.FailedAt, r.ID) {
			continue
		}
		if len(page.Rows) == p.Limit {
			last := page.Rows[len(page.Rows)-1]
			page.Next = idemdriver.EncodeCursor(last.FailedAt, last.ID)
			break
		}
		page.Rows = append(page.Rows, r)
	}
	return page, nil
}

// failedRows returns the failed outbox rows (of error text errText, when
// set), the most recently failed first.
func (s *MemoryStore) failedRows(errText string) []idemdriver.FailedOutgoing {
	o := &s.outbox
	o.mu.Lock()
	var out []idemdriver.FailedOutgoing
	for _, r := range o.rows {
		if r.sentAt.IsZero() && !r.failedAt.IsZero() && (errText == "" || r.lastErr == errText) {
			rec := r.rec
			rec.Payload, rec.Headers = slices.Clone(rec.Payload), maps.Clone(rec.Headers)
			out = append(out, idemdriver.FailedOutgoing{OutgoingRecord: rec, FailedAt: r.failedAt.UTC().Truncate(time.Microsecond), Error: r.lastErr})
		}
	}
	o.mu.Unlock()
	slices.SortFunc(out, func(a, b idemdriver.FailedOutgoing) int {
		return cmp.Or(b.FailedAt.Compare(a.FailedAt), cmp.Compare(b.ID, a.ID))
	})
	return out
}

// RetryOutgoing implements [idemdriver.OutboxOperator].
func (s *MemoryStore) RetryOutgoing(ctx context.Context, id string) (idemdriver.ActionResult, error) {
	if err := idemdriver.ValidateMessageID(id, 0); err != nil {
		return idemdriver.ActionResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return idemdriver.ActionResult{}, err
	}
	o := &s.outbox
	o.mu.Lock()
	defer o.mu.Unlock()
	r := o.ids[id]
	res := idemdriver.ActionResult{Record: idemdriver.Record{MessageID: id}}
	switch {
	case r == nil:
		return idemdriver.ActionResult{}, fmt.Errorf("%w: outbox row %q", ErrNotFound, id)
	case !r.sentAt.IsZero():
		return idemdriver.ActionResult{}, fmt.Errorf("%w: outbox row %q was sent; only a failed row can be retried", ErrWrongState, id)
	case r.failedAt.IsZero():
		return res, nil
	}
	now := s.now()
	r.failedAt, r.available, r.leaseUntil = time.Time{}, now, time.Time{}
	o.done = 0 // claims start at the first row that may be pending
	res.Changed, res.Record.Consumer = true, r.rec.Consumer
	return res, nil
}
