package idempgxv5_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/jackc/pgx/v5"
)

// scaleRows is how many records the at-scale tables hold before a run.
const scaleRows = 10_000_000

// scaleLayouts are the layouts BenchmarkAtScale compares: the default
// one, and the partitioned one with 1-hour buckets (the 10M records in the
// 12 buckets before the load, about 833,000 each) and with 4-hour buckets
// (in the 3 buckets before the load, about 3.3M each).
var scaleLayouts = []struct {
	name  string
	part  *idempgxv5.Partitions
	parts int // past buckets the 10M records are spread over
}{
	{"default", nil, 0},
	{"partitioned1h", &idempgxv5.Partitions{Bucket: time.Hour}, 12},
	{"partitioned4h", &idempgxv5.Partitions{Bucket: 4 * time.Hour}, 3},
}

// uuid4 returns a random (version 4) UUID in its text form.
func uuid4() string {
	var u [16]byte
	_, _ = rand.Read(u[:])
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	h := hex.EncodeToString(u[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// scaleBundle returns a bundle on the benchmark database whose store is on
// a processed table holding scaleRows records of consumer "bench" with
// UUIDv4 IDs (idem_scale10m_default; idem_scale10m_part for 1-hour
// buckets, idem_scale10m_part<N>h for others), spread over parts past
// buckets, loaded once and kept across runs (a table <name>_loaded marks
// a finished load; loading takes minutes), and a fresh effects table.
func scaleBundle(b *testing.B, part *idempgxv5.Partitions, parts int) *bundle {
	b.Helper()
	ctx := context.Background()
	pool := newPool(b, poolOpts{maxConns: int32(benchWorkers), url: benchURL()})
	name := "idem_scale10m_default"
	switch {
	case part == nil:
	case part.Bucket == time.Hour:
		name = "idem_scale10m_part"
	default:
		name = fmt.Sprintf("idem_scale10m_part%dh", int(part.Bucket/time.Hour))
	}
	bb := &bundle{pool: pool, table: name, effects: randName("idem_fx_"), part: part}
	var loaded bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, name+"_loaded").Scan(&loaded); err != nil {
		b.Fatal(err)
	}
	if !loaded {
		if err := dropTables(ctx, pool, name); err != nil {
			b.Fatal(err)
		}
	}
	store, err := idempgxv5.New(pool, &idempgxv5.Config{Table: name, Partitions: part})
	if err != nil {
		b.Fatal(err)
	}
	bb.store = store
	if err := store.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	if !loaded {
		b.Logf("loading %d records into %s (once; minutes)", scaleRows, name)
		if err := loadScale(ctx, bb, parts); err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() {
		if err := dropTables(context.Background(), pool, bb.effects); err != nil {
			b.Errorf("drop effects: %v", err)
		}
	})
	if _, err := pool.Exec(ctx, `CREATE TABLE `+bb.effects+` (id bigserial PRIMARY KEY, key text NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	return bb
}

// loadScale loads scaleRows records into the bundle's (new) table: for
// the default layout without its indexes, which are then built at once;
// for the partitioned one into parts past buckets, each loaded as a
// standalone table, indexed, then attached.
func loadScale(ctx context.Context, bb *bundle, parts int) error {
	conn, err := bb.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	t := bb.table
	exec := func(q string) error {
		_, err := conn.Exec(ctx, q)
		return err
	}
	if err := exec(`SET maintenance_work_mem = '512MB'`); err != nil {
		return err
	}
	if bb.part == nil {
		if err := exec(`ALTER TABLE ` + t + ` DROP CONSTRAINT ` + t + `_pkey; DROP INDEX ` + t + `_processed_at_idx`); err != nil {
			return err
		}
		for i := 0; i < 10; i++ {
			if err := exec(fmt.Sprintf(`INSERT INTO %s (consumer, message_id, fingerprint, processed_at)
				SELECT 'bench', gen_random_uuid()::text, sha256(g::text::bytea), now() - interval '12 hours' + g * interval '4 ms'
				FROM generate_series(%d, %d) g`, t, i*scaleRows/10+1, (i+1)*scaleRows/10)); err != nil {
				return err
			}
		}
		if err := exec(`ALTER TABLE ` + t + ` ADD CONSTRAINT ` + t + `_pkey PRIMARY KEY (consumer, message_id)`); err != nil {
			return err
		}
		if err := exec(`CREATE INDEX ` + t + `_processed_at_idx ON ` + t + ` (consumer, processed_at)`); err != nil {
			return err
		}
	} else {
		if err := exec(fmt.Sprintf(`DO $$
DECLARE
	bucket interval := %d * interval '1 second';
	cur timestamptz := date_bin(bucket, now(), timestamptz 'epoch');
	lo timestamptz; hi timestamptz; p text;
BEGIN
	FOR i IN 1..%d LOOP
		lo := cur - i * bucket; hi := lo + bucket;
		p := '%s_p' || to_char(lo AT TIME ZONE 'UTC', 'YYYYMMDDHH24MI');
		EXECUTE format('CREATE TABLE %%I (LIKE %s INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', p);
		EXECUTE format('INSERT INTO %%I (consumer, message_id, fingerprint, processed_at) SELECT ''bench'', gen_random_uuid()::text, sha256(g::text::bytea), %%L::timestamptz + (g %%%% %d) * interval ''1 ms'' FROM generate_series(1, %d) g', p, lo);
		EXECUTE format('ALTER TABLE %%I ADD CONSTRAINT %%I PRIMARY KEY (consumer, message_id, processed_at)', p, p || '_pkey');
		EXECUTE format('ALTER TABLE %%I ADD CONSTRAINT %%I CHECK (processed_at >= %%L AND processed_at < %%L)', p, p || '_bound', lo, hi);
		EXECUTE format('ALTER TABLE %s ATTACH PARTITION %%I FOR VALUES FROM (%%L) TO (%%L)', p, lo, hi);
		EXECUTE format('ALTER TABLE %%I DROP CONSTRAINT %%I', p, p || '_bound');
	END LOOP;
END $$`, int(bb.part.Bucket/time.Second), parts, t, t, bb.part.Bucket.Milliseconds(), scaleRows/parts, t)); err != nil {
			return err
		}
	}
	if err := exec(`VACUUM ANALYZE ` + t); err != nil {
		return err
	}
	return exec(`CREATE TABLE ` + t + `_loaded ()`)
}

// batchUUID is the op of a batch-100 case: ProcessBatch of 100 new
// messages with UUIDv4 IDs, whose handler writes their side effects with
// one unnest INSERT.
func batchUUID(bb *bundle, c *idem.Consumer[pgx.Tx]) func(ctx context.Context, i int64) error {
	const size = 100
	payload := []byte(`{"order":"o-1","amount":200}`)
	insert := `INSERT INTO ` + bb.effects + ` (key) SELECT unnest($1::text[])`
	h := func(ctx context.Context, tx pgx.Tx, msgs []idem.Message) error {
		keys := make([]string, len(msgs))
		for i, m := range msgs {
			keys[i] = m.ID
		}
		_, err := tx.Exec(ctx, insert, keys)
		return err
	}
	return func(ctx context.Context, i int64) error {
		msgs := make([]idem.Message, size)
		for k := range msgs {
			msgs[k] = idem.Message{ID: uuid4(), Payload: payload}
		}
		outs, err := c.ProcessBatch(ctx, msgs, h)
		if err == nil {
			for _, o := range outs {
				if o.Status != idem.Processed {
					return fmt.Errorf("outcome %v", o.Status)
				}
			}
		}
		return err
	}
}

// partitionsSize is the SQL of the size on disk (bytes) of table $1 with
// its indexes, TOAST and partitions.
const partitionsSize = `COALESCE((SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree($1::regclass)), pg_total_relation_size($1::regclass))`

// reportBytesPerRecord reports the table's size on disk, with its
// indexes, TOAST and partitions, per record, as "B/record".
func reportBytesPerRecord(b *testing.B, bb *bundle) {
	b.Helper()
	var size, n int64
	err := bb.pool.QueryRow(context.Background(), `SELECT `+partitionsSize+`, (SELECT count(*) FROM `+bb.table+`)`, bb.table).Scan(&size, &n)
	if err != nil {
		b.Fatal(err)
	}
	if n > 0 {
		b.ReportMetric(float64(size)/float64(n), "B/record")
	}
}

// BenchmarkAtScale measures ProcessBatch of 100 new messages with random
// UUIDv4 IDs (batchUUID) at benchWorkers workers, on a processed table
// that is empty and on one that holds 10 million records of the same
// consumer (scaleBundle), in the default layout and in the partitioned
// one, interleaved in this order per round: default/empty,
// default/10M, partitioned1h/empty, partitioned1h/10M, partitioned4h/empty,
// partitioned4h/10M (see scaleLayouts). Each reports msgs/s,
// WAL bytes and full-page images per message, and the 10M cases their
// ratio to the empty case of their layout (x-<layout>/empty) and the
// table's bytes per record. The first run loads the tables (minutes).
//
//	cat /proc/loadavg; IDEM_BENCH_ROUNDS=3 go test -run '^$' -bench BenchmarkAtScale -benchtime 20s -timeout 2h; cat /proc/loadavg
func BenchmarkAtScale(b *testing.B) {
	for range benchRounds {
		for _, layout := range scaleLayouts {
			b.Run(layout.name+"/empty", func(b *testing.B) {
				bb := setup(b, poolOpts{maxConns: int32(benchWorkers), url: benchURL(), part: layout.part})
				rate := measure(b, bb, 100, batchUUID(bb, bb.consumer(b, "bench")))
				reportRatios(b, layout.name+"/empty", rate)
			})
			b.Run(layout.name+"/10M", func(b *testing.B) {
				bb := scaleBundle(b, layout.part, layout.parts)
				rate := measure(b, bb, 100, batchUUID(bb, bb.consumer(b, "bench")))
				reportRatios(b, layout.name+"/10M", rate, layout.name+"/empty")
				reportBytesPerRecord(b, bb)
			})
		}
	}
}

// expiredRecords is how many expired records BenchmarkPurgeCost purges.
const expiredRecords = 1_000_000

// BenchmarkPurgeCost measures what purging 1M expired records costs
// concurrent processing: ProcessBatch of 100 UUIDv4 messages at
// benchWorkers workers on a table that also holds 1M records of the same
// consumer written 30 days ago (its runs make its 7-day horizon pass
// them), without a purge (baseline, for 10s) and while idem.Purge
// (BatchSize 1000) removes them (for as long as the purge takes, at
// least 10s): in the default layout by DELETE batches, in the
// partitioned layout (1-hour buckets, the expired records in 4 buckets)
// by dropping partitions. Cases run in this order per round:
// default/baseline, default/purge, partitioned/baseline,
// partitioned/purge. Each reports msgs/s; the purge cases their ratio to
// the baseline before them, the purge's seconds, the records it deleted
// and the table's size before and after (MB-before, MB-after).
//
//	cat /proc/loadavg; IDEM_BENCH_ROUNDS=3 go test -run '^$' -bench BenchmarkPurgeCost -benchtime 1x -timeout 1h; cat /proc/loadavg
func BenchmarkPurgeCost(b *testing.B) {
	for range benchRounds {
		for _, layout := range []struct {
			name string
			part *idempgxv5.Partitions
		}{{"default", nil}, {"partitioned", &idempgxv5.Partitions{Bucket: time.Hour}}} {
			for _, purge := range []bool{false, true} {
				name := layout.name + map[bool]string{false: "/baseline", true: "/purge"}[purge]
				b.Run(name, func(b *testing.B) {
					bb := setup(b, poolOpts{maxConns: int32(benchWorkers) + 2, url: benchURL(), part: layout.part})
					seedExpired(b, bb)
					c := bb.consumer(b, "bench")
					before := tableSize(b, bb)
					rate, res, took := processDuring(b, bb, batchUUID(bb, c), purge)
					b.ReportMetric(rate, "msgs/s")
					if purge {
						reportRatios(b, name, rate, layout.name+"/baseline")
						b.ReportMetric(took.Seconds(), "purge-s")
						b.ReportMetric(float64(res.Deleted), "deleted")
						b.ReportMetric(float64(before)/1e6, "MB-before")
						b.ReportMetric(float64(tableSize(b, bb))/1e6, "MB-after")
						if res.Deleted < expiredRecords {
							b.Errorf("purge deleted %d, want %d", res.Deleted, expiredRecords)
						}
					} else {
						reportRatios(b, name, rate)
					}
				})
			}
		}
	}
}

// seedExpired writes expiredRecords records of consumer "bench" 30 days
// ago (spread over 4 hours), and runs that make its 7-day horizon pass
// them, then analyzes the table.
func seedExpired(b *testing.B, bb *bundle) {
	b.Helper()
	ctx := context.Background()
	base := time.Now().Add(-30 * 24 * time.Hour)
	if bb.part != nil {
		for h := 0; h < 4; h++ {
			if err := idempgxv5.EnsurePartitionsAt(ctx, bb.store, base.Add(time.Duration(h)*time.Hour)); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, q := range []string{
		fmt.Sprintf(`INSERT INTO %s (consumer, message_id, fingerprint, processed_at)
			SELECT 'bench', gen_random_uuid()::text, sha256(g::text::bytea), now() - interval '30 days' + (g %% 4) * interval '1 hour'
			FROM generate_series(1, %d) g`, bb.table, expiredRecords),
		`INSERT INTO ` + bb.table + `_runs (consumer, started_at, ended_at) VALUES ('bench', now() - interval '60 days', now())`,
		`VACUUM ANALYZE ` + bb.table,
	} {
		if _, err := bb.pool.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
}

// tableSize is the bundle's table's size on disk with its indexes and
// partitions, in bytes.
func tableSize(b *testing.B, bb *bundle) (n int64) {
	b.Helper()
	if err := bb.pool.QueryRow(context.Background(), `SELECT `+partitionsSize, bb.table).Scan(&n); err != nil {
		b.Fatal(err)
	}
	return n
}

// processDuring runs op across benchWorkers workers for 10s, or, with
// purge, while idem.Purge of consumer "bench" (7-day window) runs and at
// least 10s, and returns the throughput of op (100 messages each), the
// purge's result and how long it took.
func processDuring(b *testing.B, bb *bundle, op func(ctx context.Context, i int64) error, purge bool) (float64, idem.PurgeResult, time.Duration) {
	b.Helper()
	const minWindow = 10 * time.Second
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		res     idem.PurgeResult
		purgeEr error
		took    time.Duration
		done    = make(chan struct{})
	)
	start := time.Now()
	if purge {
		go func() {
			defer close(done)
			res, purgeEr = idem.Purge(ctx, bb.store, idem.PurgeParams{Consumer: "bench", RetentionWindow: 7 * 24 * time.Hour, BatchSize: idem.DefaultPurgeBatchSize})
			took = time.Since(start)
		}()
	} else {
		close(done)
	}
	var (
		ops     atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		opErr   error
	)
	stop := time.After(minWindow)
	stopped := make(chan struct{})
	go func() {
		<-stop
		<-done
		close(stopped)
	}()
	b.ResetTimer()
	for range benchWorkers {
		wg.Go(func() {
			for {
				select {
				case <-stopped:
					return
				default:
				}
				if err := op(ctx, ops.Add(1)); err != nil {
					errOnce.Do(func() { opErr = err })
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if opErr != nil {
		b.Fatal(opErr)
	}
	if purgeEr != nil {
		b.Fatal(purgeEr)
	}
	return float64(ops.Load()*100) / elapsed.Seconds(), res, took
}
