//go:build !nodemo

package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestDemoThroughPgBouncer runs the story with PostgreSQL behind PgBouncer
// in transaction pooling as the store, given as a plain URL: the command
// finds that the pooler refuses its session settings, connects without
// them in a query exec mode that prepares no named statement, and every
// payment is charged once, none twice, none lost. The run has a database
// of its own (PgBouncer forwards every name), so that it shares no table
// with the other demo tests on the test PostgreSQL.
func TestDemoThroughPgBouncer(t *testing.T) {
	t.Parallel()
	bouncer := serviceURL(t, "IDEM_TEST_PGBOUNCER_URL")
	direct := serviceURL(t, "IDEM_TEST_POSTGRES_URL")
	var b [6]byte
	_, _ = rand.Read(b[:])
	db := "idem_demo_pgb_" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, direct)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, `CREATE DATABASE `+db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c, err := pgx.Connect(ctx, direct)
		if err != nil {
			t.Errorf("drop %s: %v", db, err)
			return
		}
		defer c.Close(ctx)
		// FORCE ends PgBouncer's server connections to it.
		if _, err := c.Exec(ctx, `DROP DATABASE IF EXISTS `+db+` WITH (FORCE)`); err != nil {
			t.Errorf("drop %s: %v", db, err)
		}
	})
	u, err := url.Parse(bouncer)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + db
	rep, _ := demoJSON(t, "--store", u.String(), "--messages", "400", "--crash-rate", "0.02", "--consumers", "3")
	wantChargedOnce(t, rep, 400)
	if !strings.Contains(rep.Store, "through a pooler") {
		t.Errorf("store %q: want postgres through a pooler", rep.Store)
	}
}
