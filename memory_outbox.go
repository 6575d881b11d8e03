package idem

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/idem-go/idem/idemdriver"
)

// Interface checks.
var (
	_ idemdriver.OutboxTx[*MemoryTx] = (*MemoryStore)(nil)
	_ idemdriver.OutboxStore         = (*MemoryStore)(nil)
)

// memOutbox is a MemoryStore's outbox table: rows in sequence order,
// indexed by ID; rows[:done] are all sent, failed or deleted, so claims
// start after them. A deleted row leaves ids at once and rows once
// deleted rows make up half of them.
type memOutbox struct {
	mu      sync.Mutex
	seq     int64
	rows    []*memOutRow
	ids     map[string]*memOutRow
	done    int
	deleted int // rows in rows that are deleted
}

type memOutRow struct {
	rec                                     idemdriver.OutgoingRecord
	available, leaseUntil, sentAt, failedAt time.Time
	lastErr                                 string
	deleted                                 bool
}

func (r *memOutRow) pending() bool { return !r.deleted && r.sentAt.IsZero() && r.failedAt.IsZero() }

// EmitTx implements idemdriver.OutboxTx: the rows are added to the outbox
// when tx commits (MemoryTx.OnCommit), in order; a row whose ID exists is
// left as it is. p is checked first (idemdriver.ValidateEmitParams).
func (s *MemoryStore) EmitTx(ctx context.Context, tx *MemoryTx, p *idemdriver.EmitParams) error {
	if err := idemdriver.ValidateEmitParams(p); err != nil {
		return err
	}
	if tx.ended {
		return ErrTxDone
	}
	rows := make([]idemdriver.OutgoingRecord, len(p.Messages))
	for i, m := range p.Messages {
		m.Payload = slices.Clone(m.Payload)
		m.Headers = maps.Clone(m.Headers)
		rows[i] = m
	}
	tx.OnCommit(func() {
		o := &s.outbox
		o.mu.Lock()
		defer o.mu.Unlock()
		now := s.now()
		if o.ids == nil {
			o.ids = map[string]*memOutRow{}
		}
		for _, m := range rows {
			if o.ids[m.ID] != nil {
				continue
			}
			o.seq++
			m.Seq, m.Attempts, m.CreatedAt = o.seq, 0, now
			r := &memOutRow{rec: m, available: now}
			o.ids[m.ID] = r
			o.rows = append(o.rows, r)
		}
	})
	return nil
}

// ClaimOutgoing implements idemdriver.OutboxStore, by the store's clock.
func (s *MemoryStore) ClaimOutgoing(ctx context.Context, p *idemdriver.ClaimOutgoingParams) ([]idemdriver.OutgoingRecord, error) {
	if err := idemdriver.ValidateClaimOutgoingParams(p); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	o := &s.outbox
	o.mu.Lock()
	defer o.mu.Unlock()
	now := s.now()
	held := map[[2]string]bool{} // keys with an earlier pending row
	var out []idemdriver.OutgoingRecord
	for o.done < len(o.rows) && !o.rows[o.done].pending() {
		o.done++
	}
	for _, r := range o.rows[o.done:] {
		if len(out) == p.Limit {
			break
		}
		if !r.pending() {
			continue
		}
		k := [2]string{r.rec.Destination, r.rec.Key}
		first := r.rec.Key == "" || !held[k]
		held[k] = r.rec.Key != ""
		if !first || r.available.After(now) || r.leaseUntil.After(now) {
			continue
		}
		r.leaseUntil = now.Add(p.Lease)
		r.rec.Attempts++
		c := r.rec
		c.Payload, c.Headers = slices.Clone(c.Payload), maps.Clone(c.Headers)
		out = append(out, c)
	}
	return out, nil
}

// MarkSent implements idemdriver.OutboxStore: it deletes the rows, or,
// with p.Keep, marks the unsent ones sent, under one lock.
func (s *MemoryStore) MarkSent(ctx context.Context, p *idemdriver.MarkSentParams) error {
	if err := idemdriver.ValidateMarkSentParams(p); err != nil {
		return err
	}
	// claimed reports whether r is the row p named as its i-th ID: the
	// same seq, when p has seqs (a row written again has a new one).
	claimed := func(r *memOutRow, i int) bool { return r != nil && (len(p.Seqs) == 0 || r.rec.Seq == p.Seqs[i]) }
	o := &s.outbox
	o.mu.Lock()
	defer o.mu.Unlock()
	if p.Keep {
		now := s.now()
		for i, id := range p.IDs {
			if r := o.ids[id]; claimed(r, i) && r.sentAt.IsZero() {
				r.sentAt, r.leaseUntil = now, time.Time{}
			}
		}
		return nil
	}
	for i, id := range p.IDs {
		if r := o.ids[id]; claimed(r, i) {
			r.deleted = true
			delete(o.ids, id)
			o.deleted++
		}
	}
	if o.deleted > 64 && 2*o.deleted > len(o.rows) {
		o.rows = slices.DeleteFunc(o.rows, func(r *memOutRow) bool { return r.deleted })
		o.done, o.deleted = 0, 0
	}
	return nil
}

// MarkFailed implements idemdriver.OutboxStore, fenced by each row's
// Attempt, under one lock.
func (s *MemoryStore) MarkFailed(ctx context.Context, p *idemdriver.MarkFailedParams) error {
	if err := idemdriver.ValidateMarkFailedParams(p); err != nil {
		return err
	}
	rows := make(map[string]idemdriver.FailedRow, len(p.Rows))
	ids := make([]string, len(p.Rows))
	for i, f := range p.Rows {
		rows[f.ID], ids[i] = f, f.ID
	}
	return s.outboxUpdate(ids, func(r *memOutRow, now time.Time) {
		f := rows[r.rec.ID]
		if r.rec.Attempts != f.Attempt || f.Seq != 0 && r.rec.Seq != f.Seq {
			return // another claim took the row since, or it is another row
		}
		r.leaseUntil, r.lastErr = time.Time{}, f.Error
		if f.Permanent {
			r.failedAt = now
		} else {
			r.available = now.Add(f.RetryAfter)
		}
	})
}

// outboxUpdate applies fn to the unsent rows with the given IDs (a
// deleted row has no ID any more).
func (s *MemoryStore) outboxUpdate(ids []string, fn func(r *memOutRow, now time.Time)) error {
	o := &s.outbox
	o.mu.Lock()
	defer o.mu.Unlock()
	now := s.now()
	for _, id := range ids {
		if r := o.ids[id]; r != nil && r.sentAt.IsZero() {
			fn(r, now)
		}
	}
	return nil
}

// PendingOutgoing returns how many outbox rows consumer emitted while
// processing the incoming message sourceID that are neither sent nor
// failed: a check for tests (broker/brokertest), which walks every row.
// Relays and consumers do not need it.
func (s *MemoryStore) PendingOutgoing(consumer, sourceID string) int {
	o := &s.outbox
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, r := range o.rows {
		if r.pending() && r.rec.Consumer == consumer && r.rec.SourceID == sourceID {
			n++
		}
	}
	return n
}

// PurgeOutbox implements idemdriver.OutboxStore, by the store's clock.
func (s *MemoryStore) PurgeOutbox(ctx context.Context, p *idemdriver.PurgeOutboxParams) (int64, error) {
	if err := idemdriver.ValidatePurgeOutboxParams(p); err != nil {
		return 0, err
	}
	o := &s.outbox
	o.mu.Lock()
	defer o.mu.Unlock()
	horizon := s.now().Add(-p.Retention)
	var n int64
	o.rows = slices.DeleteFunc(o.rows, func(r *memOutRow) bool {
		if r.deleted {
			return true // gone already: not counted
		}
		done := r.sentAt
		if done.IsZero() {
			done = r.failedAt
		}
		if n == int64(p.Limit) || done.IsZero() || !done.Before(horizon) {
			return false
		}
		n++
		delete(o.ids, r.rec.ID)
		return true
	})
	o.done, o.deleted = 0, 0
	return n, nil
}

// OutboxStats implements idemdriver.OutboxStore.
func (s *MemoryStore) OutboxStats(ctx context.Context) (idemdriver.OutboxStats, error) {
	o := &s.outbox
	o.mu.Lock()
	defer o.mu.Unlock()
	var st idemdriver.OutboxStats
	now := s.now()
	for _, r := range o.rows {
		switch {
		case r.pending():
			if st.Pending == 0 {
				st.OldestPending = max(now.Sub(r.rec.CreatedAt), 0)
			}
			st.Pending++
		case !r.deleted && r.sentAt.IsZero():
			st.Failed++
		}
	}
	return st, nil
}
