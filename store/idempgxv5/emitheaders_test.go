package idempgxv5_test

import (
	"context"
	"testing"

	"github.com/idem-go/idem/idemdriver"
	"github.com/jackc/pgx/v5"
)

// An emit none of whose messages has headers leaves the headers column
// to its default: its rows hold '{}', as the rows an emit with headers
// writes for a message without any. Each form is sent quiet (a
// transaction the Store began: EmitCommit, EmitTx) and not (the caller's
// own transaction: EmitTx), one and several rows, with and without
// headers side by side; every row ends with the headers it was given.
func TestEmitHeadersDefault(t *testing.T) {
	ctx := context.Background()
	b := setup(t, poolOpts{maxConns: 2})
	rec := func(id string, h map[string]string) idemdriver.OutgoingRecord {
		return idemdriver.OutgoingRecord{ID: id, Consumer: "eh", SourceID: "s", Destination: "d", Key: id, Payload: []byte("p"), Headers: h}
	}
	trace := map[string]string{"trace": "t1"}
	want := map[string]string{}
	emits := [][]idemdriver.OutgoingRecord{
		{rec("none", nil)},
		{rec("none-1", nil), rec("none-2", map[string]string{})},
		{rec("mixed-1", nil), rec("mixed-2", trace)},
		{rec("only", trace)},
	}
	for _, rs := range emits {
		for _, r := range rs {
			want[r.ID] = "{}"
			if len(r.Headers) > 0 {
				want[r.ID] = `{"trace": "t1"}`
			}
		}
	}
	type way struct {
		name string
		emit func(p *idemdriver.EmitParams) error
	}
	ways := []way{
		{"EmitCommit", func(p *idemdriver.EmitParams) error {
			tx, err := b.store.Begin(ctx)
			if err != nil {
				return err
			}
			return b.store.EmitCommit(ctx, tx, p)
		}},
		{"EmitTx in the Store's transaction", func(p *idemdriver.EmitParams) error {
			tx, err := b.store.Begin(ctx)
			if err != nil {
				return err
			}
			if err := b.store.EmitTx(ctx, tx, p); err != nil {
				_ = b.store.Rollback(ctx, tx)
				return err
			}
			return b.store.Commit(ctx, tx)
		}},
		{"EmitTx in the caller's transaction", func(p *idemdriver.EmitParams) error {
			return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return b.store.EmitTx(ctx, tx, p) })
		}},
	}
	for _, w := range ways {
		if _, err := b.pool.Exec(ctx, `DELETE FROM `+b.table+`_outbox`); err != nil {
			t.Fatal(err)
		}
		for _, rs := range emits {
			if err := w.emit(&idemdriver.EmitParams{Consumer: "eh", Messages: rs}); err != nil {
				t.Fatalf("%s: %v", w.name, err)
			}
		}
		rows, err := b.pool.Query(ctx, `SELECT id::text, headers::text FROM `+b.table+`_outbox`)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		var id, h string
		if _, err := pgx.ForEachRow(rows, []any{&id, &h}, func() error { got[id] = h; return nil }); err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Errorf("%s: %d rows %v, want %d", w.name, len(got), got, len(want))
		}
		for id, h := range want {
			if got[id] != h {
				t.Errorf("%s: row %s has headers %q, want %q", w.name, id, got[id], h)
			}
		}
	}
}
