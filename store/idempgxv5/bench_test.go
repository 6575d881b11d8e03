package idempgxv5_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// benchWorkers is the concurrency of every benchmark: that many goroutines
// share a pool of as many connections. 8 unless IDEM_BENCH_WORKERS says
// otherwise (1 shows the latency-bound case).
var benchWorkers = func() int {
	if n, err := strconv.Atoi(os.Getenv("IDEM_BENCH_WORKERS")); err == nil && n > 0 {
		return n
	}
	return 8
}()

// benchURL is the database the benchmarks run on: the durable PostgreSQL
// (IDEM_TEST_POSTGRES_DURABLE_URL: fsync, synchronous_commit and
// full_page_writes on, what users run) when it is set, else the test
// database (whose fsync is off: figures that flatter every contender).
func benchURL() string { return os.Getenv(testenv.PostgresDurableEnv) }

// benchRounds is how many times a benchmark runs its cases in turn
// (IDEM_BENCH_ROUNDS, default 1). go test -count N would run each case N
// times in a row; rounds interleave them, so that a ratio compares cases
// measured moments apart, under the same load.
var benchRounds = func() int {
	if n, err := strconv.Atoi(os.Getenv("IDEM_BENCH_ROUNDS")); err == nil && n > 0 {
		return n
	}
	return 1
}()

var benchSeq atomic.Int64

// benchPrefix makes message IDs unique across the runs of a benchmark.
func benchPrefix() string {
	return "b" + strconv.FormatInt(benchSeq.Add(1), 10) + "-"
}

// benchSetup is setup on benchURL's database with a pool of benchWorkers
// connections, plus the hand-written consumer's processed table
// (bundle.best): the least a person can write for the same guarantee, one
// text primary key and the time of processing (which retention needs).
func benchSetup(b *testing.B) *bundle {
	b.Helper()
	bb := setup(b, poolOpts{maxConns: int32(benchWorkers), url: benchURL()})
	bb.best = bb.effects + "_best"
	if _, err := bb.pool.Exec(context.Background(), `CREATE TABLE `+bb.best+
		` (message_id text COLLATE "C" PRIMARY KEY, processed_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		b.Fatal(err)
	}
	return bb
}

// steady seeds the bundle's tables with 100,000 rows each (records of
// another consumer, effect rows, hand-written records) and analyzes them,
// so that a benchmark measures a table in its steady state: with history,
// and with statistics and cached plans that match its size. (A table
// analyzed while nearly empty keeps cheap-looking sequential-scan plans for
// its lookups until autovacuum analyzes it again.)
func steady(b *testing.B, bb *bundle) {
	b.Helper()
	ctx := context.Background()
	history := `INSERT INTO ` + bb.table + ` (consumer, message_id, fingerprint)
			SELECT 'history', 'h-' || g, sha256(g::text::bytea) FROM generate_series(1, 100000) g`
	if bb.part == nil { // schema v2: the consumer's key
		history = recordsInsert(bb.table, true, "'history'", "message_id, fingerprint") +
			`'h-' || g, sha256(g::text::bytea) FROM generate_series(1, 100000) g`
	}
	for _, q := range []string{
		history,
		`INSERT INTO ` + bb.effects + ` (key) SELECT 'h-' || g FROM generate_series(1, 100000) g`,
		`INSERT INTO ` + bb.best + ` (message_id) SELECT 'h-' || g FROM generate_series(1, 100000) g`,
		`ANALYZE ` + bb.table + `, ` + bb.effects + `, ` + bb.best,
	} {
		if _, err := bb.pool.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	if bb.checked == "" {
		return
	}
	for _, q := range []string{
		`INSERT INTO ` + bb.checked + ` (message_id, fingerprint) SELECT 'h-' || g, sha256(g::text::bytea) FROM generate_series(1, 100000) g`,
		`ANALYZE ` + bb.checked,
	} {
		if _, err := bb.pool.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
}

// ratios keeps the throughput each case of a benchmark last measured, so
// that a later case of the same round (see benchRounds) reports its ratio against a reference measured moments
// before on the same machine, under the same load.
var ratios = struct {
	sync.Mutex
	last map[string]float64
}{last: map[string]float64{}}

// reportRatios records msgsPerSec as case name's throughput, and reports
// its ratio to each reference case of refs measured earlier in the run as
// the metric "x-<ref>".
func reportRatios(b *testing.B, name string, msgsPerSec float64, refs ...string) {
	ratios.Lock()
	defer ratios.Unlock()
	ratios.last[name] = msgsPerSec
	for _, r := range refs {
		if v, ok := ratios.last[r]; ok && v > 0 {
			b.ReportMetric(msgsPerSec/v, "x-"+r)
		}
	}
}

// runWorkers runs op b.N times across benchWorkers goroutines and reports
// the throughput in messages per second (msgsPerOp messages per op), the
// CPU time per message where it can be measured (see cpuMeter) and the WAL
// per message (see walMeter), and returns the throughput.
func runWorkers(b *testing.B, bb *bundle, msgsPerOp int, op func(ctx context.Context, i int64) error) float64 {
	b.Helper()
	steady(b, bb)
	return measure(b, bb, msgsPerOp, op)
}

// runOps calls op(ctx, i) for every i in [0, b.N), on benchWorkers
// goroutines, and returns the first error (the workers stop at it).
func runOps(ctx context.Context, b *testing.B, op func(ctx context.Context, i int64) error) error {
	var (
		next    atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		opErr   error
	)
	for range benchWorkers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				if err := op(ctx, i); err != nil {
					errOnce.Do(func() { opErr = err })
					return
				}
			}
		})
	}
	wg.Wait()
	return opErr
}

// measure is runWorkers on the bundle's tables as they are.
func measure(b *testing.B, bb *bundle, msgsPerOp int, op func(ctx context.Context, i int64) error) float64 {
	b.Helper()
	ctx := context.Background()
	m := startCPU(b, bb.pool)
	w := startWAL(b, bb)
	b.ResetTimer()
	start := time.Now()
	opErr := runOps(ctx, b, op)
	elapsed := time.Since(start)
	b.StopTimer()
	if opErr != nil {
		b.Fatal(opErr)
	}
	rate := float64(b.N*msgsPerOp) / elapsed.Seconds()
	b.ReportMetric(rate, "msgs/s")
	m.report(b, b.N*msgsPerOp)
	w.report(b, b.N*msgsPerOp)
	return rate
}

// walMeter measures the WAL a benchmark writes: bytes (the advance of
// pg_current_wal_lsn) and full-page images (pg_stat_wal.wal_fpi) per
// message. Both are the whole server's: other sessions writing at the same
// time count too. Full-page images come after each checkpoint (every
// checkpoint_timeout, 5 minutes by default), for the first change of each
// page: a short run sees many or none depending on when it starts.
type walMeter struct {
	bb       *bundle
	lsn, fpi int64
}

func startWAL(b *testing.B, bb *bundle) *walMeter {
	w := &walMeter{bb: bb}
	w.lsn, w.fpi = w.read(b)
	return w
}

// read flushes the statistics the pool's backends hold (each sends them
// when it goes idle after pg_stat_force_next_flush, before answering), and
// reads the WAL position and the count of full-page images.
func (w *walMeter) read(b *testing.B) (lsn, fpi int64) {
	b.Helper()
	ctx := context.Background()
	conns := w.bb.pool.AcquireAllIdle(ctx)
	for _, c := range conns {
		if _, err := c.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
			b.Fatal(err)
		}
		c.Release()
	}
	err := w.bb.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, wal_fpi FROM pg_stat_wal`).Scan(&lsn, &fpi)
	if err != nil {
		b.Fatal(err)
	}
	return lsn, fpi
}

// report adds the metrics wal-B/msg and fpi/msg. With IDEM_BENCH_WAL_RANGE
// set it also logs the WAL range measured (as bytes since 0/0) and the
// file numbers of the bundle's relations, for pg_walinspect to break the
// range's records down by relation after the run (the tables are dropped
// at the benchmark's cleanup).
func (w *walMeter) report(b *testing.B, msgs int) {
	lsn, fpi := w.read(b)
	b.ReportMetric(float64(lsn-w.lsn)/float64(msgs), "wal-B/msg")
	b.ReportMetric(float64(fpi-w.fpi)/float64(msgs), "fpi/msg")
	if os.Getenv("IDEM_BENCH_WAL_RANGE") == "" {
		return
	}
	var rels string
	if err := w.bb.pool.QueryRow(context.Background(), `SELECT string_agg(pg_relation_filenode(oid) || '=' || relname, ' ')
		FROM pg_class WHERE starts_with(relname, $1) OR starts_with(relname, $2)`, w.bb.table, w.bb.effects).Scan(&rels); err != nil {
		b.Fatal(err)
	}
	b.Logf("wal-range %d %d msgs %d rels %s", w.lsn, lsn, msgs, rels)
}

// bestClaim is the hand-written consumer's claim: BEGIN and a plain INSERT
// ... ON CONFLICT DO NOTHING pipelined in one round trip, claimed when it
// inserted a row. It returns the open transaction either way.
func (b *bundle) bestClaim(ctx context.Context, id string) (pgx.Tx, bool, error) {
	batch := &pgx.Batch{}
	batch.BeginTx(pgx.TxOptions{})
	batch.Queue(`INSERT INTO `+b.best+` (message_id) VALUES ($1) ON CONFLICT DO NOTHING`, id)
	br := b.pool.SendBatch(ctx, batch)
	tx := br.Tx()
	_, err := br.Exec() // BEGIN
	var tag interface{ RowsAffected() int64 }
	if err == nil {
		tag, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = tx.Rollback(ctx)
		return nil, false, err
	}
	return tx, tag.RowsAffected() == 1, nil
}

// bestProcess is the hand-written consumer: bestClaim, then the effect and
// COMMIT for a new message, ROLLBACK for a duplicate.
func (b *bundle) bestProcess(ctx context.Context, id string) (claimed bool, err error) {
	tx, claimed, err := b.bestClaim(ctx, id)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if !claimed {
		return false, tx.Rollback(ctx)
	}
	if err := b.writeEffect(ctx, tx, id); err != nil {
		return false, err
	}
	return true, tx.Commit(ctx)
}

// checkedSetup gives bb the processed table of the hand-written consumer
// with idem's guarantee (bundle.checkedProcess): the message ID as its
// primary key, the payload's fingerprint, and the time of processing
// with the index a purge by age walks. steady seeds it with the other
// tables.
func checkedSetup(b *testing.B, bb *bundle) {
	b.Helper()
	bb.checked = bb.effects + "_checked"
	if err := createChecked(context.Background(), bb.pool, bb.checked); err != nil {
		b.Fatal(err)
	}
}

// createChecked creates table name in the shape of the hand-written
// consumer's processed table (checkedSetup).
func createChecked(ctx context.Context, pool *pgxpool.Pool, name string) error {
	for _, q := range []string{
		`CREATE TABLE ` + name + ` (message_id text COLLATE "C" PRIMARY KEY, fingerprint bytea NOT NULL, processed_at timestamptz NOT NULL DEFAULT now())`,
		`CREATE INDEX ON ` + name + ` (processed_at)`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

// checkedProcess is the best a person can hand-write for what a
// transactional claim of idem guarantees beyond bestProcess: the
// payload's SHA-256 fingerprint is stored with the message ID, so an ID
// reused with another payload is told from a redelivery, and the table
// can be purged by age (checkedSetup). On one connection, with raw
// statements: BEGIN and INSERT ... ON CONFLICT DO NOTHING in one round
// trip; a new message (one row inserted) then writes its effect and
// commits; a duplicate reads the stored fingerprint and rolls back in one
// more round trip, and is an error when the fingerprints differ.
func (b *bundle) checkedProcess(ctx context.Context, id string, payload []byte) (claimed bool, err error) {
	return b.checkedProcessEmit(ctx, id, payload, nil)
}

// checkedProcessEmit is checkedProcess whose new message also queues
// emit's statements after its effect's INSERT, sent with it in one round
// trip before the COMMIT (emit nil: checkedProcess).
func (b *bundle) checkedProcessEmit(ctx context.Context, id string, payload []byte, emit func(*pgx.Batch)) (claimed bool, err error) {
	fp := sha256.Sum256(payload)
	c, err := b.pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer func() {
		if err != nil {
			_ = c.Conn().Close(ctx) // in an unknown transaction state: the pool drops it
		}
		c.Release()
	}()
	batch := &pgx.Batch{}
	batch.Queue(`BEGIN`)
	batch.Queue(`INSERT INTO `+b.checked+` (message_id, fingerprint) VALUES ($1, $2) ON CONFLICT DO NOTHING`, id, fp[:])
	br := c.SendBatch(ctx, batch)
	_, err = br.Exec()
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, err
	}
	if tag.RowsAffected() == 1 {
		effect := `INSERT INTO ` + b.effects + ` (key) VALUES ($1)`
		if emit == nil {
			_, err = c.Exec(ctx, effect, id)
		} else {
			batch = &pgx.Batch{}
			batch.Queue(effect, id)
			emit(batch)
			err = c.SendBatch(ctx, batch).Close()
		}
		if err == nil {
			_, err = c.Exec(ctx, `COMMIT`)
		}
		return err == nil, err
	}
	batch = &pgx.Batch{}
	batch.Queue(`SELECT fingerprint FROM `+b.checked+` WHERE message_id = $1`, id)
	batch.Queue(`ROLLBACK`)
	br = c.SendBatch(ctx, batch)
	var stored []byte
	err = br.QueryRow().Scan(&stored)
	if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err == nil && !bytes.Equal(stored, fp[:]) {
		err = fmt.Errorf("message %q reused with another payload", id)
	}
	return false, err
}

// bestBatch is the hand-written batch: BEGIN and claim (an INSERT ...
// RETURNING message_id of the IDs ids, with args as its further
// parameters) pipelined in one round trip, the side effects of the
// claimed IDs by one unnest INSERT, and COMMIT. Every ID must be new.
func (b *bundle) bestBatch(ctx context.Context, claim string, ids []string, args ...any) error {
	batch := &pgx.Batch{}
	batch.BeginTx(pgx.TxOptions{})
	batch.Queue(claim, append([]any{ids}, args...)...)
	br := b.pool.SendBatch(ctx, batch)
	tx := br.Tx()
	defer func() { _ = tx.Rollback(ctx) }()
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
	if err != nil {
		return err
	}
	if len(claimed) != len(ids) {
		return fmt.Errorf("claimed %d of %d", len(claimed), len(ids))
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+b.effects+` (key) SELECT unnest($1::text[])`, claimed); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// BenchmarkProcess compares, on one PostgreSQL (the durable one when
// IDEM_TEST_POSTGRES_DURABLE_URL is set), with benchWorkers workers on a
// pool of as many connections, in this order:
//   - naive: BEGIN; INSERT the side effect; COMMIT (pool.Begin), no dedupe;
//   - best: the hand-written consumer (bundle.bestProcess): BEGIN and
//     INSERT ... ON CONFLICT DO NOTHING into a one-key processed table in
//     one round trip, the side effect, COMMIT;
//   - best_retained: best, with an index on processed_at in its processed
//     table, which a purge by age needs (idem's table has its own,
//     (consumer, processed_at));
//   - best_checked: the hand-written consumer with what idem's claim
//     guarantees beyond best (bundle.checkedProcess): the payload's
//     fingerprint stored, and checked on a duplicate, and the purge
//     index of best_retained;
//   - idem: Consumer.Process writing the same side effect with the
//     handler's transaction (BEGIN and the claim in one round trip);
//   - best_duplicate, best_checked_duplicate, duplicate: the same three
//     redelivering processed messages (ROLLBACK after the claim;
//     best_checked_duplicate also reads the stored fingerprint);
//   - best_batch100: the hand-written batch: BEGIN and one INSERT ...
//     SELECT unnest ON CONFLICT DO NOTHING RETURNING of 100 IDs in one
//     round trip, the side effects of the inserted ones by one unnest
//     INSERT, COMMIT;
//   - best_checked_batch100: best_batch100 on best_checked's table: the
//     fingerprints stored and the IDs claimed in byte order
//     (bundle.checkedProcess's guarantee, for a batch of new messages);
//   - idem_batch100: ProcessBatch of 100 new messages, the side effects
//     written by one unnest INSERT (msgs/s counts messages, not batches).
//
// Each case reports msgs/s, its ratio to the cases it is compared with as
// measured last in the same run (x-naive, x-best, x-best_retained,
// x-best_checked, x-best_duplicate, x-best_checked_duplicate,
// x-best_batch100, x-best_checked_batch100, x-idem), CPU per message and WAL bytes and full-page
// images per message. A round takes 2 to 5 minutes; run, and record the
// load:
//
//	cat /proc/loadavg; IDEM_BENCH_ROUNDS=3 go test -run '^$' -bench BenchmarkProcess -benchtime 2s; cat /proc/loadavg
func BenchmarkProcess(b *testing.B) {
	for range benchRounds {
		benchProcessRound(b)
	}
}

// benchProcessRound runs each case of BenchmarkProcess once.
func benchProcessRound(b *testing.B) {
	payload := []byte(`{"order":"o-1","amount":200}`)

	b.Run("naive", func(b *testing.B) {
		bb := benchSetup(b)
		insert := `INSERT INTO ` + bb.effects + ` (key) VALUES ($1)`
		prefix := benchPrefix()
		rate := runWorkers(b, bb, 1, func(ctx context.Context, i int64) error {
			tx, err := bb.pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(ctx) }()
			if _, err := tx.Exec(ctx, insert, prefix+strconv.FormatInt(i, 10)); err != nil {
				return err
			}
			return tx.Commit(ctx)
		})
		reportRatios(b, "naive", rate)
	})

	b.Run("best", func(b *testing.B) {
		bb := benchSetup(b)
		rate := bestNew(b, bb)
		reportRatios(b, "best", rate, "naive")
	})

	// The hand-written consumer once its records can be purged by age
	// without reading the whole table: its processed table gets the index
	// on processed_at that such a purge walks. idem's table has one too,
	// (consumer, processed_at), so this is the like-for-like reference.
	b.Run("best_retained", func(b *testing.B) {
		bb := benchSetup(b)
		if _, err := bb.pool.Exec(context.Background(), `CREATE INDEX ON `+bb.best+` (processed_at)`); err != nil {
			b.Fatal(err)
		}
		rate := bestNew(b, bb)
		reportRatios(b, "best_retained", rate, "naive", "best")
	})

	// The hand-written consumer with what idem's claim adds: a purge
	// index and the payload's fingerprint, checked on a duplicate.
	b.Run("best_checked", func(b *testing.B) {
		bb := benchSetup(b)
		reportRatios(b, "best_checked", checkedNew(b, bb, payload), "naive", "best")
	})

	b.Run("idem", func(b *testing.B) {
		bb := benchSetup(b)
		rate := processNew(b, bb, bb.consumer(b, "bench"), bb.effectHandler(), payload)
		reportRatios(b, "idem", rate, "naive", "best", "best_retained", "best_checked")
	})

	const seeded = 1000
	b.Run("best_duplicate", func(b *testing.B) {
		bb := benchSetup(b)
		if _, err := bb.pool.Exec(context.Background(), `INSERT INTO `+bb.best+` (message_id)
			SELECT 'dup-' || g FROM generate_series(0, $1::int - 1) g`, seeded); err != nil {
			b.Fatal(err)
		}
		rate := runWorkers(b, bb, 1, func(ctx context.Context, i int64) error {
			claimed, err := bb.bestProcess(ctx, "dup-"+strconv.FormatInt(i%seeded, 10))
			if err == nil && claimed {
				err = fmt.Errorf("duplicate %d claimed", i)
			}
			return err
		})
		reportRatios(b, "best_duplicate", rate, "best")
	})

	b.Run("best_checked_duplicate", func(b *testing.B) {
		bb := benchSetup(b)
		checkedSetup(b, bb)
		sum := sha256.Sum256(payload)
		if _, err := bb.pool.Exec(context.Background(), `INSERT INTO `+bb.checked+` (message_id, fingerprint)
			SELECT 'dup-' || g, $2::bytea FROM generate_series(0, $1::int - 1) g`, seeded, sum[:]); err != nil {
			b.Fatal(err)
		}
		rate := runWorkers(b, bb, 1, func(ctx context.Context, i int64) error {
			claimed, err := bb.checkedProcess(ctx, "dup-"+strconv.FormatInt(i%seeded, 10), payload)
			if err == nil && claimed {
				err = fmt.Errorf("duplicate %d claimed", i)
			}
			return err
		})
		reportRatios(b, "best_checked_duplicate", rate, "best_duplicate")
	})

	b.Run("duplicate", func(b *testing.B) {
		bb := benchSetup(b)
		c := bb.consumer(b, "bench")
		msgs := make([]idem.Message, seeded)
		for i := range msgs {
			msgs[i] = idem.Message{ID: "dup-" + strconv.Itoa(i), Payload: payload}
		}
		if _, err := c.ProcessBatch(context.Background(), msgs, func(context.Context, pgx.Tx, []idem.Message) error { return nil }); err != nil {
			b.Fatal(err)
		}
		h := bb.effectHandler()
		rate := runWorkers(b, bb, 1, func(ctx context.Context, i int64) error {
			out, err := c.Process(ctx, msgs[i%seeded], h)
			if err == nil && out.Status != idem.Duplicate {
				err = fmt.Errorf("outcome %v", out.Status)
			}
			return err
		})
		reportRatios(b, "duplicate", rate, "best_duplicate", "best_checked_duplicate", "idem")
	})

	const size = 100
	b.Run("best_batch100", func(b *testing.B) {
		bb := benchSetup(b)
		claim := `INSERT INTO ` + bb.best + ` (message_id) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING RETURNING message_id`
		prefix := benchPrefix()
		rate := runWorkers(b, bb, size, func(ctx context.Context, i int64) error {
			ids := make([]string, size)
			for k := range ids {
				ids[k] = prefix + strconv.FormatInt(i*size+int64(k), 10)
			}
			return bb.bestBatch(ctx, claim, ids)
		})
		reportRatios(b, "best_batch100", rate, "best")
	})

	// The hand-written batch with what idem's batch claim adds: each
	// message's fingerprint stored (checkedSetup's table), the IDs claimed
	// in byte order, so that two batches sharing IDs lock them in the same
	// order and cannot deadlock. (A batch with duplicates would read their
	// stored fingerprints with one more statement; every message here is
	// new.)
	b.Run("best_checked_batch100", func(b *testing.B) {
		bb := benchSetup(b)
		checkedSetup(b, bb)
		claim := `INSERT INTO ` + bb.checked + ` (message_id, fingerprint) SELECT * FROM unnest($1::text[], $2::bytea[]) ON CONFLICT DO NOTHING RETURNING message_id`
		prefix := benchPrefix()
		rate := runWorkers(b, bb, size, func(ctx context.Context, i int64) error {
			ids := make([]string, size)
			fps := make([][]byte, size)
			for k := range ids {
				ids[k] = prefix + strconv.FormatInt(i*size+int64(k), 10)
				sum := sha256.Sum256(payload)
				fps[k] = sum[:]
			}
			slices.Sort(ids) // one payload: the fingerprints need not follow
			return bb.bestBatch(ctx, claim, ids, fps)
		})
		reportRatios(b, "best_checked_batch100", rate, "best_batch100", "best_checked")
	})

	b.Run("idem_batch100", func(b *testing.B) {
		bb := benchSetup(b)
		c := bb.consumer(b, "bench")
		insert := `INSERT INTO ` + bb.effects + ` (key) SELECT unnest($1::text[])`
		prefix := benchPrefix()
		h := func(ctx context.Context, tx pgx.Tx, msgs []idem.Message) error {
			keys := make([]string, len(msgs))
			for i, m := range msgs {
				keys[i] = m.ID
			}
			_, err := tx.Exec(ctx, insert, keys)
			return err
		}
		rate := runWorkers(b, bb, size, func(ctx context.Context, i int64) error {
			msgs := make([]idem.Message, size)
			for k := range msgs {
				msgs[k] = idem.Message{ID: prefix + strconv.FormatInt(i*size+int64(k), 10), Payload: payload}
			}
			outs, err := c.ProcessBatch(ctx, msgs, h)
			if err == nil && outs[size-1].Status != idem.Processed {
				err = fmt.Errorf("outcome %v", outs[size-1].Status)
			}
			return err
		})
		reportRatios(b, "idem_batch100", rate, "best_batch100", "best_checked_batch100", "idem")
	})
}

// bestNew runs the hand-written consumer over new messages with
// runWorkers and returns its throughput.
func bestNew(b *testing.B, bb *bundle) float64 {
	b.Helper()
	prefix := benchPrefix()
	return runWorkers(b, bb, 1, func(ctx context.Context, i int64) error {
		claimed, err := bb.bestProcess(ctx, prefix+strconv.FormatInt(i, 10))
		if err == nil && !claimed {
			err = fmt.Errorf("message %d not claimed", i)
		}
		return err
	})
}

// checkedNew runs the hand-written consumer with idem's guarantee
// (checkedSetup, bundle.checkedProcess) over new messages with payload
// with runWorkers and returns its throughput.
func checkedNew(b *testing.B, bb *bundle, payload []byte) float64 {
	b.Helper()
	checkedSetup(b, bb)
	prefix := benchPrefix()
	return runWorkers(b, bb, 1, func(ctx context.Context, i int64) error {
		claimed, err := bb.checkedProcess(ctx, prefix+strconv.FormatInt(i, 10), payload)
		if err == nil && !claimed {
			err = fmt.Errorf("message %d not claimed", i)
		}
		return err
	})
}

// processNew runs Consumer.Process of new messages with payload and
// handler h across the benchmark's workers, each outcome Processed, and
// returns the throughput.
func processNew(b *testing.B, bb *bundle, c *idem.Consumer[pgx.Tx], h idem.Handler[pgx.Tx], payload []byte) float64 {
	b.Helper()
	prefix := benchPrefix()
	return runWorkers(b, bb, 1, func(ctx context.Context, i int64) error {
		out, err := c.Process(ctx, idem.Message{ID: prefix + strconv.FormatInt(i, 10), Payload: payload}, h)
		if err == nil && out.Status != idem.Processed {
			err = fmt.Errorf("outcome %v", out.Status)
		}
		return err
	})
}

// BenchmarkLeaseRoundTrips reports lease mode's store calls per message
// (new, duplicate, release) with the store's StepRecorder capability and
// without it, and the time of a new message (idemtest.BenchmarkRoundTrips):
//
//	go test -run '^$' -bench BenchmarkLeaseRoundTrips -benchtime 20x
func BenchmarkLeaseRoundTrips(b *testing.B) {
	idemtest.BenchmarkRoundTrips(b, setup(b, poolOpts{}).store, "bench-rt")
}
