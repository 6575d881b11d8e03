package idempgxv5_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/jackc/pgx/v5"
)

// BenchmarkOutbox measures what the outbox costs a consumer, in one run:
//   - idem: Consumer.Process of a new message whose handler writes one
//     effect row (BenchmarkProcess's idem);
//   - idem_outbox1: the same handler also emits one outgoing message (one
//     more INSERT in the transaction, quiet: the Store notifies relays
//     after the commit);
//   - idem_outbox1_notify_in_tx: the same with the table's trigger
//     notifying inside every transaction, as before migration 005 (its
//     function put back as it was), to show what that costs;
//   - relay: a Relay sending those rows through a publisher that confirms
//     at once, in batches of 100 (claim, then one mark per batch): the
//     store's share of the relay's throughput, msgs/s;
//   - relay_workers4: the same with four rounds in flight (RelayConfig.Workers).
//
// The processing cases report their ratio to idem in the same round
// (x-outbox_idem). They run on the durable PostgreSQL when
// IDEM_TEST_POSTGRES_DURABLE_URL is set (see benchURL).
//
// Run: IDEM_BENCH_ROUNDS=3 go test -run '^$' -bench BenchmarkOutbox -benchtime 2s
func BenchmarkOutbox(b *testing.B) {
	for range benchRounds {
		benchOutboxRound(b)
	}
}

// benchOutboxRound runs each case of BenchmarkOutbox once.
func benchOutboxRound(b *testing.B) {
	payload := []byte(`{"order":"o-1","amount":200}`)
	process := func(b *testing.B, name string, emit, notifyInTx bool) {
		bb := benchSetup(b)
		if notifyInTx {
			if _, err := bb.pool.Exec(context.Background(), `CREATE OR REPLACE FUNCTION `+bb.table+`_outbox_notify() RETURNS trigger
				LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_notify('`+bb.table+`_outbox', ''); RETURN NULL; END $$`); err != nil {
				b.Fatal(err)
			}
		}
		c := bb.consumer(b, "bench")
		effect := bb.effectHandler()
		h := effect
		if emit {
			h = func(ctx context.Context, tx pgx.Tx, msg idem.Message) error {
				if err := effect(ctx, tx, msg); err != nil {
					return err
				}
				_, err := idem.Emit(ctx, idem.OutgoingMessage{Destination: "orders.charged", Key: msg.ID, Payload: msg.Payload})
				return err
			}
		}
		reportRatios(b, name, processNew(b, bb, c, h, payload), "outbox_idem")
	}
	b.Run("idem", func(b *testing.B) { process(b, "outbox_idem", false, false) })
	b.Run("idem_outbox1", func(b *testing.B) { process(b, "idem_outbox1", true, false) })
	b.Run("idem_outbox1_notify_in_tx", func(b *testing.B) { process(b, "idem_outbox1_notify_in_tx", true, true) })
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
			Publisher: idem.PublisherFunc(func(_ context.Context, m []idem.Outgoing) []error { return make([]error, len(m)) })})
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
