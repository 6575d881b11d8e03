package idemsql_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idemsql"
)

// TestEmitRelayWokenQuiet checks EmitParams.RelayWoken on PostgreSQL: a
// transaction whose emit sets it commits without notifying the outbox's
// channel, one whose emit does not notifies once, and both write their
// rows. A listener receives notifications in commit order, so a final
// NOTIFY of its own ends the count.
func TestEmitRelayWokenQuiet(t *testing.T) {
	t.Parallel()
	e := newEnv(t, idemsql.Postgres, envOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, serverURL(t, envPostgres))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	channel := `"` + e.table + `_outbox"`
	if _, err := conn.Exec(ctx, `LISTEN `+channel); err != nil {
		t.Fatal(err)
	}
	emit := func(id string, woken bool) {
		tx, err := e.store.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		p := &idemdriver.EmitParams{Consumer: "c", RelayWoken: woken,
			Messages: []idemdriver.OutgoingRecord{{ID: id, Destination: "d", Payload: []byte(id)}}}
		if err := e.store.EmitTx(ctx, tx, p); err != nil {
			_ = tx.Rollback()
			t.Fatalf("EmitTx(%s): %v", id, err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	emit("woken", true)
	emit("plain", false)
	if _, err := e.db.ExecContext(ctx, `SELECT pg_notify($1, 'end')`, e.table+"_outbox"); err != nil {
		t.Fatal(err)
	}
	var fromEmits int
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			t.Fatalf("waiting for the notifications: %v", err)
		}
		if n.Payload == "end" {
			break
		}
		fromEmits++
	}
	if fromEmits != 1 {
		t.Errorf("%d notifications from the two emits' commits, want 1 (the one without RelayWoken)", fromEmits)
	}
	st, err := e.store.OutboxStats(ctx)
	if err != nil || st.Pending != 2 {
		t.Errorf("OutboxStats = %+v, %v; want both rows pending", st, err)
	}
}
