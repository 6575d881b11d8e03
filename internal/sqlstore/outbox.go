package sqlstore

import (
	"cmp"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem/idemdriver"
)

// OutboxDialect is what the outbox statements need of a dialect: its
// placeholders, its clock and its few differences. Each dialect's package
// fills one in (internal/pgsql for PostgreSQL, store/idemsql for MySQL and
// SQLite); [NewOutbox] builds the statements from it, so every dialect
// runs the same statements with its own spelling.
type OutboxDialect struct {
	// Table is the outbox table as written in SQL.
	Table string
	// Param returns the i-th (1-based) placeholder of a parameter of the
	// kind ("text", "bytea", "bigint", "json"): "$3::text", "?3", or "?"
	// where the statements use their parameters in the order of their
	// numbers (MySQL's claim runs as two statements for that reason).
	Param func(i int, kind string) string
	// Now is the server's clock as a value of the time columns.
	Now string
	// Plus returns the time column value Now plus the bigint microseconds
	// of placeholder p.
	Plus func(p string) string
	// Minus returns Now minus the bigint microseconds of placeholder p.
	Minus func(p string) string
	// LeaseEnd, if set, replaces Plus for the end of a claim's lease: the
	// lease must count from when the rows were locked, not from before
	// any lock wait of the statement, or a relay whose claim waited would
	// publish past the end of a lease another relay can then take over
	// (the publish gets half the lease from when the claim returns).
	// PostgreSQL's now() is the transaction's start: its claim counts
	// from clock_timestamp().
	LeaseEnd func(p string) string
	// Micros returns the expression of time column x as bigint
	// microseconds since the epoch.
	Micros func(x string) string
	// HeadersOut is the headers column as text in a select list.
	HeadersOut string
	// TextOut ends each text column (id, consumer, source_id,
	// destination, order_key) in a select list: PostgreSQL's "::text"
	// gives the relay's rows the type text whatever the columns' (domains
	// since migration 010), so that a claim prepared before a migration
	// that changes them still returns the types it was prepared with
	// (PostgreSQL refuses to run a cached plan whose result types
	// changed: SQLSTATE 0A000).
	TextOut string
	// IgnoreDuplicate ends an INSERT so that a row whose id exists is left
	// as it is without an error.
	IgnoreDuplicate string
	// SkipLocked ends the row selections of the claim and of the purge:
	// " FOR UPDATE SKIP LOCKED", or "" for a single-writer database. So
	// relays side by side claim and purge disjoint rows, never waiting
	// for each other's row locks (two purges that lock the same rows in
	// different orders would deadlock).
	SkipLocked string
	// KeyPending is the condition "row p is pending" in the claim's order
	// check (is there an earlier pending row of the same destination and
	// key as row o?), with whatever else lets the dialect's key index
	// serve the check (PostgreSQL's, since migration 011, holds a hash of
	// the key), written to match that index's predicate and only that
	// index's. Empty means
	// "p.sent_at IS NULL AND p.failed_at IS NULL". PostgreSQL's pending
	// condition is spelled "COALESCE(p.sent_at, p.failed_at) IS NULL":
	// its planner may use a
	// partial index only when the query implies the index's predicate,
	// and this spelling does not imply that of the pending-rows index on
	// seq, which would otherwise serve the check as a walk through every
	// earlier pending row (a cost that grows with the backlog, per row
	// claimed) whenever the two indexes cost about the same on paper.
	KeyPending string
	// IDArray, if set, is the condition "id is in the array given as
	// parameter 1", for a driver that takes a []string as an array:
	// MarkSent then runs one statement (a DELETE, or with Keep an UPDATE)
	// whatever the number of IDs.
	IDArray string
	// IDSeqArrays, with IDArray, is the condition "(id, seq) is a pair of
	// the arrays given as parameters 1 and 2": MarkSent with seqs then runs
	// one statement whatever the number of rows.
	IDSeqArrays string
	// MarkFailedArrays, if set, is the statement that marks failed rows
	// given as six arrays, for a driver that takes slices as arrays: IDs
	// ([]string), attempts ([]int64), permanent ([]bool), retry delays in
	// microseconds ([]int64), error texts ([]string) and seqs ([]int64, 0
	// for a row named by ID and attempt alone). MarkFailed then
	// runs one statement whatever the number of rows; otherwise it runs
	// one per MaxFailedPerStatement rows, written out.
	MarkFailedArrays string
	// NoUpdateReturning is set for a dialect without UPDATE ... RETURNING
	// (MariaDB, MySQL): the claim then selects and locks the rows, and
	// updates them with a second statement, in one transaction.
	NoUpdateReturning bool
	// Quiet, if set, is a condition the INSERT of EmitStatementQuiet
	// checks for each row, true, evaluated for what it does before the
	// rows are written: PostgreSQL's set_config of idem.outbox_quiet for
	// the transaction, so that a store that quiets the outbox trigger
	// does it in the INSERT instead of a statement of its own.
	Quiet string
	// RoundFailedArrays, if set (with SkipLocked and IDArray), is the
	// statement that marks the failed rows of a relay round holding its
	// rows' locks (idemdriver.OutboxLockedRounder), given as the six
	// arrays of MarkFailedArrays: it sets each row's attempts to the
	// array's (the claim wrote none), its error, and either its retry
	// time (from the statement's clock, not the transaction's start) or
	// failed_at; the rows are named by ID and seq, and need no fence (the
	// round holds their locks).
	RoundFailedArrays string
	// RoundBound, with RoundFailedArrays, is a condition of the locked
	// round's claim, true, evaluated once before any row is locked, that
	// bounds the round's transaction on the server by the milliseconds
	// of parameter 2 (text): PostgreSQL's set_config of
	// idle_in_transaction_session_timeout for the transaction, in an
	// uncorrelated subquery (run once, as an init plan).
	RoundBound string
	// HeadersDefault, if set, lets an emit none of whose messages has
	// headers leave the headers column to the table's default ('{}'),
	// which the dialect's schema is sure to have: PostgreSQL's jsonb
	// column, whose value given as a parameter the server parses as JSON
	// for every row. (MySQL takes a literal default on a text column
	// only in some versions and modes: its LONGTEXT column may lack one.)
	HeadersDefault bool
	// SeqsJoin, required with NoUpdateReturning, is a table expression
	// that joins the rows whose seq is in parameter 1, a JSON array of
	// numbers, to the outbox table as o, one lookup of the primary key per
	// element in the array's order, visiting no other row: the rows the
	// claim's UPDATE and the purge's DELETE write, which their SELECT ...
	// FOR UPDATE SKIP LOCKED locked, are named through it. InnoDB runs
	// "WHERE seq IN (...)" of many seqs on a table not much larger than
	// the list as a scan of the whole table, locking every row it reads,
	// other relays' too (MariaDB 10.11): the claims' UPDATEs of two relay
	// workers each waited for a row the other had read, and deadlocked
	// (error 1213); a purge's DELETE waited for every row another
	// transaction locked.
	SeqsJoin string
	// SentJoin, with SeqsJoin, is the same for MarkSent's rows named by
	// seq and ID: parameter 1 a JSON array of [seq, ID in hexadecimal]
	// pairs, each row joined only while its ID is the one given. MarkSent
	// then runs one statement (a DELETE, or with Keep an UPDATE) whatever
	// the number of rows, in seq order, locking no row but its own.
	SentJoin string
	// MarkFailedJSON, if set (and MarkFailedArrays not), is the statement
	// that marks failed rows given as parameter 1, a JSON array of [ID in
	// hexadecimal, attempt, permanent (0 or 1), retry delay in
	// microseconds, error text, seq (0 for none)] arrays, each row looked
	// up by its ID alone, in the array's order: MarkFailed then runs one
	// statement whatever the number of rows, locking no other row (its
	// written-out form, an OR of the rows' conditions, ran on MariaDB as a
	// scan of a small table under REPEATABLE READ, locking every row, and
	// deadlocked with a relay's claim).
	MarkFailedJSON string
}

// Outbox is the outbox statements of one dialect, and the logic that runs
// them through a Querier.
type Outbox struct {
	d       OutboxDialect
	cols    string // the columns of a claimed row
	pending string // a pending row of alias o, first in its key
	// Fixed statements.
	claimReturning, claimSelect, purge, purgeSelect, stats string
	markSentArray, deleteSentArray                         string
	lockedClaim                                            string
	markSentSeqArrays, deleteSentSeqArrays                 string
	claimUpdate, purgeDelete, markSentJoin, deleteSentJoin string // SeqsJoin's and SentJoin's
	// emitSQL caches the INSERT of 1 to len(emitSQL) rows, built on first
	// use: most processings emit one or a few rows, and building the text
	// (a placeholder string per column) cost an emit 15 allocations;
	// quietSQL, the same for EmitStatementQuiet. Indexed by emitForm: with
	// or without the headers column.
	emitSQL, quietSQL [2][8]atomic.Pointer[string]
}

// MarkFailedSQL is the dialect's MarkFailedArrays (empty without one), for
// tests that look at its plan.
func (o *Outbox) MarkFailedSQL() string { return o.d.MarkFailedArrays }

// ClaimSQL is the claim statement (the selection of the two-statement
// claim without UPDATE ... RETURNING), for tests that look at its plan.
func (o *Outbox) ClaimSQL() string {
	if o.d.NoUpdateReturning {
		return o.claimSelect
	}
	return o.claimReturning
}

// insertCols are the columns EmitTx writes; the rest take their defaults.
// On a dialect with HeadersDefault, an emit none of whose messages has
// headers leaves headers out too (insertColsNoHeaders): the column's
// default, '{}', is what EncodeHeaders writes for no headers, and a
// constant of the statement's plan costs the server no parse per row
// (PostgreSQL: about 3,000 instructions of an emitting transaction's
// 218,000).
const (
	insertCols          = `(id, consumer, source_id, destination, order_key, payload, headers)`
	insertColsNoHeaders = `(id, consumer, source_id, destination, order_key, payload)`
)

// MaxInList is the most IDs one MarkSent statement names where the
// dialect has no IDArray; more take several statements.
const MaxInList = 500

// MaxFailedPerStatement is the most rows one MarkFailed statement names
// where the dialect has no MarkFailedArrays (up to seven parameters a
// row); more take several statements.
const MaxFailedPerStatement = 100

// NewOutbox builds the outbox statements for d.
func NewOutbox(d OutboxDialect) *Outbox {
	t := d.Table
	o := &Outbox{d: d}
	x := d.TextOut
	o.cols = `id` + x + `, seq, consumer` + x + `, source_id` + x + `, destination` + x + `, order_key` + x + `, payload, ` + d.HeadersOut + `, attempts, ` + d.Micros(`created_at`)
	keyPending := d.KeyPending
	if keyPending == "" {
		keyPending = `p.sent_at IS NULL AND p.failed_at IS NULL`
	}
	o.pending = `o.sent_at IS NULL AND o.failed_at IS NULL AND o.available_at <= ` + d.Now + `
	AND (o.lease_until IS NULL OR o.lease_until <= ` + d.Now + `)
	AND (o.order_key = '' OR NOT EXISTS (SELECT 1 FROM ` + t + ` p
		WHERE p.destination = o.destination AND p.order_key = o.order_key AND p.seq < o.seq
		AND ` + keyPending + `))`
	leaseEnd := d.Plus
	if d.LeaseEnd != nil {
		leaseEnd = d.LeaseEnd
	}
	lease := `lease_until = ` + leaseEnd(d.Param(2, "bigint")) + `, attempts = attempts + 1`
	o.claimReturning = `UPDATE ` + t + ` SET ` + lease + `
WHERE id IN (SELECT o.id FROM ` + t + ` o WHERE ` + o.pending + `
	ORDER BY o.seq LIMIT ` + d.Param(1, "bigint") + d.SkipLocked + `)
RETURNING ` + o.cols
	o.claimSelect = `SELECT ` + o.cols + ` FROM ` + t + ` o WHERE ` + o.pending + `
ORDER BY o.seq LIMIT ` + d.Param(1, "bigint") + d.SkipLocked
	if d.IDArray != "" {
		o.markSentArray = o.markSent(d.IDArray)
		o.deleteSentArray = `DELETE FROM ` + t + ` WHERE ` + d.IDArray
		o.markSentSeqArrays = o.markSent(d.IDSeqArrays)
		o.deleteSentSeqArrays = `DELETE FROM ` + t + ` WHERE ` + d.IDSeqArrays
	}
	done := `WHERE sent_at < ` + d.Minus(d.Param(1, "bigint")) + ` OR (sent_at IS NULL AND failed_at < ` + d.Minus(d.Param(2, "bigint")) + `)
	LIMIT ` + d.Param(3, "bigint") + d.SkipLocked
	o.purge = `DELETE FROM ` + t + ` WHERE id IN (SELECT id FROM (SELECT id FROM ` + t + `
	` + done + `) AS done)`
	o.purgeSelect = `SELECT seq FROM ` + t + ` ` + done
	o.lockedClaim = o.lockedClaimSQL()
	if d.SeqsJoin != "" {
		o.claimUpdate = `UPDATE ` + d.SeqsJoin + ` SET o.lease_until = ` + leaseEnd(d.Param(2, "bigint")) + `, o.attempts = o.attempts + 1`
		o.purgeDelete = `DELETE o FROM ` + d.SeqsJoin
	}
	if d.SentJoin != "" {
		o.deleteSentJoin = `DELETE o FROM ` + d.SentJoin
		o.markSentJoin = `UPDATE ` + d.SentJoin + ` SET o.sent_at = ` + d.Now + `, o.lease_until = NULL WHERE o.sent_at IS NULL`
	}
	// The backlog through the indexes of the pending and the failed rows
	// (their partial indexes where the dialect has them), not a scan of
	// the table: the oldest pending row is the first by seq.
	pending := ` FROM ` + t + ` WHERE sent_at IS NULL AND failed_at IS NULL`
	o.stats = `SELECT (SELECT COUNT(*)` + pending + `), (SELECT COUNT(*) FROM ` + t + ` WHERE failed_at IS NOT NULL AND sent_at IS NULL), ` +
		d.Micros(d.Now) + ` - COALESCE(` + d.Micros(`(SELECT created_at`+pending+` ORDER BY seq LIMIT 1)`) + `, ` + d.Micros(d.Now) + `)`
	return o
}

// Table is the outbox table as written in SQL.
func (o *Outbox) Table() string { return o.d.Table }

// Emit inserts p's rows in one statement, in order, after checking p
// (idemdriver.ValidateEmitParams), so tx stays usable on invalid input.
func (o *Outbox) Emit(ctx context.Context, tx Querier, p *idemdriver.EmitParams) error {
	q, args, err := o.EmitStatement(p)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, q, args...)
	return err
}

// EmitStatement returns the INSERT of [Outbox.Emit] and its arguments,
// for a store that sends it itself (pipelined with other statements),
// after checking p (idemdriver.ValidateEmitParams): its errors match
// idemdriver.ErrInvalidOutgoing or ErrInvalidConsumerName.
func (o *Outbox) EmitStatement(p *idemdriver.EmitParams) (string, []any, error) {
	return o.emitStatement(p, false)
}

// EmitStatementQuiet is EmitStatement for a dialect with Quiet: an INSERT
// ... SELECT of the same rows that also evaluates Quiet before writing
// them. Without Quiet it is EmitStatement.
func (o *Outbox) EmitStatementQuiet(p *idemdriver.EmitParams) (string, []any, error) {
	return o.emitStatement(p, o.d.Quiet != "")
}

func (o *Outbox) emitStatement(p *idemdriver.EmitParams, quiet bool) (string, []any, error) {
	if err := idemdriver.ValidateEmitParams(p); err != nil {
		return "", nil, err
	}
	form := withHeaders
	if o.d.HeadersDefault {
		form = withoutHeaders
		for _, m := range p.Messages {
			if len(m.Headers) > 0 {
				form = withHeaders
				break
			}
		}
	}
	width := form.width()
	args := make([]any, 0, width*len(p.Messages))
	for _, m := range p.Messages {
		args = append(args, m.ID, m.Consumer, m.SourceID, m.Destination, m.Key, NonNil(m.Payload))
		if form == withHeaders {
			h, err := EncodeHeaders(m.Headers)
			if err != nil {
				return "", nil, err
			}
			args = append(args, h)
		}
	}
	return o.emitText(len(p.Messages), quiet, form), args, nil
}

// emitForm says whether an emit's INSERT writes the headers column.
type emitForm int

const (
	withHeaders    emitForm = iota // every message's headers, "{}" for none
	withoutHeaders                 // no message has headers: the column's default
)

// width is the number of parameters a row of the form takes.
func (f emitForm) width() int {
	if f == withoutHeaders {
		return 6
	}
	return 7
}

// emitText returns the INSERT of n rows (n >= 1) of form f, with quiet
// the one of EmitStatementQuiet, cached for up to len(o.emitSQL[f]) rows.
func (o *Outbox) emitText(n int, quiet bool, f emitForm) string {
	cache := &o.emitSQL[f]
	if quiet {
		cache = &o.quietSQL[f]
	}
	cached := n <= len(cache)
	if cached {
		if q := cache[n-1].Load(); q != nil {
			return *q
		}
	}
	var b strings.Builder
	cols := insertCols
	if f == withoutHeaders {
		cols = insertColsNoHeaders
	}
	b.WriteString(`INSERT INTO ` + o.d.Table + ` ` + cols)
	if quiet {
		b.WriteString(` SELECT * FROM (VALUES `)
	} else {
		b.WriteString(` VALUES `)
	}
	kinds := [7]string{"text", "text", "text", "text", "text", "bytea", "json"}
	width := f.width()
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('(')
		for k, kind := range kinds[:width] {
			if k > 0 {
				b.WriteString(", ")
			}
			b.WriteString(o.d.Param(width*i+k+1, kind))
		}
		b.WriteByte(')')
	}
	if quiet {
		b.WriteString(`) AS v WHERE ` + o.d.Quiet)
	}
	b.WriteString(o.d.IgnoreDuplicate)
	q := b.String()
	if cached {
		cache[n-1].Store(&q)
	}
	return q
}

// Claim claims p's rows: with one UPDATE ... RETURNING on db, or, for a
// dialect without it, with a locking SELECT and an UPDATE in the
// transaction begin starts (begin is unused otherwise). p is checked
// first (idemdriver.ValidateClaimOutgoingParams).
func (o *Outbox) Claim(ctx context.Context, db Querier, begin func(context.Context) (Tx, error), p *idemdriver.ClaimOutgoingParams) ([]idemdriver.OutgoingRecord, error) {
	if err := idemdriver.ValidateClaimOutgoingParams(p); err != nil {
		return nil, err
	}
	if !o.d.NoUpdateReturning {
		return o.claimIn(ctx, db, p)
	}
	tx, err := begin(ctx)
	if err != nil {
		return nil, err
	}
	defer rollback(ctx, tx)
	recs, err := o.claimIn(ctx, tx, p)
	if err != nil || len(recs) == 0 {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, err
	}
	return recs, nil
}

// claimIn runs the claim's statements on q: the UPDATE ... RETURNING, or
// without it the locking SELECT and the UPDATE of the rows it locked,
// which q must run in one transaction.
func (o *Outbox) claimIn(ctx context.Context, q Querier, p *idemdriver.ClaimOutgoingParams) ([]idemdriver.OutgoingRecord, error) {
	lease := DurationMicros(p.Lease)
	if !o.d.NoUpdateReturning {
		rows, err := q.Query(ctx, o.claimReturning, int64(p.Limit), lease)
		if err != nil {
			return nil, err
		}
		return ScanClaimed(rows)
	}
	rows, err := q.Query(ctx, o.claimSelect, int64(p.Limit))
	if err != nil {
		return nil, err
	}
	recs, err := scanOutgoing(rows, 1)
	if err != nil || len(recs) == 0 {
		return nil, err
	}
	seqs := make([]int64, len(recs))
	for i, r := range recs {
		seqs[i] = r.Seq // in seq order, as the SELECT locked them
	}
	if _, err := q.Exec(ctx, o.claimUpdate, seqsJSON(seqs), lease); err != nil {
		return nil, err
	}
	return recs, nil
}

// SentClaimStatements returns the two statements of a MarkSent followed
// by a Claim and their arguments, for a store that sends them together in
// one transaction (store/idempgxv5's MarkSentClaim): the DELETE (with
// sent.Keep, the UPDATE) of sent's rows, then the claim's UPDATE ...
// RETURNING, whose rows ScanClaimed reads. Only for a dialect with
// IDArray and UPDATE ... RETURNING (ok false otherwise). Both are checked
// first (idemdriver.ValidateMarkSentParams and
// ValidateClaimOutgoingParams); markSQL is empty when sent names no row.
func (o *Outbox) SentClaimStatements(sent *idemdriver.MarkSentParams, claim *idemdriver.ClaimOutgoingParams) (markSQL string, markArgs []any, claimSQL string, claimArgs []any, ok bool, err error) {
	if o.d.IDArray == "" || o.d.NoUpdateReturning {
		return "", nil, "", nil, false, nil
	}
	if err := idemdriver.ValidateMarkSentParams(sent); err != nil {
		return "", nil, "", nil, true, err
	}
	if err := idemdriver.ValidateClaimOutgoingParams(claim); err != nil {
		return "", nil, "", nil, true, err
	}
	if len(sent.IDs) > 0 {
		markSQL, markArgs = o.markSentArrays(sent)
	}
	return markSQL, markArgs, o.claimReturning, []any{int64(claim.Limit), DurationMicros(claim.Lease)}, true, nil
}

// ScanClaimed reads the rows of the claim's UPDATE ... RETURNING and
// closes rows.
func ScanClaimed(rows Rows) ([]idemdriver.OutgoingRecord, error) { return scanOutgoing(rows, 0) }

// markSentArrays is MarkSent's one statement for a dialect with IDArray.
func (o *Outbox) markSentArrays(p *idemdriver.MarkSentParams) (string, []any) {
	withSeqs := len(p.Seqs) > 0
	q, args := o.deleteSentArray, []any{p.IDs}
	if withSeqs {
		q, args = o.deleteSentSeqArrays, []any{p.IDs, p.Seqs}
	}
	if p.Keep {
		q = o.markSentArray
		if withSeqs {
			q = o.markSentSeqArrays
		}
	}
	return q, args
}

// seqsJSON is the JSON array of seqs, SeqsJoin's parameter.
func seqsJSON(seqs []int64) string {
	b := make([]byte, 0, 2+12*len(seqs))
	b = append(b, '[')
	for i, seq := range seqs {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, seq, 10)
	}
	return string(append(b, ']'))
}

// sentJSON is SentJoin's parameter for p's rows (p.Seqs set): the [seq,
// hex of ID] pairs in seq order, so that the rows are locked in the order
// of the primary key, as every other statement that locks several rows
// of the table locks them. Hexadecimal, as an ID is any bytes and a JSON
// string holds UTF-8 only.
func sentJSON(p *idemdriver.MarkSentParams) string {
	order := make([]int, len(p.IDs))
	n := 2
	for i := range order {
		order[i] = i
		n += 26 + 2*len(p.IDs[i])
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(p.Seqs[a], p.Seqs[b]) })
	b := make([]byte, 0, n)
	b = append(b, '[')
	for k, i := range order {
		if k > 0 {
			b = append(b, ',')
		}
		b = append(b, '[')
		b = strconv.AppendInt(b, p.Seqs[i], 10)
		b = append(b, ',', '"')
		b = hex.AppendEncode(b, []byte(p.IDs[i]))
		b = append(b, '"', ']')
	}
	return string(append(b, ']'))
}

// failedJSON is MarkFailedJSON's parameter for rows, in seq order.
func failedJSON(rows []idemdriver.FailedRow) (string, error) {
	rows = slices.Clone(rows)
	slices.SortStableFunc(rows, func(a, b idemdriver.FailedRow) int { return cmp.Compare(a.Seq, b.Seq) })
	list := make([][6]any, len(rows))
	for i, r := range rows {
		permanent := 0
		if r.Permanent {
			permanent = 1
		}
		list[i] = [6]any{hex.EncodeToString([]byte(r.ID)), r.Attempt, permanent, DurationMicros(r.RetryAfter), ErrorText(r.Error), r.Seq}
	}
	b, err := json.Marshal(list)
	return string(b), err
}

// rollback ends tx, which a commit may have ended already, even when ctx
// has.
func rollback(ctx context.Context, tx Tx) {
	rctx, cancel := Detached(ctx)
	defer cancel()
	_ = tx.Rollback(rctx)
}

// Tx is a transaction of a dialect that claims in two statements.
type Tx interface {
	Querier
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// list returns n placeholders from the from-th, comma-separated.
func (o *Outbox) list(from, n int, kind string) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(o.d.Param(from+i, kind))
	}
	return b.String()
}

// scanOutgoing reads claimed rows, adding addAttempt to the attempts read
// (1 when the rows were read before the update that counts the claim).
func scanOutgoing(rows Rows, addAttempt int) ([]idemdriver.OutgoingRecord, error) {
	var out []idemdriver.OutgoingRecord
	err := ForEach(rows, func(r Row) error {
		var (
			rec     idemdriver.OutgoingRecord
			headers string
			created int64
		)
		if err := r.Scan(&rec.ID, &rec.Seq, &rec.Consumer, &rec.SourceID, &rec.Destination, &rec.Key,
			&rec.Payload, &headers, &rec.Attempts, &created); err != nil {
			return err
		}
		rec.Attempts += addAttempt
		rec.CreatedAt = Time(created)
		rec.Headers = DecodeHeaders(headers)
		out = append(out, rec)
		return nil
	})
	return out, err
}

// MarkSent ends p's rows, whose send was confirmed: it deletes them, or,
// with p.Keep, marks them sent (those not sent yet) and ends their lease.
// With one statement when the dialect has IDArray, else MaxInList IDs per
// statement, each on its own (an error may come after the first ones
// ended their rows). Not fenced: a confirmed message was sent, whoever
// holds the row.
func (o *Outbox) MarkSent(ctx context.Context, db Querier, p *idemdriver.MarkSentParams) error {
	if err := idemdriver.ValidateMarkSentParams(p); err != nil {
		return err
	}
	if len(p.IDs) == 0 {
		return nil
	}
	withSeqs := len(p.Seqs) > 0
	if o.d.IDArray != "" {
		q, args := o.markSentArrays(p)
		_, err := db.Exec(ctx, q, args...)
		return err
	}
	if o.d.SentJoin != "" && withSeqs {
		q := o.deleteSentJoin
		if p.Keep {
			q = o.markSentJoin
		}
		_, err := db.Exec(ctx, q, sentJSON(p))
		return err
	}
	for from := 0; from < len(p.IDs); from += MaxInList {
		n := min(len(p.IDs)-from, MaxInList)
		args := make([]any, 0, 3*n)
		var in string
		if withSeqs {
			// Rows named by seq, each only while it still has the ID it
			// was claimed with: seqs are never reused, so a row matching
			// both is the row claimed. The seqs are what is looked up
			// (the primary key or rowid); two IN lists, one of IDs and
			// one of seqs, would have SQLite probe every pair of them.
			for _, seq := range p.Seqs[from : from+n] {
				args = append(args, seq)
			}
			var b strings.Builder
			b.WriteString(`seq IN (` + o.list(1, n, "bigint") + `) AND id = CASE seq`)
			for i, id := range p.IDs[from : from+n] {
				args = append(args, p.Seqs[from+i], id)
				b.WriteString(` WHEN ` + o.d.Param(len(args)-1, "bigint") + ` THEN ` + o.d.Param(len(args), "text"))
			}
			b.WriteString(` END`)
			in = b.String()
		} else {
			for _, id := range p.IDs[from : from+n] {
				args = append(args, id)
			}
			in = `id IN (` + o.list(1, n, "text") + `)`
		}
		q := `DELETE FROM ` + o.d.Table + ` WHERE ` + in
		if p.Keep {
			q = o.markSent(in)
		}
		if _, err := db.Exec(ctx, q, args...); err != nil {
			return err
		}
	}
	return nil
}

// markSent is the UPDATE that marks the unsent rows matching cond sent.
func (o *Outbox) markSent(cond string) string {
	return `UPDATE ` + o.d.Table + ` SET sent_at = ` + o.d.Now + `, lease_until = NULL WHERE ` + cond + ` AND sent_at IS NULL`
}

// MarkFailed ends the leases of p's rows, each for a retry after its
// RetryAfter or for good, after checking p
// (idemdriver.ValidateMarkFailedParams): with one statement when the
// dialect has MarkFailedArrays, else one per MaxFailedPerStatement rows,
// each on its own (an error may come after the first ones marked their
// rows). Fenced by each row's Attempt, it leaves alone a row another claim
// took since.
func (o *Outbox) MarkFailed(ctx context.Context, db Querier, p *idemdriver.MarkFailedParams) error {
	if err := idemdriver.ValidateMarkFailedParams(p); err != nil {
		return err
	}
	if o.d.MarkFailedArrays != "" {
		_, err := db.Exec(ctx, o.d.MarkFailedArrays, failedArrays(p.Rows)...)
		return err
	}
	if o.d.MarkFailedJSON != "" {
		list, err := failedJSON(p.Rows)
		if err != nil {
			return err
		}
		_, err = db.Exec(ctx, o.d.MarkFailedJSON, list)
		return err
	}
	for rows := p.Rows; len(rows) > 0; {
		n := min(len(rows), MaxFailedPerStatement)
		q, args := o.markFailed(rows[:n])
		if _, err := db.Exec(ctx, q, args...); err != nil {
			return err
		}
		rows = rows[n:]
	}
	return nil
}

// markFailed returns one UPDATE that marks rows failed, and its
// arguments: each column a CASE on the row's ID, and the rows selected by
// ID and attempt. Parameters are numbered in the order they appear, as
// MySQL's placeholders need.
func (o *Outbox) markFailed(rows []idemdriver.FailedRow) (string, []any) {
	var (
		b    strings.Builder
		args []any
	)
	param := func(kind string, v any) string {
		args = append(args, v)
		return o.d.Param(len(args), kind)
	}
	b.WriteString(`UPDATE ` + o.d.Table + ` SET lease_until = NULL, last_error = CASE id`)
	for _, r := range rows {
		b.WriteString(` WHEN ` + param("text", r.ID) + ` THEN ` + param("text", ErrorText(r.Error)))
	}
	b.WriteString(` ELSE last_error END`)
	// set writes ", col = CASE id WHEN ... THEN value(row) ... ELSE col
	// END" for the rows whose Permanent is permanent, if there are any.
	set := func(col string, permanent bool, value func(idemdriver.FailedRow) string) {
		started := false
		for _, r := range rows {
			if r.Permanent != permanent {
				continue
			}
			if !started {
				b.WriteString(`, ` + col + ` = CASE id`)
				started = true
			}
			b.WriteString(` WHEN ` + param("text", r.ID) + ` THEN ` + value(r))
		}
		if started {
			b.WriteString(` ELSE ` + col + ` END`)
		}
	}
	set("failed_at", true, func(idemdriver.FailedRow) string { return o.d.Now })
	set("available_at", false, func(r idemdriver.FailedRow) string {
		return o.d.Plus(param("bigint", DurationMicros(r.RetryAfter)))
	})
	b.WriteString(` WHERE sent_at IS NULL AND (`)
	for i, r := range rows {
		if i > 0 {
			b.WriteString(` OR `)
		}
		b.WriteString(`(id = ` + param("text", r.ID) + ` AND attempts = ` + param("bigint", int64(r.Attempt)))
		if r.Seq != 0 {
			b.WriteString(` AND seq = ` + param("bigint", r.Seq))
		}
		b.WriteString(`)`)
	}
	b.WriteString(`)`)
	return b.String(), args
}

// Purge deletes up to p.Limit rows done (failed for good, or sent and
// kept) for longer than p.Retention,
// after checking p (idemdriver.ValidatePurgeOutboxParams), skipping rows
// locked by another transaction (where the dialect has SkipLocked): with
// one DELETE on db, or, for a dialect without UPDATE ... RETURNING, with
// a locking SELECT and a DELETE of the rows it locked in the transaction
// begin starts (begin is unused otherwise): MariaDB's single DELETE would
// wait for a row its subquery skipped.
func (o *Outbox) Purge(ctx context.Context, db Querier, begin func(context.Context) (Tx, error), p *idemdriver.PurgeOutboxParams) (int64, error) {
	if err := idemdriver.ValidatePurgeOutboxParams(p); err != nil {
		return 0, err
	}
	r := DurationMicros(p.Retention)
	if !o.d.NoUpdateReturning {
		return db.Exec(ctx, o.purge, r, r, int64(p.Limit))
	}
	tx, err := begin(ctx)
	if err != nil {
		return 0, err
	}
	defer rollback(ctx, tx)
	rows, err := tx.Query(ctx, o.purgeSelect, r, r, int64(p.Limit))
	if err != nil {
		return 0, err
	}
	var seqs []int64
	if err := ForEach(rows, func(row Row) error {
		var seq int64
		err := row.Scan(&seq)
		seqs = append(seqs, seq)
		return err
	}); err != nil || len(seqs) == 0 {
		return 0, err
	}
	n, err := tx.Exec(ctx, o.purgeDelete, seqsJSON(seqs))
	if err != nil {
		return 0, err
	}
	return n, tx.Commit(ctx)
}

// Stats reads the backlog.
func (o *Outbox) Stats(ctx context.Context, db Querier) (idemdriver.OutboxStats, error) {
	var (
		s   idemdriver.OutboxStats
		age int64
	)
	err := db.QueryRow(ctx, o.stats).Scan(&s.Pending, &s.Failed, &age)
	s.OldestPending = time.Duration(max(age, 0)) * time.Microsecond
	return s, err
}

// EncodeHeaders is the headers column's text: a JSON object of strings
// ("{}" for none).
func EncodeHeaders(h map[string]string) (string, error) {
	if len(h) == 0 {
		return "{}", nil
	}
	b, err := json.Marshal(h)
	if err != nil {
		return "", fmt.Errorf("%w: headers: %w", idemdriver.ErrInvalidOutgoing, err)
	}
	return string(b), nil
}

// DecodeHeaders reads the headers column as another program may have
// written it: a JSON object whose string values are taken as they are and
// other values as their JSON text. Anything else is no headers.
func DecodeHeaders(s string) map[string]string {
	if s == "{}" {
		return nil // what most rows hold, without a JSON decoder's allocations
	}
	var raw map[string]json.RawMessage
	if json.Unmarshal([]byte(s), &raw) != nil || len(raw) == 0 {
		return nil
	}
	h := make(map[string]string, len(raw))
	for k, v := range raw {
		var str string
		if json.Unmarshal(v, &str) == nil {
			h[k] = str
		} else {
			h[k] = string(v)
		}
	}
	return h
}
