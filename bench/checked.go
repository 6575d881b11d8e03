package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
)

// The best_checked contenders are the hand-written consumer with idem's
// guarantee, on every store: a processed table of the message ID (primary
// key), the payload's SHA-256 fingerprint and the time of processing, with
// an index on that time for a purge by age. A message is BEGIN, a plain
// insert that skips a conflict (INSERT ... ON CONFLICT DO NOTHING on
// PostgreSQL and SQLite, INSERT IGNORE on MariaDB), the
// side effect and COMMIT; on a conflict it reads the stored fingerprint,
// compares it and rolls back. best_checked_batchN does the same for a
// batch: one insert of the batch's records (IDs in byte order, so two
// batches sharing IDs lock them in the same order) returning the IDs it
// inserted, the fingerprints of the others read with one statement, the
// side effects of the new ones with one statement. idem's ratio to them
// is the "× best_checked" column.

// errPayloadReused is a duplicate whose stored fingerprint is not its
// payload's: the ID was reused for another message. The bench's
// workload never does it; the check is what the reference pays for.
var errPayloadReused = errors.New("bench: message ID reused with another payload")

// A checkedRun is the best_checked consumer over one run's tables.
type checkedRun interface {
	// one handles a message at a time.
	one() msgHandler
	// batch handles a batch of messages in one transaction.
	batch() batchHandler
}

// checkedOf returns rdb's best_checked consumer, or nil when its store has
// none.
func checkedOf(rdb runDB) checkedRun {
	if r, ok := rdb.(interface{ bestChecked() checkedRun }); ok {
		return r.bestChecked()
	}
	return nil
}

func (r *txRun[TTx]) bestChecked() checkedRun { return r.checked }

// checkedContenders returns best_checked, and best_checked_batchN for
// each batch size.
func checkedContenders(batchSizes []int) []contender {
	cs := []contender{{"best_checked", "checked", 1}}
	for _, b := range batchSizes {
		cs = append(cs, contender{fmt.Sprintf("best_checked_batch%d", b), "checked-batch", b})
	}
	return cs
}

// checkedRef is the best_checked contender r's throughput is compared
// with: best_checked_batchN for a batch of N, best_checked otherwise;
// "" for the reference itself and for the relay.
func checkedRef(r result) string {
	name := "best_checked"
	if r.Batch > 1 {
		name = fmt.Sprintf("best_checked_batch%d", r.Batch)
	}
	if r.Contender == name || r.Contender == "relay" {
		return ""
	}
	return name
}

// fingerprint is the SHA-256 of a payload, as idem stores it.
func fingerprint(p []byte) []byte {
	s := sha256.Sum256(p)
	return s[:]
}

// sqlChecked is best_checked over database/sql (MariaDB, SQLite).
type sqlChecked struct {
	db      *sql.DB
	dialect string // "mysql", "sqlite" or "postgres" (pgx's stdlib driver)
	table   string // the processed table
	effects string // the side-effect table, one id column
	faults  *faults
}

// newSQLChecked creates the processed table of best_checked on db and
// returns the consumer. The caller drops the table.
func newSQLChecked(ctx context.Context, db *sql.DB, dialect, table, effects string, f *faults) (*sqlChecked, error) {
	var ddl []string
	switch dialect {
	case "mysql":
		ddl = []string{`CREATE TABLE ` + table + ` (message_id VARBINARY(255) NOT NULL PRIMARY KEY,
			fingerprint BINARY(32) NOT NULL, processed_at DATETIME(6) NOT NULL, KEY (processed_at)) ENGINE=InnoDB`}
	case "sqlite":
		ddl = []string{`CREATE TABLE ` + table + ` (message_id TEXT NOT NULL PRIMARY KEY, fingerprint BLOB NOT NULL, processed_at INTEGER NOT NULL)`,
			`CREATE INDEX ` + table + `_processed_at ON ` + table + ` (processed_at)`}
	case "postgres": // pgChecked's table
		ddl = []string{`CREATE TABLE ` + table + ` (message_id text COLLATE "C" PRIMARY KEY, fingerprint bytea NOT NULL, processed_at timestamptz NOT NULL DEFAULT now())`,
			`CREATE INDEX ON ` + table + ` (processed_at)`}
	default:
		return nil, fmt.Errorf("best_checked: unknown dialect %q", dialect)
	}
	for _, q := range ddl {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return nil, fmt.Errorf("best_checked: %w", err)
		}
	}
	return &sqlChecked{db: db, dialect: dialect, table: table, effects: effects, faults: f}, nil
}

// insert returns the statement inserting n records, skipping those whose
// ID is taken, and returning the IDs it inserted when returning is set
// (MariaDB 10.5 and SQLite 3.35 have RETURNING).
func (c *sqlChecked) insert(n int, returning bool) string {
	var b strings.Builder
	switch c.dialect {
	case "mysql":
		b.WriteString(`INSERT IGNORE INTO ` + c.table + ` (message_id, fingerprint, processed_at) VALUES `)
	case "sqlite":
		b.WriteString(`INSERT INTO ` + c.table + ` (message_id, fingerprint, processed_at) VALUES `)
	default: // postgres: processed_at is its default, now()
		b.WriteString(`INSERT INTO ` + c.table + ` (message_id, fingerprint) VALUES `)
	}
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`(` + c.ph(2*i+1) + `, ` + c.ph(2*i+2))
		switch c.dialect {
		case "mysql":
			b.WriteString(`, UTC_TIMESTAMP(6)`)
		case "sqlite":
			b.WriteString(`, unixepoch('subsec') * 1000`)
		}
		b.WriteByte(')')
	}
	if c.dialect != "mysql" {
		// Only a taken ID is skipped (SQLite's INSERT OR IGNORE would
		// also skip a NOT NULL or CHECK failure).
		b.WriteString(` ON CONFLICT (message_id) DO NOTHING`)
	}
	if returning {
		b.WriteString(` RETURNING message_id`)
	}
	return b.String()
}

// ph is the dialect's i-th placeholder (from 1): ? or $i.
func (c *sqlChecked) ph(i int) string {
	if c.dialect == "postgres" {
		return "$" + strconv.Itoa(i)
	}
	return "?"
}

// list is n placeholders joined by commas, each in parentheses when
// rows is set (the rows of a multi-row VALUES).
func (c *sqlChecked) list(n int, rows bool) string {
	open, end := "", ""
	if rows {
		open, end = "(", ")"
	}
	if c.dialect != "postgres" {
		return open + "?" + end + strings.Repeat(", "+open+"?"+end, n-1)
	}
	b := make([]byte, 0, n*(len(open)+len(end)+6))
	for i := 1; i <= n; i++ {
		if i > 1 {
			b = append(b, ", "...)
		}
		b = append(b, open...)
		b = append(b, '$')
		b = strconv.AppendInt(b, int64(i), 10)
		b = append(b, end...)
	}
	return string(b)
}

func (c *sqlChecked) one() msgHandler { return c.oneWith(nil, nil) }

// oneWith is best_checked that also runs extra in the transaction of a
// new message, after its side effect, and calls committed after its
// commit (best_outbox1's outbox row and relay wake-up); both may be nil.
func (c *sqlChecked) oneWith(extra func(ctx context.Context, tx *sql.Tx, id string) error, committed func()) msgHandler {
	claim := c.insert(1, false)
	read := `SELECT fingerprint FROM ` + c.table + ` WHERE message_id = ` + c.ph(1)
	effect := `INSERT INTO ` + c.effects + ` (id) VALUES (` + c.ph(1) + `)`
	return func(ctx context.Context, msg idem.Message) (bool, error) {
		fp := fingerprint(msg.Payload)
		tx, err := c.db.BeginTx(ctx, nil)
		if err != nil {
			return false, err
		}
		defer func() { _ = tx.Rollback() }()
		res, err := tx.ExecContext(ctx, claim, msg.ID, fp)
		if err != nil {
			return false, err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return false, err
		}
		if n == 0 { // a duplicate: check its payload, roll back
			var stored []byte
			if err := tx.QueryRowContext(ctx, read, msg.ID).Scan(&stored); err != nil {
				return false, err
			}
			if err := tx.Rollback(); err != nil {
				return false, err
			}
			if !bytes.Equal(stored, fp) {
				return false, fmt.Errorf("%w: %s", errPayloadReused, msg.ID)
			}
			return true, nil
		}
		if _, err := tx.ExecContext(ctx, effect, msg.ID); err != nil {
			return false, err
		}
		if extra != nil {
			if err := extra(ctx, tx, msg.ID); err != nil {
				return false, err
			}
		}
		if c.faults.fail(msg.ID) {
			return false, errInjected
		}
		if err := tx.Commit(); err != nil {
			return false, err
		}
		if committed != nil {
			committed()
		}
		return true, nil
	}
}

func (c *sqlChecked) batch() batchHandler {
	return func(ctx context.Context, msgs []idem.Message) []bool {
		acks, _ := c.processBatch(ctx, msgs)
		return acks
	}
}

// processBatch is best_checked_batchN on database/sql: BEGIN, the claim
// (one insert of the batch's records skipping the taken IDs, RETURNING the
// inserted ones), the duplicates' fingerprints read with one statement,
// the side effects written with one statement, COMMIT.
func (c *sqlChecked) processBatch(ctx context.Context, msgs []idem.Message) ([]bool, error) {
	tx, err := c.db.BeginTx(ctx, nil)
	if err != nil {
		return make([]bool, len(msgs)), err
	}
	defer func() { _ = tx.Rollback() }()
	return checkedBatch(msgs, c.faults, batchSteps{
		claim: func(ids []string, fps [][]byte) ([]string, error) {
			args := make([]any, 0, 2*len(ids))
			for i, id := range ids {
				args = append(args, id, fps[i])
			}
			return queryStrings(ctx, tx, c.insert(len(ids), true), args...)
		},
		stored: func(dups []string) (map[string][]byte, error) {
			args := make([]any, len(dups))
			for i, id := range dups {
				args[i] = id
			}
			rows, err := tx.QueryContext(ctx, `SELECT message_id, fingerprint FROM `+c.table+` WHERE message_id IN (`+c.list(len(dups), false)+`)`, args...)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			return scanFingerprints(rows)
		},
		effects: func(ids []string) error {
			args := make([]any, len(ids))
			for i, id := range ids {
				args[i] = id
			}
			_, err := tx.ExecContext(ctx, `INSERT INTO `+c.effects+` (id) VALUES `+c.list(len(ids), true), args...)
			return err
		},
		commit:   tx.Commit,
		rollback: tx.Rollback,
	})
}

// batchSteps are the statements of best_checked_batchN in one open
// transaction, for checkedBatch.
type batchSteps struct {
	// claim inserts the records of ids (in byte order, with their
	// fingerprints fps), skipping the IDs taken, and returns those it
	// inserted.
	claim func(ids []string, fps [][]byte) ([]string, error)
	// stored returns the stored fingerprint of each of dups.
	stored func(dups []string) (map[string][]byte, error)
	// effects writes the side effects of ids.
	effects          func(ids []string) error
	commit, rollback func() error
}

// checkedBatch runs the steps of best_checked_batchN over msgs: the
// records claimed in byte order of their IDs (two batches sharing IDs
// lock them in the same order), the stored fingerprints of the others
// compared with their payloads', the side effects of the new ones, then
// COMMIT (ROLLBACK when none is new). It returns one ack per message: a
// new one, or a duplicate of the same payload; all false on an error.
func checkedBatch(msgs []idem.Message, f *faults, s batchSteps) ([]bool, error) {
	acks := make([]bool, len(msgs))
	byID := make(map[string][]byte, len(msgs))
	for _, m := range msgs {
		byID[m.ID] = fingerprint(m.Payload)
	}
	ids := make([]string, 0, len(byID))
	for id := range byID {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	fps := make([][]byte, len(ids))
	for i, id := range ids {
		fps[i] = byID[id]
	}
	claimed, err := s.claim(ids, fps)
	if err != nil {
		return acks, err
	}
	isNew := make(map[string]bool, len(claimed))
	for _, id := range claimed {
		isNew[id] = true
	}
	var dups []string
	for _, id := range ids {
		if !isNew[id] {
			dups = append(dups, id)
		}
	}
	var stored map[string][]byte
	if len(dups) > 0 {
		if stored, err = s.stored(dups); err != nil {
			return acks, err
		}
	}
	if len(claimed) > 0 {
		if err := s.effects(claimed); err != nil {
			return acks, err
		}
		failed := false
		for _, id := range claimed {
			if f.fail(id) {
				failed = true
			}
		}
		if failed {
			return acks, errInjected
		}
		err = s.commit()
	} else {
		err = s.rollback()
	}
	if err != nil {
		return acks, err
	}
	for i, m := range msgs {
		fp, ok := stored[m.ID]
		acks[i] = isNew[m.ID] || ok && bytes.Equal(fp, byID[m.ID])
	}
	return acks, nil
}

// fingerprintRows is what scanFingerprints reads: database/sql's and
// pgx's rows both have these.
type fingerprintRows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// scanFingerprints reads rows of (message_id, fingerprint); the caller
// closes them.
func scanFingerprints(rows fingerprintRows) (map[string][]byte, error) {
	out := map[string][]byte{}
	for rows.Next() {
		var id string
		var fp []byte
		if err := rows.Scan(&id, &fp); err != nil {
			return nil, err
		}
		out[id] = fp
	}
	return out, rows.Err()
}

// queryStrings runs q in tx and returns its rows' single text column.
func queryStrings(ctx context.Context, tx *sql.Tx, q string, args ...any) ([]string, error) {
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// pgChecked is best_checked on PostgreSQL through pgx, with raw
// statements pipelined where they can be: BEGIN and the claim in one
// round trip, the fingerprint's read and ROLLBACK in one.
type pgChecked struct {
	pool    *pgxpool.Pool
	table   string
	effects string
	faults  *faults
}

// newPGChecked creates best_checked's processed table on pool. The caller
// drops it.
func newPGChecked(ctx context.Context, pool *pgxpool.Pool, table, effects string, f *faults) (*pgChecked, error) {
	for _, q := range []string{
		`CREATE TABLE ` + table + ` (message_id text COLLATE "C" PRIMARY KEY, fingerprint bytea NOT NULL, processed_at timestamptz NOT NULL DEFAULT now())`,
		`CREATE INDEX ON ` + table + ` (processed_at)`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			return nil, fmt.Errorf("best_checked: %w", err)
		}
	}
	return &pgChecked{pool: pool, table: table, effects: effects, faults: f}, nil
}

func (c *pgChecked) one() msgHandler {
	claim := `INSERT INTO ` + c.table + ` (message_id, fingerprint) VALUES ($1, $2) ON CONFLICT DO NOTHING`
	read := `SELECT fingerprint FROM ` + c.table + ` WHERE message_id = $1`
	effect := `INSERT INTO ` + c.effects + ` (id) VALUES ($1)`
	return func(ctx context.Context, msg idem.Message) (ack bool, err error) {
		fp := fingerprint(msg.Payload)
		conn, err := c.pool.Acquire(ctx)
		if err != nil {
			return false, err
		}
		open := true // a transaction may be open on conn
		defer func() {
			if open {
				// In an unknown transaction state: the pool drops it.
				_ = conn.Conn().Close(context.WithoutCancel(ctx))
			}
			conn.Release()
		}()
		b := &pgx.Batch{}
		b.Queue(`BEGIN`)
		b.Queue(claim, msg.ID, fp)
		tag, err := execAfterBegin(conn.SendBatch(ctx, b))
		if err != nil {
			return false, err
		}
		if tag.RowsAffected() == 1 {
			if _, err := conn.Exec(ctx, effect, msg.ID); err != nil {
				return false, err
			}
			if c.faults.fail(msg.ID) {
				if _, err := conn.Exec(ctx, `ROLLBACK`); err == nil {
					open = false
				}
				return false, errInjected
			}
			if _, err := conn.Exec(ctx, `COMMIT`); err != nil {
				return false, err
			}
			open = false
			return true, nil
		}
		b = &pgx.Batch{}
		b.Queue(read, msg.ID)
		b.Queue(`ROLLBACK`)
		br := conn.SendBatch(ctx, b)
		var stored []byte
		err = br.QueryRow().Scan(&stored)
		if err == nil {
			_, err = br.Exec()
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return false, err
		}
		open = false
		if !bytes.Equal(stored, fp) {
			return false, fmt.Errorf("%w: %s", errPayloadReused, msg.ID)
		}
		return true, nil
	}
}

func (c *pgChecked) batch() batchHandler {
	return func(ctx context.Context, msgs []idem.Message) []bool {
		acks, _ := c.processBatch(ctx, msgs)
		return acks
	}
}

// processBatch is best_checked_batchN on PostgreSQL: BEGIN and the claim
// (INSERT ... SELECT unnest ON CONFLICT DO NOTHING RETURNING) in one round
// trip, the duplicates' fingerprints read with one statement, the side
// effects written with one unnest INSERT, COMMIT.
func (c *pgChecked) processBatch(ctx context.Context, msgs []idem.Message) ([]bool, error) {
	var tx pgx.Tx
	defer func() {
		if tx != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	return checkedBatch(msgs, c.faults, batchSteps{
		claim: func(ids []string, fps [][]byte) ([]string, error) {
			b := &pgx.Batch{}
			b.BeginTx(pgx.TxOptions{})
			b.Queue(`INSERT INTO `+c.table+` (message_id, fingerprint) SELECT * FROM unnest($1::text[], $2::bytea[]) ON CONFLICT DO NOTHING RETURNING message_id`, ids, fps)
			br := c.pool.SendBatch(ctx, b)
			tx = br.Tx()
			_, err := br.Exec() // BEGIN
			var claimed []string
			if err == nil {
				var rows pgx.Rows
				if rows, err = br.Query(); err == nil {
					claimed, err = pgx.CollectRows(rows, pgx.RowTo[string])
				}
			}
			if cerr := br.Close(); err == nil {
				err = cerr
			}
			return claimed, err
		},
		stored: func(dups []string) (map[string][]byte, error) {
			rows, err := tx.Query(ctx, `SELECT message_id, fingerprint FROM `+c.table+` WHERE message_id = ANY($1::text[])`, dups)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			return scanFingerprints(rows)
		},
		effects: func(ids []string) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+c.effects+` (id) SELECT unnest($1::text[])`, ids)
			return err
		},
		commit:   func() error { return tx.Commit(ctx) },
		rollback: func() error { return tx.Rollback(ctx) },
	})
}

// execAfterBegin reads the results of a pipelined batch of BEGIN and one
// statement, closes it, and returns the statement's command tag.
func execAfterBegin(br pgx.BatchResults) (pgconn.CommandTag, error) {
	_, err := br.Exec() // BEGIN
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}
