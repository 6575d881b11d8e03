package idempgxv5_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
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

// confirmAll is a publisher that confirms every message at once.
var confirmAll = idem.PublisherFunc(func(_ context.Context, m []idem.Outgoing) []error { return make([]error, len(m)) })

// BenchmarkOutbox measures what the outbox costs a consumer, in one run:
//   - best: the hand-written consumer (BenchmarkProcess's best);
//   - best_outbox1: the hand-written outbox (processBestRelayed): best plus
//     one narrow outbox row per message, in the same transaction, deleted
//     by two hand-written relay loops once published. It is the floor an
//     outbox costs on this server: what every outbox pays, without what
//     idem's adds (order per key, an outgoing ID that is unique, leases
//     instead of a transaction held open through the publish, retries);
//   - best_checked: the hand-written consumer with idem's guarantee
//     (BenchmarkProcess's best_checked: the payload's fingerprint kept,
//     the purge index);
//   - best_checked_outbox1: the hand-written outbox with idem's outbox
//     guarantees (checkedOutbox, processCheckedRelayed) on best_checked:
//     a unique outgoing ID (the primary key; emitting an ID again does
//     nothing), order per destination and key under two relay loops (an
//     index on a hash of the key and seq), leases instead of a
//     transaction held through the publish, retries and fenced marks;
//     each round's confirmed rows deleted with its next claim. The
//     reference idem_outbox1 is judged against;
//   - best_checked_outbox1_hashid: the same with idem's derived outgoing
//     ID (idem.OutgoingID, 69 bytes) instead of the hand-written one
//     ("bench/<message ID>/charged");
//   - best_checked_outbox1_locked: best_checked_outbox1 whose relay rounds
//     each hold their rows' locks through the publish in one transaction
//     (checkedOutbox.lockedRound), the reference of idem_outbox1_locked;
//   - idem: Consumer.Process of a new message whose handler writes one
//     effect row (BenchmarkProcess's idem);
//   - idem_outbox1: the same handler also emits one outgoing message, and
//     a Relay (on a pool of its own, publishing to a Publisher that
//     confirms at once, woken by the Consumer after each commit, which
//     therefore sends no notification: EmitParams.RelayWoken) sends them
//     while the consumers run, deleting each round's confirmed rows with
//     its next claim (Relay.Run on an OutboxSentClaimer). The timed section ends when every message
//     was sent and its row deleted, so the row's whole life (insert,
//     claim, delete) is paid in it;
//   - idem_outbox1_keepsent: idem_outbox1 with RelayConfig.KeepSent (sent
//     rows marked sent, purged once sent over a millisecond ago, every
//     second; the timed section ends when they are all purged): the
//     row's life before rows were deleted on acknowledgement (insert,
//     claim, mark sent, purge);
//   - idem_outbox1_locked: idem_outbox1 with RelayConfig.LockedRounds:
//     each round holds its rows' locks through the publish and writes
//     each sent row once, its delete, where idem_outbox1's rounds lease
//     their rows (an UPDATE of lease_until and attempts), publish with no
//     transaction open, and delete them with their next claim;
//   - idem_outbox1_norelay: the same without a relay (the insert alone:
//     what the consumer's own transaction pays);
//   - relay: a Relay sending b.N rows written beforehand, through a
//     publisher that confirms at once, in batches of 100 (claim, then one
//     mark per batch): the store's share of the relay's throughput, msgs/s;
//   - relay_workers4: the same with four rounds in flight (RelayConfig.Workers).
//
// The processing cases report their ratio to the case without outgoing
// messages in the same round: x-K is this case's msgs/s divided by that of
// case K, where outbox_best names best and outbox_idem names idem. So
// best_outbox1's and idem_outbox1's x-outbox_best and x-outbox_idem are the
// outbox's cost, idem's x-outbox_best is idem against best, and
// idem_outbox1 (and idem_outbox1_keepsent) also report x-best_outbox1;
// best_checked (outbox_best_checked) reports x-outbox_best,
// best_checked_outbox1 x-outbox_best_checked (its outbox's cost) and
// x-best_outbox1 (what the guarantees cost by hand), and idem_outbox1
// x-best_checked_outbox1: idem against the same guarantee written by
// hand (idem_outbox1_locked: x-best_checked_outbox1_locked). They also report the CPU (client, and server: the backends of both
// pools) and WAL per message. They run on the durable PostgreSQL when
// IDEM_TEST_POSTGRES_DURABLE_URL is set (see benchURL). The WAL and server
// CPU figures are the server's and its backends': on a shared machine
// they move much less than throughput does.
//
// Run: cat /proc/loadavg; IDEM_BENCH_ROUNDS=6 go test -run '^$' -bench 'BenchmarkOutbox/^(best|best_checked|best_outbox1|best_checked_outbox1|idem|idem_outbox1)(#[0-9]+)?$' -benchtime 10000x -benchmem
func BenchmarkOutbox(b *testing.B) {
	for range benchRounds {
		benchOutboxRound(b)
	}
}

// benchOutboxRound runs each case of BenchmarkOutbox once.
func benchOutboxRound(b *testing.B) {
	payload := []byte(`{"order":"o-1","amount":200}`)
	emitting := func(effect idem.Handler[pgx.Tx]) idem.Handler[pgx.Tx] {
		return func(ctx context.Context, tx pgx.Tx, msg idem.Message) error {
			if err := effect(ctx, tx, msg); err != nil {
				return err
			}
			_, err := idem.Emit(ctx, idem.OutgoingMessage{Destination: "orders.charged", Key: msg.ID, Payload: msg.Payload})
			return err
		}
	}
	b.Run("best", func(b *testing.B) {
		bb := benchSetup(b)
		reportRatios(b, "outbox_best", bestNew(b, bb))
	})
	b.Run("best_outbox1", func(b *testing.B) {
		bb := benchSetup(b)
		reportRatios(b, "best_outbox1", processBestRelayed(b, bb, payload), "outbox_best")
	})
	b.Run("best_checked", func(b *testing.B) {
		bb := benchSetup(b)
		reportRatios(b, "outbox_best_checked", checkedNew(b, bb, payload), "outbox_best")
	})
	b.Run("best_checked_outbox1", func(b *testing.B) {
		bb := benchSetup(b)
		reportRatios(b, "best_checked_outbox1", processCheckedRelayed(b, bb, payload, checkedVariant{}), "outbox_best_checked", "best_outbox1")
	})
	b.Run("best_checked_outbox1_hashid", func(b *testing.B) {
		bb := benchSetup(b)
		reportRatios(b, "best_checked_outbox1_hashid", processCheckedRelayed(b, bb, payload, checkedVariant{hashedID: true}), "outbox_best_checked", "best_checked_outbox1")
	})
	b.Run("best_checked_outbox1_locked", func(b *testing.B) {
		bb := benchSetup(b)
		reportRatios(b, "best_checked_outbox1_locked", processCheckedRelayed(b, bb, payload, checkedVariant{locked: true}), "outbox_best_checked", "best_checked_outbox1")
	})
	b.Run("idem", func(b *testing.B) {
		bb := benchSetup(b)
		reportRatios(b, "outbox_idem", processNew(b, bb, bb.consumer(b, "bench"), bb.effectHandler(), payload), "outbox_best", "outbox_best_checked")
	})
	b.Run("idem_outbox1", func(b *testing.B) {
		bb := benchSetup(b)
		reportRatios(b, "idem_outbox1", processRelayed(b, bb, emitting(bb.effectHandler()), payload, relayDelete), "outbox_idem", "best_outbox1", "best_checked_outbox1")
	})
	b.Run("idem_outbox1_keepsent", func(b *testing.B) {
		bb := benchSetup(b)
		reportRatios(b, "idem_outbox1_keepsent", processRelayed(b, bb, emitting(bb.effectHandler()), payload, relayKeep), "outbox_idem", "best_outbox1")
	})
	b.Run("idem_outbox1_locked", func(b *testing.B) {
		bb := benchSetup(b)
		reportRatios(b, "idem_outbox1_locked", processRelayed(b, bb, emitting(bb.effectHandler()), payload, relayLocked), "outbox_idem", "best_outbox1", "best_checked_outbox1_locked")
	})
	b.Run("idem_outbox1_norelay", func(b *testing.B) {
		bb := benchSetup(b)
		reportRatios(b, "idem_outbox1_norelay", processNew(b, bb, bb.consumer(b, "bench"), emitting(bb.effectHandler()), payload), "outbox_idem")
	})
	relay := func(b *testing.B, workers int) {
		bb := setup(b, poolOpts{maxConns: int32(workers + 2), url: benchURL()})
		ctx := context.Background()
		if _, err := bb.pool.Exec(ctx, `INSERT INTO `+bb.table+`_outbox (id, destination, order_key, payload)
			SELECT 'r-' || g, 'orders.charged', 'k-' || g, '\x7b7d'::bytea FROM generate_series(1, $1::int) g`, b.N); err != nil {
			b.Fatal(err)
		}
		if _, err := bb.pool.Exec(ctx, `ANALYZE `+bb.table+`_outbox`); err != nil {
			b.Fatal(err)
		}
		r, err := idem.NewRelay(idem.RelayConfig{Store: bb.store, BatchSize: 100,
			Publisher: confirmAll})
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		var sent atomic.Int64
		var wg sync.WaitGroup
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for sent.Load() < int64(b.N) {
					res, err := r.RunOnce(ctx)
					if err != nil {
						b.Error(err)
						return
					}
					if res.Claimed == 0 {
						return
					}
					sent.Add(int64(res.Sent))
				}
			}()
		}
		wg.Wait()
		if got := sent.Load(); got != int64(b.N) {
			b.Fatalf("sent %d of %d", got, b.N)
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	}
	b.Run("relay", func(b *testing.B) { relay(b, 1) })
	b.Run("relay_workers4", func(b *testing.B) { relay(b, 4) })
}

// processRelayed is processNew with a Relay sending the emitted messages
// while the workers process (see BenchmarkOutbox's idem_outbox1): the
// Relay's store is on a pool of two connections of its own, the Consumer
// wakes it after every commit, and the timed section ends once every
// message was published and its row is gone: deleted once confirmed, or,
// with relayKeep (RelayConfig.KeepSent), marked sent and then purged;
// with relayLocked (RelayConfig.LockedRounds), deleted by locked rounds. CPU is measured on the backends of both pools. It returns
// the throughput.
func processRelayed(b *testing.B, bb *bundle, h idem.Handler[pgx.Tx], payload []byte, mode relayMode) float64 {
	b.Helper()
	steady(b, bb)
	ctx := context.Background()
	rpool := newPool(b, poolOpts{maxConns: 2, url: benchURL()})
	rstore, err := idempgxv5.New(rpool, &idempgxv5.Config{Table: bb.table})
	if err != nil {
		b.Fatal(err)
	}
	var sent, rounds atomic.Int64
	all := make(chan struct{})
	var allOnce sync.Once
	pub := idem.PublisherFunc(func(_ context.Context, m []idem.Outgoing) []error {
		rounds.Add(1)
		if sent.Add(int64(len(m))) >= int64(b.N) {
			allOnce.Do(func() { close(all) })
		}
		return make([]error, len(m))
	})
	r, err := idem.NewRelay(idem.RelayConfig{Store: rstore, KeepSent: mode == relayKeep, LockedRounds: mode == relayLocked, Retention: time.Millisecond, PurgeInterval: time.Second,
		Publisher: pub})
	if err != nil {
		b.Fatal(err)
	}
	cfg := idem.Config{Name: "bench", PurgeInterval: -1, Relay: r}
	c, err := idem.NewConsumer[pgx.Tx](bb.store, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	m := startCPUs(b, bb.pool, rpool)
	w := startWAL(b, bb)
	rctx, cancel := context.WithCancel(ctx)
	var running sync.WaitGroup
	running.Go(func() { _ = r.Run(rctx) })
	defer func() { cancel(); running.Wait() }()
	prefix := benchPrefix()
	b.ResetTimer()
	start := time.Now()
	if err := runOps(ctx, b, func(ctx context.Context, i int64) error {
		out, err := c.Process(ctx, idem.Message{ID: prefix + strconv.FormatInt(i, 10), Payload: payload}, h)
		if err == nil && out.Status != idem.Processed {
			err = fmt.Errorf("outcome %v", out.Status)
		}
		return err
	}); err != nil {
		b.Fatal(err)
	}
	select {
	case <-all:
	case <-time.After(time.Minute):
		b.Fatalf("relay sent %d of %d in a minute", sent.Load(), b.N)
	}
	// Published is not yet deleted (marked): wait for that, then purge
	// what was kept.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
		st, err := rstore.OutboxStats(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if st.Pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d rows still pending a minute after their publish", st.Pending)
		}
	}
	// The relay's own purge may hold some rows (a purge skips rows
	// another has locked): purge until none is left.
	for deadline := time.Now().Add(time.Minute); ; {
		if _, err := rstore.PurgeOutbox(ctx, &idemdriver.PurgeOutboxParams{Retention: time.Microsecond, Limit: 1000}); err != nil {
			b.Fatal(err)
		}
		var left int
		if err := bb.pool.QueryRow(ctx, `SELECT count(*) FROM `+bb.table+`_outbox`).Scan(&left); err != nil {
			b.Fatal(err)
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d rows left a minute after their purge", left)
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	if sent.Load() != int64(b.N) {
		b.Fatalf("sent %d of %d", sent.Load(), b.N)
	}
	rate := float64(b.N) / elapsed.Seconds()
	b.ReportMetric(rate, "msgs/s")
	b.ReportMetric(float64(b.N)/float64(rounds.Load()), "msgs/round")
	m.report(b, b.N)
	w.report(b, b.N)
	return rate
}

// relayMode is how processRelayed's rows are sent.
type relayMode int

const (
	relayDelete relayMode = iota // an idem.Relay, deleting rows once sent
	relayKeep                    // an idem.Relay with KeepSent
	relayLocked                  // an idem.Relay with LockedRounds
)

// processBestRelayed is the hand-written outbox, the least a person can
// write to emit one outgoing message per incoming one with the outbox
// pattern's guarantee (sent after, and only after, the commit; at least
// once): the hand-written consumer (bundle.bestProcess), whose effect and
// an INSERT into a minimal outbox table (an identity key, the outgoing ID,
// destination, key and payload; no other index, no sent rows kept) go in
// one round trip before COMMIT; and two relay loops, woken after each
// commit, each of which in one transaction deletes up to 1,000 rows in
// key order (FOR UPDATE SKIP LOCKED) returning them, publishes them
// (a publisher that confirms at once) and commits. The timed section ends
// when every message was published and its row's delete committed. It
// returns the throughput.
func processBestRelayed(b *testing.B, bb *bundle, payload []byte) float64 {
	b.Helper()
	ctx := context.Background()
	outbox := bb.best + "_outbox"
	if _, err := bb.pool.Exec(ctx, `CREATE TABLE `+outbox+` (seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		id text NOT NULL, destination text NOT NULL, order_key text NOT NULL, payload bytea NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	steady(b, bb)
	rpool := newPool(b, poolOpts{maxConns: 2, url: benchURL()})
	var sent, rounds atomic.Int64
	wake := make(chan struct{}, 1)
	round := func(ctx context.Context) (int, error) {
		tx, err := rpool.Begin(ctx)
		if err != nil {
			return 0, err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		rows, err := tx.Query(ctx, `DELETE FROM `+outbox+` WHERE seq IN (SELECT seq FROM `+outbox+`
			ORDER BY seq LIMIT 1000 FOR UPDATE SKIP LOCKED) RETURNING id, destination, order_key, payload`)
		if err != nil {
			return 0, err
		}
		var out []idem.Outgoing
		for rows.Next() {
			var m idem.Outgoing
			if err := rows.Scan(&m.ID, &m.Destination, &m.Key, &m.Payload); err != nil {
				return 0, err
			}
			out = append(out, m)
		}
		if err := rows.Err(); err != nil {
			return 0, err
		}
		if len(out) > 0 {
			rounds.Add(1)
		}
		sent.Add(int64(len(out))) // the publish, confirmed at once
		return len(out), tx.Commit(ctx)
	}
	rctx, cancel := context.WithCancel(ctx)
	var relays sync.WaitGroup
	for range 2 {
		relays.Go(func() {
			for rctx.Err() == nil {
				n, err := round(rctx)
				if err != nil && rctx.Err() == nil {
					b.Error(err)
					return
				}
				if n < 1000 {
					idleWait(rctx, wake)
				}
			}
		})
	}
	defer func() { cancel(); relays.Wait() }()
	return timeRelayed(b, bb, rpool, outbox, wake, &sent, &rounds, func(ctx context.Context, id string) error {
		tx, claimed, err := bb.bestClaim(ctx, id)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if !claimed {
			return errors.New("not claimed")
		}
		batch := &pgx.Batch{}
		batch.Queue(`INSERT INTO `+bb.effects+` (key) VALUES ($1)`, id)
		batch.Queue(`INSERT INTO `+outbox+` (id, destination, order_key, payload) VALUES ($1, $2, $3, $4)`,
			id+"/charged", "orders.charged", id, payload)
		if err := tx.SendBatch(ctx, batch).Close(); err != nil {
			return err
		}
		return tx.Commit(ctx)
	})
}

// checkedVariant is a variant of best_checked_outbox1 (see
// processCheckedRelayed).
type checkedVariant struct {
	hashedID bool // idem's derived outgoing ID instead of checkedID's own
	locked   bool // rounds that hold their rows by lock through the publish
}

// timeRelayed is the timed section of a hand-written outbox case: process
// of b.N new message IDs across the workers, each followed by a wake-up
// of the relay loops (wake), until every message was published (sent
// counts them, rounds the publishes) and outbox is empty. It reports the
// throughput, the messages per publish, the CPU per message (the backends
// of bb's pool and of the relay's rpool) and the WAL per message, and
// returns the throughput.
func timeRelayed(b *testing.B, bb *bundle, rpool *pgxpool.Pool, outbox string, wake chan<- struct{}, sent, rounds *atomic.Int64,
	process func(ctx context.Context, id string) error) float64 {
	b.Helper()
	ctx := context.Background()
	m := startCPUs(b, bb.pool, rpool)
	w := startWAL(b, bb)
	prefix := benchPrefix()
	b.ResetTimer()
	start := time.Now()
	if err := runOps(ctx, b, func(ctx context.Context, i int64) error {
		if err := process(ctx, prefix+strconv.FormatInt(i, 10)); err != nil {
			return fmt.Errorf("message %d: %w", i, err)
		}
		select {
		case wake <- struct{}{}:
		default:
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
		var left int
		if err := bb.pool.QueryRow(ctx, `SELECT count(*) FROM `+outbox).Scan(&left); err != nil {
			b.Fatal(err)
		}
		if left == 0 && sent.Load() == int64(b.N) {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("sent %d of %d, %d rows left a minute after the last commit", sent.Load(), b.N, left)
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	rate := float64(b.N) / elapsed.Seconds()
	b.ReportMetric(rate, "msgs/s")
	b.ReportMetric(float64(b.N)/float64(rounds.Load()), "msgs/round")
	m.report(b, b.N)
	w.report(b, b.N)
	return rate
}

// processCheckedRelayed is the hand-written outbox with idem's outbox
// guarantees (checkedOutbox, on best_checked's consumer: the processed
// table with the payload's fingerprint and the purge index,
// bundle.checkedProcessEmit): each new message's effect and outbox INSERT
// go in one round trip before the COMMIT, and two relay loops on a pool of
// two connections of their own, woken after each commit, claim (a lease),
// publish (a publisher that confirms at once) and delete each round's rows
// with their next claim (v.locked: each round holds its rows' locks
// through the publish, checkedOutbox.lockedRound). The outgoing ID is
// checkedID's (v.hashedID: idem's derived one). The timed section ends
// when every message was published and its row's delete committed. It
// returns the throughput.
func processCheckedRelayed(b *testing.B, bb *bundle, payload []byte, v checkedVariant) float64 {
	b.Helper()
	ctx := context.Background()
	checkedSetup(b, bb)
	ob := newCheckedOutbox(bb.effects + "_cob")
	ob.locked = v.locked
	if err := ob.create(ctx, bb.pool); err != nil {
		b.Fatal(err)
	}
	steady(b, bb)
	rpool := newPool(b, poolOpts{maxConns: 2, url: benchURL()})
	var sent, rounds atomic.Int64
	pub := idem.PublisherFunc(func(_ context.Context, m []idem.Outgoing) []error {
		rounds.Add(1)
		sent.Add(int64(len(m)))
		return make([]error, len(m))
	})
	wake := make(chan struct{}, 1)
	rctx, cancel := context.WithCancel(ctx)
	var relays sync.WaitGroup
	for range 2 {
		relays.Go(func() {
			if err := ob.run(rctx, rpool, pub, wake); err != nil {
				b.Error(err)
			}
		})
	}
	defer func() { cancel(); relays.Wait() }()
	return timeRelayed(b, bb, rpool, ob.table, wake, &sent, &rounds, func(ctx context.Context, id string) error {
		claimed, err := bb.checkedProcessEmit(ctx, id, payload, func(batch *pgx.Batch) {
			ob.emit(batch, checkedID("bench", id, v.hashedID), "orders.charged", id, payload)
		})
		if err == nil && !claimed {
			err = errors.New("not claimed")
		}
		return err
	})
}
