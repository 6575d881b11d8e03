package idempgxv5_test

import (
	"context"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/jackc/pgx/v5"
)

// A Consumer whose Config.Relay is set wakes that relay after its commit,
// so the Store sends no notification for the rows: EmitParams.RelayWoken.
// A transaction that also emitted rows without it is notified as before.
func TestOutboxRelayWokenIsNotNotified(t *testing.T) {
	ctx := context.Background()
	b := setup(t, poolOpts{})
	notified := listenOutbox(t, b)
	var sent []string
	r, err := idem.NewRelay(idem.RelayConfig{Store: b.store, Publisher: idem.PublisherFunc(func(_ context.Context, m []idem.Outgoing) []error {
		for _, o := range m {
			sent = append(sent, o.Destination)
		}
		return make([]error, len(m))
	})})
	if err != nil {
		t.Fatal(err)
	}
	c, err := idem.NewConsumer[pgx.Tx](b.store, idem.Config{Name: "woken", PurgeInterval: -1, Relay: r})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	out, err := c.Process(ctx, idem.Message{ID: "m1", Payload: []byte("p")}, func(ctx context.Context, _ pgx.Tx, _ idem.Message) error {
		_, err := idem.Emit(ctx, idem.OutgoingMessage{Destination: "d1", Payload: []byte("p")})
		return err
	})
	if err != nil || out.Status != idem.Processed {
		t.Fatalf("Process = %v, %v", out.Status, err)
	}
	if notified(500 * time.Millisecond) {
		t.Error("a notification after the commit of a Consumer that wakes its own relay")
	}
	// The woken relay sends the row.
	res, err := r.RunOnce(ctx)
	if err != nil || res.Sent != 1 || len(sent) != 1 || sent[0] != "d1" {
		t.Fatalf("RunOnce = %+v, %v; sent %v; want the row of d1", res, err, sent)
	}

	// A Store transaction: rows with RelayWoken, then rows without.
	emit := func(tx pgx.Tx, id string, woken bool) {
		t.Helper()
		if err := b.store.EmitTx(ctx, tx, &idemdriver.EmitParams{Consumer: "woken", RelayWoken: woken,
			Messages: []idemdriver.OutgoingRecord{{ID: id, Destination: "d", Payload: []byte("p")}}}); err != nil {
			t.Fatal(err)
		}
	}
	tx, err := b.store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	emit(tx, "o2", true)
	if err := b.store.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if notified(500 * time.Millisecond) {
		t.Error("a notification after a Store transaction whose rows were all RelayWoken")
	}
	tx, err = b.store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	emit(tx, "o3", true)
	emit(tx, "o4", false)
	if err := b.store.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if !notified(30 * time.Second) {
		t.Fatal("no notification after a Store transaction that also emitted rows without RelayWoken")
	}
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.table+`_outbox WHERE id IN ('o2', 'o3', 'o4')`).Scan(&n); err != nil || n != 3 {
		t.Errorf("%d outbox rows, %v; want 3", n, err)
	}
}
