package console_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/idemsql"
)

// pgStore is a migrated idemsql store on PostgreSQL (IDEM_TEST_POSTGRES_URL)
// on tables of its own, dropped at the end.
func pgStore(t *testing.T) (*idemsql.Store, *sql.DB, string) {
	t.Helper()
	u := testenv.URL(t, "IDEM_TEST_POSTGRES_URL", "postgres://idem:idem@127.0.0.1:5432/idem_test?sslmode=disable")
	db, err := sql.Open("pgx", u)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	table := "idem_console_" + hex.EncodeToString(b)
	st, err := idemsql.New(db, idemsql.Postgres, &idemsql.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		for _, tb := range []string{"", "_steps", "_runs", "_migrations", "_outbox"} {
			_, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS "+table+tb)
		}
		_, _ = db.ExecContext(ctx, "DROP FUNCTION IF EXISTS "+table+"_outbox_notify()")
		_, _ = db.ExecContext(ctx, "DROP DOMAIN IF EXISTS "+table+"_outbox_id, "+table+"_outbox_str")
		db.Close()
	})
	return st, db, table
}

// On PostgreSQL, failed work made by a real LeaseConsumer and a real
// Relay is listed by the console, and a retry confirmed twice acts once:
// the consumer's handler and the publisher each run once more, and the
// rows say so.
func TestPostgresFailedWorkRetriedOnce(t *testing.T) {
	store, db, table := pgStore(t)
	_, reprocess := poisoned(t, store, "payments", "pay-1", "pay-2")

	tx, err := store.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := store.EmitTx(t.Context(), tx, &idemdriver.EmitParams{Consumer: "payments", Messages: []idemdriver.OutgoingRecord{
		{ID: "out-1", SourceID: "pay-1", Consumer: "payments", Destination: "receipts", Payload: []byte("secret payload")},
		{ID: "out-2", SourceID: "pay-2", Consumer: "payments", Destination: "receipts", Payload: []byte("secret payload")},
	}}); err != nil {
		t.Fatal(err)
	}
	if err := store.Commit(t.Context(), tx); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	published := map[string]int{}
	fail := true
	relay, err := idem.NewRelay(idem.RelayConfig{Store: store, Publisher: idem.PublisherFunc(func(_ context.Context, msgs []idem.Outgoing) []error {
		mu.Lock()
		defer mu.Unlock()
		errs := make([]error, len(msgs))
		for i, m := range msgs {
			if fail {
				errs[i] = idem.Permanent(errors.New("no route to receipts"))
				continue
			}
			published[m.ID]++
		}
		return errs
	})})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := relay.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}

	f := newFixture(t, store, console.Config{})
	var page console.RecordPageView
	_, js, _ := f.get("/api/failed?consumer=payments")
	if err := json.Unmarshal([]byte(js), &page); err != nil || len(page.Records) != 2 {
		t.Fatalf("api/failed: %s (%v)", js, err)
	}
	var ob console.OutboxView
	_, js, _ = f.get("/api/outbox")
	if err := json.Unmarshal([]byte(js), &ob); err != nil || len(ob.Groups) != 1 || ob.Groups[0].Count != 2 || len(ob.Rows) != 2 {
		t.Fatalf("api/outbox: %s (%v)", js, err)
	}
	if strings.Contains(js, "secret payload") {
		t.Errorf("payload shown without ShowPayloads: %s", js)
	}

	form := f.confirmForm("action=retry&consumer=payments&id=pay-1")
	for range 2 {
		if code, body := f.post("/action", form); code != http.StatusOK {
			t.Fatalf("retry: %d %s", code, body)
		}
	}
	outForm := f.confirmForm("action=retry-outbox&outbox_id=out-1")
	for range 2 {
		if code, body := f.post("/action", outForm); code != http.StatusOK {
			t.Fatalf("outbox retry: %d %s", code, body)
		}
	}
	if n := reprocess(); n != 1 {
		t.Errorf("handler ran %d times after the retry, want 1", n)
	}
	mu.Lock()
	fail = false
	mu.Unlock()
	for range 3 {
		if _, err := relay.RunOnce(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if published["out-1"] != 1 || published["out-2"] != 0 {
		t.Errorf("published %v, want out-1 once and out-2 never", published)
	}
	var completed, failed int
	if err := db.QueryRowContext(t.Context(), "SELECT count(*) FILTER (WHERE state = 2), count(*) FILTER (WHERE state = 3) FROM "+table+" WHERE consumer_key = (SELECT key FROM "+table+"_consumers WHERE name = 'payments')").Scan(&completed, &failed); err != nil {
		t.Fatal(err)
	}
	if completed != 1 || failed != 1 {
		t.Errorf("rows: %d completed, %d failed; want 1 and 1", completed, failed)
	}
	// The relay deletes a row once its send is confirmed: out-1 is gone,
	// out-2 is still failed for good.
	var left, failedOut int
	if err := db.QueryRowContext(t.Context(), "SELECT count(*), count(*) FILTER (WHERE id = 'out-2' AND failed_at IS NOT NULL) FROM "+table+"_outbox").Scan(&left, &failedOut); err != nil {
		t.Fatal(err)
	}
	if left != 1 || failedOut != 1 {
		t.Errorf("outbox: %d rows left, %d of them out-2 failed; want out-2 alone, failed", left, failedOut)
	}
}
