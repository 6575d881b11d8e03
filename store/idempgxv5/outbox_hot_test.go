package idempgxv5_test

import (
	"context"
	"testing"

	"github.com/idem-go/idem"
)

// TestOutboxClaimsUpdateInPlace checks that the relay's claims of rows a
// producer inserted are heap-only updates (no new index entries, the new
// version on the row's page), which the outbox table's fill factor of 50
// makes possible: on full pages nearly every claim wrote a new version
// elsewhere and an entry in each index. Each row is then deleted, once
// sent, by the relay's one statement. Every statement runs on the one
// connection of the pool, whose statistics are flushed before they are
// read.
func TestOutboxClaimsUpdateInPlace(t *testing.T) {
	testURL(t)
	b := setup(t, poolOpts{maxConns: 1})
	ctx := context.Background()
	outbox := b.table + "_outbox"
	const n = 2000
	if _, err := b.pool.Exec(ctx, `INSERT INTO `+outbox+` (id, destination, order_key, payload)
		SELECT 'id-' || g, 'orders', 'order-' || g, '\x7b7d'::bytea FROM generate_series(1, $1::int) g`, n); err != nil {
		t.Fatal(err)
	}
	var published int
	r, err := idem.NewRelay(idem.RelayConfig{Store: b.store, Retention: -1,
		Publisher: idem.PublisherFunc(func(_ context.Context, m []idem.Outgoing) []error {
			published += len(m)
			return make([]error, len(m))
		})})
	if err != nil {
		t.Fatal(err)
	}
	for {
		res, err := r.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res.Claimed == 0 {
			break
		}
	}
	if published != n {
		t.Fatalf("published %d messages, want %d", published, n)
	}
	if _, err := b.pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		t.Fatal(err)
	}
	var upd, hot, del, left int64
	if err := b.pool.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd, n_tup_del, (SELECT count(*) FROM `+outbox+`)
		FROM pg_stat_user_tables WHERE relid = $1::regclass`, outbox).Scan(&upd, &hot, &del, &left); err != nil {
		t.Fatal(err)
	}
	if left != 0 || del < n {
		t.Fatalf("%d rows left, %d deleted, want none left and %d deleted once sent", left, del, n)
	}
	if upd < n {
		t.Fatalf("%d updates counted, want at least %d (a claim per row)", upd, n)
	}
	if hot < n*9/10 {
		t.Errorf("%d of %d updates were heap-only, want at least %d (the claims)", hot, upd, n*9/10)
	}
	t.Logf("%d of %d updates heap-only", hot, upd)
}
