package sqlstore

import (
	"github.com/idem-go/idem/idemdriver"
)

// LockedClaimSQL is the claim of a relay round that holds its rows' locks
// through the publish (idemdriver.OutboxLockedRounder): the pending rows,
// first of their keys and under no live lease, in seq order, locked FOR
// UPDATE SKIP LOCKED and left unwritten, after the dialect's RoundBound
// (its parameter 2); ScanLocked reads its rows, its parameter 1 is the
// limit. Empty for a dialect without SkipLocked, RoundBound,
// RoundFailedArrays or IDArray.
func (o *Outbox) LockedClaimSQL() string { return o.lockedClaim }

// lockedClaimSQL builds LockedClaimSQL's text for NewOutbox.
func (o *Outbox) lockedClaimSQL() string {
	if o.d.SkipLocked == "" || o.d.RoundBound == "" || o.d.RoundFailedArrays == "" || o.d.IDArray == "" || o.d.NoUpdateReturning {
		return ""
	}
	return `SELECT ` + o.cols + ` FROM ` + o.d.Table + ` o WHERE ` + o.d.RoundBound + ` AND ` + o.pending + `
ORDER BY o.seq LIMIT ` + o.d.Param(1, "bigint") + o.d.SkipLocked
}

// ScanLocked reads the rows of LockedClaimSQL and closes rows: their
// Attempts count this round (one more than the column).
func ScanLocked(rows Rows) ([]idemdriver.OutgoingRecord, error) { return scanOutgoing(rows, 1) }

// LockedEndStatements returns the statements that end a locked round's
// rows in its transaction, with their arguments: the failed rows' UPDATE
// (RoundFailedArrays; empty without failed rows), then the sent rows'
// DELETE (with sent.Keep, the UPDATE marking them sent; empty without
// sent rows). sent is checked with idemdriver.ValidateMarkSentParams,
// failed (when not empty) with ValidateMarkFailedParams.
func (o *Outbox) LockedEndStatements(sent *idemdriver.MarkSentParams, failed []idemdriver.FailedRow) (failedSQL string, failedArgs []any, sentSQL string, sentArgs []any, err error) {
	if err := idemdriver.ValidateMarkSentParams(sent); err != nil {
		return "", nil, "", nil, err
	}
	if len(failed) > 0 {
		if err := idemdriver.ValidateMarkFailedParams(&idemdriver.MarkFailedParams{Rows: failed}); err != nil {
			return "", nil, "", nil, err
		}
		failedSQL, failedArgs = o.d.RoundFailedArrays, failedArrays(failed)
	}
	if len(sent.IDs) > 0 {
		sentSQL, sentArgs = o.markSentArrays(sent)
	}
	return failedSQL, failedArgs, sentSQL, sentArgs, nil
}

// failedArrays is the six arrays of MarkFailedArrays and RoundFailedArrays
// for rows: IDs, attempts, permanent, retry delays in microseconds, error
// texts, seqs.
func failedArrays(rows []idemdriver.FailedRow) []any {
	n := len(rows)
	ids, attempts, permanent, retry, errs, seqs := make([]string, n), make([]int64, n), make([]bool, n), make([]int64, n), make([]string, n), make([]int64, n)
	for i, r := range rows {
		ids[i], attempts[i], permanent[i], retry[i], errs[i], seqs[i] = r.ID, int64(r.Attempt), r.Permanent, DurationMicros(r.RetryAfter), ErrorText(r.Error), r.Seq
	}
	return []any{ids, attempts, permanent, retry, errs, seqs}
}
