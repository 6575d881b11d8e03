package idempgxv5_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/faultproxy"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestStalledConnections stalls every store connection of several
// consumers mid-run (a fault proxy stops forwarding and closes nothing,
// as a half-open connection or a black-holed network does; connections
// made afterwards work). The store deadline frees the deliveries caught
// in a claim or a commit, the pool drops their connections, the claims
// of redeliveries that find a record locked by a stalled session give up
// at the lock timeout and come back, and the server ends the stalled
// sessions at idle_in_transaction_session_timeout, releasing their
// locks. Every message then has its effect exactly once: 0 double, 0
// lost, counted in the database.
func TestStalledConnections(t *testing.T) {
	t.Parallel()
	const (
		messages     = 400
		workers      = 6
		storeTimeout = 2 * time.Second
		idleInTx     = 4 * time.Second
		// stmtTimeout bounds the handler's own statement, as a handler
		// should (its statements are bounded by its context alone).
		stmtTimeout = 2 * time.Second
	)
	direct := setup(t, poolOpts{})
	proxy, url := faultproxy.URL(t, testURL(t))
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = workers + 2
	cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = idleInTx.String()
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		proxy.Close() // the network is back: the pool's stalled connections end
		pool.Close()
	})
	store, err := idempgxv5.New(pool, &idempgxv5.Config{Table: direct.table})
	if err != nil {
		t.Fatal(err)
	}
	c, err := idem.NewConsumer(store, idem.Config{Name: "stall", StoreTimeout: storeTimeout, PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute) // the broker's handler timeout, far away
	defer cancel()
	rep := faultproxy.Deliver(ctx, t, faultproxy.Delivery[pgx.Tx]{
		Consumer: c, Messages: messages, Workers: workers, FaultAt: messages / 3,
		Fault: func() { t.Logf("stalled %d connections", proxy.Stall()) },
		Effect: func(ctx context.Context, tx pgx.Tx, id string) error {
			ctx, cancel := context.WithTimeout(ctx, stmtTimeout)
			defer cancel()
			_, err := tx.Exec(ctx, `INSERT INTO `+direct.effects+` (key) VALUES ($1)`, id)
			return err
		},
	})
	t.Logf("PostgreSQL via pgx, StoreTimeout %v, idle_in_transaction_session_timeout %v: %v", storeTimeout, idleInTx, rep)

	var rows, distinct, records int
	if err := direct.pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT key) FROM `+direct.effects).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	records = direct.countRecords(t, "stall")
	t.Logf("effects: %d rows, %d distinct (double %d, lost %d); records %d", rows, distinct, rows-distinct, messages-distinct, records)
	if rows != messages || distinct != messages || records != messages {
		t.Errorf("effects: %d rows, %d distinct, records %d; want %d of each (0 double, 0 lost)", rows, distinct, records, messages)
	}
	if rep.Hit == 0 || rep.TimedOut == 0 {
		t.Errorf("the stall hit no delivery or none timed out: %v", rep)
	}
	if bound := storeTimeout + idleInTx + 5*time.Second; rep.Recovery > bound {
		t.Errorf("recovered %v after the stall, want at most %v (store timeout + idle_in_transaction_session_timeout + margin)", rep.Recovery, bound)
	}
}

// TestRelayMarksOverSlowNetwork: a relay round whose publisher refuses
// every message, and the network to PostgreSQL turns slow just after the
// claim (a fault proxy holds each answer 400ms). The 30 rows are marked
// with one statement, in well under the 12s that one mark per row would
// take (past the 10s a mark may take), counted in the table: every row
// back to pending with its error, none left claimed until its lease ends.
func TestRelayMarksOverSlowNetwork(t *testing.T) {
	t.Parallel()
	const rows = 30
	direct := setup(t, poolOpts{})
	ctx := t.Context()
	msgs := make([]idemdriver.OutgoingRecord, rows)
	for i := range msgs {
		msgs[i] = idemdriver.OutgoingRecord{ID: "slow-" + strconv.Itoa(i), Destination: "d", Payload: []byte("p")}
	}
	tx, err := direct.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := direct.store.EmitTx(ctx, tx, &idemdriver.EmitParams{Consumer: "c", Messages: msgs}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	proxy, url := faultproxy.URL(t, testURL(t))
	store, err := idempgxv5.New(newPool(t, poolOpts{url: url}), &idempgxv5.Config{Table: direct.table})
	if err != nil {
		t.Fatal(err)
	}
	refuse := idem.PublisherFunc(func(_ context.Context, out []idem.Outgoing) []error {
		proxy.Slow(400 * time.Millisecond) // from the first mark on
		errs := make([]error, len(out))
		for i := range errs {
			errs[i] = errors.New("broker refused")
		}
		return errs
	})
	r, err := idem.NewRelay(idem.RelayConfig{Store: store, Publisher: refuse, BatchSize: rows, Lease: 5 * time.Minute, Retention: -1})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res, err := r.RunOnce(ctx)
	took := time.Since(start)
	if err != nil || res.Claimed != rows || res.Retried != rows {
		t.Errorf("RunOnce = %+v, %v after %v; want %d claimed and retried, no error", res, err, took, rows)
	}
	var marked int
	if err := direct.pool.QueryRow(ctx, `SELECT count(*) FROM `+direct.table+`_outbox
		WHERE lease_until IS NULL AND last_error IS NOT NULL AND sent_at IS NULL AND failed_at IS NULL`).Scan(&marked); err != nil {
		t.Fatal(err)
	}
	if marked != rows {
		t.Errorf("%d of %d rows marked for retry after a round of %v", marked, rows, took)
	}
	if took < 400*time.Millisecond || took > 6*time.Second {
		t.Errorf("the round took %v, want from 400ms (the slow answers in place) to 6s (one mark per row takes 12s)", took)
	}
}
