package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "modernc.org/sqlite" // the "sqlite" database/sql driver

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/idem-go/idem/store/idemsql"
)

// envPostgres names the PostgreSQL the harness uses (scripts/services sets
// it), unless envPostgresDurable is set: then the durable one (fsync,
// synchronous_commit and full_page_writes on, as users run it), whose
// figures are the ones to publish.
const (
	envPostgres        = "IDEM_TEST_POSTGRES_URL"
	envPostgresDurable = "IDEM_TEST_POSTGRES_DURABLE_URL"
)

// postgresURL is the PostgreSQL the harness runs on: envPostgresDurable's
// when set, else envPostgres's, else "".
func postgresURL() string {
	if u := os.Getenv(envPostgresDurable); u != "" {
		return u
	}
	return os.Getenv(envPostgres)
}

// errInjected is the handler error of the "handler error on first attempt"
// fault.
var errInjected = errors.New("bench: injected handler failure")

// A database is one store backend for the whole harness.
type database interface {
	// name is "sqlite" or "postgres", as given to --stores.
	name() string
	// newRun creates the tables of one run: a processed-messages table for
	// idem and a side-effect table, both fresh.
	newRun(ctx context.Context, tag string, f *faults) (runDB, error)
	// hasBest reports whether its runs have the hand-written best
	// consumer (runDB.best).
	hasBest() bool
	close()
}

// msgHandler handles one delivery; ack says whether it may be acknowledged.
type msgHandler func(ctx context.Context, msg idem.Message) (ack bool, err error)

// batchHandler handles a batch of deliveries; one ack flag per message.
type batchHandler func(ctx context.Context, msgs []idem.Message) []bool

// runDB is the store side of one run: the contenders' handlers, all writing
// one side-effect row per message, and the count of those rows.
type runDB interface {
	// naive writes the row in a transaction of its own, with no
	// deduplication.
	naive() msgHandler
	// best is the hand-written consumer, the best a person can write for
	// the same guarantee (nil when the store has none): a processed table
	// of one text primary key, claimed by a plain INSERT ... ON CONFLICT
	// DO NOTHING pipelined with BEGIN (claimed when it inserted a row),
	// the row written in the same transaction; a duplicate is rolled
	// back and acknowledged.
	best() msgHandler
	// idem runs the message through an idem.Consumer (transactional mode,
	// idem.Bind) that writes the row in the claim's transaction.
	idem(consumer string) (msgHandler, error)
	// idemBatch runs batches through idem.BindBatch, writing the batch's
	// new rows with one statement.
	idemBatch(consumer string) (batchHandler, error)
	// idemOutbox is idem with one outgoing message per new message: the
	// handler writes the row and emits a message to dest through the
	// outbox, in the claim's transaction; the consumer hands it to relay
	// after commit (Config.Relay).
	idemOutbox(consumer, dest string, relay *idem.Relay) (msgHandler, error)
	// fillOutbox processes ids (new messages) with consumer, 100 per
	// batch, each emitting one message to dest, and no relay: the
	// outbox then holds len(ids) pending rows.
	fillOutbox(ctx context.Context, consumer, dest string, ids []string) error
	// outbox is the run's outbox, for a relay.
	outbox() idemdriver.OutboxStore
	// effects returns the number of side-effect rows of each message ID.
	effects(ctx context.Context) (map[string]int, error)
	close()
}

// faults says which messages fail or crash the consumer. Each entry fires
// once.
type faults struct {
	failOnce sync.Map // message ID -> struct{}: the handler fails on its first attempt
	crash    sync.Map // message ID -> struct{}: the consumer dies after its commit, before its ack
}

// fail reports whether the handler must fail for id now (once).
func (f *faults) fail(id string) bool {
	if f == nil {
		return false
	}
	_, ok := f.failOnce.LoadAndDelete(id)
	return ok
}

// crashNow reports whether the consumer must die after committing id (once).
func (f *faults) crashNow(id string) bool {
	if f == nil {
		return false
	}
	_, ok := f.crash.LoadAndDelete(id)
	return ok
}

// txRun implements runDB over any idemdriver.TxStore.
type txRun[TTx any] struct {
	store      idemdriver.TxStore[TTx]
	insertOne  func(ctx context.Context, tx TTx, id string) error
	insertMany func(ctx context.Context, tx TTx, ids []string) error
	count      func(ctx context.Context) (map[string]int, error)
	cleanup    func()
	faults     *faults
	// bestClaim, when set, is the hand-written consumer's claim: it begins
	// a transaction and claims id, returning the open transaction.
	bestClaim func(ctx context.Context, id string) (tx TTx, claimed bool, err error)
	// checked is the best_checked consumer (checked.go) on the run's
	// tables; nil when the store has none.
	checked checkedRun

	mu        sync.Mutex
	consumers []*idem.Consumer[TTx]
}

func (r *txRun[TTx]) naive() msgHandler {
	return func(ctx context.Context, msg idem.Message) (bool, error) {
		tx, err := r.store.Begin(ctx)
		if err != nil {
			return false, err
		}
		return r.writeAndCommit(ctx, tx, msg.ID)
	}
}

// writeAndCommit writes id's side-effect row in tx (failing once where the
// fault says so) and commits; on error it rolls tx back.
func (r *txRun[TTx]) writeAndCommit(ctx context.Context, tx TTx, id string) (bool, error) {
	if err := r.insertOne(ctx, tx, id); err != nil {
		_ = r.store.Rollback(ctx, tx)
		return false, err
	}
	if r.faults.fail(id) {
		_ = r.store.Rollback(ctx, tx)
		return false, errInjected
	}
	if err := r.store.Commit(ctx, tx); err != nil {
		_ = r.store.Rollback(ctx, tx)
		return false, err
	}
	return true, nil
}

func (r *txRun[TTx]) best() msgHandler {
	if r.bestClaim == nil {
		return nil
	}
	return func(ctx context.Context, msg idem.Message) (bool, error) {
		tx, claimed, err := r.bestClaim(ctx, msg.ID)
		if err != nil {
			return false, err
		}
		if !claimed { // a duplicate: processed before
			return true, r.store.Rollback(ctx, tx)
		}
		return r.writeAndCommit(ctx, tx, msg.ID)
	}
}

func (r *txRun[TTx]) consumer(name string) (*idem.Consumer[TTx], error) {
	return r.consumerWith(idem.Config{Name: name, PurgeInterval: -1})
}

func (r *txRun[TTx]) consumerWith(cfg idem.Config) (*idem.Consumer[TTx], error) {
	c, err := idem.NewConsumer(r.store, cfg)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.consumers = append(r.consumers, c)
	r.mu.Unlock()
	return c, nil
}

func (r *txRun[TTx]) idem(name string) (msgHandler, error) { return r.idemOutbox(name, "", nil) }

func (r *txRun[TTx]) idemBatch(name string) (batchHandler, error) {
	c, err := r.consumer(name)
	if err != nil {
		return nil, err
	}
	p := idem.BindBatch(c, func(ctx context.Context, tx TTx, msgs []idem.Message) error {
		ids := make([]string, len(msgs))
		for i, m := range msgs {
			ids[i] = m.ID
		}
		if err := r.insertMany(ctx, tx, ids); err != nil {
			return err
		}
		failed := false
		for _, id := range ids {
			if r.faults.fail(id) {
				failed = true
			}
		}
		if failed {
			return errInjected
		}
		return nil
	})
	return func(ctx context.Context, msgs []idem.Message) []bool {
		outs, _ := p.ProcessBatch(ctx, msgs)
		acks := make([]bool, len(msgs))
		for i := range msgs {
			acks[i] = i < len(outs) && outs[i].Ack()
		}
		return acks
	}, nil
}

// emitOne emits id's outgoing message to dest: its ID is derived from
// the consumer and id, its ordering key is id (no order between
// messages), its payload about 100 bytes.
// In a batch handler (batch true) it emits for id's message of the batch.
func emitOne(ctx context.Context, dest, id string, batch bool) error {
	m := idem.OutgoingMessage{Name: "done", Destination: dest, Key: id, Payload: payload(id)}
	var err error
	if batch {
		_, err = idem.EmitFor(ctx, id, m)
	} else {
		_, err = idem.Emit(ctx, m)
	}
	return err
}

// idemOutbox is also idem's handler, with no dest (nothing emitted).
func (r *txRun[TTx]) idemOutbox(name, dest string, relay *idem.Relay) (msgHandler, error) {
	c, err := r.consumerWith(idem.Config{Name: name, PurgeInterval: -1, Relay: relay})
	if err != nil {
		return nil, err
	}
	p := idem.Bind(c, func(ctx context.Context, tx TTx, msg idem.Message) error {
		if err := r.insertOne(ctx, tx, msg.ID); err != nil {
			return err
		}
		if dest != "" {
			if err := emitOne(ctx, dest, msg.ID, false); err != nil {
				return err
			}
		}
		if r.faults.fail(msg.ID) {
			return errInjected
		}
		return nil
	})
	return func(ctx context.Context, msg idem.Message) (bool, error) {
		out, err := p.Process(ctx, msg)
		return out.Ack(), err
	}, nil
}

func (r *txRun[TTx]) fillOutbox(ctx context.Context, name, dest string, ids []string) error {
	c, err := r.consumer(name)
	if err != nil {
		return err
	}
	for len(ids) > 0 {
		chunk := ids[:min(100, len(ids))]
		ids = ids[len(chunk):]
		msgs := make([]idem.Message, len(chunk))
		for i, id := range chunk {
			msgs[i] = idem.Message{ID: id, Payload: payload(id)}
		}
		outs, err := c.ProcessBatch(ctx, msgs, func(ctx context.Context, tx TTx, msgs []idem.Message) error {
			for _, m := range msgs {
				if err := emitOne(ctx, dest, m.ID, true); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, o := range outs {
			if o.Status != idem.Processed {
				return fmt.Errorf("fill outbox: message %s: %v", o.MessageID, o.Status)
			}
		}
	}
	return nil
}

func (r *txRun[TTx]) outbox() idemdriver.OutboxStore {
	o, _ := any(r.store).(idemdriver.OutboxStore)
	return o
}

func (r *txRun[TTx]) effects(ctx context.Context) (map[string]int, error) { return r.count(ctx) }

func (r *txRun[TTx]) close() {
	r.mu.Lock()
	for _, c := range r.consumers {
		_ = c.Close()
	}
	r.mu.Unlock()
	r.cleanup()
}

// sqliteDB keeps each run in its own SQLite file (WAL, BEGIN IMMEDIATE,
// synchronous at its default FULL) under a temporary directory.
type sqliteDB struct {
	dir      string
	maxConns int
}

func newSQLiteDB(maxConns int) (*sqliteDB, error) {
	dir, err := os.MkdirTemp("", "idem-bench-")
	if err != nil {
		return nil, err
	}
	return &sqliteDB{dir: dir, maxConns: maxConns}, nil
}

func (d *sqliteDB) name() string  { return "sqlite" }
func (d *sqliteDB) hasBest() bool { return false }
func (d *sqliteDB) close()        { _ = os.RemoveAll(d.dir) }

func (d *sqliteDB) newRun(ctx context.Context, tag string, f *faults) (runDB, error) {
	path := filepath.Join(d.dir, tag+".db")
	db, err := sql.Open("sqlite", idemsql.SQLiteDSN(path))
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(d.maxConns)
	fail := func(err error) (runDB, error) {
		db.Close()
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	store, err := idemsql.New(db, idemsql.SQLite, nil)
	if err != nil {
		return fail(err)
	}
	if err := store.Migrate(ctx); err != nil {
		return fail(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE effects (id TEXT NOT NULL)`); err != nil {
		return fail(err)
	}
	chk, err := newSQLChecked(ctx, db, "sqlite", "checked", "effects", f)
	if err != nil {
		return fail(err)
	}
	return &txRun[*sql.Tx]{
		store: store, faults: f, checked: chk,
		insertOne: func(ctx context.Context, tx *sql.Tx, id string) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO effects (id) VALUES (?)`, id)
			return err
		},
		insertMany: func(ctx context.Context, tx *sql.Tx, ids []string) error {
			args := make([]any, len(ids))
			for i, id := range ids {
				args[i] = id
			}
			q := `INSERT INTO effects (id) VALUES ` + strings.TrimSuffix(strings.Repeat("(?),", len(ids)), ",")
			_, err := tx.ExecContext(ctx, q, args...)
			return err
		},
		count: func(ctx context.Context) (map[string]int, error) {
			return countRows(ctx, db, `SELECT id, count(*) FROM effects GROUP BY id`)
		},
		cleanup: func() {
			db.Close()
			for _, suffix := range []string{"", "-wal", "-shm"} {
				_ = os.Remove(path + suffix)
			}
		},
	}, nil
}

func countRows(ctx context.Context, db *sql.DB, q string) (map[string]int, error) {
	rows, err := db.QueryContext(ctx, q)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return nil, err
		}
		out[id] = n
	}
	return out, rows.Err()
}

// postgresDB runs on the PostgreSQL at IDEM_TEST_POSTGRES_URL through
// store/idempgxv5 (pgx v5), each run on its own tables, dropped after it.
type postgresDB struct {
	pool *pgxpool.Pool
}

func newPostgresDB(ctx context.Context, url string, maxConns int) (*postgresDB, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", envPostgres, err)
	}
	cfg.MaxConns = int32(maxConns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: %w", err)
	}
	return &postgresDB{pool: pool}, nil
}

func (d *postgresDB) name() string  { return "postgres" }
func (d *postgresDB) hasBest() bool { return true }
func (d *postgresDB) close()        { d.pool.Close() }

// serverVersion returns PostgreSQL's version string and its fsync setting.
func (d *postgresDB) serverVersion(ctx context.Context) (version, fsync string, err error) {
	if err = d.pool.QueryRow(ctx, `SHOW server_version`).Scan(&version); err != nil {
		return "", "", err
	}
	err = d.pool.QueryRow(ctx, `SHOW fsync`).Scan(&fsync)
	return version, fsync, err
}

func (d *postgresDB) newRun(ctx context.Context, tag string, f *faults) (runDB, error) {
	table := "bench_" + tag
	effects, best, checked := table+"_effects", table+"_best", table+"_checked"
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = d.pool.Exec(ctx, fmt.Sprintf(`DROP TABLE IF EXISTS %s, %s, %s, %s, %s_steps, %s_runs, %s_outbox, %s_migrations`,
			effects, best, checked, table, table, table, table, table))
		_, _ = d.pool.Exec(ctx, fmt.Sprintf(`DROP FUNCTION IF EXISTS %s_outbox_notify()`, table))
	}
	fail := func(err error) (runDB, error) {
		drop()
		return nil, fmt.Errorf("postgres: %w", err)
	}
	store, err := idempgxv5.New(d.pool, &idempgxv5.Config{Table: table})
	if err != nil {
		return fail(err)
	}
	if err := store.Migrate(ctx); err != nil {
		return fail(err)
	}
	if _, err := d.pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (id text NOT NULL)`, effects)); err != nil {
		return fail(err)
	}
	// The hand-written consumer's processed table: one text primary key
	// and the time of processing, which retention needs.
	if _, err := d.pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (message_id text COLLATE "C" PRIMARY KEY, processed_at timestamptz NOT NULL DEFAULT now())`, best)); err != nil {
		return fail(err)
	}
	chk, err := newPGChecked(ctx, d.pool, checked, effects, f)
	if err != nil {
		return fail(err)
	}
	bestIns := fmt.Sprintf(`INSERT INTO %s (message_id) VALUES ($1) ON CONFLICT DO NOTHING`, best)
	insOne := fmt.Sprintf(`INSERT INTO %s (id) VALUES ($1)`, effects)
	insMany := fmt.Sprintf(`INSERT INTO %s (id) SELECT unnest($1::text[])`, effects)
	return &txRun[pgx.Tx]{
		store: store, faults: f, checked: chk,
		bestClaim: func(ctx context.Context, id string) (pgx.Tx, bool, error) {
			b := &pgx.Batch{}
			b.BeginTx(pgx.TxOptions{})
			b.Queue(bestIns, id)
			br := d.pool.SendBatch(ctx, b)
			tx := br.Tx()
			tag, err := execAfterBegin(br)
			if err != nil {
				_ = tx.Rollback(context.WithoutCancel(ctx))
				return nil, false, err
			}
			return tx, tag.RowsAffected() == 1, nil
		},
		insertOne: func(ctx context.Context, tx pgx.Tx, id string) error {
			_, err := tx.Exec(ctx, insOne, id)
			return err
		},
		insertMany: func(ctx context.Context, tx pgx.Tx, ids []string) error {
			_, err := tx.Exec(ctx, insMany, ids)
			return err
		},
		count: func(ctx context.Context) (map[string]int, error) {
			rows, err := d.pool.Query(ctx, fmt.Sprintf(`SELECT id, count(*) FROM %s GROUP BY id`, effects))
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			out := map[string]int{}
			for rows.Next() {
				var id string
				var n int64
				if err := rows.Scan(&id, &n); err != nil {
					return nil, err
				}
				out[id] = int(n)
			}
			return out, rows.Err()
		},
		cleanup: drop,
	}, nil
}
