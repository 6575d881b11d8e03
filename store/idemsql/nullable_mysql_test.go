package idemsql_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idemsql"
)

// mysqlRaw is a record's columns as stored, each as its text ("NULL" for
// NULL), in a fixed order: state, token, attempt, fingerprint (hex),
// processed_at, lease_expires_at, updated_at, result, content_type,
// last_error.
type mysqlRaw [10]string

const mysqlRawCols = `state, token, attempt, HEX(fingerprint), processed_at, lease_expires_at, updated_at, result, content_type, last_error`

func (r mysqlRaw) lease() [3]string { return [3]string{r[0], r[1], r[2]} }

// readMySQLRaw reads every record of consumer c in table, by message ID.
func readMySQLRaw(t *testing.T, ctx context.Context, db *sql.DB, table string) map[string]mysqlRaw {
	t.Helper()
	rows, err := db.QueryContext(ctx, `SELECT message_id, `+mysqlRawCols+` FROM `+table+` WHERE consumer = 'c'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]mysqlRaw{}
	for rows.Next() {
		var id string
		var vals [10]sql.NullString
		dest := []any{&id}
		for i := range vals {
			dest = append(dest, &vals[i])
		}
		if err := rows.Scan(dest...); err != nil {
			t.Fatal(err)
		}
		var r mysqlRaw
		for i, v := range vals {
			r[i] = "NULL"
			if v.Valid {
				r[i] = v.String
			}
		}
		out[id] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestMySQLNullableLeaseColumns upgrades a MySQL table made by migrations
// 001 to 005 that holds records of every kind (one from before migration
// 002, whose lease columns were added with their defaults; transactional
// ones; in_progress, completed and failed lease-mode ones): migration 006
// keeps every record and every stored value (and what Inspect reads of
// it), runs again without error when its version was not recorded, new
// transactional claims (single and batch) store NULL lease columns, and
// every statement reads NULL as completed, token 0 and attempt 1: claims
// and batch claims report duplicates, Acquire neither takes over nor
// miscounts them, fenced writes with token 0 own nothing, Inspect reports
// them, and the purge counts and deletes them (but never an in_progress
// record).
func TestMySQLNullableLeaseColumns(t *testing.T) {
	t.Parallel()
	e := newEnv(t, idemsql.MySQL, envOptions{noMigrate: true})
	ctx := t.Context()
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := e.db.ExecContext(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	migs := migrationsOf(t, idemsql.MySQL, e.table)
	if len(migs) < 6 || migs[5].Version != 6 {
		t.Fatalf("migrations: %d, want 006 sixth", len(migs))
	}
	if err := idemsql.MigrateWith(ctx, e.store, migs[:1]); err != nil {
		t.Fatal(err)
	}
	insert := `INSERT INTO ` + e.table + ` (consumer, message_id, fingerprint, processed_at) VALUES (?, ?, ?, UTC_TIMESTAMP(6))`
	exec(insert, "c", "v1", fp("v1")) // a record of the version-1 store
	if err := idemsql.MigrateWith(ctx, e.store, migs[:5]); err != nil {
		t.Fatal(err)
	}

	// Records written before 006: a transactional claim, and lease-mode
	// records in_progress (its lease then expired), completed and failed.
	c := e.consumer("c")
	if out, err := c.Process(ctx, idem.Message{ID: "v5", Payload: []byte("v5")}, e.effectHandler); err != nil || out.Status != idem.Processed {
		t.Fatalf("Process(v5): %v, %v", out.Status, err)
	}
	const long = time.Hour
	acquire := func(what, id string, want bool) idemdriver.AcquireResult {
		t.Helper()
		r, err := e.store.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "c", MessageID: id, Fingerprint: fp(id), Lease: long})
		if err != nil || r.Acquired != want {
			t.Fatalf("%s: Acquire(%s) = %+v, %v; want acquired %v", what, id, r, err, want)
		}
		return r
	}
	acquire("before 006", "old-lease", true)
	done := acquire("before 006", "old-done", true)
	if err := e.store.Complete(ctx, &idemdriver.CompleteParams{Consumer: "c", MessageID: "old-done", Token: done.Token, Result: []byte("r"), ContentType: "text/plain"}); err != nil {
		t.Fatal(err)
	}
	failed := acquire("before 006", "old-failed", true)
	if err := e.store.Release(ctx, &idemdriver.ReleaseParams{Consumer: "c", MessageID: "old-failed", Token: failed.Token, Error: "boom", Terminal: true}); err != nil {
		t.Fatal(err)
	}
	exec(`UPDATE ` + e.table + ` SET lease_expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE, updated_at = UTC_TIMESTAMP(6) - INTERVAL 2 MINUTE WHERE message_id = 'old-lease'`)

	old := []string{"v1", "v5", "old-lease", "old-done", "old-failed"}
	rawBefore := readMySQLRaw(t, ctx, e.db, e.table)
	inspected := map[string]idemdriver.Record{}
	for _, id := range old {
		inspected[id] = e.inspect("c", id)
	}
	for id, want := range map[string][3]string{
		"v1": {"2", "0", "1"}, "v5": {"2", "0", "1"}, "old-lease": {"1", "1", "1"}, "old-done": {"2", "1", "1"}, "old-failed": {"3", "2", "1"},
	} {
		if got := rawBefore[id].lease(); got != want {
			t.Fatalf("%s before 006: state, token, attempt %v, want %v", id, got, want)
		}
	}

	if err := e.store.Migrate(ctx); err != nil {
		t.Fatalf("Migrate to 006: %v", err)
	}
	// MySQL commits DDL statement by statement: 006 applied and its
	// version not recorded (a connection lost in between) runs again.
	exec(`DELETE FROM ` + e.table + `_migrations WHERE version = 6`)
	if err := e.store.Migrate(ctx); err != nil {
		t.Fatalf("Migrate with 006 applied but not recorded: %v", err)
	}
	var versions, maxVersion int
	if err := e.db.QueryRowContext(ctx, `SELECT COUNT(*), MAX(version) FROM `+e.table+`_migrations`).Scan(&versions, &maxVersion); err != nil ||
		versions != len(migs) || maxVersion != migs[len(migs)-1].Version {
		t.Fatalf("versions: %d up to %d, %v; want %d", versions, maxVersion, err, len(migs))
	}
	var nullable, noDefault int
	if err := e.db.QueryRowContext(ctx, `SELECT SUM(IS_NULLABLE = 'YES'), SUM(COLUMN_DEFAULT IS NULL OR COLUMN_DEFAULT = 'NULL') FROM information_schema.COLUMNS
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME IN ('state', 'token', 'attempt')`, e.table).Scan(&nullable, &noDefault); err != nil || nullable != 3 || noDefault != 3 {
		t.Fatalf("state, token, attempt: %d nullable, %d without a default, %v; want 3, 3", nullable, noDefault, err)
	}

	// Every record and every value kept, and read the same.
	if got := readMySQLRaw(t, ctx, e.db, e.table); !reflect.DeepEqual(got, rawBefore) {
		t.Errorf("records after 006:\n%v\nwant them unchanged:\n%v", got, rawBefore)
	}
	for _, id := range old {
		if got := e.inspect("c", id); !reflect.DeepEqual(got, inspected[id]) {
			t.Errorf("Inspect(%s) after 006: %+v, want %+v", id, got, inspected[id])
		}
	}

	// New transactional records: NULL lease columns.
	if out, err := c.Process(ctx, idem.Message{ID: "new", Payload: []byte("new")}, e.effectHandler); err != nil || out.Status != idem.Processed {
		t.Fatalf("Process(new): %v, %v", out.Status, err)
	}
	batch := func(ids ...string) []idem.Status {
		t.Helper()
		var msgs []idem.Message
		for _, id := range ids {
			msgs = append(msgs, idem.Message{ID: id, Payload: []byte(id)})
		}
		outs, err := c.ProcessBatch(ctx, msgs, func(ctx context.Context, tx *sql.Tx, msgs []idem.Message) error {
			for _, m := range msgs {
				if err := e.writeEffect(ctx, tx, m.ID); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil || len(outs) != len(ids) {
			t.Fatalf("ProcessBatch(%v): %v, %v", ids, outs, err)
		}
		var st []idem.Status
		for _, o := range outs {
			st = append(st, o.Status)
		}
		return st
	}
	if st := batch("b1", "b2"); st[0] != idem.Processed || st[1] != idem.Processed {
		t.Fatalf("batch of new messages: %v", st)
	}
	raw := func(id string) [3]string { return readMySQLRaw(t, ctx, e.db, e.table)[id].lease() }
	null := [3]string{"NULL", "NULL", "NULL"}
	for _, id := range []string{"new", "b1", "b2"} {
		if r := raw(id); r != null {
			t.Errorf("%s: state, token, attempt %v, want NULL", id, r)
		}
	}

	// Every kind of record as a duplicate, one by one and in a batch with
	// a new message; the in_progress one is in progress.
	kinds := []string{"v1", "v5", "new", "b1", "old-done"}
	for _, id := range kinds {
		if out, err := c.Process(ctx, idem.Message{ID: id, Payload: []byte(id)}, e.effectHandler); err != nil || out.Status != idem.Duplicate {
			t.Errorf("Process(%s) again: %v, %v; want Duplicate", id, out.Status, err)
		}
	}
	if out, err := c.Process(ctx, idem.Message{ID: "new", Payload: []byte("other")}, e.effectHandler); err == nil || out.Status != idem.FingerprintMismatch {
		t.Errorf("Process(new) with another payload: %v, %v; want FingerprintMismatch", out.Status, err)
	}
	if out, err := c.Process(ctx, idem.Message{ID: "old-lease", Payload: []byte("old-lease")}, e.effectHandler); out.Status != idem.InProgress {
		t.Errorf("Process(old-lease): %v, %v; want InProgress", out.Status, err)
	}
	st := batch(append([]string{"b3"}, kinds...)...)
	for i, s := range st {
		if want := map[bool]idem.Status{true: idem.Processed, false: idem.Duplicate}[i == 0]; s != want {
			t.Errorf("batch with duplicates: element %d: %v, want %v", i, s, want)
		}
	}
	// One effect each for the messages processed in transactional mode,
	// none for the record of the version-1 store and the lease-mode one.
	for _, id := range []string{"v5", "new", "b1", "b2", "b3"} {
		e.wantEffects(id, 1)
	}
	e.wantEffects("v1", 0)
	e.wantEffects("old-done", 0)

	// Lease mode: transactional records are completed, attempt 1, never
	// taken over; the in_progress record from before 006 is taken over.
	for _, id := range []string{"v1", "v5", "new", "b3"} {
		r := acquire("transactional record", id, false)
		if r.State != idemdriver.StateCompleted || r.Attempt != 1 || r.LeaseRemaining != 0 || !bytes.Equal(r.Fingerprint, fp(id)) {
			t.Errorf("Acquire(%s): %+v, want the completed record, attempt 1", id, r)
		}
	}
	if took := acquire("takeover", "old-lease", true); took.Token != 2 || took.Attempt != 2 {
		t.Errorf("takeover of old-lease: token %d, attempt %d; want 2, 2", took.Token, took.Attempt)
	}
	if r := acquire("completed lease record", "old-done", false); r.State != idemdriver.StateCompleted || string(r.Result) != "r" {
		t.Errorf("Acquire(old-done): %+v, want its stored result", r)
	}
	if r := acquire("failed lease record", "old-failed", false); r.State != idemdriver.StateFailed || r.Error != "boom" {
		t.Errorf("Acquire(old-failed): %+v, want the failed record", r)
	}
	// Fenced writes by token 0 (a transactional record's) own nothing and
	// change nothing.
	for _, id := range []string{"v5", "new"} {
		before := raw(id)
		for op, err := range map[string]error{
			"Renew":    e.store.Renew(ctx, &idemdriver.RenewParams{Consumer: "c", MessageID: id, Token: 0, Lease: long}),
			"Complete": e.store.Complete(ctx, &idemdriver.CompleteParams{Consumer: "c", MessageID: id, Token: 0}),
			"Release":  e.store.Release(ctx, &idemdriver.ReleaseParams{Consumer: "c", MessageID: id, Token: 0, Terminal: true}),
			"SaveStep": e.store.SaveStep(ctx, &idemdriver.StepParams{Consumer: "c", MessageID: id, Token: 0, Step: "s", Result: []byte{}}),
		} {
			if !errors.Is(err, idemdriver.ErrLeaseLost) {
				t.Errorf("%s(%s, token 0): %v, want ErrLeaseLost", op, id, err)
			}
		}
		if r := raw(id); r != before {
			t.Errorf("%s after the fenced writes: %v, want %v", id, r, before)
		}
	}
	// A new lease-mode record is written in full.
	if fresh := acquire("new lease record", "lease-new", true); fresh.Token != 1 || fresh.Attempt != 1 || raw("lease-new") != [3]string{"1", "1", "1"} {
		t.Errorf("lease-new: %+v, stored %v; want token 1, attempt 1", fresh, raw("lease-new"))
	}

	// Inspect reads the NULLs as a transactional record's values.
	for _, id := range []string{"new", "b1", "b3"} {
		r := e.inspect("c", id)
		if r.State != idemdriver.StateCompleted || r.Token != 0 || r.Attempt != 1 || !r.LeaseExpiresAt.IsZero() || !bytes.Equal(r.Fingerprint, fp(id)) {
			t.Errorf("Inspect(%s): %+v; want completed, token 0, attempt 1", id, r)
		}
	}

	// The purge counts and deletes every record but the in_progress ones,
	// whatever their lease columns hold.
	all := []string{"v1", "v5", "old-lease", "old-done", "old-failed", "new", "b1", "b2", "b3", "lease-new"}
	if err := e.ageRecords(ctx, "c", all, 30*24*time.Hour); err != nil {
		t.Fatal(err)
	}
	const deletable = 8
	count, err := purge(ctx, e.store, &idem.PurgeParams{Consumer: "c", RetentionWindow: 7 * 24 * time.Hour, DryRun: true})
	if err != nil || count.Deleted != deletable {
		t.Errorf("purge count: %+v, %v; want %d", count, err, deletable)
	}
	res, err := purge(ctx, e.store, &idem.PurgeParams{Consumer: "c", RetentionWindow: 7 * 24 * time.Hour, BatchSize: 3})
	if err != nil || res.Deleted != deletable {
		t.Errorf("purge: %+v, %v; want %d deleted", res, err, deletable)
	}
	left := fmt.Sprint(keysOf(readMySQLRaw(t, ctx, e.db, e.table)))
	if left != "[lease-new old-lease]" {
		t.Errorf("left after the purge: %s, want the two in_progress records", left)
	}
}

// keysOf returns m's keys in order.
func keysOf(m map[string]mysqlRaw) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
