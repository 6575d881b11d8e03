package idempgxv5_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/idem-go/idem/idemdriver"
)

// BenchmarkLeaseFinish measures the end of a lease-mode attempt on
// PostgreSQL, complete with a result and release, against the least a
// hand-written lease costs for it: one UPDATE ... WHERE message_id = $1
// AND token = $n, in autocommit. Each case first makes b.N in-progress
// records with token 1 (one INSERT, not measured), then ends each once,
// on benchWorkers workers, in turn in each of IDEM_BENCH_ROUNDS rounds,
// every table seeded with 100,000 rows:
//
//   - hand_complete: the hand-written completion on a table of its own
//     (message ID, token, lease end, state, result): state and result
//     set, fenced by the token.
//   - hand_complete_wide: the same on a table shaped like idem's (the
//     consumer in the key, the fingerprint and times, the (consumer,
//     processed_at) retention index), which also stamps processed_at, as
//     idem's does (the retention window counts from completion); ratio
//     x-hand_complete.
//   - complete: the store's Complete (idemdriver.LeaseStore) with a
//     result and a content type; ratio x-hand_complete and
//     x-hand_complete_wide.
//   - release: the store's Release with an error text (not terminal);
//     ratio x-hand_complete.
//
// Each case reports msgs/s, client-us/msg, server-us/msg, cpu-us/msg,
// wal-B/msg and fpi/msg (see runWorkers); -benchmem's allocs/op is the
// allocations per message. Each is one statement and one round trip per
// message. Run it on the durable server:
//
//	IDEM_BENCH_WORKERS=8 IDEM_BENCH_ROUNDS=5 go test -run '^$' -bench BenchmarkLeaseFinish -benchtime 3000x -benchmem
func BenchmarkLeaseFinish(b *testing.B) {
	for range benchRounds {
		benchLeaseFinishRound(b)
	}
}

func benchLeaseFinishRound(b *testing.B) {
	result := []byte(`{"charge":"ch_42","amount":200}`)

	b.Run("hand_complete", func(b *testing.B) {
		bb := benchSetup(b)
		t := bb.best + "_lease"
		prefix := benchPrefix()
		execAll(b, bb,
			`CREATE TABLE `+t+` (message_id text COLLATE "C" PRIMARY KEY, token bigint NOT NULL, lease_until timestamptz NOT NULL,
	state smallint NOT NULL, result bytea)`,
			`INSERT INTO `+t+` (message_id, token, lease_until, state) SELECT 'h-' || g, 1, now(), 2 FROM generate_series(1, 100000) g`,
			`INSERT INTO `+t+` (message_id, token, lease_until, state) SELECT '`+prefix+`' || g, 1, now() + interval '1 hour', 1
	FROM generate_series(0, `+strconv.Itoa(b.N-1)+`) g`,
			`ANALYZE `+t)
		q := `UPDATE ` + t + ` SET state = 2, result = $2, lease_until = now() WHERE message_id = $1 AND state = 1 AND token = $3`
		rate := runWorkers(b, bb, 1, func(ctx context.Context, i int64) error {
			return oneRow(bb.pool.Exec(ctx, q, prefix+strconv.FormatInt(i, 10), result, int64(1)))
		})
		reportRatios(b, "hand_complete", rate)
	})

	b.Run("hand_complete_wide", func(b *testing.B) {
		bb := benchSetup(b)
		t := bb.best + "_lease_wide"
		prefix := benchPrefix()
		execAll(b, bb,
			`CREATE TABLE `+t+` (consumer text COLLATE "C" NOT NULL, message_id text COLLATE "C" NOT NULL,
	fingerprint bytea, state smallint NOT NULL, token bigint NOT NULL, attempt integer NOT NULL,
	lease_expires_at timestamptz, processed_at timestamptz NOT NULL, result bytea, content_type text,
	PRIMARY KEY (consumer, message_id))`,
			`CREATE INDEX ON `+t+` (consumer, processed_at)`,
			`INSERT INTO `+t+` (consumer, message_id, fingerprint, state, token, attempt, processed_at)
	SELECT 'history', 'h-' || g, sha256(g::text::bytea), 2, 1, 1, now() FROM generate_series(1, 100000) g`,
			`INSERT INTO `+t+` (consumer, message_id, fingerprint, state, token, attempt, lease_expires_at, processed_at)
	SELECT 'bench', '`+prefix+`' || g, sha256(g::text::bytea), 1, 1, 1, now() + interval '1 hour', now()
	FROM generate_series(0, `+strconv.Itoa(b.N-1)+`) g`,
			`ANALYZE `+t)
		q := `UPDATE ` + t + ` SET state = 2, result = $3, content_type = $4, lease_expires_at = now(), processed_at = now()
WHERE consumer = $1 AND message_id = $2 AND state = 1 AND token = $5`
		rate := runWorkers(b, bb, 1, func(ctx context.Context, i int64) error {
			return oneRow(bb.pool.Exec(ctx, q, "bench", prefix+strconv.FormatInt(i, 10), result, "application/json", int64(1)))
		})
		reportRatios(b, "hand_complete_wide", rate, "hand_complete")
	})

	b.Run("complete", func(b *testing.B) {
		bb := benchSetup(b)
		prefix := leasedRecords(b, bb)
		rate := runWorkers(b, bb, 1, func(ctx context.Context, i int64) error {
			return bb.store.Complete(ctx, &idemdriver.CompleteParams{
				Consumer: "bench", MessageID: prefix + strconv.FormatInt(i, 10), Token: 1,
				Result: result, ContentType: "application/json",
			})
		})
		reportRatios(b, "complete", rate, "hand_complete", "hand_complete_wide")
	})

	b.Run("release", func(b *testing.B) {
		bb := benchSetup(b)
		prefix := leasedRecords(b, bb)
		rate := runWorkers(b, bb, 1, func(ctx context.Context, i int64) error {
			return bb.store.Release(ctx, &idemdriver.ReleaseParams{
				Consumer: "bench", MessageID: prefix + strconv.FormatInt(i, 10), Token: 1, Error: "upstream unavailable",
			})
		})
		reportRatios(b, "release", rate, "hand_complete")
	})
}

// leasedRecords inserts b.N in-progress records of consumer "bench" with
// token 1, attempt 1 and a lease of an hour, as Acquire writes them, and
// returns the prefix of their message IDs (followed by 0 to b.N-1).
func leasedRecords(b *testing.B, bb *bundle) string {
	b.Helper()
	prefix := benchPrefix()
	execAll(b, bb, recordsInsert(bb.table, true, "'bench'", "message_id, fingerprint, processed_at, state, token, attempt, lease_expires_at")+
		`'`+prefix+`' || g, sha256(g::text::bytea), now(), 1, 1, 1, now() + interval '1 hour'
	FROM generate_series(0, `+strconv.Itoa(b.N-1)+`) g`)
	return prefix
}

// execAll runs each statement on the bundle's pool, failing b on error.
func execAll(b *testing.B, bb *bundle, statements ...string) {
	b.Helper()
	for _, q := range statements {
		if _, err := bb.pool.Exec(context.Background(), q); err != nil {
			b.Fatal(err)
		}
	}
}

// oneRow is nil when a fenced UPDATE changed exactly one row.
func oneRow(tag interface{ RowsAffected() int64 }, err error) error {
	if err != nil {
		return err
	}
	if n := tag.RowsAffected(); n != 1 {
		return fmt.Errorf("the fenced update changed %d rows, want 1", n)
	}
	return nil
}
