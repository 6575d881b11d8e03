package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem/store/idemsql"
)

// handSQLite is handStore on a SQLite file (the bench's driver, idem's
// DSN: WAL, immediate transactions): the same table as handPG's, the
// lease's end in Unix milliseconds of this process's clock. A claim and
// an outcome batch are one transaction each (one commit), a statement
// per message inside it, in process.
type handSQLite struct {
	db                           *sql.DB
	claimSQL, peekSQL, finishSQL *sql.Stmt
}

// newHandSQLite creates the table in the SQLite file at path.
func newHandSQLite(ctx context.Context, path string) (*handSQLite, error) {
	db, err := sql.Open("sqlite", idemsql.SQLiteDSN(path))
	if err != nil {
		return nil, err
	}
	s := &handSQLite{db: db}
	if err := s.prepare(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	return s, nil
}

func (s *handSQLite) prepare(ctx context.Context) (err error) {
	if _, err = s.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS hand (
	message_id text PRIMARY KEY,
	fingerprint blob NOT NULL,
	state integer NOT NULL,
	token integer NOT NULL,
	lease_until integer NOT NULL,
	call_started integer
)`); err != nil {
		return err
	}
	// The retention index, as handPG's: a finished record's lease_until
	// is its outcome's time, from which the retention window counts.
	if _, err = s.db.ExecContext(ctx, `CREATE INDEX IF NOT EXISTS hand_retention ON hand (lease_until)`); err != nil {
		return err
	}
	// As handPG's claim, for one message: $1 ID, $2 fingerprint, $3 the
	// lease's end, $4 now.
	if s.claimSQL, err = s.db.PrepareContext(ctx, `INSERT INTO hand AS r (message_id, fingerprint, state, token, lease_until, call_started)
VALUES (?1, ?2, 1, 1, ?3, 1)
ON CONFLICT (message_id) DO UPDATE
SET token = r.token + 1, lease_until = excluded.lease_until,
	state = CASE WHEN r.call_started IS NULL THEN 1 ELSE 3 END,
	call_started = COALESCE(r.call_started, r.token + 1)
WHERE r.state = 1 AND r.lease_until <= ?4 AND r.fingerprint = excluded.fingerprint
RETURNING token, state`); err != nil {
		return err
	}
	if s.peekSQL, err = s.db.PrepareContext(ctx, `SELECT token, CASE WHEN fingerprint <> ?2 THEN 4 ELSE state END FROM hand WHERE message_id = ?1`); err != nil {
		return err
	}
	s.finishSQL, err = s.db.PrepareContext(ctx, `UPDATE hand SET state = ?3, lease_until = ?4,
	call_started = CASE WHEN ?3 = 1 THEN NULL ELSE call_started END
WHERE message_id = ?1 AND token = ?2 AND state = 1`)
	return err
}

func (s *handSQLite) claim(ctx context.Context, msgs []handMsg, lease time.Duration) (map[string]handClaim, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	up, peek := tx.StmtContext(ctx, s.claimSQL), tx.StmtContext(ctx, s.peekSQL)
	now := time.Now()
	got := make(map[string]handClaim, len(msgs))
	for _, m := range msgs {
		var c handClaim
		err := up.QueryRowContext(ctx, m.id, m.fingerprint, now.Add(lease).UnixMilli(), now.UnixMilli()).Scan(&c.token, &c.state)
		c.acquired = err == nil && c.state == handHeld
		if errors.Is(err, sql.ErrNoRows) { // not taken: what is there
			err = peek.QueryRowContext(ctx, m.id, m.fingerprint).Scan(&c.token, &c.state)
		}
		if err != nil {
			return nil, err
		}
		got[m.id] = c
	}
	return got, tx.Commit()
}

func (s *handSQLite) finish(ctx context.Context, outs []handOutcome) (map[string]bool, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	up := tx.StmtContext(ctx, s.finishSQL)
	now := time.Now().UnixMilli()
	done := make(map[string]bool, len(outs))
	for _, o := range outs {
		res, err := up.ExecContext(ctx, o.id, o.token, o.state, now)
		if err != nil {
			return nil, err
		}
		if n, err := res.RowsAffected(); err == nil && n == 1 {
			done[o.id] = true
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	return done, nil
}

func (s *handSQLite) close() { s.db.Close() }
