package idemredis

import (
	"context"

	"github.com/idem-go/idem/idemdriver"
)

var _ idemdriver.LeaseBatchRenewer = (*Store)(nil)

// RenewBatch implements [idemdriver.LeaseBatchRenewer]: the fenced script
// of Renew for each lease of ps, sent in one pipeline (one round trip per
// server; a Cluster client splits it by node), each script atomic on its
// own: per element, nil when the lease now ends its Lease (rounded up to a
// millisecond) after the server's now, an error matching
// idemdriver.ErrLeaseLost when its token does not own the record, the
// error of idemdriver.ValidateRenewParams when invalid (left out of the
// pipeline). A script the server does not know yet is run again on its
// own. Every error, the network's included, is an element's; err is only
// that of an ended ctx or a batch over idemdriver.MaxLeaseBatch (matching
// idemdriver.ErrInvalidConfig).
func (s *Store) RenewBatch(ctx context.Context, ps []idemdriver.RenewParams) ([]error, error) {
	if err := idemdriver.ValidateBatchSize(len(ps)); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil || len(ps) == 0 {
		return nil, err
	}
	errs := make([]error, len(ps))
	b := getBatch(ctx, len(ps), renewEval, 1, 2)
	for i := range ps {
		p := &ps[i]
		if errs[i] = idemdriver.ValidateRenewParams(p); errs[i] != nil {
			continue
		}
		_, rk := s.keyFrame(b, i, p.Consumer, p.MessageID)
		b.set(i, rk, p.Token, s.leaseArg(p.Lease))
	}
	s.sendBatch(ctx, b)
	for i, cmd := range b.cmds {
		if cmd != nil {
			p := &ps[i]
			v, err := cmd.Result()
			errs[i] = s.fenced("renew", p.Consumer, p.MessageID, p.Token, v, err)
		}
	}
	b.release()
	return errs, nil
}

// RenewsBatches implements [idemdriver.LeaseBatchRenewer]: true.
func (s *Store) RenewsBatches() bool { return true }
