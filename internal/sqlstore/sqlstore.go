// Package sqlstore holds the Go logic that idem's SQL stores share,
// whatever the dialect and the driver: a small interface over a
// connection (Querier), which store/idempgxv5 implements over pgx and
// store/idemsql over database/sql, and the code that runs statements
// through it and reads their results (claims and their results, lease
// records, fenced writes, inspection, runs and purge sessions,
// migrations). Statement text lives with each dialect (internal/pgsql for
// PostgreSQL). It is internal: not part of idem's API.
//
// Times cross every driver as int64 microseconds since the Unix epoch
// (UTC), converted by the server, so nothing depends on a driver's time
// handling; Go values built from them are in UTC.
package sqlstore

import (
	"context"
	"errors"
	"hash/fnv"
	"math"
	"time"
)

// ErrNoRows is what Row.Scan returns when a query returned no row, whatever
// the driver's own sentinel (pgx.ErrNoRows, sql.ErrNoRows).
var ErrNoRows = errors.New("sqlstore: no rows in result set")

// Querier is what the shared logic needs of a connection, a pool or a
// transaction. Implementations translate the driver's no-rows error to
// ErrNoRows in Row.Scan.
type Querier interface {
	// Exec runs a statement and returns the rows it affected.
	Exec(ctx context.Context, query string, args ...any) (int64, error)
	// Query runs a statement that returns rows.
	Query(ctx context.Context, query string, args ...any) (Rows, error)
	// QueryRow runs a statement that returns at most one row.
	QueryRow(ctx context.Context, query string, args ...any) Row
}

// Row is one row of a QueryRow; Scan returns ErrNoRows when there is none.
type Row interface {
	Scan(dest ...any) error
}

// Rows are the rows of a Query: Next, Scan and Err as database/sql's, and
// Close, which may be called more than once.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// ForEach scans every row of rows with scan (which calls Scan on the row),
// and closes rows.
func ForEach(rows Rows, scan func(Row) error) error {
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// FinishTimeout bounds a rollback, an unlock or a lock release that runs
// after the caller's context has ended, so a connection is never handed
// back to its pool in an unknown state.
const FinishTimeout = 10 * time.Second

// Detached returns a context for cleanup after ctx may have ended, bounded
// by FinishTimeout.
func Detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), FinishTimeout)
}

// MaxClaimAttempts bounds how often one claim, acquire or batch is re-run
// when the record it conflicted with vanished before it could be read (a
// purge deleted it in that instant) or changed between two statements. In
// practice the first attempt settles.
const MaxClaimAttempts = 4

// LockKey derives a 64-bit PostgreSQL advisory lock key from a purpose
// and names: FNV-1a 64 over "idem", then for each part a NUL byte and the
// part. Every PostgreSQL store derives its keys this way, so two stores
// (and the idem command) on one table exclude each other; the keys are
// stable across processes and versions of idem. A purge lock is
// LockKey("purge", table, consumer), the migration lock
// LockKey("migrate", table), the table as configured (so
// "idem_processed" and "public.idem_processed" are two keys).
func LockKey(parts ...string) int64 {
	h := fnv.New64a()
	h.Write([]byte("idem"))
	for _, p := range parts {
		h.Write([]byte{0})
		h.Write([]byte(p))
	}
	return int64(h.Sum64())
}

// Micros is t as microseconds since the Unix epoch, truncated: a horizon
// truncated so keeps every record written at it.
func Micros(t time.Time) int64 { return t.UnixMicro() }

// Time is the UTC time of us microseconds since the Unix epoch.
func Time(us int64) time.Time { return time.UnixMicro(us).UTC() }

// DurationMicros is d in whole microseconds, rounded up so that a
// positive duration (a lease, a gap) never becomes 0.
func DurationMicros(d time.Duration) int64 {
	if d > math.MaxInt64-time.Microsecond {
		return int64(d / time.Microsecond) // rounding up would overflow
	}
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}
