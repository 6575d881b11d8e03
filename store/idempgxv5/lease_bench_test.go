package idempgxv5_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// BenchmarkLeaseClaim measures lease mode's claim of a new message on
// PostgreSQL against the least a hand-written lease costs: one statement,
// INSERT ... ON CONFLICT DO UPDATE ... WHERE the lease expired RETURNING
// the fencing token, on a table of its own (message ID, token, lease end),
// in autocommit. Cases, in turn in each of IDEM_BENCH_ROUNDS rounds, on
// benchWorkers workers, each table seeded with 100,000 rows first:
//
//   - hand_lease: the hand-written claim.
//   - hand_lease_wide: the same claim on a table shaped like idem's (the
//     consumer in the key, the fingerprint, state, attempt and times, the
//     (consumer, processed_at) index), taking over only an in-progress
//     record with the same fingerprint, as idem does: what the table's
//     shape costs, apart from the statement's; ratio x-hand_lease.
//   - acquire: the store's Acquire (idemdriver.LeaseStore) of a new
//     message, one statement; ratio x-hand_lease.
//   - consumer_acquire: LeaseConsumer.Acquire, then Abandon (no store
//     write), the claim as lease mode's callers pay it (fingerprint,
//     store-call timeout, the attempt and its renewal entry); ratio
//     x-hand_lease and x-acquire.
//
// acquire also reports x-hand_lease_wide.
//
// Each case reports msgs/s, client-us/msg, server-us/msg, cpu-us/msg,
// wal-B/msg and fpi/msg (see runWorkers); -benchmem's allocs/op is the
// allocations per message. Run it on the durable server:
//
//	IDEM_BENCH_WORKERS=8 IDEM_BENCH_ROUNDS=5 go test -run '^$' -bench BenchmarkLeaseClaim -benchtime 2s -benchmem
func BenchmarkLeaseClaim(b *testing.B) {
	for range benchRounds {
		benchLeaseClaimRound(b)
	}
}

func benchLeaseClaimRound(b *testing.B) {
	const lease = 30 * time.Second
	payload := []byte(`{"order":"o-1","amount":200}`)

	b.Run("hand_lease", func(b *testing.B) {
		bb := benchSetup(b)
		t := bb.best + "_lease"
		ctx := context.Background()
		for _, q := range []string{
			`CREATE TABLE ` + t + ` (message_id text COLLATE "C" PRIMARY KEY, token bigint NOT NULL, lease_until timestamptz NOT NULL)`,
			`INSERT INTO ` + t + ` (message_id, token, lease_until) SELECT 'h-' || g, 1, now() FROM generate_series(1, 100000) g`,
			`ANALYZE ` + t,
		} {
			if _, err := bb.pool.Exec(ctx, q); err != nil {
				b.Fatal(err)
			}
		}
		claim := `INSERT INTO ` + t + ` AS l (message_id, token, lease_until) VALUES ($1, 1, now() + $2::bigint * interval '1 microsecond')
ON CONFLICT (message_id) DO UPDATE SET token = l.token + 1, lease_until = excluded.lease_until
WHERE l.lease_until <= now()
RETURNING token`
		prefix := benchPrefix()
		us := lease.Microseconds()
		rate := runWorkers(b, bb, 1, func(ctx context.Context, i int64) error {
			var token int64
			if err := bb.pool.QueryRow(ctx, claim, prefix+strconv.FormatInt(i, 10), us).Scan(&token); err != nil {
				return err
			}
			if token != 1 {
				return fmt.Errorf("message %d: token %d, want 1", i, token)
			}
			return nil
		})
		reportRatios(b, "hand_lease", rate)
	})

	b.Run("hand_lease_wide", func(b *testing.B) {
		bb := benchSetup(b)
		t := bb.best + "_lease_wide"
		ctx := context.Background()
		for _, q := range []string{
			`CREATE TABLE ` + t + ` (consumer text COLLATE "C" NOT NULL, message_id text COLLATE "C" NOT NULL,
	fingerprint bytea, state smallint NOT NULL, token bigint NOT NULL, attempt integer NOT NULL,
	lease_expires_at timestamptz, processed_at timestamptz NOT NULL, updated_at timestamptz,
	PRIMARY KEY (consumer, message_id))`,
			`CREATE INDEX ON ` + t + ` (consumer, processed_at)`,
			`INSERT INTO ` + t + ` (consumer, message_id, fingerprint, state, token, attempt, processed_at)
	SELECT 'history', 'h-' || g, sha256(g::text::bytea), 2, 1, 1, now() FROM generate_series(1, 100000) g`,
			`ANALYZE ` + t,
		} {
			if _, err := bb.pool.Exec(ctx, q); err != nil {
				b.Fatal(err)
			}
		}
		claim := `INSERT INTO ` + t + ` AS l (consumer, message_id, fingerprint, state, token, attempt, lease_expires_at, processed_at, updated_at)
VALUES ($1, $2, $3, 1, 1, 1, now() + $4::bigint * interval '1 microsecond', now(), now())
ON CONFLICT (consumer, message_id) DO UPDATE SET token = l.token + 1, attempt = l.attempt + 1,
	lease_expires_at = excluded.lease_expires_at, processed_at = excluded.processed_at, updated_at = excluded.updated_at
WHERE l.state = 1 AND l.lease_expires_at <= now() AND l.fingerprint = excluded.fingerprint
RETURNING token`
		prefix := benchPrefix()
		fp := sha256.Sum256(payload)
		us := lease.Microseconds()
		rate := runWorkers(b, bb, 1, func(ctx context.Context, i int64) error {
			var token int64
			if err := bb.pool.QueryRow(ctx, claim, "bench", prefix+strconv.FormatInt(i, 10), fp[:], us).Scan(&token); err != nil {
				return err
			}
			if token != 1 {
				return fmt.Errorf("message %d: token %d, want 1", i, token)
			}
			return nil
		})
		reportRatios(b, "hand_lease_wide", rate, "hand_lease")
	})

	b.Run("acquire", func(b *testing.B) {
		bb := benchSetup(b)
		prefix := benchPrefix()
		fp := sha256.Sum256(payload)
		rate := runWorkers(b, bb, 1, func(ctx context.Context, i int64) error {
			acq, err := bb.store.Acquire(ctx, &idemdriver.AcquireParams{
				Consumer: "bench", MessageID: prefix + strconv.FormatInt(i, 10), Fingerprint: fp[:], Lease: lease,
			})
			if err == nil && (!acq.Acquired || acq.Token != 1) {
				err = fmt.Errorf("message %d: acquired %v, token %d", i, acq.Acquired, acq.Token)
			}
			return err
		})
		reportRatios(b, "acquire", rate, "hand_lease", "hand_lease_wide")
	})

	b.Run("consumer_acquire", func(b *testing.B) {
		bb := benchSetup(b)
		c, err := idem.NewLeaseConsumer(bb.store, idem.Config{Name: "bench", Lease: lease, PurgeInterval: -1, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = c.Close() }()
		prefix := benchPrefix()
		rate := runWorkers(b, bb, 1, func(ctx context.Context, i int64) error {
			a, out, err := c.Acquire(ctx, idem.Message{ID: prefix + strconv.FormatInt(i, 10), Payload: payload}, idem.AcquireOptions{})
			if a == nil {
				return fmt.Errorf("message %d: %v: %w", i, out.Status, err)
			}
			_, _ = a.Abandon(ctx, nil)
			return nil
		})
		reportRatios(b, "consumer_acquire", rate, "hand_lease", "acquire")
	})
}
