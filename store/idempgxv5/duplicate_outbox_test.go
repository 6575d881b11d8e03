package idempgxv5_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
)

// TestDuplicateLeavesOutboxAlone: a duplicate of a message whose handler
// emitted, delivered to a Consumer with a Relay, sends no statement that
// reads or writes the outbox table (it wakes the relay instead), so its
// cost does not grow with the outbox's backlog. A lookup of the message's
// pending rows has no index to use: with 200,000 pending rows it took
// 72 ms per duplicate, against 0.16 ms without it.
func TestDuplicateLeavesOutboxAlone(t *testing.T) {
	ctx := context.Background()
	tr := &outboxStatements{}
	pool := tracedPool(t, tr)
	b := setupOn(t, pool)
	if _, err := pool.Exec(ctx, `INSERT INTO `+b.table+`_outbox (id, consumer, source_id, destination, payload)
		SELECT 'o-' || g, 'c', 's-' || g, 'd', '\x7b7d'::bytea FROM generate_series(1, 1000) g`); err != nil {
		t.Fatal(err)
	}
	r, err := idem.NewRelay(idem.RelayConfig{Store: b.store, Publisher: confirmAll})
	if err != nil {
		t.Fatal(err)
	}
	c, err := idem.NewConsumer[pgx.Tx](b.store, idem.Config{Name: "c", PurgeInterval: -1, Relay: r})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h := func(ctx context.Context, _ pgx.Tx, msg idem.Message) error {
		_, err := idem.Emit(ctx, idem.OutgoingMessage{Destination: "d", Payload: msg.Payload})
		return err
	}
	if out, err := c.Process(ctx, idem.Message{ID: "m", Payload: []byte("p")}, h); err != nil || out.Status != idem.Processed {
		t.Fatalf("first delivery: %v, %v", out.Status, err)
	}
	if n := tr.n.Load(); n == 0 {
		t.Fatal("the tracer saw no outbox statement for the emitting delivery; it does not see what it should")
	}
	tr.n.Store(0)
	for i := range 3 {
		if out, err := c.Process(ctx, idem.Message{ID: "m", Payload: []byte("p")}, h); err != nil || out.Status != idem.Duplicate {
			t.Fatalf("redelivery %d: %v, %v; want Duplicate", i+1, out.Status, err)
		}
	}
	if n := tr.n.Load(); n != 0 {
		t.Errorf("3 duplicates sent %d statements on the outbox table, want none", n)
	}
	checkPoolAfterWake(t, pool)
}

// outboxStatements is a pgx query and batch tracer that counts the
// statements naming an outbox table ("_outbox").
type outboxStatements struct{ n atomic.Int64 }

func (o *outboxStatements) count(sql string) {
	if strings.Contains(sql, "_outbox") {
		o.n.Add(1)
	}
}

func (o *outboxStatements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	o.count(d.SQL)
	return ctx
}

func (o *outboxStatements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (o *outboxStatements) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (o *outboxStatements) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	o.count(d.SQL)
}

func (o *outboxStatements) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
