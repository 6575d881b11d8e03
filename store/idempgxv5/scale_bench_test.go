package idempgxv5_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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

// scaleTable is the name of the kept at-scale table of idem's layout
// part (idem_scale10m_default; idem_scale10m_part for 1-hour buckets,
// idem_scale10m_part<N>h for others).
func scaleTable(part *idempgxv5.Partitions) string {
	switch {
	case part == nil:
		return "idem_scale10m_default"
	case part.Bucket == time.Hour:
		return "idem_scale10m_part"
	default:
		return fmt.Sprintf("idem_scale10m_part%dh", int(part.Bucket/time.Hour))
	}
}

// scaleLoaded reports whether table name was loaded by an earlier run (a
// table <name>_loaded marks a finished load); if not, it drops what an
// unfinished load left.
func scaleLoaded(b *testing.B, pool *pgxpool.Pool, name string) bool {
	b.Helper()
	ctx := context.Background()
	var loaded bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, name+"_loaded").Scan(&loaded); err != nil {
		b.Fatal(err)
	}
	if !loaded {
		if err := dropTables(ctx, pool, name); err != nil {
			b.Fatal(err)
		}
	}
	return loaded
}

// scaleEffects gives bb a fresh effects table, dropped at cleanup.
func scaleEffects(b *testing.B, bb *bundle) {
	b.Helper()
	bb.effects = randName("idem_fx_")
	b.Cleanup(func() {
		if err := dropTables(context.Background(), bb.pool, bb.effects); err != nil {
			b.Errorf("drop effects: %v", err)
		}
	})
	if _, err := bb.pool.Exec(context.Background(), `CREATE TABLE `+bb.effects+` (id bigserial PRIMARY KEY, key text NOT NULL)`); err != nil {
		b.Fatal(err)
	}
}

// scaleBundle returns a bundle on the benchmark database whose store is on
// a processed table (scaleTable) holding scaleRows records of consumer
// "bench" with UUIDv4 IDs, spread over parts past buckets, loaded once and
// kept across runs (loading takes minutes; see loadScale), and a fresh
// effects table.
func scaleBundle(b *testing.B, part *idempgxv5.Partitions, parts int) *bundle {
	b.Helper()
	ctx := context.Background()
	pool := newPool(b, poolOpts{maxConns: int32(benchWorkers), url: benchURL()})
	bb := &bundle{pool: pool, table: scaleTable(part), part: part}
	loaded := scaleLoaded(b, pool, bb.table)
	store, err := idempgxv5.New(pool, &idempgxv5.Config{Table: bb.table, Partitions: part})
	if err != nil {
		b.Fatal(err)
	}
	bb.store = store
	if err := store.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	if !loaded {
		b.Logf("loading %d records into %s (once; minutes)", scaleRows, bb.table)
		if err := loadScale(ctx, b, bb, parts); err != nil {
			b.Fatal(err)
		}
	}
	scaleEffects(b, bb)
	return bb
}

// checkedScaleBundle returns a bundle whose hand-written processed table
// (bundle.checked: checkedSetup's shape, idem_scale10m_checked) holds
// scaleRows records with UUIDv4 IDs, loaded once like scaleBundle's, and
// a fresh effects table.
func checkedScaleBundle(b *testing.B) *bundle {
	b.Helper()
	ctx := context.Background()
	pool := newPool(b, poolOpts{maxConns: int32(benchWorkers), url: benchURL()})
	bb := &bundle{pool: pool, checked: "idem_scale10m_checked"}
	if !scaleLoaded(b, pool, bb.checked) {
		b.Logf("loading %d records into %s (once; minutes)", scaleRows, bb.checked)
		if err := loadChecked(ctx, bb); err != nil {
			b.Fatal(err)
		}
	}
	scaleEffects(b, bb)
	return bb
}

// loadChecked creates and loads bb.checked with scaleRows records
// processed over the last 12 hours, then analyzes it and marks it loaded.
func loadChecked(ctx context.Context, bb *bundle) error {
	if err := createChecked(ctx, bb.pool, bb.checked); err != nil {
		return err
	}
	tpl := uuid4()
	if _, err := bb.pool.Exec(ctx, `INSERT INTO `+bb.checked+` (message_id, fingerprint) VALUES ($1, sha256('{}'))`, tpl); err != nil {
		return err
	}
	return loadFlat(ctx, bb.pool, bb.checked, tpl)
}

// loadFlat loads scaleRows records into table t (not partitioned) like
// the template record of message ID tpl (see fillRows), processed over
// the last 12 hours, without t's indexes and key constraints, which are
// then built at once (withoutIndexes); it then deletes the template,
// analyzes t and marks it loaded.
func loadFlat(ctx context.Context, pool *pgxpool.Pool, t, tpl string) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SET maintenance_work_mem = '512MB'`); err != nil {
		return err
	}
	err = withoutIndexes(ctx, conn.Conn(), t, func() error {
		const chunks = 10
		for i := int64(0); i < chunks; i++ {
			lo, hi := i*scaleRows/chunks+1, (i+1)*scaleRows/chunks
			if err := fillRows(ctx, conn.Conn(), t, t, tpl, lo, hi, `now() - interval '12 hours' + g * interval '4 ms'`); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return finishLoad(ctx, conn.Conn(), t, tpl)
}

// finishLoad deletes the template record tpl from t, analyzes t and
// marks it loaded.
func finishLoad(ctx context.Context, conn *pgx.Conn, t, tpl string) error {
	for _, q := range []string{
		`DELETE FROM ` + t + ` WHERE message_id::text = '` + tpl + `'`,
		`VACUUM ANALYZE ` + t,
		`CREATE TABLE ` + t + `_loaded ()`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

// templateRecord writes one record of consumer "bench" through the
// bundle's store, whatever its table's columns, and returns its message
// ID: the template the fast loads copy (fillRows).
func templateRecord(ctx context.Context, b *testing.B, bb *bundle) string {
	b.Helper()
	id := uuid4()
	c := bb.consumer(b, "bench")
	outs, err := c.ProcessBatch(ctx, []idem.Message{{ID: id, Payload: []byte(`{}`)}},
		func(context.Context, pgx.Tx, []idem.Message) error { return nil })
	if err == nil && outs[0].Status != idem.Processed {
		err = fmt.Errorf("template record: outcome %v", outs[0].Status)
	}
	if err != nil {
		b.Fatal(err)
	}
	return id
}

// loadScale loads scaleRows records of consumer "bench" into the bundle's
// (new) table, each a copy of a record written through the store
// (templateRecord) with its own random ID, fingerprint and time (fillRows),
// so that the load follows the table's columns whatever they are: for
// the default layout without its indexes, which are then built at once;
// for the partitioned one into parts past buckets, each loaded as a
// standalone table, then attached (which builds its indexes).
func loadScale(ctx context.Context, b *testing.B, bb *bundle, parts int) error {
	tpl := templateRecord(ctx, b, bb)
	if bb.part == nil {
		return loadFlat(ctx, bb.pool, bb.table, tpl)
	}
	conn, err := bb.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	t := bb.table
	if _, err := conn.Exec(ctx, `SET maintenance_work_mem = '512MB'`); err != nil {
		return err
	}
	var cur time.Time
	if err := conn.QueryRow(ctx, `SELECT date_bin($1::interval, now(), timestamptz 'epoch')`, bb.part.Bucket).Scan(&cur); err != nil {
		return err
	}
	for i := 1; i <= parts; i++ {
		lo := cur.Add(-time.Duration(i) * bb.part.Bucket)
		hi := lo.Add(bb.part.Bucket)
		los, his := `'`+lo.UTC().Format(time.RFC3339)+`'`, `'`+hi.UTC().Format(time.RFC3339)+`'`
		p := t + "_p" + lo.UTC().Format("200601021504")
		if _, err := conn.Exec(ctx, `CREATE TABLE `+p+` (LIKE `+t+` INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`); err != nil {
			return err
		}
		at := fmt.Sprintf(`%s::timestamptz + (g %% %d) * interval '1 ms'`, los, bb.part.Bucket.Milliseconds())
		if err := fillRows(ctx, conn.Conn(), p, t, tpl, 1, scaleRows/int64(parts), at); err != nil {
			return err
		}
		for _, q := range []string{
			// The bound lets ATTACH skip its scan of the rows.
			`ALTER TABLE ` + p + ` ADD CONSTRAINT ` + p + `_bound CHECK (processed_at >= ` + los + ` AND processed_at < ` + his + `)`,
			`ALTER TABLE ` + t + ` ATTACH PARTITION ` + p + ` FOR VALUES FROM (` + los + `) TO (` + his + `)`,
			`ALTER TABLE ` + p + ` DROP CONSTRAINT ` + p + `_bound`,
		} {
			if _, err := conn.Exec(ctx, q); err != nil {
				return err
			}
		}
	}
	return finishLoad(ctx, conn.Conn(), t, tpl)
}

// fillRows inserts into table into one row for each g in [lo, hi], a
// copy of the row of table from whose message ID is tpl, but for: the
// message ID (a random UUIDv4 from gen_random_uuid), the fingerprint
// (when bytea: SHA-256 of g, cut to the template's length), processed_at
// (the SQL expression at, of g), and columns with an identity, a sequence
// default or a generation expression (left to the table). It reads the
// columns from the catalog, so that it follows schema changes.
func fillRows(ctx context.Context, conn *pgx.Conn, into, from, tpl string, lo, hi int64, at string) error {
	rows, err := conn.Query(ctx, `SELECT a.attname, format_type(a.atttypid, a.atttypmod),
		a.attidentity <> '' OR a.attgenerated <> '' OR coalesce(pg_get_expr(d.adbin, d.adrelid) LIKE 'nextval(%', false)
		FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
		WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum`, into)
	if err != nil {
		return err
	}
	var cols, exprs []string
	for rows.Next() {
		var name, typ string
		var auto bool
		if err := rows.Scan(&name, &typ, &auto); err != nil {
			rows.Close()
			return err
		}
		if auto {
			continue
		}
		q := pgx.Identifier{name}.Sanitize()
		cols = append(cols, q)
		switch {
		case name == "message_id":
			exprs = append(exprs, `gen_random_uuid()::text::`+typ)
		case name == "fingerprint" && typ == "bytea":
			exprs = append(exprs, `substr(sha256(g::text::bytea), 1, octet_length(tpl.fingerprint))`)
		case name == "processed_at":
			exprs = append(exprs, at)
		default:
			exprs = append(exprs, `tpl.`+q)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	_, err = conn.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (%s) SELECT %s FROM %s tpl, generate_series(%d, %d) g WHERE tpl.message_id::text = '%s'`,
		into, strings.Join(cols, ", "), strings.Join(exprs, ", "), from, lo, hi, tpl))
	return err
}

// withoutIndexes runs fill on table t without t's indexes and its
// primary key, unique, exclusion and foreign key constraints (and the
// foreign keys of other tables that reference it), read from the catalog
// and dropped first, then put back as they were: faster than keeping
// random-key B-trees up to date row by row.
func withoutIndexes(ctx context.Context, conn *pgx.Conn, t string, fill func() error) error {
	type constraint struct{ rel, name, def, kind string }
	var cons []constraint
	rows, err := conn.Query(ctx, `SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid), contype::text FROM pg_constraint
		WHERE (conrelid = $1::regclass AND contype IN ('p', 'u', 'x', 'f')) OR (confrelid = $1::regclass AND contype = 'f')`, t)
	if err == nil {
		cons, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (c constraint, err error) {
			return c, r.Scan(&c.rel, &c.name, &c.def, &c.kind)
		})
	}
	if err != nil {
		return err
	}
	rows, err = conn.Query(ctx, `SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index i
		WHERE indrelid = $1::regclass AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid AND c.conrelid = i.indrelid)`, t)
	var idx [][2]string
	if err == nil {
		idx, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (i [2]string, err error) {
			return i, r.Scan(&i[0], &i[1])
		})
	}
	if err != nil {
		return err
	}
	var drop, add []string
	for _, fk := range []bool{true, false} {
		for _, c := range cons {
			if (c.kind == "f") == fk {
				drop = append(drop, `ALTER TABLE `+c.rel+` DROP CONSTRAINT `+pgx.Identifier{c.name}.Sanitize())
			}
		}
	}
	for _, i := range idx {
		drop = append(drop, `DROP INDEX `+i[0])
	}
	for _, fk := range []bool{false, true} {
		for _, c := range cons {
			if (c.kind == "f") == fk {
				add = append(add, `ALTER TABLE `+c.rel+` ADD CONSTRAINT `+pgx.Identifier{c.name}.Sanitize()+` `+c.def)
			}
		}
		if !fk {
			for _, i := range idx {
				add = append(add, i[1])
			}
		}
	}
	for _, q := range drop {
		if _, err := conn.Exec(ctx, q); err != nil {
			return err
		}
	}
	if err := fill(); err != nil {
		return err
	}
	for _, q := range add {
		if _, err := conn.Exec(ctx, q); err != nil {
			return err
		}
	}
	return nil
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

// checkedBatchUUID is the op of the hand-written batch-100 case at scale:
// bundle.bestBatch on bb.checked, as best_checked_batch100 in
// BenchmarkProcess (the fingerprints stored, the IDs claimed in byte
// order), of 100 new messages with UUIDv4 IDs.
func checkedBatchUUID(bb *bundle) func(ctx context.Context, i int64) error {
	const size = 100
	payload := []byte(`{"order":"o-1","amount":200}`)
	claim := `INSERT INTO ` + bb.checked + ` (message_id, fingerprint) SELECT * FROM unnest($1::text[], $2::bytea[]) ON CONFLICT DO NOTHING RETURNING message_id`
	return func(ctx context.Context, i int64) error {
		ids := make([]string, size)
		fps := make([][]byte, size)
		for k := range ids {
			ids[k] = uuid4()
			sum := sha256.Sum256(payload)
			fps[k] = sum[:]
		}
		slices.Sort(ids) // one payload: the fingerprints need not follow
		return bb.bestBatch(ctx, claim, ids, fps)
	}
}

// partitionsSize is the SQL of the size on disk (bytes) of table $1 with
// its indexes, TOAST and partitions, and of its indexes alone.
const partitionsSize = `COALESCE((SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree($1::regclass)), pg_total_relation_size($1::regclass))::bigint,
	COALESCE((SELECT sum(pg_indexes_size(relid)) FROM pg_partition_tree($1::regclass)), pg_indexes_size($1::regclass))::bigint`

// reportBytesPerRecord reports the size on disk of table t, with its
// indexes, TOAST and partitions, per record ("B/record"), in all
// ("MB-table") and of its indexes ("MB-indexes").
func reportBytesPerRecord(b *testing.B, pool *pgxpool.Pool, t string) {
	b.Helper()
	var size, idx, n int64
	err := pool.QueryRow(context.Background(), `SELECT `+partitionsSize+`, (SELECT count(*) FROM `+t+`)`, t).Scan(&size, &idx, &n)
	if err != nil {
		b.Fatal(err)
	}
	if n > 0 {
		b.ReportMetric(float64(size)/float64(n), "B/record")
	}
	b.ReportMetric(float64(size)/1e6, "MB-table")
	b.ReportMetric(float64(idx)/1e6, "MB-indexes")
}

// bufMeter measures the server's buffer traffic over a case: blocks read
// from outside shared_buffers (the kernel's cache or the disk) and found
// in it, per message (pg_stat_database, the benchmark's database), blocks
// backends had to write out themselves to make room (pg_stat_bgwriter
// buffers_backend), and the checkpoints that began (timed or requested).
// Like walMeter's, the counters are the whole server's.
type bufMeter struct {
	pool                      *pgxpool.Pool
	read, hit, backend, ckpts int64
}

func startBuf(b *testing.B, pool *pgxpool.Pool) *bufMeter {
	m := &bufMeter{pool: pool}
	m.read, m.hit, m.backend, m.ckpts = m.sample(b)
	return m
}

// sample flushes the statistics of the pool's idle backends and reads
// the counters.
func (m *bufMeter) sample(b *testing.B) (read, hit, backend, ckpts int64) {
	b.Helper()
	ctx := context.Background()
	for _, c := range m.pool.AcquireAllIdle(ctx) {
		if _, err := c.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
			b.Fatal(err)
		}
		c.Release()
	}
	err := m.pool.QueryRow(ctx, `SELECT d.blks_read, d.blks_hit, w.buffers_backend, w.checkpoints_timed + w.checkpoints_req
		FROM pg_stat_database d, pg_stat_bgwriter w WHERE d.datname = current_database()`).Scan(&read, &hit, &backend, &ckpts)
	if err != nil {
		b.Fatal(err)
	}
	return read, hit, backend, ckpts
}

// report adds the metrics blks-read/msg, blks-hit/msg, be-writes/msg and
// checkpoints.
func (m *bufMeter) report(b *testing.B, msgs int) {
	read, hit, backend, ckpts := m.sample(b)
	b.ReportMetric(float64(read-m.read)/float64(msgs), "blks-read/msg")
	b.ReportMetric(float64(hit-m.hit)/float64(msgs), "blks-hit/msg")
	b.ReportMetric(float64(backend-m.backend)/float64(msgs), "be-writes/msg")
	b.ReportMetric(float64(ckpts-m.ckpts), "checkpoints")
}

// measureScale is measure (msgs/s, CPU and WAL per message) with the
// buffer counters of bufMeter, of ops of 100 messages.
func measureScale(b *testing.B, bb *bundle, op func(ctx context.Context, i int64) error) float64 {
	b.Helper()
	m := startBuf(b, bb.pool)
	rate := measure(b, bb, 100, op)
	m.report(b, b.N*100)
	return rate
}

// BenchmarkAtScale measures batches of 100 new messages with random
// UUIDv4 IDs at benchWorkers workers on processed tables that are empty
// and that hold 10 million records (scaleRows) with such IDs, interleaved
// in this order per round:
//   - best_checked/empty, best_checked/10M: the hand-written batch
//     (checkedBatchUUID, best_checked_batch100 of BenchmarkProcess) on
//     best_checked's table, empty and holding the 10M records
//     (checkedScaleBundle);
//   - default/empty, default/10M: idem's ProcessBatch (batchUUID) on the
//     default layout, empty and holding the 10M records of the consumer
//     (scaleBundle); the 10M case also reports its ratio to the
//     hand-written one on a table of the same size (x-best_checked/10M);
//   - partitioned1h/..., partitioned4h/...: the same on the partitioned
//     layout (scaleLayouts).
//
// Each case reports msgs/s, CPU, WAL bytes and full-page images per
// message (measure), blocks read and hit, backend writes per message and
// the checkpoints begun (bufMeter), and the 10M cases their ratio to the
// empty case of their layout (x-<layout>/empty) and the table's size
// (reportBytesPerRecord). The first run loads the 10M tables and keeps
// them (idem_scale10m_*, minutes each). A -bench pattern picks the
// layouts, e.g. 'BenchmarkAtScale/(best_checked|default|partitioned4h)/':
//
//	cat /proc/loadavg; IDEM_BENCH_ROUNDS=5 go test -run '^$' -bench 'BenchmarkAtScale/(best_checked|default|partitioned4h)/' -benchtime 2000x -timeout 3h; cat /proc/loadavg
func BenchmarkAtScale(b *testing.B) {
	for range benchRounds {
		b.Run("best_checked/empty", func(b *testing.B) {
			bb := setup(b, poolOpts{maxConns: int32(benchWorkers), url: benchURL()})
			checkedSetup(b, bb)
			rate := measureScale(b, bb, checkedBatchUUID(bb))
			reportRatios(b, "best_checked/empty", rate)
		})
		b.Run("best_checked/10M", func(b *testing.B) {
			bb := checkedScaleBundle(b)
			rate := measureScale(b, bb, checkedBatchUUID(bb))
			reportRatios(b, "best_checked/10M", rate, "best_checked/empty")
			reportBytesPerRecord(b, bb.pool, bb.checked)
		})
		for _, layout := range scaleLayouts {
			b.Run(layout.name+"/empty", func(b *testing.B) {
				bb := setup(b, poolOpts{maxConns: int32(benchWorkers), url: benchURL(), part: layout.part})
				rate := measureScale(b, bb, batchUUID(bb, bb.consumer(b, "bench")))
				reportRatios(b, layout.name+"/empty", rate, "best_checked/empty")
			})
			b.Run(layout.name+"/10M", func(b *testing.B) {
				bb := scaleBundle(b, layout.part, layout.parts)
				rate := measureScale(b, bb, batchUUID(bb, bb.consumer(b, "bench")))
				reportRatios(b, layout.name+"/10M", rate, layout.name+"/empty", "best_checked/10M")
				reportBytesPerRecord(b, bb.pool, bb.table)
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
// them), without a purge (baseline, for 10s), while idem.Purge
// (BatchSize 1000) paced at idem.DefaultPurgeDutyCycle deletes them (paced,
// for 30s, then cancelled: the steady cost of a purge that runs for
// hours), and while idem.Purge flat out (DutyCycle 1) removes them all
// (purge, for as long as the purge takes, at least 10s): in the default
// layout by DELETE batches, in the partitioned layout (1-hour buckets, the
// expired records in 4 buckets) by dropping partitions (no paced case:
// each partition goes in one statement). Cases run in this order per
// round: default/baseline, default/paced, default/purge,
// partitioned/baseline, partitioned/purge. Each reports msgs/s, and per
// message processed CPU (of the client and of every backend of the pool,
// the purge's included), WAL and buffer traffic (measure, bufMeter); the
// paced and purge cases also their ratio to the baseline before them, the
// purge's seconds, the records it deleted, its rate (purge-rec/s) and the
// table's size before and after (MB-before, MB-after).
//
//	cat /proc/loadavg; IDEM_BENCH_ROUNDS=3 go test -run '^$' -bench BenchmarkPurgeCost -benchtime 1x -timeout 1h; cat /proc/loadavg
func BenchmarkPurgeCost(b *testing.B) {
	for range benchRounds {
		for _, layout := range []struct {
			name  string
			part  *idempgxv5.Partitions
			paces []float64
		}{
			{"default", nil, []float64{0, idem.DefaultPurgeDutyCycle, 1}},
			{"partitioned", &idempgxv5.Partitions{Bucket: time.Hour}, []float64{0, 1}},
		} {
			for _, pace := range layout.paces {
				purge := pace > 0
				name := layout.name + map[float64]string{0: "/baseline", idem.DefaultPurgeDutyCycle: "/paced", 1: "/purge"}[pace]
				b.Run(name, func(b *testing.B) {
					bb := setup(b, poolOpts{maxConns: int32(benchWorkers) + 2, url: benchURL(), part: layout.part})
					seedExpired(b, bb)
					c := bb.consumer(b, "bench")
					before := tableSize(b, bb)
					cpu, wal, buf := startCPU(b, bb.pool), startWAL(b, bb), startBuf(b, bb.pool)
					rate, msgs, res, took := processDuring(b, bb, batchUUID(bb, c), pace)
					b.ReportMetric(rate, "msgs/s")
					cpu.report(b, msgs)
					wal.report(b, msgs)
					buf.report(b, msgs)
					if purge {
						reportRatios(b, name, rate, layout.name+"/baseline")
						b.ReportMetric(took.Seconds(), "purge-s")
						b.ReportMetric(float64(res.Deleted), "deleted")
						b.ReportMetric(float64(res.Deleted)/took.Seconds(), "purge-rec/s")
						b.ReportMetric(res.Paused.Seconds(), "paused-s")
						b.ReportMetric(float64(before)/1e6, "MB-before")
						b.ReportMetric(float64(tableSize(b, bb))/1e6, "MB-after")
						if pace == 1 && res.Deleted < expiredRecords {
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
// ago (spread over 4 hours), copies of one written through the store
// (templateRecord, fillRows), and a run that makes its 7-day horizon pass
// them (marked through the store, then moved back to 60 days ago), then
// analyzes the table.
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
	tpl := templateRecord(ctx, b, bb)
	conn, err := bb.pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	if err := fillRows(ctx, conn.Conn(), bb.table, bb.table, tpl, 1, expiredRecords, `now() - interval '30 days' + (g % 4) * interval '1 hour'`); err != nil {
		b.Fatal(err)
	}
	if err := bb.store.MarkRunning(ctx, &idemdriver.MarkRunningParams{Consumer: "bench", MaxGap: time.Hour}); err != nil {
		b.Fatal(err)
	}
	for _, q := range []string{
		`DELETE FROM ` + bb.table + ` WHERE message_id::text = '` + tpl + `'`,
		`UPDATE ` + bb.table + `_runs SET started_at = now() - interval '60 days'`,
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
	var idx int64
	if err := bb.pool.QueryRow(context.Background(), `SELECT `+partitionsSize, bb.table).Scan(&n, &idx); err != nil {
		b.Fatal(err)
	}
	return n
}

// processDuring runs op across benchWorkers workers for 10s; with pace 1,
// while idem.Purge of consumer "bench" (7-day window) runs flat out and at
// least 10s; with a pace below 1, for 30s while idem.Purge runs at that
// duty cycle, cancelled at the end. It returns the throughput of op (100
// messages each), the messages processed, the purge's result and how long
// it ran.
func processDuring(b *testing.B, bb *bundle, op func(ctx context.Context, i int64) error, pace float64) (float64, int, idem.PurgeResult, time.Duration) {
	b.Helper()
	minWindow := 10 * time.Second
	if pace > 0 && pace < 1 {
		minWindow = 30 * time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pctx, pcancel := context.WithTimeout(ctx, minWindow)
	defer pcancel()
	if pace == 1 {
		pctx = ctx
	}
	var (
		res     idem.PurgeResult
		purgeEr error
		took    time.Duration
		done    = make(chan struct{})
	)
	start := time.Now()
	if pace > 0 {
		go func() {
			defer close(done)
			res, purgeEr = idem.Purge(pctx, bb.store, idem.PurgeParams{Consumer: "bench", RetentionWindow: 7 * 24 * time.Hour, BatchSize: idem.DefaultPurgeBatchSize, DutyCycle: pace})
			took = time.Since(start)
			if pace < 1 && errors.Is(purgeEr, context.DeadlineExceeded) {
				purgeEr = nil // the paced window's end
			}
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
	msgs := int(ops.Load() * 100)
	return float64(msgs) / elapsed.Seconds(), msgs, res, took
}
