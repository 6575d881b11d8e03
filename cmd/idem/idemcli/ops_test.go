package idemcli

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/clitest"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idemsql"
)

// storeURLs returns the store URLs the operating commands are tested on:
// SQLite always, PostgreSQL and MariaDB from the IDEM_TEST_* variables.
func storeURLs(t *testing.T) map[string]string { return clitest.StoreURLs(t) }

func TestOperatingCommands(t *testing.T) {
	t.Parallel()
	for name, url := range storeURLs(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testOperatingCommands(t, url)
		})
	}
}

func testOperatingCommands(t *testing.T, url string) {
	ctx := context.Background()
	var nonce [4]byte
	_, _ = rand.Read(nonce[:])
	table := "idem_ops_" + hex.EncodeToString(nonce[:])
	flags := []string{"--store", url, "--table", table}
	cmd := func(args ...string) (int, string, string) { return run(t, append(args, flags...)...) }

	if code, out, errOut := cmd("migrate"); code != 0 || !strings.Contains(out, "migrated") {
		t.Fatalf("migrate: exit %d, %q %q", code, out, errOut)
	}
	st, err := openSQLStore(ctx, url, table)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.db.Close() }) // registered first, so it runs after the drops
	t.Cleanup(func() {
		for _, tb := range []string{table + "_steps", table, table + "_migrations", table + "_runs", table + "_outbox"} {
			_, _ = st.db.ExecContext(ctx, "DROP TABLE IF EXISTS "+tb)
		}
		if st.dialect == idemsql.Postgres {
			_, _ = st.db.ExecContext(ctx, "DROP FUNCTION IF EXISTS "+table+"_outbox_notify()")
			_, _ = st.db.ExecContext(ctx, "DROP DOMAIN IF EXISTS "+table+"_outbox_id, "+table+"_outbox_str")
		}
	})
	if code, _, errOut := cmd("migrate"); code != 0 {
		t.Fatalf("second migrate: exit %d, %q", code, errOut)
	}
	// A table with no records says so under the header.
	if code, out, errOut := cmd("stats"); code != 0 || !strings.HasPrefix(out, "CONSUMER  RECORDS  OLDEST  NEWEST\nno records in this table yet\n") {
		t.Errorf("stats of an empty table: exit %d, %q %q", code, out, errOut)
	}

	c, err := idem.NewConsumer(st.store, idem.Config{Name: "orders", PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		_, err := c.Process(ctx, idem.Message{ID: fmt.Sprintf("m-%d", i), Payload: []byte("x")},
			func(ctx context.Context, _ *sql.Tx, m idem.Message) error {
				if m.ID != "m-0" {
					return nil
				}
				_, err := idem.Emit(ctx, idem.OutgoingMessage{Destination: "orders.seen"})
				return err
			})
		if err != nil {
			t.Fatal(err)
		}
	}
	// The consumer marks itself running from a goroutine of its own; a
	// mark landing between the steps below would start the newest run, and
	// the runs written here would not be what the purge reads. Closing the
	// consumer waits for that goroutine, so the runs are this test's alone.
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// Age every record but m-9 by two hours, in the dialect's own terms.
	age := map[idemsql.Dialect]string{
		idemsql.Postgres: `UPDATE %[1]s SET processed_at = processed_at - interval '2 hours' WHERE consumer_key = (SELECT key FROM %[1]s_consumers WHERE name = 'orders') AND message_id <> 'm-9'`,
		idemsql.MySQL:    `UPDATE %s SET processed_at = processed_at - INTERVAL 2 HOUR WHERE consumer = 'orders' AND message_id <> 'm-9'`,
		idemsql.SQLite:   `UPDATE %s SET processed_at = processed_at - 7200000000 WHERE consumer = 'orders' AND message_id <> 'm-9'`,
	}[st.dialect]
	// The consumer ran for those two hours: a run from before m-0 to now.
	if err := st.store.MarkRunning(ctx, &idemdriver.MarkRunningParams{Consumer: "orders"}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.db.ExecContext(ctx, fmt.Sprintf(age, table)); err != nil {
		t.Fatal(err)
	}
	ageRuns := map[idemsql.Dialect]string{
		idemsql.Postgres: `UPDATE %s_runs SET started_at = started_at - interval '2 hours', ended_at = ended_at - interval '2 hours' WHERE consumer = 'orders'`,
		idemsql.MySQL:    `UPDATE %s_runs SET started_at = started_at - INTERVAL 2 HOUR, ended_at = ended_at - INTERVAL 2 HOUR WHERE consumer = 'orders'`,
		idemsql.SQLite:   `UPDATE %s_runs SET started_at = started_at - 7300000000, ended_at = ended_at - 7300000000 WHERE consumer = 'orders'`,
	}[st.dialect]
	if _, err := st.db.ExecContext(ctx, fmt.Sprintf(ageRuns, table)); err != nil {
		t.Fatal(err)
	}
	if err := st.store.MarkRunning(ctx, &idemdriver.MarkRunningParams{Consumer: "orders", MaxGap: 3 * time.Hour}); err != nil {
		t.Fatal(err)
	}

	code, out, errOut := cmd("stats")
	if code != 0 || !strings.Contains(out, "orders") || !strings.Contains(out, " 10 ") {
		t.Errorf("stats: exit %d, %q %q", code, out, errOut)
	}
	if !regexp.MustCompile(`(?m)^outbox +1 +0 +\S+$`).MatchString(out) {
		t.Errorf("stats: no outbox line with 1 pending and 0 failed in %q", out)
	}
	code, out, errOut = cmd("inspect", "--consumer", "orders", "--id", "m-3")
	fp, _ := idem.SHA256Fingerprint([]byte("x"))
	if code != 0 || !strings.Contains(out, "m-3") || !strings.Contains(out, hex.EncodeToString(fp)) {
		t.Errorf("inspect: exit %d, %q %q", code, out, errOut)
	}
	if code, _, errOut = cmd("inspect", "--consumer", "orders", "--id", "nope"); code != 1 || !strings.Contains(errOut, "no record") {
		t.Errorf("inspect of a missing ID: exit %d, %q", code, errOut)
	}
	// A purge is idempotent: one of a consumer with no records (purged
	// clean before, or a typo) deletes nothing and names the consumers.
	if code, out, errOut = cmd("purge", "--consumer", "ghost", "--older-than", "1h"); code != 0 || !strings.Contains(out, "deleted 0 records") || !strings.Contains(out, "unknown consumer") || !strings.Contains(out, `its consumers: "orders"`) {
		t.Errorf("purge of an unknown consumer: exit %d, %q %q", code, out, errOut)
	}
	if code, out, errOut = cmd("purge", "--consumer", "orders", "--older-than", "1h", "--dry-run"); code != 0 || !strings.Contains(out, "would delete 9 records") || strings.Contains(errOut, "deleted so far") {
		t.Errorf("purge --dry-run: exit %d, %q %q", code, out, errOut)
	}
	// The consumer has run for two hours: a window of three has no
	// horizon yet, and the purge says so rather than print an empty one.
	if code, out, errOut = cmd("purge", "--consumer", "orders", "--older-than", "3h"); code != 0 || out != `deleted 0 records of consumer "orders": its recorded running time is under 3h0m0s, so none is due yet`+"\n" {
		t.Errorf("purge before the window: exit %d, %q %q", code, out, errOut)
	}
	for _, bad := range []string{"0", "-0.5", "1.5", "NaN"} {
		if code, _, errOut = cmd("purge", "--consumer", "orders", "--older-than", "1h", "--duty-cycle", bad); code != 2 || !strings.Contains(errOut, "--duty-cycle must be in (0, 1]") {
			t.Errorf("purge --duty-cycle %s: exit %d, %q", bad, code, errOut)
		}
	}
	code, out, errOut = cmd("purge", "--consumer", "orders", "--older-than", "1h", "--batch-size", "4", "--duty-cycle", "0.5")
	if code != 0 || !strings.Contains(out, "deleted 9 records") || !strings.Contains(out, "in 3 batch(es)") || !strings.Contains(out, "records/s, paused ") || !strings.Contains(errOut, "deleted so far") {
		t.Errorf("purge: exit %d, %q %q", code, out, errOut)
	}
	if code, out, _ = cmd("stats"); code != 0 || !strings.Contains(out, " 1 ") {
		t.Errorf("stats after purge: %q", out)
	}
	if code, _, _ = cmd("inspect", "--consumer", "orders", "--id", "m-9"); code != 0 {
		t.Errorf("the newest record was purged")
	}
}

// TestWrongCredentials: a server that refuses the URL's password or
// database is named as refusing, with what to check, and the password is
// not printed back.
func TestWrongCredentials(t *testing.T) {
	t.Parallel()
	const pw = "Wr0ngPassw0rdQ"
	for name, raw := range storeURLs(t) {
		if name == "sqlite" {
			continue
		}
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		badPassword, badDatabase := *u, *u
		badPassword.User = url.UserPassword(u.User.Username(), pw)
		badDatabase.Path = "/idem_no_such_database"
		for what, store := range map[string]string{"password": badPassword.String(), "database": badDatabase.String()} {
			t.Run(name+"/"+what, func(t *testing.T) {
				t.Parallel()
				code, _, errOut := run(t, "stats", "--store", store)
				if code != 1 || !strings.Contains(errOut, " refused the connection (check the user, password and database in the URL): ") {
					t.Errorf("exit %d, %q", code, errOut)
				}
				if strings.Contains(errOut, pw) {
					t.Errorf("the password is printed: %q", errOut)
				}
			})
		}
	}
}
