package idemsql

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/sqlstore"
)

// Rows per statement of the RETURNING batch claim on MariaDB: three
// placeholders a row, far below MySQL's 65,535.
const mariadbBatchRows = 1000

// batchTexts caches the batch claim and fingerprint statements by table,
// kind and row count, built on first use: a batch of 100 built its
// statement row by row at every call (SQLite's placeholders cost four
// allocations a row).
var batchTexts sync.Map // batchTextKey -> string

type batchTextKey struct {
	table string
	kind  uint8 // one of the batch* kinds below
	n     int
	lock  string // MySQL's lock-timeout prefix
}

const (
	batchSQLiteInsert  uint8 = iota // INSERT ... ON CONFLICT DO NOTHING RETURNING
	batchMariaDBInsert              // INSERT IGNORE ... RETURNING
	batchSQLiteRead                 // SELECT of fingerprints (SQLite's table)
	batchMySQLRead                  // SELECT of fingerprints (MySQL's table)
)

// batchText returns the statement of kind for n rows on s's table.
func (s *Store) batchText(kind uint8, n int, lock string) string {
	k := batchTextKey{table: s.table.Qualified, kind: kind, n: n, lock: lock}
	if q, ok := batchTexts.Load(k); ok {
		return q.(string)
	}
	var b strings.Builder
	b.WriteString(lock)
	switch kind {
	case batchSQLiteInsert:
		// An INSERT ... SELECT of a VALUES list of (message ID,
		// fingerprint) pairs, the consumer the first argument: the clock's
		// expression is written once instead of once per row, and SQLite,
		// which parses the text at every run, parses a batch of 100 in
		// about 60% of the time. WHERE true keeps the parser from reading
		// ON CONFLICT as a join's ON. The placeholders are anonymous (?,
		// numbered in the order they appear: the consumer's first):
		// modernc.org/sqlite reads a numbered one's name into a Go string
		// at every bind, an allocation per argument.
		b.WriteString(strings.TrimSuffix(s.q.batchPrefix, `VALUES `) + `SELECT ?, column1, column2, ` + sqliteNow + ` FROM (VALUES `)
		for i := range n {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString("(?, ?)")
		}
		b.WriteString(`) WHERE true ON CONFLICT (consumer, message_id) DO NOTHING RETURNING message_id`)
	case batchMariaDBInsert:
		// IGNORE skips a row whose key exists (after waiting for the
		// transaction inserting it, as any insert does) and would also
		// turn a value too long for its column into a truncated one with
		// a warning: the claim's values cannot be (consumer and message
		// ID of at most 255 bytes, fingerprint of at most 64, checked
		// before the statement runs, against the table's VARBINARY(255)
		// and VARBINARY(64)).
		b.WriteString(`INSERT IGNORE` + strings.TrimPrefix(s.q.batchPrefix, `INSERT`))
		for i := range n {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(mysqlRow)
		}
		b.WriteString(` RETURNING message_id`)
	case batchSQLiteRead, batchMySQLRead:
		b.WriteString(s.q.fpsPrefix)
		for i := range n {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteByte('?')
		}
		b.WriteString(s.q.fpsSuffix)
	}
	q, _ := batchTexts.LoadOrStore(k, b.String())
	return q.(string)
}

// mysqlReturning reports whether s's MySQL server has INSERT ...
// RETURNING (MariaDB 10.5 and later; MySQL has none), asking it (SELECT
// VERSION(), in tx) until one call gets an answer, which s keeps
// (Store.returning).
func (s *Store) mysqlReturning(ctx context.Context, tx *sql.Tx) (bool, error) {
	if v, known := s.returning.get(); known {
		return v, nil
	}
	var version string
	if err := tx.QueryRowContext(ctx, `SELECT VERSION()`).Scan(&version); err != nil {
		return false, err
	}
	return s.returning.set(mariaDBReturning(version)), nil
}

// mariaDBReturning reports whether the server of version string v (SELECT
// VERSION(), e.g. "10.11.6-MariaDB-0+deb12u1") is MariaDB 10.5 or later.
func mariaDBReturning(v string) bool {
	if !strings.Contains(v, "MariaDB") {
		return false
	}
	major, rest, _ := strings.Cut(v, ".")
	minor, _, _ := strings.Cut(rest, ".")
	ma, err1 := strconv.Atoi(major)
	mi, err2 := strconv.Atoi(minor)
	return err1 == nil && err2 == nil && (ma > 10 || ma == 10 && mi >= 5)
}

// claimBatchReturning claims msgs (sorted by ID, distinct) with one
// multi-row insert per rows messages that skips the taken IDs and returns
// those it inserted (SQLite: INSERT ... ON CONFLICT DO NOTHING RETURNING;
// MariaDB: INSERT IGNORE ... RETURNING, with lock's lock timeout), then
// reads the fingerprints of the others with one SELECT, only when there
// are any: the statements of a hand-written batch consumer. The results
// are in the order of msgs.
func (s *Store) claimBatchReturning(ctx context.Context, tx *sql.Tx, consumer string, msgs []idemdriver.ClaimMessage, lock string) ([]idemdriver.ClaimResult, error) {
	mysql := s.dialect == MySQL
	kind, rows, read, readRows := batchSQLiteInsert, sqliteBatchRows, batchSQLiteRead, sqliteBatchRows
	if mysql {
		kind, rows, read, readRows = batchMariaDBInsert, mariadbBatchRows, batchMySQLRead, mysqlFingerprintRows
	}
	res := make([]idemdriver.ClaimResult, len(msgs))
	settled := make([]bool, len(msgs))
	c := any(consumer)
	pending := msgs
	for attempt := 0; len(pending) > 0; attempt++ {
		if attempt == maxClaimAttempts {
			return nil, sqlstore.ErrUnsettled("batch claim", consumer)
		}
		for from := 0; from < len(pending); from += rows {
			chunk := pending[from:min(from+rows, len(pending))]
			var args []any
			if mysql {
				args = make([]any, 0, 3*len(chunk))
				for _, m := range chunk {
					args = append(args, c, m.MessageID, m.Fingerprint)
				}
			} else {
				args = make([]any, 0, 1+2*len(chunk))
				args = append(args, c)
				for _, m := range chunk {
					args = append(args, m.MessageID, m.Fingerprint)
				}
			}
			if err := s.claimChunk(ctx, tx, s.batchText(kind, len(chunk), lock), args, msgs, res, settled); err != nil {
				if mysql {
					err = mysqlWrapLockTimeout(err)
				}
				return nil, err
			}
		}
		var dups []idemdriver.ClaimMessage
		for _, m := range pending {
			if i, _ := searchID(msgs, m.MessageID); !settled[i] {
				dups = append(dups, m)
			}
		}
		if len(dups) == 0 {
			break
		}
		got := make(map[string]idemdriver.ClaimResult, len(dups))
		if err := s.readFingerprintsIn(ctx, tx, consumer, dups, read, readRows, got); err != nil {
			return nil, err
		}
		for id, r := range got {
			if i, ok := searchID(msgs, id); ok {
				res[i], settled[i] = r, true
			}
		}
		// A record that conflicted and vanished before it was read (a
		// purge deleted it) is claimed again.
		pending = sqlstore.Unsettled(dups, got)
	}
	return res, nil
}

// claimChunk runs one batch insert q and marks the IDs it returns claimed
// in res and settled (indexed as msgs). q runs through the Store's
// prepared statements (stmtCache) when it has q's.
func (s *Store) claimChunk(ctx context.Context, tx *sql.Tx, q string, args []any, msgs []idemdriver.ClaimMessage, res []idemdriver.ClaimResult, settled []bool) error {
	rows, err := s.prepared(tx).QueryContext(ctx, q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	var id sql.RawBytes
	for rows.Next() {
		if err := rows.Scan(&id); err != nil {
			return err
		}
		i, ok := searchID(msgs, id)
		if !ok || settled[i] {
			return fmt.Errorf("idemsql: batch claim returned message ID %q, not one of the batch's", id)
		}
		res[i], settled[i] = sqlstore.Claimed, true
	}
	return rows.Err()
}

// searchID returns the index of the message whose ID is id in msgs
// (sorted by ID), without converting id to a string, and whether it is
// there.
func searchID[T ~string | ~[]byte](msgs []idemdriver.ClaimMessage, id T) (int, bool) {
	lo, hi := 0, len(msgs)
	for lo < hi {
		h := int(uint(lo+hi) >> 1)
		if msgs[h].MessageID < string(id) {
			lo = h + 1
		} else {
			hi = h
		}
	}
	return lo, lo < len(msgs) && msgs[lo].MessageID == string(id)
}

// inOrder returns res, the results of sorted (p's messages sorted by ID),
// in the order of p.Messages.
func inOrder(p *idemdriver.ClaimBatchParams, sorted []idemdriver.ClaimMessage, res []idemdriver.ClaimResult) []idemdriver.ClaimResult {
	if &sorted[0] == &p.Messages[0] {
		return res
	}
	out := make([]idemdriver.ClaimResult, len(res))
	for i, m := range p.Messages {
		j, _ := searchID(sorted, m.MessageID)
		out[i] = res[j]
	}
	return out
}
