package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/bits"
	"reflect"
	"slices"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/lastval"
	"github.com/idem-go/idem/internal/pgsql"
	"github.com/idem-go/idem/internal/sqlstore"
)

// Rows per multi-row statement: MySQL's claim reports duplicates in a
// 64-bit mask; the other limits keep below every placeholder limit
// (MySQL's 65,535, and SQLite's 999 before version 3.32, with 2 per row plus
// the shared consumer).
const (
	mysqlClaimRows       = 64
	mysqlFingerprintRows = 1000
	sqliteBatchRows      = 400
)

// claimMySQL runs one claim; see mysqlClaimSQL.
func (s *Store) claimMySQL(ctx context.Context, tx preparedTx, p *idemdriver.ClaimParams) (res idemdriver.ClaimResult, found bool, err error) {
	claim := s.mysqlClaim.Get(p.LockTimeout, func(d time.Duration) string { return mysqlLockTimeout(d) + s.q.claim })
	id := any(p.MessageID) // boxed once for its two places and the read
	r, err := tx.ExecContext(ctx, claim, consumerArg(p.Consumer), id, p.Fingerprint, id)
	if err != nil {
		return res, false, mysqlWrapLockTimeout(err)
	}
	dups, err := mysqlDuplicates(r, 1)
	if err != nil {
		return res, false, err
	}
	if dups == 0 {
		return sqlstore.Claimed, true, nil
	}
	return s.readExisting(ctx, tx, p, id)
}

// claimPostgres runs one claim on PostgreSQL: the claim statement of
// store/idempgxv5 (internal/pgsql), run with ExecContext since the row it
// returns when it inserted is all it says, and rows affected counts it
// (database/sql and pgx's stdlib then build no *sql.Rows for it); a
// conflict is settled as pgsql.Queries.ClaimTx does. After a claim that
// found a duplicate, the Store's next claim is pgsql.Queries.ClaimRead
// instead, which reads the record in the same statement, until a claim
// inserts (see claimMode).
//
// The statements are those of the table's shape (pgsql.Table); one that
// fails because the shape changed under the Store makes it find the
// shape again, and the claim's error is returned (tx is the caller's).
func (s *Store) claimPostgres(ctx context.Context, tx *sql.Tx, p *idemdriver.ClaimParams) (idemdriver.ClaimResult, error) {
	read := s.pgClaimRead.Load()
	res, err := pgsql.InTx(ctx, s.pg, txQuerier{tx}, p.Consumer, func(q *pgsql.Queries) (idemdriver.ClaimResult, error) {
		if read {
			return claimReadPostgres(ctx, q, tx, p)
		}
		return claimPostgresIn(ctx, q, tx, p)
	})
	if err == nil && s.claimMode == claimAdaptive && read == res.Claimed {
		s.pgClaimRead.Store(!res.Claimed)
	}
	return res, err
}

// Which claim statement a PostgreSQL Store runs (Store.claimMode).
const (
	// claimAdaptive: Claim, and ClaimRead after a duplicate until a claim
	// inserts. A duplicate costs a round trip less through ClaimRead (3
	// instead of 4 with BEGIN and ROLLBACK, database/sql sending each on
	// its own), a new message some server CPU more (the read's setup), so
	// each statement is run where the last claim says it pays: runs of
	// duplicates come together (a redelivery).
	claimAdaptive uint8 = iota
	// claimPlain: always Claim (tests).
	claimPlain
	// claimRead: always ClaimRead (tests).
	claimRead
)

// claimPostgresIn is claimPostgres with the statements q.
func claimPostgresIn(ctx context.Context, q *pgsql.Queries, tx *sql.Tx, p *idemdriver.ClaimParams) (idemdriver.ClaimResult, error) {
	args := q.ClaimArgs(p)
	r, err := tx.ExecContext(ctx, q.Claim, args...)
	if err != nil {
		return idemdriver.ClaimResult{}, pgsql.WrapLockTimeout(err)
	}
	n, err := r.RowsAffected()
	switch {
	case err != nil:
		return idemdriver.ClaimResult{}, err
	case n == 1:
		return sqlstore.Claimed, nil
	}
	return settlePostgres(ctx, q, tx, p, args)
}

// settlePostgres settles a claim that conflicted (args are its
// arguments), as pgsql.Queries.ClaimTx does.
func settlePostgres(ctx context.Context, q *pgsql.Queries, tx *sql.Tx, p *idemdriver.ClaimParams, args []any) (idemdriver.ClaimResult, error) {
	res, err := q.Settle(ctx, txQuerier{tx}, p, args)
	if err != nil {
		return idemdriver.ClaimResult{}, pgsql.WrapLockTimeout(err)
	}
	return res, nil
}

// claimReadPostgres is claimPostgresIn with q.ClaimRead, which returns
// the stored fingerprint and state of a conflicting record committed
// before it began; one its snapshot does not show is settled as
// claimPostgresIn settles a conflict. It reads the one row with
// QueryContext, as QueryRowContext would, without the *sql.Row.
func claimReadPostgres(ctx context.Context, q *pgsql.Queries, tx *sql.Tx, p *idemdriver.ClaimParams) (idemdriver.ClaimResult, error) {
	args := q.ClaimArgs(p)
	var rec struct {
		claimed bool
		fp      []byte
		state   sql.NullInt64
		dest    [3]any
	}
	rec.dest = [3]any{&rec.claimed, &rec.fp, &rec.state}
	rows, err := tx.QueryContext(ctx, q.ClaimRead, args...)
	if err != nil {
		return idemdriver.ClaimResult{}, pgsql.WrapLockTimeout(err)
	}
	if rows.Next() {
		err = rows.Scan(rec.dest[:]...)
	} else if err = rows.Err(); err == nil {
		err = errors.New("idemsql: the claim returned no row")
	}
	if cerr := rows.Close(); err == nil {
		err = cerr
	}
	switch {
	case err != nil:
		return idemdriver.ClaimResult{}, pgsql.WrapLockTimeout(err)
	case rec.claimed:
		return sqlstore.Claimed, nil
	case rec.fp != nil:
		return sqlstore.Existing(rec.fp, rec.state), nil
	}
	return settlePostgres(ctx, q, tx, p, args)
}

// mysqlLockWaitTimeout is MySQL's ER_LOCK_WAIT_TIMEOUT.
const mysqlLockWaitTimeout = 1205

// mysqlWrapLockTimeout returns err marked with idemdriver.ErrLockTimeout
// when it is MySQL error 1205, and err unchanged otherwise.
func mysqlWrapLockTimeout(err error) error {
	if n, ok := mysqlErrorNumber(err); ok && n == mysqlLockWaitTimeout {
		return fmt.Errorf("%w: %w", idemdriver.ErrLockTimeout, err)
	}
	return err
}

// mysqlErrorNumber returns the server's error number of err: the uint16
// Number field of the driver's error struct (go-sql-driver/mysql's
// *MySQLError), found without importing the driver, which the store
// leaves to the caller.
func mysqlErrorNumber(err error) (uint16, bool) {
	for ; err != nil; err = errors.Unwrap(err) {
		v := reflect.ValueOf(err)
		if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
			continue
		}
		if f := v.Elem().FieldByName("Number"); f.IsValid() && f.Kind() == reflect.Uint16 {
			return uint16(f.Uint()), true
		}
	}
	return 0, false
}

// readExisting reads the fingerprint and state of the record a claim
// found; found is false when it vanished before it could be read. id is
// p.MessageID as the claim boxed it. It reads the one row with
// QueryContext, as QueryRowContext would, without the *sql.Row.
func (s *Store) readExisting(ctx context.Context, tx preparedTx, p *idemdriver.ClaimParams, id any) (res idemdriver.ClaimResult, found bool, err error) {
	// One allocation for both destinations and the arguments.
	var rec struct {
		fp    []byte
		state sql.NullInt64
		dest  [2]any
		args  [2]any
	}
	rec.dest = [2]any{&rec.fp, &rec.state}
	rec.args = [2]any{consumerArg(p.Consumer), id}
	rows, err := tx.QueryContext(ctx, s.q.fingerprint, rec.args[:]...)
	if err != nil {
		return res, false, err
	}
	if !rows.Next() {
		err = rows.Err()
		if cerr := rows.Close(); err == nil {
			err = cerr
		}
		return res, false, err
	}
	err = rows.Scan(rec.dest[:]...)
	if cerr := rows.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return res, false, err
	}
	return sqlstore.Existing(rec.fp, rec.state), true, nil
}

// consumerArg returns name as a statement argument, reusing the last one
// boxed when it is the same name (the common case: one consumer per
// process, or a few taking turns).
func consumerArg(name string) any {
	return consumerArgs.Get(name, func(name string) any { return name })
}

// consumerArgs is the last consumer name boxed by consumerArg.
var consumerArgs lastval.Cache[string, any]

// mysqlDuplicates reads the result of a MySQL claim of n rows: bit i is
// set when row i was a duplicate. It checks the bitmask against rows
// affected, which counts a new row as 1 and a duplicate as 0, or as 1
// with CLIENT_FOUND_ROWS.
func mysqlDuplicates(r sql.Result, n int) (uint64, error) {
	id, err := r.LastInsertId()
	if err != nil {
		return 0, fmt.Errorf("idemsql: reading the duplicate bitmask: %w", err)
	}
	affected, err := r.RowsAffected()
	if err != nil {
		return 0, err
	}
	mask := uint64(id)
	inserted := int64(n - bits.OnesCount64(mask))
	if (n < 64 && mask>>n != 0) || (affected != inserted && affected != int64(n)) {
		return 0, fmt.Errorf("idemsql: claim of %d rows reported duplicate bitmask %#x and %d rows affected; is the table's schema idem's?", n, mask, affected)
	}
	return mask, nil
}

// claimSQLite runs one claim. The transaction holds SQLite's write lock
// from its first write on, so no other writer is in flight.
func (s *Store) claimSQLite(ctx context.Context, tx preparedTx, p *idemdriver.ClaimParams) (res idemdriver.ClaimResult, found bool, err error) {
	id := any(p.MessageID) // boxed once for the claim and the read
	r, err := tx.ExecContext(ctx, s.q.claim, consumerArg(p.Consumer), id, p.Fingerprint)
	if err != nil {
		return res, false, err
	}
	n, err := r.RowsAffected()
	if err != nil {
		return res, false, err
	}
	if n == 1 {
		return sqlstore.Claimed, true, nil
	}
	return s.readExisting(ctx, tx, p, id)
}

// claimBatchMySQL claims msgs (sorted by ID) on MySQL and returns their
// results in that order. On MariaDB 10.5 and later it is
// claimBatchReturning's INSERT IGNORE ... RETURNING; on a server without
// RETURNING, one statement per 64 messages (see mysqlClaimSQL), then one
// locking read of the fingerprints of the duplicates.
func (s *Store) claimBatchMySQL(ctx context.Context, tx *sql.Tx, consumer string, msgs []idemdriver.ClaimMessage, lockTimeout time.Duration) ([]idemdriver.ClaimResult, error) {
	lockPrefix := mysqlLockTimeout(lockTimeout)
	returning, err := s.mysqlReturning(ctx, tx)
	if err != nil {
		return nil, err
	}
	if returning {
		return s.claimBatchReturning(ctx, tx, consumer, msgs, lockPrefix)
	}
	got, err := s.claimBatchBitmask(ctx, tx, consumer, msgs, lockPrefix)
	if err != nil {
		return nil, err
	}
	res := make([]idemdriver.ClaimResult, len(msgs))
	for i, m := range msgs {
		r, ok := got[m.MessageID]
		if !ok {
			return nil, fmt.Errorf("idem: batch claim of consumer %q settled no result for message ID %q", consumer, m.MessageID)
		}
		res[i] = r
	}
	return res, nil
}

// claimBatchBitmask is the MySQL batch claim without RETURNING: one
// INSERT ... ON DUPLICATE KEY UPDATE per 64 messages whose insert ID is
// the bitmask of the duplicates (see mysqlClaimSQL), then one locking
// read of the duplicates' fingerprints.
func (s *Store) claimBatchBitmask(ctx context.Context, tx *sql.Tx, consumer string, msgs []idemdriver.ClaimMessage, lockPrefix string) (map[string]idemdriver.ClaimResult, error) {
	got := make(map[string]idemdriver.ClaimResult, len(msgs))
	pending := msgs
	for attempt := 0; len(pending) > 0; attempt++ {
		if attempt == maxClaimAttempts {
			return nil, sqlstore.ErrUnsettled("batch claim", consumer)
		}
		var dups []idemdriver.ClaimMessage
		for chunk := range slices.Chunk(pending, mysqlClaimRows) {
			args := make([]any, 0, 4*len(chunk))
			for _, m := range chunk {
				args = append(args, consumer, m.MessageID, m.Fingerprint)
			}
			for _, m := range chunk {
				args = append(args, m.MessageID)
			}
			r, err := tx.ExecContext(ctx, lockPrefix+mysqlClaimSQL(s.q.batchPrefix, len(chunk)), args...)
			if err != nil {
				return nil, mysqlWrapLockTimeout(err)
			}
			mask, err := mysqlDuplicates(r, len(chunk))
			if err != nil {
				return nil, err
			}
			for i, m := range chunk {
				if mask&(1<<i) != 0 {
					dups = append(dups, m)
				} else {
					got[m.MessageID] = sqlstore.Claimed
				}
			}
		}
		if err := s.readFingerprintsIn(ctx, tx, consumer, dups, batchMySQLRead, mysqlFingerprintRows, got); err != nil {
			return nil, err
		}
		pending = sqlstore.Unsettled(dups, got)
	}
	return got, nil
}

// readFingerprintsIn reads the stored fingerprints of msgs with the
// dialect's IN-list query of kind (batchSQLiteRead or batchMySQLRead, the
// latter a locking read), per IDs per statement, and records them in got
// as duplicates.
func (s *Store) readFingerprintsIn(ctx context.Context, tx *sql.Tx, consumer string, msgs []idemdriver.ClaimMessage, kind uint8, per int, got map[string]idemdriver.ClaimResult) error {
	for part := range slices.Chunk(msgs, per) {
		args := make([]any, 0, 1+len(part))
		args = append(args, consumer)
		for _, m := range part {
			args = append(args, m.MessageID)
		}
		rows, err := querier{tx}.Query(ctx, s.batchText(kind, len(part), ""), args...)
		if err := sqlstore.ReadExisting(rows, err, got); err != nil {
			return err
		}
	}
	return nil
}
