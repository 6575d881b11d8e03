package idem

import (
	"context"
	"time"

	"github.com/idem-go/idem/idemdriver"
)

var _ idemdriver.Reopener = (*MemoryStore)(nil)

// ErrTokenMoved is idemdriver.ErrTokenMoved: a reopen found the record
// completed or failed under a later token than the one it was to reopen.
var ErrTokenMoved = idemdriver.ErrTokenMoved

// ReopenRecord implements [idemdriver.Reopener] under the store's lock.
func (s *MemoryStore) ReopenRecord(ctx context.Context, p *idemdriver.ReopenRecordParams) (idemdriver.ActionResult, error) {
	if err := idemdriver.ValidateReopenRecordParams(p); err != nil {
		return idemdriver.ActionResult{}, err
	}
	return s.operate(ctx, p.Consumer, p.MessageID, func(r *memRecord, now time.Time) (bool, error) {
		if r.state != idemdriver.StateCompleted || r.token != p.Token {
			return false, idemdriver.CheckReopen(r.public(p.Consumer, p.MessageID), p.Token)
		}
		r.state, r.token, r.attempt, r.released = idemdriver.StateInProgress, r.token+1, 0, true
		r.leaseUntil, r.at = now, now
		r.result, r.contentType, r.steps = nil, "", nil
		return true, nil
	})
}
