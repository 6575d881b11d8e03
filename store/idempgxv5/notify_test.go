package idempgxv5_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/jackc/pgx/v5"
)

// Relays are woken after commit, whoever wrote the outbox rows: a
// Consumer's transaction (begun by the Store) is quiet inside, and the
// Store notifies after its commit; a transaction the Store did not begin
// is notified by the table's trigger at its commit; a rolled-back
// consumer transaction notifies nobody.
func TestOutboxNotifiesAfterCommit(t *testing.T) {
	ctx := context.Background()
	b := setup(t, poolOpts{})
	notified := listenOutbox(t, b)

	c := b.consumer(t, "notify")
	var quiet string
	emit := func(ctx context.Context, tx pgx.Tx, msg idem.Message) error {
		if _, err := idem.Emit(ctx, idem.OutgoingMessage{Destination: "d", Payload: msg.Payload}); err != nil {
			return err
		}
		return nil
	}
	out, err := c.Process(ctx, idem.Message{ID: "m1", Payload: []byte("p")}, emit)
	if err != nil || out.Status != idem.Processed {
		t.Fatalf("Process = %v, %v", out.Status, err)
	}
	if !notified(30 * time.Second) {
		t.Fatal("no notification after a consumer's commit")
	}

	// Inside a transaction the Store began, emitting sets the quiet flag.
	tx, err := b.store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.store.EmitTx(ctx, tx, &idemdriver.EmitParams{Consumer: "notify", Messages: []idemdriver.OutgoingRecord{{ID: "o2", Destination: "d", Payload: []byte("p")}}}); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, `SELECT current_setting('idem.outbox_quiet', true)`).Scan(&quiet); err != nil || quiet != "on" {
		t.Errorf("idem.outbox_quiet in the Store's transaction = %q, %v; want on", quiet, err)
	}
	if err := b.store.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if !notified(30 * time.Second) {
		t.Fatal("no notification after the commit of a Store transaction that emitted")
	}

	// A transaction the Store did not begin: the trigger notifies.
	ptx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.store.EmitTx(ctx, ptx, &idemdriver.EmitParams{Consumer: "notify", Messages: []idemdriver.OutgoingRecord{{ID: "o3", Destination: "d", Payload: []byte("p")}}}); err != nil {
		t.Fatal(err)
	}
	var set *string
	if err := ptx.QueryRow(ctx, `SELECT current_setting('idem.outbox_quiet', true)`).Scan(&set); err != nil || (set != nil && *set == "on") {
		t.Errorf("idem.outbox_quiet in the caller's own transaction is on (%v)", err)
	}
	if err := ptx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if !notified(30 * time.Second) {
		t.Fatal("no notification from the trigger for a transaction the Store did not begin")
	}

	// A handler error rolls the rows back, and nobody is woken.
	boom := errors.New("boom")
	if _, err := c.Process(ctx, idem.Message{ID: "m4", Payload: []byte("p")}, func(ctx context.Context, tx pgx.Tx, msg idem.Message) error {
		if err := emit(ctx, tx, msg); err != nil {
			return err
		}
		return boom
	}); !errors.Is(err, boom) {
		t.Fatalf("Process with a failing handler = %v, want boom", err)
	}
	if notified(200 * time.Millisecond) {
		t.Error("a notification after a rolled-back emission")
	}
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.table+`_outbox`).Scan(&n); err != nil || n != 3 {
		t.Errorf("%d outbox rows, %v; want 3", n, err)
	}
}

// listenOutbox LISTENs on b's outbox channel and returns notified, which
// reports whether a notification arrives within wait (generous for one
// that must come; short for one that must not: a notification is
// delivered at its commit, before the writer's Commit returns, so it is
// already queued when notified is called; the Store's own is sent right
// after the commit).
func listenOutbox(t *testing.T, b *bundle) (notified func(wait time.Duration) bool) {
	t.Helper()
	ctx := context.Background()
	listener, err := pgx.Connect(ctx, testURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = listener.Close(ctx) })
	if _, err := listener.Exec(ctx, `LISTEN "`+b.table+`_outbox"`); err != nil {
		t.Fatal(err)
	}
	return func(wait time.Duration) bool {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		_, err := listener.WaitForNotification(wctx)
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatal(err)
		}
		return err == nil
	}
}
