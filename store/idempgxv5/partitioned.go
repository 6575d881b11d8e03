package idempgxv5

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/pgsql"
	"github.com/idem-go/idem/internal/sqlstore"
	"github.com/jackc/pgx/v5"
)

// Partitions selects the partitioned layout of the processed-messages
// table (Config.Partitions): the table is range-partitioned by
// processed_at (the server's now() at the claim), one partition per
// bucket of Bucket, and the purge drops whole partitions instead of
// deleting rows. See docs/partitioned.md for when to choose it.
//
// The layout is chosen when the table is created (Migrate): a Store with
// Partitions on a table created without it, or the other way round,
// fails at Migrate with an error matching idemdriver.ErrInvalidConfig.
//
// What changes, compared with the default layout:
//   - (consumer, message_id) is unique by a transaction-scoped advisory
//     lock on (table, consumer, message ID), which every claim takes
//     (pg_advisory_xact_lock, under the claim's LockTimeout) in a
//     statement before the one that looks the ID up in every partition
//     and inserts it into the partition of now(). Claims therefore
//     need READ COMMITTED (another level is an error matching
//     ErrIsolation) and a table written only through idem's claims.
//   - A partition is dropped (ALTER TABLE ... DETACH PARTITION ...
//     CONCURRENTLY, then DROP TABLE) once its upper bound is at or
//     before the purge horizon of every consumer with records in it.
//     A consumer that never purges again (one that no longer runs)
//     holds back the drop of every partition with its records.
//   - Lease mode is not offered: the lease methods return an error
//     matching ErrLeaseUnsupported.
type Partitions struct {
	// Bucket is the span of processed_at of one partition: whole
	// minutes, at least one; zero means one hour. Buckets are aligned on
	// the Unix epoch. A record is dropped at the first purge after the
	// end of its bucket has passed the horizon, so records live up to
	// the retention window plus one bucket (plus the purge interval);
	// a claim looks the ID up in every live partition, about
	// window / Bucket + 2 of them.
	Bucket time.Duration
	// Ahead is how many buckets after the current one are created ahead
	// (at Migrate, and when a consumer marks itself running, about every
	// minute); zero means 2. A claim that finds no partition for now()
	// fails with an error matching ErrNoPartition (BeginClaim creates
	// the partition and claims again once).
	Ahead int
	// ExactPurge also deletes, row by row as the default layout does,
	// the purging consumer's records before the horizon that no
	// partition drop removed (those of the bucket the horizon falls in,
	// and of buckets held back by another consumer), so that no record
	// outlives the horizon, at the cost of the row deletes the layout
	// otherwise avoids.
	ExactPurge bool
}

// ErrLeaseUnsupported is returned by the lease methods (Acquire, Renew,
// Complete, Release, SaveStep) of a Store in the partitioned layout.
var ErrLeaseUnsupported = errors.New("idempgxv5: lease mode is not offered on the partitioned layout")

// ErrTooManyConsumers is returned (wrapped) by a claim, an Acquire or a
// batch of a consumer new to a table of schema v2 (migrations 014 and
// 015) that already holds 32,767 consumer names, the most its smallint
// keys allow; the message is not claimed. Names that have a key are not
// affected. See "Schema v2" in the package documentation.
var ErrTooManyConsumers = pgsql.ErrTooManyConsumers

// ErrIsolation is returned by a claim on the partitioned layout in a
// transaction that is not READ COMMITTED; nothing was claimed.
var ErrIsolation = pgsql.ErrIsolation

// ErrNoPartition is returned by a claim on the partitioned layout when no
// partition covers the server's now() (none was created ahead in time);
// the transaction is aborted and nothing was claimed.
var ErrNoPartition = pgsql.ErrNoPartition

// partitioned is the partitioned layout's part of a Store.
type partitioned struct {
	q      *pgsql.Partitioned
	bucket time.Duration
	ahead  int
	exact  bool
	// until is the end (Unix µs, by the server's clock) of the last
	// bucket created ahead: MarkRunning creates more only when the local
	// clock says it is within one bucket of it.
	until atomic.Int64
}

// newPartitioned checks cfg.
func newPartitioned(table string, cfg *Partitions) (*partitioned, error) {
	p := &partitioned{q: pgsql.NewPartitioned(table), bucket: cfg.Bucket, ahead: cfg.Ahead, exact: cfg.ExactPurge}
	if p.bucket == 0 {
		p.bucket = time.Hour
	}
	if p.ahead == 0 {
		p.ahead = 2
	}
	if p.bucket < time.Minute || p.bucket%time.Minute != 0 || p.ahead < 0 {
		return nil, fmt.Errorf("%w: idempgxv5: Partitions.Bucket %v (want whole minutes, at least one), Ahead %d", idemdriver.ErrInvalidConfig, cfg.Bucket, cfg.Ahead)
	}
	return p, nil
}

// EnsurePartitions creates the partitions of the partitioned layout from
// the bucket of the server's now() to Ahead buckets after it, those that
// do not exist yet, in one transaction under an advisory lock (key of
// "partitions" and the table) so that concurrent callers do not race.
// Each is a standalone table attached with ATTACH PARTITION, which locks
// the parent in SHARE UPDATE EXCLUSIVE mode only (claims go on). It is a
// no-op on the default layout. Migrate and MarkRunning call it.
func (s *Store) EnsurePartitions(ctx context.Context) error {
	if s.part == nil {
		return nil
	}
	return s.ensureAt(ctx, time.Time{})
}

// ensureAt is EnsurePartitions from the bucket of at (zero: the server's
// now()).
func (s *Store) ensureAt(ctx context.Context, at time.Time) error {
	p := s.part
	var until int64
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var nowUS int64
		if err := tx.QueryRow(ctx, `SELECT `+pgsql.Micros(`now()`)+` FROM (SELECT pg_advisory_xact_lock($1::bigint)) AS l`,
			sqlstore.LockKey("partitions", s.table.Qualified)).Scan(&nowUS); err != nil {
			return err
		}
		from := time.UnixMicro(nowUS)
		if !at.IsZero() {
			from = at
		}
		b := pgsql.BucketAt(from, p.bucket)
		for i := 0; i <= p.ahead; i++ {
			name := pgsql.PartitionName(s.table.Qualified, b)
			var exists bool
			if err := tx.QueryRow(ctx, p.q.Exists, name).Scan(&exists); err != nil {
				return err
			}
			if !exists {
				for _, st := range pgsql.CreatePartition(s.table.Qualified, name, b) {
					if _, err := tx.Exec(ctx, st); err != nil {
						return fmt.Errorf("create partition %s: %w", name, err)
					}
				}
			}
			until = b.Hi.UnixMicro()
			b = pgsql.Bucket{Lo: b.Hi, Hi: b.Hi.Add(p.bucket)}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("idempgxv5: partitions: %w", err)
	}
	if at.IsZero() {
		for old := p.until.Load(); until > old && !p.until.CompareAndSwap(old, until); old = p.until.Load() {
		}
	}
	return nil
}

// ensureSoon runs EnsurePartitions when the local clock is within one
// bucket of the end of the partitions made ahead (or none were yet).
func (s *Store) ensureSoon(ctx context.Context) error {
	if s.part == nil {
		return nil
	}
	if u := s.part.until.Load(); u != 0 && time.Now().Add(s.part.bucket).UnixMicro() < u {
		return nil
	}
	return s.EnsurePartitions(ctx)
}

// checkLayout returns an error matching idemdriver.ErrInvalidConfig when
// the table exists with the other layout than the Store's.
func (s *Store) checkLayout(ctx context.Context) error {
	var kind *string
	err := s.pool.QueryRow(ctx, `SELECT c.relkind::text FROM pg_class c WHERE c.oid = to_regclass($1::text)`, s.table.Qualified).Scan(&kind)
	if errors.Is(err, pgx.ErrNoRows) || kind == nil {
		return nil
	}
	if err != nil {
		return err
	}
	if want := map[bool]string{true: "p", false: "r"}[s.part != nil]; *kind != want {
		return fmt.Errorf("%w: idempgxv5: table %s exists in the %s layout", idemdriver.ErrInvalidConfig, s.table.Qualified,
			map[bool]string{true: "partitioned", false: "default"}[*kind == "p"])
	}
	return nil
}

// dropper is the partitioned layout's purge batch: it drops the
// partitions behind every horizon and reports their records of the
// purging consumer Limit at a time, then (ExactPurge) deletes rows.
type dropper struct {
	s       *Store
	pending int64 // records of dropped partitions not reported yet
	rows    pgsql.DeleteFunc
}

func (d *dropper) batch(ctx context.Context, consumer string, horizonUS int64, limit int) (int64, error) {
	if d.pending == 0 {
		n, err := d.s.dropExpired(ctx, consumer, horizonUS)
		if err != nil {
			return 0, err
		}
		d.pending = n
	}
	n := min(d.pending, int64(limit))
	d.pending -= n
	if n < int64(limit) && d.s.part.exact { // the rest of the batch by rows
		m, err := d.rows(ctx, consumer, horizonUS, limit-int(n))
		return n + m, err
	}
	return n, nil
}

// detachAttempts is how many times a purge tries to detach one partition.
const detachAttempts = 3

// detachWait bounds each DETACH: it waits only for other DDL, VACUUM or
// ANALYZE on the table (claims do not conflict), and is cancelled after
// detachWait, by a cancel request (no session setting, which a pooler in
// transaction mode could hand to another client).
const detachWait = 5 * time.Second

// dropExpired records consumer's horizon and drops every partition whose
// upper bound is at or before the horizon of each consumer with records
// in it; it returns consumer's records in the dropped partitions.
//
// The drops of one table run one purger at a time, whatever the
// consumer: a transaction of their own holds the advisory lock
// ("drop", table) with pg_try_advisory_xact_lock while they run, idle;
// a purger that finds it held drops nothing this time.
func (s *Store) dropExpired(ctx context.Context, consumer string, horizonUS int64) (int64, error) {
	q := s.part.q
	if _, err := s.pool.Exec(ctx, q.SetHorizon, consumer, horizonUS); err != nil {
		return 0, err
	}
	lock, err := s.pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer abort(ctx, lock)
	var mine bool
	if err := lock.QueryRow(ctx, pgsql.TryXactLock, sqlstore.LockKey("drop", s.table.Qualified)).Scan(&mine); err != nil || !mine {
		return 0, err
	}
	type part struct {
		name    string
		lo, hi  int64
		pending bool
	}
	rows, err := s.pool.Query(ctx, q.Partitions, s.table.Qualified)
	if err != nil {
		return 0, err
	}
	parts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (p part, err error) {
		err = r.Scan(&p.name, &p.lo, &p.hi, &p.pending)
		return p, err
	})
	if err != nil {
		return 0, err
	}
	var total int64
	for _, p := range parts {
		if p.hi > horizonUS {
			break
		}
		var blockers, n int64
		if err := s.pool.QueryRow(ctx, q.Blockers(p.name), p.hi).Scan(&blockers); err != nil {
			return total, err
		}
		if blockers > 0 {
			continue
		}
		if err := s.pool.QueryRow(ctx, pgsql.CountIn(p.name), consumer).Scan(&n); err != nil {
			return total, err
		}
		if err := s.detach(ctx, p.name, p.pending); err != nil {
			return total, err
		}
		if _, err := s.pool.Exec(ctx, `DROP TABLE `+p.name); err != nil {
			return total, fmt.Errorf("drop partition %s: %w", p.name, err)
		}
		total += n
	}
	return total, nil
}

// detach detaches partition name from the table with DETACH PARTITION
// ... CONCURRENTLY (or FINALIZE, for one whose concurrent detach was
// interrupted after its first phase), each attempt cancelled after
// detachWait, trying detachAttempts times.
func (s *Store) detach(ctx context.Context, name string, pending bool) error {
	how := `CONCURRENTLY`
	if pending {
		how = `FINALIZE`
	}
	var err error
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, detachWait)
		_, err = s.pool.Exec(actx, `ALTER TABLE `+s.table.Qualified+` DETACH PARTITION `+name+` `+how)
		cancel()
		if err == nil || attempt == detachAttempts || ctx.Err() != nil {
			break
		}
		var still bool
		if qerr := s.pool.QueryRow(ctx, `SELECT inhdetachpending FROM pg_inherits WHERE inhrelid = to_regclass($1::text)`, name).Scan(&still); qerr == nil && still {
			how = `FINALIZE` // the first phase had committed
		}
	}
	if err != nil {
		return fmt.Errorf("detach partition %s: %w", name, err)
	}
	return nil
}
