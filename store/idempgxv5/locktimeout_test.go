package idempgxv5_test

import (
	"context"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A claim's lock timeout is its own: on every claim path (BeginClaim,
// ClaimTx through ProcessTx, the batch claim) the handler's statements
// see the session's lock_timeout, not the claim's.
func TestClaimLockTimeoutIsTheClaimsOwn(t *testing.T) {
	t.Parallel()
	direct := setup(t, poolOpts{})
	cfg, err := pgxpool.ParseConfig(testURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["lock_timeout"] = "7s"
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := idempgxv5.New(pool, &idempgxv5.Config{Table: direct.table})
	if err != nil {
		t.Fatal(err)
	}
	c, err := idem.NewConsumer(store, idem.Config{Name: "lt", StoreTimeout: 4 * time.Second, PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	setting := func(ctx context.Context, tx pgx.Tx) string {
		var v string
		if err := tx.QueryRow(ctx, `SELECT current_setting('lock_timeout')`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	check := func(path string, got string) {
		if got != "7s" {
			t.Errorf("%s: the handler sees lock_timeout %q, want the session's 7s (the claim's is 2s)", path, got)
		}
	}
	ctx := t.Context()
	if _, err := c.Process(ctx, idem.Message{ID: "a"}, func(ctx context.Context, tx pgx.Tx, _ idem.Message) error {
		check("Process", setting(ctx, tx))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ProcessTx(ctx, tx, idem.Message{ID: "b"}, func(ctx context.Context, tx pgx.Tx, _ idem.Message) error {
		check("ProcessTx", setting(ctx, tx))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	check("ProcessTx, after it returned", setting(ctx, tx))
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ProcessBatch(ctx, []idem.Message{{ID: "c"}, {ID: "d"}}, func(ctx context.Context, tx pgx.Tx, _ []idem.Message) error {
		check("ProcessBatch", setting(ctx, tx))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n := direct.countRecords(t, "lt"); n != 4 {
		t.Errorf("records: %d, want 4", n)
	}
}
