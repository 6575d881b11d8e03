package idempgxv5_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/sqlschema"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/idempgxv5"
)

// consumerKeysVersion is the version of the migration that begins
// schema v2 (014_consumer_keys.sql; 015 contracts).
const consumerKeysVersion = 14

// v1Columns are the processed table's columns before the upgrade, as text.
const v1Columns = `consumer, message_id, fingerprint, processed_at, state, token, attempt, lease_expires_at, result, content_type, last_error, updated_at`

// v2Columns are v1Columns read from a table of schema v2 as r, the
// consumer's name from the consumers table c.
const v2Columns = `c.name AS consumer, r.message_id, r.fingerprint, r.processed_at, r.state, r.token, r.attempt, r.lease_expires_at, r.result, r.content_type, r.last_error, r.updated_at`

// dumpRows returns the rows of query, each as its text.
func dumpRows(t *testing.T, pool *pgxpool.Pool, query string) []string {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT r::text FROM (`+query+`) r`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// upgradeWorker processes messages on its own store while the table is
// upgraded, each new message's effect a row of the effects table:
// through Process (the store begins the transaction and claims in one
// round trip) or, with callerTx, through ProcessTx in a transaction of
// its own, which a failed claim rolls back and the message is delivered
// again (as a broker redelivers it); or, with lease set, in lease mode,
// the effect written by a step of the attempt (a recovery point). It also
// redelivers old records of its consumer, which must be duplicates.
type upgradeWorker struct {
	c        *idem.Consumer[pgx.Tx]
	lease    *idem.LeaseConsumer
	pool     *pgxpool.Pool
	name     string
	callerTx bool
	old      []string // IDs of completed v1 records of its consumer
	done     atomic.Int64
	mu       sync.Mutex
	claimed  []string
	dups     int
	shapeErr int     // claims in the caller's transaction that failed with 42703
	failures []error // anything else
	effects  string
	final    bool // the last redeliveries, after the upgrade: duplicates only
}

// run processes until stop is closed.
func (w *upgradeWorker) run(ctx context.Context, effects string, stop <-chan struct{}) {
	handler := func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+effects+` (key) VALUES ($1)`, m.ID)
		return err
	}
	w.effects = effects
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		id := w.name + "-live-" + strconv.Itoa(i)
		for { // until processed: a failed claim's message is delivered again
			out, err := w.process(ctx, idem.Message{ID: id, Payload: []byte(id)}, handler)
			var pgErr *pgconn.PgError
			w.mu.Lock()
			switch {
			case err == nil && out.Status == idem.Processed:
				w.claimed = append(w.claimed, id)
			case err != nil && w.callerTx && errors.As(err, &pgErr) && pgErr.Code == "42703":
				w.shapeErr++
				w.mu.Unlock()
				continue
			default:
				w.failures = append(w.failures, fmt.Errorf("claim %s: %v, %v", id, out.Status, err))
			}
			w.mu.Unlock()
			break
		}
		oldID := w.old[i%len(w.old)]
		dup, err := w.process(ctx, idem.Message{ID: oldID, Payload: []byte(strings.TrimPrefix(oldID, "v1-"))}, handler)
		var pgErr *pgconn.PgError
		w.mu.Lock()
		switch {
		case err == nil && dup.Status == idem.Duplicate:
			w.dups++
		case err != nil && w.callerTx && errors.As(err, &pgErr) && pgErr.Code == "42703":
			w.shapeErr++
		default:
			w.failures = append(w.failures, fmt.Errorf("redelivery of %s: %v, %v", oldID, dup.Status, err))
		}
		w.mu.Unlock()
		w.done.Add(1)
	}
}

// process is one delivery of m.
func (w *upgradeWorker) process(ctx context.Context, m idem.Message, h idem.Handler[pgx.Tx]) (idem.Outcome, error) {
	if w.lease != nil {
		return w.lease.Process(ctx, m, func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
			if w.final {
				return idem.Result{}, errors.New("a duplicate's handler ran")
			}
			_, err := a.Step(ctx, "effect", func(ctx context.Context) ([]byte, error) {
				_, err := w.pool.Exec(ctx, `INSERT INTO `+w.effects+` (key) VALUES ($1)`, m.ID)
				return nil, err
			})
			return idem.Result{Body: []byte("done " + m.ID)}, err
		})
	}
	if !w.callerTx {
		return w.c.Process(ctx, m, h)
	}
	tx, err := w.pool.Begin(ctx)
	if err != nil {
		return idem.Outcome{}, err
	}
	out, err := w.c.ProcessTx(ctx, tx, m, h)
	if err != nil {
		_ = tx.Rollback(context.Background())
		return out, err
	}
	return out, tx.Commit(ctx)
}

// progress waits until every worker has processed n more messages (a new
// one and a redelivery each) than when it was called.
func progress(t *testing.T, what string, n int64, ws ...*upgradeWorker) {
	t.Helper()
	base := make([]int64, len(ws))
	for i, w := range ws {
		base[i] = w.done.Load()
	}
	testenv.Eventually(t, time.Minute, what, func() bool {
		for i, w := range ws {
			if w.done.Load() < base[i]+n {
				return false
			}
		}
		return true
	}, nil)
}

// TestOnlineUpgrade upgrades a table of schema v1 holding records of
// three consumers in every state (transactional completions; lease-mode
// completions with results; failed records; records in progress under a
// live lease with recovery points; outbox rows pending and sent), more
// than the size below which the migrations run in one transaction, to
// schema v2 with the embedded migrations 014 and 015, while three
// consumers of this version process new messages (each with an effect)
// and redeliveries of old ones: one through Process, one through
// ProcessTx in transactions of its own, one in lease mode (Acquire, the
// effect in a step of the attempt, SaveStep, Complete). Their stores are
// not the one that migrates, so they find the change of shape
// themselves.
//
// While 014's first ALTER TABLE, and then 015's contract, wait behind a
// transaction that has read the table, both consumers still complete
// messages: each statement gives way after its lock timeout (one second)
// instead of queueing their claims until that transaction ends. After
// the upgrade every record keeps each of its fields under its consumer's
// name, the recovery points of the v1 records and the outbox rows are
// unchanged, every message
// processed has exactly one record and one effect (a last redelivery of
// all of them finds duplicates only), the consumer in Process saw no
// error, the one in ProcessTx at most the failed claims of the shape
// change (SQLSTATE 42703, delivered again), the table has the v2 shape
// (primary key (consumer_key, message_id), no consumer column, trigger
// or check), and a second run does nothing.
func TestOnlineUpgrade(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	u := upgradeTable(t, upgradeVariant{name: "default"}, consumerKeysVersion)
	direct, table, exec := u.direct, u.table, u.exec
	records := sqlschema.SmallRows + 2000 // the online path
	consumerOf := `CASE g % 3 WHEN 0 THEN 'orders' WHEN 1 THEN 'payments-service-v2' ELSE 'audit' END`
	exec(`INSERT INTO `+table+` (consumer, message_id, fingerprint, processed_at, state, token, attempt, lease_expires_at, result, content_type, last_error, updated_at)
		SELECT `+consumerOf+`, 'v1-' || g, sha256(g::text::bytea), now() - g * interval '1 second',
			CASE g % 5 WHEN 0 THEN NULL WHEN 1 THEN 2 WHEN 2 THEN 3 WHEN 3 THEN 1 ELSE 2 END,
			CASE g % 5 WHEN 0 THEN NULL ELSE g END,
			CASE g % 5 WHEN 0 THEN NULL ELSE 1 + g % 3 END,
			CASE WHEN g % 5 = 3 THEN now() + interval '1 hour' END,
			CASE WHEN g % 5 IN (1, 4) THEN convert_to('result ' || g, 'UTF8') END,
			CASE WHEN g % 5 = 1 THEN 'text/plain' END,
			CASE WHEN g % 5 = 2 THEN 'boom ' || g END,
			CASE WHEN g % 5 <> 0 THEN now() - g * interval '1 second' END
		FROM generate_series(1, $1::int) g`, records)
	exec(`INSERT INTO `+table+`_steps (consumer, message_id, step, result)
		SELECT `+consumerOf+`, 'v1-' || g, 'charge', '\x01'::bytea FROM generate_series(3, $1::int, 5) g`, records)
	exec(`INSERT INTO ` + table + `_outbox (id, consumer, source_id, destination, order_key, payload, sent_at)
		SELECT 'out-' || g, 'orders', 'v1-' || g, 'receipts', 'k' || g % 7, convert_to('p' || g, 'UTF8'), CASE WHEN g % 2 = 0 THEN now() END FROM generate_series(1, 200) g`)
	effects := table + `_fx`
	exec(`CREATE TABLE ` + effects + ` (id bigserial PRIMARY KEY, key text NOT NULL)`)
	steps := `SELECT * FROM ` + table + `_steps WHERE message_id LIKE 'v1-%' ORDER BY consumer, message_id, step`
	outbox := `SELECT * FROM ` + table + `_outbox ORDER BY seq`
	before := [][]string{
		dumpRows(t, direct, `SELECT `+v1Columns+` FROM `+table+` WHERE message_id LIKE 'v1-%' ORDER BY consumer, message_id`),
		dumpRows(t, direct, steps), dumpRows(t, direct, outbox)}
	if len(before[0]) != records {
		t.Fatalf("%d v1 records, want %d", len(before[0]), records)
	}

	// Completed transactional records (g % 5 == 0) of each worker's
	// consumer: g % 3 == 1 for payments-service-v2, 0 for orders.
	oldOf := func(r int) []string {
		var ids []string
		for g := 5; g <= records; g += 5 {
			if g%3 == r {
				ids = append(ids, "v1-"+strconv.Itoa(g))
			}
		}
		return ids
	}
	var workers []*upgradeWorker
	for _, w := range []struct {
		name            string
		r               int
		callerTx, lease bool
	}{{"payments-service-v2", 1, false, false}, {"orders", 0, true, false}, {"audit", 2, false, true}} {
		st, err := idempgxv5.New(u.pool, &idempgxv5.Config{Table: table})
		if err != nil {
			t.Fatal(err)
		}
		cfg := idem.Config{Name: w.name, PurgeInterval: -1}
		uw := &upgradeWorker{pool: u.pool, name: w.name, callerTx: w.callerTx, old: oldOf(w.r)}
		if w.lease {
			cfg.Lease = time.Minute
			if uw.lease, err = idem.NewLeaseConsumer(st, cfg); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = uw.lease.Close() }()
		} else {
			if uw.c, err = idem.NewConsumer[pgx.Tx](st, cfg); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = uw.c.Close() }()
		}
		workers = append(workers, uw)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.run(ctx, effects, stop)
		}()
	}
	stopped := false
	stopWorkers := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	defer stopWorkers()
	progress(t, "claims on the v1 table", 3, workers...)

	// blocked runs migs while a transaction that has read the table holds
	// a lock the statement waiting names must wait for, checks that the
	// consumers complete messages meanwhile, then ends that transaction.
	blocked := func(migs []sqlschema.Migration, waiting string) {
		blocker, err := direct.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = blocker.Rollback(context.Background()) }()
		if _, err := blocker.Exec(ctx, `SELECT 1 FROM `+table+` LIMIT 1`); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- idempgxv5.MigrateWith(ctx, u.store, migs) }()
		waitForLockWaiters(t, direct, waiting, 1)
		progress(t, "claims while "+waiting+" waits", 3, workers...)
		if err := blocker.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("upgrade: %v", err)
		}
	}
	var expand []sqlschema.Migration
	for _, m := range u.migs {
		if m.Version <= consumerKeysVersion {
			expand = append(expand, m)
		}
	}
	if len(expand) == len(u.migs) {
		t.Fatal("no migration after 014")
	}
	blocked(expand, "ADD COLUMN IF NOT EXISTS consumer_key")
	progress(t, "claims after 014", 3, workers...)
	blocked(u.migs, "DROP COLUMN consumer")
	progress(t, "claims after 015", 3, workers...)
	stopWorkers()
	if err := idempgxv5.MigrateWith(ctx, u.store, u.migs); err != nil {
		t.Fatalf("second upgrade: %v", err)
	}

	var claimed []string
	for _, w := range workers {
		if len(w.failures) > 0 {
			t.Errorf("%s: %d failures, first: %v", w.name, len(w.failures), w.failures[0])
		}
		if w.dups == 0 {
			t.Errorf("%s: no redelivery recognised as a duplicate", w.name)
		}
		if !w.callerTx && w.shapeErr > 0 {
			t.Errorf("%s: %d errors in Process", w.name, w.shapeErr)
		}
		t.Logf("%s: %d messages processed, %d duplicates, %d claims failed on the shape change and delivered again", w.name, len(w.claimed), w.dups, w.shapeErr)
		claimed = append(claimed, w.claimed...)
		// Each message once more: a duplicate, and no effect.
		w.final = true
		for _, id := range w.claimed {
			out, err := w.process(ctx, idem.Message{ID: id, Payload: []byte(id)}, func(context.Context, pgx.Tx, idem.Message) error {
				return errors.New("a duplicate's handler ran")
			})
			if err != nil || out.Status != idem.Duplicate {
				t.Errorf("%s: last redelivery of %s: %v, %v", w.name, id, out.Status, err)
				break
			}
		}
	}
	var lost, doubled, recs int
	if err := direct.QueryRow(ctx, `SELECT count(*) FILTER (WHERE n = 0), count(*) FILTER (WHERE n > 1) FROM (SELECT (SELECT count(*) FROM `+effects+` e WHERE e.key = m.id) AS n FROM unnest($1::text[]) AS m(id)) x`, claimed).Scan(&lost, &doubled); err != nil {
		t.Fatal(err)
	}
	if err := direct.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE message_id = ANY($1)`, claimed).Scan(&recs); err != nil {
		t.Fatal(err)
	}
	var effectRows int
	if err := direct.QueryRow(ctx, `SELECT count(*) FROM `+effects).Scan(&effectRows); err != nil {
		t.Fatal(err)
	}
	if lost != 0 || doubled != 0 || recs != len(claimed) || effectRows != len(claimed) {
		t.Errorf("%d messages processed: %d without an effect, %d with more than one, %d effects, %d records", len(claimed), lost, doubled, effectRows, recs)
	}

	after := [][]string{
		dumpRows(t, direct, `SELECT `+v2Columns+` FROM `+table+` r JOIN `+table+`_consumers c ON c.key = r.consumer_key WHERE r.message_id LIKE 'v1-%' ORDER BY c.name, r.message_id`),
		dumpRows(t, direct, steps), dumpRows(t, direct, outbox)}
	for i, name := range []string{"processed records", "recovery points", "outbox rows"} {
		if len(after[i]) != len(before[i]) {
			t.Errorf("%s: %d after the upgrade, %d before", name, len(after[i]), len(before[i]))
			continue
		}
		for j := range before[i] {
			if after[i][j] != before[i][j] {
				t.Errorf("%s: row %d changed:\n before %s\n after  %s", name, j, before[i][j], after[i][j])
				break
			}
		}
	}
	var (
		pkey                   string
		consumerCol, leftovers int
		names                  []string
	)
	if err := direct.QueryRow(ctx, `SELECT
		(SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = $1::regclass AND contype = 'p'),
		(SELECT count(*) FROM pg_attribute WHERE attrelid = $1::regclass AND attname = 'consumer' AND NOT attisdropped),
		(SELECT count(*) FROM pg_trigger WHERE tgrelid = $1::regclass AND tgname LIKE '%consumer\_key')
			+ (SELECT count(*) FROM pg_constraint WHERE conrelid = $1::regclass AND conname LIKE '%consumer\_key\_set')
			+ (SELECT count(*) FROM pg_index i JOIN pg_class x ON x.oid = i.indexrelid WHERE i.indrelid = $1::regclass
				AND (x.relname LIKE '%\_key\_todo' OR x.relname LIKE '%\_by\_key' OR x.relname LIKE '%\_key\_idx')),
		ARRAY(SELECT name FROM `+table+`_consumers ORDER BY name)`, table).Scan(&pkey, &consumerCol, &leftovers, &names); err != nil {
		t.Fatal(err)
	}
	if pkey != "PRIMARY KEY (consumer_key, message_id)" || consumerCol != 0 || leftovers != 0 || strings.Join(names, ",") != "audit,orders,payments-service-v2" {
		t.Errorf("after the upgrade: %s, consumer column %d, trigger/check/work indexes left %d, consumers %v", pkey, consumerCol, leftovers, names)
	}
}

// An online migration whose first statement is not concurrent (an ALTER
// TABLE, run in a transaction of its own) on a pool of one connection,
// which the migration lock's transaction holds: an error matching
// idemdriver.ErrInvalidConfig, not a wait for a connection that never
// comes free; on a pool of more it applies.
func TestOnlineUpgradeOneConnection(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	u := upgradeTable(t, upgradeVariant{name: "default"}, 1<<30)
	m := sqlschema.Migration{Version: u.migs[len(u.migs)-1].Version + 1, Name: "online.sql", NoTransaction: true,
		SQL: "-- idem:no-transaction\nALTER TABLE " + u.table + " ADD COLUMN IF NOT EXISTS extra integer;\n"}
	one, err := idempgxv5.New(newPool(t, poolOpts{maxConns: 1}), &idempgxv5.Config{Table: u.table})
	if err != nil {
		t.Fatal(err)
	}
	if err := idempgxv5.MigrateWith(ctx, one, append(u.migs, m)); !errors.Is(err, idemdriver.ErrInvalidConfig) {
		t.Errorf("online migration on one connection: %v, want ErrInvalidConfig", err)
	}
	if err := idempgxv5.MigrateWith(ctx, u.store, append(u.migs, m)); err != nil {
		t.Fatalf("online migration on a pool of more: %v", err)
	}
	var n int
	if err := u.direct.QueryRow(ctx, `SELECT count(*) FROM pg_attribute WHERE attrelid = $1::regclass AND attname = 'extra'`, u.table).Scan(&n); err != nil || n != 1 {
		t.Errorf("column added: %d (%v)", n, err)
	}
}
