package sqlstore

import (
	"context"

	"github.com/idem-go/idem/idemdriver"
)

// MarkSentClaim is MarkSent of sent followed by Claim of claim in one
// transaction that begin starts, committed once, for a store without a
// way to send the two in one round trip (store/idemsql): MarkSent's
// statements, then the claim's (its UPDATE ... RETURNING, or its locking
// SELECT and UPDATE), then COMMIT, where MarkSent and Claim commit once
// each. The claim sees the ended rows gone. With no sent row it is Claim
// (on db, or in a transaction of begin without UPDATE ... RETURNING).
// Both parameters are checked first (idemdriver.ValidateMarkSentParams,
// ValidateClaimOutgoingParams); on an error nothing committed, unless
// the commit's outcome is unknown.
func (o *Outbox) MarkSentClaim(ctx context.Context, db Querier, begin func(context.Context) (Tx, error), sent *idemdriver.MarkSentParams, claim *idemdriver.ClaimOutgoingParams) ([]idemdriver.OutgoingRecord, error) {
	if err := idemdriver.ValidateMarkSentParams(sent); err != nil {
		return nil, err
	}
	if err := idemdriver.ValidateClaimOutgoingParams(claim); err != nil {
		return nil, err
	}
	if len(sent.IDs) == 0 {
		return o.Claim(ctx, db, begin, claim)
	}
	tx, err := begin(ctx)
	if err != nil {
		return nil, err
	}
	defer rollback(ctx, tx)
	if err := o.MarkSent(ctx, tx, sent); err != nil {
		return nil, err
	}
	recs, err := o.claimIn(ctx, tx, claim)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, err
	}
	return recs, nil
}
