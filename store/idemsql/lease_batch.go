package idemsql

import (
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/sqlstore"
)

var _ idemdriver.LeaseBatcher = (*Store)(nil)

// AcquireBatch implements [idemdriver.LeaseBatcher]. On PostgreSQL the
// batch is one statement over arrays, store/idempgxv5's (one round trip,
// one commit; see its AcquireBatch): each element is judged as a single
// Acquire judges it, what a single Acquire does after its statement (a
// takeover's recovery points, the statement again) runs after it element
// by element, as does an element whose record an earlier one names. On
// SQLite the batch is one BEGIN IMMEDIATE transaction (one commit instead
// of one per message; its leases start at the transaction's clock): one
// statement claims the batch's records as Acquire's statement claims
// each, one more saves their recovery points, and what a single Acquire
// does after its statement runs element by element after them, as do the
// elements the statement could not take (acquireManySQLite).
// An element that fails validation has its error in errs; a statement
// that fails rolls the whole batch back (err). On MySQL, whose Acquire
// runs its own short transactions, the batch is one Acquire per element,
// in key order, with no saving, and every error is an element's
// (sqlstore.AcquireEach): an element whose Acquire fails (a refused
// prepare, a lost connection) has its error in errs, and the elements
// acquired before it keep their results, as on Redis, instead of being
// held by nobody until their leases run out.
func (s *Store) AcquireBatch(ctx context.Context, ps []*idemdriver.AcquireParams) (res []idemdriver.AcquireResult, errs []error, err error) {
	if err := ctx.Err(); err != nil || len(ps) == 0 {
		return nil, nil, err
	}
	acquire := func(p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) { return s.Acquire(ctx, p) }
	switch s.dialect {
	case MySQL:
		return sqlstore.AcquireEach(ps, acquire)
	case Postgres:
		return s.pg.AcquireBatch(ctx, querier{s.db}, ps)
	}
	s.prepareSQLiteLease(ctx)
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		acquire = func(p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
			var last *sqlstore.LeaseRecord
			for range maxClaimAttempts {
				res, rec, err := s.acquireSQLiteTx(ctx, s.prepared(tx), p)
				if err != nil || res.Acquired || res.State != 0 {
					return res, err
				}
				last = rec
			}
			return last.NotAcquired(), nil
		}
		many, err := s.sqliteBatchStatement(ctx, tx)
		if err != nil {
			return err
		}
		if !many {
			res, errs, err = sqlstore.AcquireBatch(ctx, ps, acquire)
			return err
		}
		res, errs, err = s.acquireManySQLite(ctx, s.prepared(tx), ps, acquire)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return res, errs, nil
}

// CompleteBatch implements [idemdriver.LeaseBatcher]. On PostgreSQL the
// batch is one statement over arrays, store/idempgxv5's (one round trip,
// one commit; see its CompleteBatch), an element whose record an earlier
// one names running alone after it. On MySQL and SQLite the fenced
// UPDATE of Complete runs for each element, in key order, in one
// transaction (one commit). An element whose token no longer owns its
// record has an error matching idemdriver.ErrLeaseLost and changes
// nothing; one that fails validation has its error; a statement that
// fails changes nothing (err).
func (s *Store) CompleteBatch(ctx context.Context, ps []*idemdriver.CompleteParams) (errs []error, err error) {
	if err := ctx.Err(); err != nil || len(ps) == 0 {
		return nil, err
	}
	switch s.dialect {
	case Postgres:
		return s.pg.CompleteBatch(ctx, querier{s.db}, ps)
	case SQLite:
		s.prepareSQLiteLease(ctx)
	}
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		var err error
		errs, err = sqlstore.CompleteBatch(ctx, ps, func(p *idemdriver.CompleteParams) error {
			return sqlstore.Fenced(ctx, querier{s.prepared(tx)}, "complete", p.Consumer, p.MessageID, p.Token, s.lq.complete,
				sqlstore.NonNil(p.Result), p.ContentType, p.Consumer, p.MessageID, p.Token)
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	return errs, nil
}

// sqliteBatchStatement reports whether s's SQLite has what the batch
// claim's statement (acquireMany) uses: the ->> operator (3.38) and unhex
// (3.41). modernc.org/sqlite has both; another driver's older SQLite
// claims a batch with the single claim's statements, element by element.
// It asks in tx until one call gets an answer, which s keeps
// (Store.batchStatement); a statement that fails to prepare changes
// nothing in the transaction. An error is ctx's.
func (s *Store) sqliteBatchStatement(ctx context.Context, tx *sql.Tx) (bool, error) {
	if v, known := s.batchStatement.get(); known {
		return v, nil
	}
	var ok bool
	err := tx.QueryRowContext(ctx, `SELECT unhex('00') = X'00' AND ('["x"]' ->> 0) = 'x'`).Scan(&ok)
	if err != nil && ctx.Err() != nil {
		return false, ctx.Err()
	}
	return s.batchStatement.set(ok && err == nil), nil
}

// manyEligible reports whether p's claim can go in SQLite's statement
// for a batch (acquireMany), whose elements travel as JSON text: a
// fingerprint to compare (an empty one binds differently), and a
// consumer, message ID and step prefix that JSON carries unchanged
// (valid UTF-8, no NUL byte).
func manyEligible(p *idemdriver.AcquireParams) bool {
	for _, v := range []string{p.Consumer, p.MessageID, p.StepPrefix} {
		if !utf8.ValidString(v) || strings.IndexByte(v, 0) >= 0 {
			return false
		}
	}
	return len(p.Fingerprint) > 0
}

// acquireManySQLite is AcquireBatch on SQLite, inside the batch's
// transaction tx: the first element of each record (in key order) that
// manyEligible admits is claimed by one statement (acquireMany), as
// acquire would claim it alone; a takeover among them then reads its
// recovery points, and the recovery points of those acquired with a step
// prefix are saved by one more statement (pointMany), as acquire saves
// each. Every other element (not acquired by the statement: held,
// finished, another fingerprint; a second element of a record; one not
// eligible) then runs acquire, in key order, which judges it as a
// single Acquire does.
func (s *Store) acquireManySQLite(ctx context.Context, tx preparedTx, ps []*idemdriver.AcquireParams, acquire func(p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error)) ([]idemdriver.AcquireResult, []error, error) {
	order, errs, err := sqlstore.AcquireOrder(ps)
	if err != nil {
		return nil, nil, err
	}
	type key struct{ consumer, id string }
	pending := make(map[key]int, len(order)) // the element of each record in the statement
	elems := make([][4]any, 0, len(order))
	for _, i := range order {
		p := ps[i]
		k := key{p.Consumer, p.MessageID}
		if _, seen := pending[k]; seen || !manyEligible(p) {
			continue
		}
		pending[k] = i
		elems = append(elems, [4]any{p.Consumer, p.MessageID, hex.EncodeToString(p.Fingerprint), sqlstore.DurationMicros(p.Lease)})
	}
	res := make([]idemdriver.AcquireResult, len(ps))
	done := make([]bool, len(ps))
	if len(elems) > 0 {
		arg, err := json.Marshal(elems)
		if err != nil {
			return nil, nil, err
		}
		rows, err := tx.QueryContext(ctx, s.lq.acquireMany, string(arg))
		if err != nil {
			return nil, nil, err
		}
		var got []int
		for rows.Next() {
			var (
				k              key
				token, attempt int64
			)
			if err := rows.Scan(&k.consumer, &k.id, &token, &attempt); err != nil {
				rows.Close()
				return nil, nil, err
			}
			i, ok := pending[k]
			if !ok {
				rows.Close()
				return nil, nil, fmt.Errorf("idem: the batch claim returned a record it was not given (consumer %q, message ID %q)", k.consumer, k.id)
			}
			res[i], done[i] = sqlstore.Acquired(token, attempt, nil), true
			got = append(got, i)
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return nil, nil, err
		}
		var points [][3]string
		for _, i := range got {
			p := ps[i]
			if res[i].Token > 1 {
				if res[i].Steps, err = sqlstore.ReadSteps(ctx, querier{tx}, s.lq.steps, p.Consumer, p.MessageID); err != nil {
					return nil, nil, err
				}
			}
			if p.StepPrefix != "" {
				points = append(points, [3]string{p.Consumer, p.MessageID, idemdriver.PrefixStep(p.StepPrefix, res[i].Token)})
			}
		}
		if len(points) > 0 {
			arg, err := json.Marshal(points)
			if err != nil {
				return nil, nil, err
			}
			if _, err := tx.ExecContext(ctx, s.lq.pointMany, string(arg)); err != nil {
				return nil, nil, err
			}
		}
	}
	for _, i := range order {
		if done[i] {
			continue
		}
		r, err := acquire(ps[i])
		if err != nil {
			return nil, nil, err
		}
		res[i] = r
	}
	return res, errs, ctx.Err()
}
