package idemsql_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/sqlschema"
	"github.com/idem-go/idem/store/idemsql"
)

// These tests check the lease mode of the store at the database: what the
// rows hold after each write, the recovery points table, retention, the
// interplay with transactional mode, and an upgrade from the schema of
// migration 001. The idemtest lease suite (TestLeaseConformance) checks
// the contract through the LeaseStore interface.

const leaseLong = 10 * time.Minute

// leaseVariants is each dialect, and MySQL once more with
// clientFoundRows=true (rows affected counts a matched row as 1 even when
// nothing changed).
func leaseVariants(t *testing.T, f func(t *testing.T, e *env)) {
	forEachDialect(t, func(t *testing.T, d idemsql.Dialect) {
		for _, v := range mysqlVariants(d) {
			t.Run(v.name, func(t *testing.T) {
				t.Parallel()
				f(t, newEnv(t, d, envOptions{mysqlParams: v.params}))
			})
		}
	})
}

// migrationsOf returns the embedded migrations of d for table.
func migrationsOf(t testing.TB, d idemsql.Dialect, table string) []sqlschema.Migration {
	t.Helper()
	tb, err := sqlschema.ParseTable(table)
	if err != nil {
		t.Fatal(err)
	}
	migs, err := sqlschema.Migrations(sqlschema.Dialect(d), tb)
	if err != nil {
		t.Fatal(err)
	}
	return migs
}

func (e *env) mustAcquire(consumer, id string, fingerprint []byte, lease time.Duration) idemdriver.AcquireResult {
	e.t.Helper()
	res, err := e.store.Acquire(context.Background(), &idemdriver.AcquireParams{Consumer: consumer, MessageID: id, Fingerprint: fingerprint, Lease: lease})
	if err != nil {
		e.t.Fatalf("Acquire(%q): %v", id, err)
	}
	return res
}

func (e *env) inspect(consumer, id string) idemdriver.Record {
	e.t.Helper()
	r, err := e.store.Inspect(context.Background(), consumer, id)
	if err != nil {
		e.t.Fatalf("Inspect(%q): %v", id, err)
	}
	return r
}

func (e *env) wantSteps(consumer string, want int) {
	e.t.Helper()
	n, err := e.countSteps(context.Background(), consumer)
	if err != nil {
		e.t.Fatalf("countSteps: %v", err)
	}
	if n != want {
		e.t.Errorf("recovery points of %q = %d, want %d", consumer, n, want)
	}
}

// TestLeaseRecordColumns follows one message through acquire, save step,
// renew, release, takeover and completion, checking the row each time
// (through Inspect) and the server's clock on the lease.
func TestLeaseRecordColumns(t *testing.T) {
	t.Parallel()
	leaseVariants(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		s := e.store
		a1 := e.mustAcquire("c", "m", fp("p"), time.Minute)
		if !a1.Acquired || a1.Token != 1 || a1.Attempt != 1 || len(a1.Steps) != 0 || a1.Steps == nil {
			t.Fatalf("first Acquire = %+v, want token 1, attempt 1, no steps (non-nil map)", a1)
		}
		r := e.inspect("c", "m")
		if r.State != idemdriver.StateInProgress || r.Token != 1 || r.Attempt != 1 || !bytes.Equal(r.Fingerprint, fp("p")) {
			t.Errorf("after Acquire: %+v", r)
		}
		// The lease is the server's now plus a minute: within a few seconds
		// of the record time, which is the server's now too.
		if d := r.LeaseExpiresAt.Sub(r.ProcessedAt); d < time.Minute-time.Millisecond || d > time.Minute+time.Millisecond {
			t.Errorf("lease ends %v after the record time, want 1m", d)
		}
		if err := s.SaveStep(ctx, &idemdriver.StepParams{Consumer: "c", MessageID: "m", Token: a1.Token, Step: "charge", Result: []byte("ch_1")}); err != nil {
			t.Fatalf("SaveStep: %v", err)
		}
		if err := s.Renew(ctx, &idemdriver.RenewParams{Consumer: "c", MessageID: "m", Token: a1.Token, Lease: time.Hour}); err != nil {
			t.Fatalf("Renew: %v", err)
		}
		// Renew twice at once and again: every renewal of the owner
		// succeeds (MySQL without clientFoundRows counts only changed rows).
		for range 3 {
			if err := s.Renew(ctx, &idemdriver.RenewParams{Consumer: "c", MessageID: "m", Token: a1.Token, Lease: time.Hour}); err != nil {
				t.Fatalf("Renew again: %v", err)
			}
		}
		r2 := e.inspect("c", "m")
		if d := r2.LeaseExpiresAt.Sub(r.ProcessedAt); d < time.Hour || d > time.Hour+time.Minute {
			t.Errorf("after Renew(1h) the lease ends %v after the acquire, want about 1h", d)
		}
		if r2.Token != 1 || r2.Attempt != 1 || r2.State != idemdriver.StateInProgress {
			t.Errorf("after Renew: %+v", r2)
		}
		if err := s.Release(ctx, &idemdriver.ReleaseParams{Consumer: "c", MessageID: "m", Token: a1.Token, Error: "boom"}); err != nil {
			t.Fatalf("Release: %v", err)
		}
		r3 := e.inspect("c", "m")
		if r3.State != idemdriver.StateInProgress || r3.Error != "boom" || r3.Attempt != 1 || r3.Token <= a1.Token {
			t.Errorf("after Release: %+v, want in_progress, the error, attempt 1 and a token past %d", r3, a1.Token)
		}
		if r3.LeaseExpiresAt.After(r3.ProcessedAt) {
			t.Errorf("after Release the lease ends at %v, after the release time %v", r3.LeaseExpiresAt, r3.ProcessedAt)
		}
		a2 := e.mustAcquire("c", "m", fp("p"), time.Minute)
		if !a2.Acquired || a2.Attempt != 2 || a2.Token <= r3.Token || string(a2.Steps["charge"]) != "ch_1" || len(a2.Steps) != 1 {
			t.Fatalf("Acquire after Release = %+v, want attempt 2, a token past %d, the step", a2, r3.Token)
		}
		if err := s.Complete(ctx, &idemdriver.CompleteParams{Consumer: "c", MessageID: "m", Token: a2.Token, Result: []byte("done"), ContentType: "text/plain"}); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		r4 := e.inspect("c", "m")
		if r4.State != idemdriver.StateCompleted || r4.Attempt != 2 || !bytes.Equal(r4.Fingerprint, fp("p")) || r4.Error != "boom" {
			t.Errorf("after Complete: %+v, want completed, attempt 2, the fingerprint kept, the last error kept", r4)
		}
		res := e.mustAcquire("c", "m", fp("p"), time.Minute)
		if res.Acquired || res.State != idemdriver.StateCompleted || string(res.Result) != "done" || res.ContentType != "text/plain" || res.Attempt != 2 || res.LeaseRemaining != 0 {
			t.Errorf("Acquire of the completed record = %+v", res)
		}
	})
}

// TestLeaseStaleTokenChangesNothing checks every fenced write with tokens
// that own nothing (an older one after a takeover, a released one, one
// never issued, 0 and -1): ErrLeaseLost, and the row and the steps stay as
// they were.
func TestLeaseStaleTokenChangesNothing(t *testing.T) {
	t.Parallel()
	leaseVariants(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		s := e.store
		a1 := e.mustAcquire("c", "m", fp("p"), leaseLong)
		if err := e.expireLease(ctx, "c", "m"); err != nil {
			t.Fatal(err)
		}
		a2 := e.mustAcquire("c", "m", fp("p"), leaseLong)
		if err := s.SaveStep(ctx, &idemdriver.StepParams{Consumer: "c", MessageID: "m", Token: a2.Token, Step: "s", Result: []byte("v")}); err != nil {
			t.Fatal(err)
		}
		if err := s.Release(ctx, &idemdriver.ReleaseParams{Consumer: "c", MessageID: "m", Token: a2.Token, Error: "e2"}); err != nil {
			t.Fatal(err)
		}
		a3 := e.mustAcquire("c", "m", fp("p"), leaseLong)
		before := e.inspect("c", "m")
		for _, tok := range []int64{a1.Token, a2.Token, a3.Token + 1, a3.Token + 100, 0, -1} {
			for name, call := range map[string]func() error{
				"Renew": func() error {
					return s.Renew(ctx, &idemdriver.RenewParams{Consumer: "c", MessageID: "m", Token: tok, Lease: time.Hour})
				},
				"SaveStep": func() error {
					return s.SaveStep(ctx, &idemdriver.StepParams{Consumer: "c", MessageID: "m", Token: tok, Step: "stale", Result: []byte("x")})
				},
				"Complete": func() error {
					return s.Complete(ctx, &idemdriver.CompleteParams{Consumer: "c", MessageID: "m", Token: tok, Result: []byte("x")})
				},
				"Release": func() error {
					return s.Release(ctx, &idemdriver.ReleaseParams{Consumer: "c", MessageID: "m", Token: tok, Error: "stale", Terminal: true})
				},
			} {
				if err := call(); !errors.Is(err, idem.ErrLeaseLost) {
					t.Errorf("%s with token %d (owner %d): err = %v, want ErrLeaseLost", name, tok, a3.Token, err)
				}
			}
		}
		// Writes to a record that does not exist own nothing either.
		if err := s.Renew(ctx, &idemdriver.RenewParams{Consumer: "c", MessageID: "nothing", Token: 1, Lease: time.Hour}); !errors.Is(err, idem.ErrLeaseLost) {
			t.Errorf("Renew of a missing record: %v, want ErrLeaseLost", err)
		}
		if err := s.SaveStep(ctx, &idemdriver.StepParams{Consumer: "c", MessageID: "nothing", Token: 1, Step: "s"}); !errors.Is(err, idem.ErrLeaseLost) {
			t.Errorf("SaveStep of a missing record: %v, want ErrLeaseLost", err)
		}
		after := e.inspect("c", "m")
		if fmt.Sprint(before) != fmt.Sprint(after) {
			t.Errorf("stale writes changed the record:\nbefore %+v\nafter  %+v", before, after)
		}
		e.wantSteps("c", 1)
		// The owner still owns it.
		if err := s.Complete(ctx, &idemdriver.CompleteParams{Consumer: "c", MessageID: "m", Token: a3.Token, Result: []byte("r")}); err != nil {
			t.Errorf("owner's Complete: %v", err)
		}
	})
}

// TestLeaseStepsRace saves steps with the old owner's token while another
// caller takes the record over: every step the old owner saved
// successfully is among the recovery points the takeover returned, and a
// rejected one (ErrLeaseLost) is nowhere. Fencing holds at the row lock,
// not only at the read (a plain read under READ COMMITTED could let a
// stale step in after the takeover read the steps).
func TestLeaseStepsRace(t *testing.T) {
	t.Parallel()
	leaseVariants(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		for round := range 5 {
			id := fmt.Sprintf("m-%d", round)
			a1 := e.mustAcquire("c", id, fp("p"), leaseLong)
			if err := e.expireLease(ctx, "c", id); err != nil {
				t.Fatal(err)
			}
			const savers = 16
			saved := make([]error, savers)
			var (
				wg  sync.WaitGroup
				a2  idemdriver.AcquireResult
				err error
			)
			start := make(chan struct{})
			for i := range savers {
				wg.Go(func() {
					<-start
					saved[i] = e.store.SaveStep(ctx, &idemdriver.StepParams{Consumer: "c", MessageID: id, Token: a1.Token, Step: fmt.Sprintf("old-%d", i), Result: []byte{byte(i)}})
				})
			}
			wg.Go(func() {
				<-start
				a2, err = e.store.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "c", MessageID: id, Fingerprint: fp("p"), Lease: leaseLong})
			})
			close(start)
			wg.Wait()
			if err != nil || !a2.Acquired {
				t.Fatalf("takeover: %+v, %v", a2, err)
			}
			var ok int
			for i, serr := range saved {
				name := fmt.Sprintf("old-%d", i)
				_, returned := a2.Steps[name]
				switch {
				case serr == nil:
					ok++
					if !returned {
						t.Errorf("round %d: step %s saved by the old owner without error, missing from the takeover's recovery points", round, name)
					}
				case errors.Is(serr, idem.ErrLeaseLost):
					if returned {
						t.Errorf("round %d: step %s rejected, yet returned by the takeover", round, name)
					}
				default:
					t.Errorf("round %d: SaveStep %s: %v", round, name, serr)
				}
			}
			if len(a2.Steps) != ok {
				t.Errorf("round %d: takeover returned %d steps, %d were saved", round, len(a2.Steps), ok)
			}
			var n int
			if err := e.db.QueryRowContext(ctx, e.q(`SELECT COUNT(*) FROM `+e.table+`_steps WHERE consumer = ? AND message_id = ?`), "c", id).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != ok {
				t.Errorf("round %d: %d steps stored, %d were saved (a stale step got in after the takeover)", round, n, ok)
			}
		}
	})
}

// TestLeaseResultsByteExact stores results of every kind, up to 5 MiB,
// through Complete and SaveStep, and reads them back byte for byte.
func TestLeaseResultsByteExact(t *testing.T) {
	t.Parallel()
	big := make([]byte, 5<<20)
	for i := range big {
		big[i] = byte(i*7 + i>>11)
	}
	every := make([]byte, 256)
	for i := range every {
		every[i] = byte(i)
	}
	results := map[string][]byte{
		"nil": nil, "empty": {}, "NUL": {0}, "every byte": every, "trailing spaces": []byte("x  "),
		"invalid UTF-8": []byte("\xff\xfe\xc3"), "5 MiB": big,
	}
	leaseVariants(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		for name, want := range results {
			id := "m-" + name
			a := e.mustAcquire("c", id, fp(name), leaseLong)
			if err := e.store.SaveStep(ctx, &idemdriver.StepParams{Consumer: "c", MessageID: id, Token: a.Token, Step: "s", Result: want}); err != nil {
				t.Fatalf("%s: SaveStep: %v", name, err)
			}
			if err := e.store.Release(ctx, &idemdriver.ReleaseParams{Consumer: "c", MessageID: id, Token: a.Token, Error: "again"}); err != nil {
				t.Fatal(err)
			}
			a = e.mustAcquire("c", id, fp(name), leaseLong)
			got, ok := a.Steps["s"]
			if !ok || !bytes.Equal(got, want) {
				t.Errorf("%s: step result is %d bytes (present %v), want %d bytes", name, len(got), ok, len(want))
			}
			if err := e.store.Complete(ctx, &idemdriver.CompleteParams{Consumer: "c", MessageID: id, Token: a.Token, Result: want, ContentType: "application/x-" + strings.ReplaceAll(name, " ", "-")}); err != nil {
				t.Fatalf("%s: Complete: %v", name, err)
			}
			res := e.mustAcquire("c", id, fp(name), leaseLong)
			if res.State != idemdriver.StateCompleted || !bytes.Equal(res.Result, want) || res.ContentType != "application/x-"+strings.ReplaceAll(name, " ", "-") {
				t.Errorf("%s: stored result is %d bytes, content type %q; want %d bytes", name, len(res.Result), res.ContentType, len(want))
			}
		}
	})
}

// TestLeaseTextLimits checks the text columns' rules: content types and
// step names that a text column cannot hold as they are are refused (and
// the record stays the attempt's), error texts are made storable and cut.
func TestLeaseTextLimits(t *testing.T) {
	t.Parallel()
	forEachDialect(t, func(t *testing.T, d idemsql.Dialect) {
		e := newEnv(t, d, envOptions{})
		ctx := t.Context()
		s := e.store
		a := e.mustAcquire("c", "m", fp("p"), leaseLong)
		for _, ct := range []string{"a\x00b", "\xff", strings.Repeat("x", idemsql.MaxContentTypeLength+1)} {
			if err := s.Complete(ctx, &idemdriver.CompleteParams{Consumer: "c", MessageID: "m", Token: a.Token, ContentType: ct}); !errors.Is(err, idem.ErrInvalidConfig) {
				t.Errorf("Complete with content type %.20q: %v, want ErrInvalidConfig", ct, err)
			}
		}
		for _, step := range []string{"", "a\x00", "\xff", strings.Repeat("s", 256)} {
			if err := s.SaveStep(ctx, &idemdriver.StepParams{Consumer: "c", MessageID: "m", Token: a.Token, Step: step}); !errors.Is(err, idem.ErrInvalidConfig) {
				t.Errorf("SaveStep named %.20q: %v, want ErrInvalidConfig", step, err)
			}
		}
		if err := s.Complete(ctx, &idemdriver.CompleteParams{Consumer: "c", MessageID: "m", Token: a.Token, ContentType: strings.Repeat("x", idemsql.MaxContentTypeLength)}); err != nil {
			t.Errorf("Complete with the longest content type: %v", err)
		}

		b := e.mustAcquire("c", "e", fp("p"), leaseLong)
		if err := s.Release(ctx, &idemdriver.ReleaseParams{Consumer: "c", MessageID: "e", Token: b.Token, Error: "a\x00b\xffc"}); err != nil {
			t.Fatalf("Release with NUL and invalid UTF-8: %v", err)
		}
		if got := e.inspect("c", "e").Error; got != "a\uFFFDb\uFFFDc" {
			t.Errorf("stored error = %q, want %q", got, "a\uFFFDb\uFFFDc")
		}
		b = e.mustAcquire("c", "e", fp("p"), leaseLong)
		long := strings.Repeat("é", idemsql.MaxErrorTextLength) // 2 bytes each
		if err := s.Release(ctx, &idemdriver.ReleaseParams{Consumer: "c", MessageID: "e", Token: b.Token, Error: long, Terminal: true}); err != nil {
			t.Fatalf("Release with a long error: %v", err)
		}
		if got := e.inspect("c", "e").Error; len(got) != idemsql.MaxErrorTextLength || got != long[:idemsql.MaxErrorTextLength] {
			t.Errorf("stored long error: %d bytes, want the first %d", len(got), idemsql.MaxErrorTextLength)
		}
	})
}

// TestLeasePurge checks retention in lease mode: completed and failed
// records older than the window are deleted with their recovery points;
// in_progress records (live, expired, released), however old, stay with
// theirs; transactional records are purged as before.
func TestLeasePurge(t *testing.T) {
	t.Parallel()
	leaseVariants(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		s := e.store
		step := func(id string, token int64) {
			t.Helper()
			for _, name := range []string{"a", "b"} {
				if err := s.SaveStep(ctx, &idemdriver.StepParams{Consumer: "c", MessageID: id, Token: token, Step: name, Result: []byte(id)}); err != nil {
					t.Fatal(err)
				}
			}
		}
		var old []string
		for i := range 5 {
			id := fmt.Sprintf("done-%d", i)
			a := e.mustAcquire("c", id, fp(id), leaseLong)
			step(id, a.Token)
			if err := s.Complete(ctx, &idemdriver.CompleteParams{Consumer: "c", MessageID: id, Token: a.Token}); err != nil {
				t.Fatal(err)
			}
			old = append(old, id)
		}
		a := e.mustAcquire("c", "failed", fp("f"), leaseLong)
		step("failed", a.Token)
		if err := s.Release(ctx, &idemdriver.ReleaseParams{Consumer: "c", MessageID: "failed", Token: a.Token, Error: "x", Terminal: true}); err != nil {
			t.Fatal(err)
		}
		old = append(old, "failed")
		for _, id := range []string{"live", "expired", "released"} {
			a := e.mustAcquire("c", id, fp(id), leaseLong)
			step(id, a.Token)
			old = append(old, id)
			switch id {
			case "expired":
				if err := e.expireLease(ctx, "c", id); err != nil {
					t.Fatal(err)
				}
			case "released":
				if err := s.Release(ctx, &idemdriver.ReleaseParams{Consumer: "c", MessageID: id, Token: a.Token, Error: "retry"}); err != nil {
					t.Fatal(err)
				}
			}
		}
		// Two transactional records, one old.
		tc := e.consumer("c")
		for _, id := range []string{"tx-old", "tx-new"} {
			if out, err := tc.Process(ctx, idem.Message{ID: id, Payload: []byte(id)}, e.effectHandler); err != nil || out.Status != idem.Processed {
				t.Fatalf("transactional %s: %v, %v", id, out.Status, err)
			}
		}
		old = append(old, "tx-old")
		// The other consumer's steps are not touched.
		o := e.mustAcquire("other", "done-0", fp("done-0"), leaseLong)
		if err := s.SaveStep(ctx, &idemdriver.StepParams{Consumer: "other", MessageID: "done-0", Token: o.Token, Step: "a"}); err != nil {
			t.Fatal(err)
		}

		if err := e.ageRecords(ctx, "c", old, 30*24*time.Hour); err != nil {
			t.Fatal(err)
		}
		e.wantRecords("c", 11)
		e.wantSteps("c", 18)
		p := &idem.PurgeParams{Consumer: "c", RetentionWindow: 7 * 24 * time.Hour, BatchSize: 2}
		p.DryRun = true
		res, err := purge(ctx, s, p)
		if err != nil || res.Deleted != 7 {
			t.Errorf("DryRun: %+v, %v; want 7 (5 completed, 1 failed, 1 transactional)", res, err)
		}
		p.DryRun = false
		res, err = purge(ctx, s, p)
		if err != nil || res.Deleted != 7 || res.Batches != 4 {
			t.Errorf("Purge: %+v, %v; want 7 deleted in 4 batches", res, err)
		}
		e.wantRecords("c", 4) // live, expired, released, tx-new
		e.wantSteps("c", 6)   // those of live, expired and released
		e.wantSteps("other", 1)
		for _, id := range []string{"live", "expired", "released"} {
			if r := e.inspect("c", id); r.State != idemdriver.StateInProgress {
				t.Errorf("%s after the purge: %+v", id, r)
			}
		}
		// The expired and released records are still taken over, with
		// their steps.
		for _, id := range []string{"expired", "released"} {
			a := e.mustAcquire("c", id, fp(id), leaseLong)
			if !a.Acquired || a.Attempt != 2 || len(a.Steps) != 2 {
				t.Errorf("%s after the purge: %+v, want attempt 2 with 2 steps", id, a)
			}
		}
		// A purged message is new again, without the old steps.
		a = e.mustAcquire("c", "done-0", fp("done-0"), leaseLong)
		if !a.Acquired || a.Attempt != 1 || len(a.Steps) != 0 {
			t.Errorf("purged message redelivered: %+v, want attempt 1 without steps", a)
		}
	})
}

// TestLeaseMixedModes checks the two modes over one table: a
// transactional claim of a record completed in lease mode is a duplicate
// with its fingerprint (Consumer: Duplicate, the handler not run), in a
// batch too; a lease Acquire of a transactional record finds it completed
// without a result (LeaseConsumer: Duplicate); a lease Acquire waits for a
// transactional claim in flight and then sees it.
func TestLeaseMixedModes(t *testing.T) {
	t.Parallel()
	leaseVariants(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		s := e.store
		a := e.mustAcquire("c", "lease", fp("p"), leaseLong)
		if err := s.Complete(ctx, &idemdriver.CompleteParams{Consumer: "c", MessageID: "lease", Token: a.Token, Result: []byte("r")}); err != nil {
			t.Fatal(err)
		}
		tx, err := s.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		res, err := s.ClaimTx(ctx, tx, &idemdriver.ClaimParams{Consumer: "c", MessageID: "lease", Fingerprint: fp("p")})
		if err != nil || res.Claimed || !bytes.Equal(res.Fingerprint, fp("p")) {
			t.Errorf("ClaimTx of a lease-completed record: %+v, %v; want a duplicate with its fingerprint", res, err)
		}
		batch, err := s.ClaimBatchTx(ctx, tx, &idemdriver.ClaimBatchParams{Consumer: "c", Messages: []idemdriver.ClaimMessage{
			{MessageID: "new", Fingerprint: fp("n")}, {MessageID: "lease", Fingerprint: fp("p")},
		}})
		if err != nil || len(batch) != 2 || !batch[0].Claimed || batch[1].Claimed || !bytes.Equal(batch[1].Fingerprint, fp("p")) {
			t.Errorf("ClaimBatchTx with a lease-completed record: %+v, %v", batch, err)
		}
		if err := s.Commit(ctx, tx); err != nil {
			t.Fatal(err)
		}
		c := e.consumer("c")
		out, err := c.Process(ctx, idem.Message{ID: "lease", Payload: []byte("p")}, func(context.Context, *sql.Tx, idem.Message) error {
			t.Error("handler ran for a lease-completed message")
			return nil
		})
		if err != nil || out.Status != idem.Duplicate {
			t.Errorf("Consumer.Process of a lease-completed message: %v, %v; want Duplicate", out.Status, err)
		}

		// "new" was claimed in transactional mode: a completed record with
		// the defaults of migration 002.
		if r := e.inspect("c", "new"); r.State != idemdriver.StateCompleted || r.Token != 0 || r.Attempt != 1 || !r.LeaseExpiresAt.IsZero() {
			t.Errorf("transactional record: %+v", r)
		}
		got := e.mustAcquire("c", "new", fp("n"), leaseLong)
		if got.Acquired || got.State != idemdriver.StateCompleted || len(got.Result) != 0 || !bytes.Equal(got.Fingerprint, fp("n")) {
			t.Errorf("Acquire of a transactional record: %+v", got)
		}
		lc, err := idem.NewLeaseConsumer(s, idem.Config{Name: "c", PurgeInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		defer lc.Close()
		out, err = lc.Process(ctx, idem.Message{ID: "new", Payload: []byte("n")}, func(context.Context, *idem.Attempt) (idem.Result, error) {
			t.Error("lease handler ran for a transactional record")
			return idem.Result{}, nil
		})
		if err != nil || out.Status != idem.Duplicate {
			t.Errorf("LeaseConsumer.Process of a transactional record: %v, %v; want Duplicate", out.Status, err)
		}

		// A claim in flight: Acquire waits for it (SQLite: for the write
		// lock), then finds the committed record.
		tx, err = s.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res, err := s.ClaimTx(ctx, tx, &idemdriver.ClaimParams{Consumer: "c", MessageID: "inflight", Fingerprint: fp("i")}); err != nil || !res.Claimed {
			t.Fatalf("ClaimTx: %+v, %v", res, err)
		}
		done := make(chan idemdriver.AcquireResult, 1)
		go func() {
			r, err := s.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "c", MessageID: "inflight", Fingerprint: fp("i"), Lease: leaseLong})
			if err != nil {
				t.Errorf("Acquire during a claim: %v", err)
			}
			done <- r
		}()
		select {
		case r := <-done:
			t.Fatalf("Acquire returned %+v while a transactional claim of the message was in flight", r)
		case <-time.After(200 * time.Millisecond):
		}
		if err := s.Commit(ctx, tx); err != nil {
			t.Fatal(err)
		}
		if r := <-done; r.Acquired || r.State != idemdriver.StateCompleted {
			t.Errorf("Acquire after the claim committed: %+v, want the completed record", r)
		}
	})
}

// TestLeaseMigrateFromV1 upgrades a table created by migration 001 alone,
// holding records: they become completed records, transactional claims and
// purges go on as before, and lease mode works on the same table.
func TestLeaseMigrateFromV1(t *testing.T) {
	t.Parallel()
	forEachDialect(t, func(t *testing.T, d idemsql.Dialect) {
		e := newEnv(t, d, envOptions{noMigrate: true})
		ctx := t.Context()
		migs := migrationsOf(t, d, e.table)
		if len(migs) < 2 || migs[0].Version != 1 || migs[1].Version != 2 {
			t.Fatalf("migrations: %v, want 001 and 002 first", migs)
		}
		for _, st := range migs[0].Statements() {
			if _, err := e.db.ExecContext(ctx, st); err != nil {
				t.Fatalf("migration 001: %v", err)
			}
		}
		var migTable string
		switch d {
		case idemsql.Postgres:
			migTable = `CREATE TABLE ` + e.table + `_migrations (version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`
		case idemsql.MySQL:
			migTable = `CREATE TABLE ` + e.table + `_migrations (version INT NOT NULL PRIMARY KEY, applied_at DATETIME(6) NOT NULL) ENGINE=InnoDB`
		default:
			migTable = `CREATE TABLE ` + e.table + `_migrations (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)`
		}
		if _, err := e.db.ExecContext(ctx, migTable); err != nil {
			t.Fatal(err)
		}
		if _, err := e.db.ExecContext(ctx, e.q(`INSERT INTO `+e.table+`_migrations (version, applied_at) VALUES (1, ?)`), appliedAt(d)); err != nil {
			t.Fatal(err)
		}
		// Records written by the version-1 store (as its claim did).
		var insert string
		switch d {
		case idemsql.Postgres:
			insert = `INSERT INTO ` + e.table + ` (consumer, message_id, fingerprint) VALUES ($1, $2, $3)`
		case idemsql.MySQL:
			insert = `INSERT INTO ` + e.table + ` (consumer, message_id, fingerprint, processed_at) VALUES (?, ?, ?, UTC_TIMESTAMP(6))`
		default:
			insert = `INSERT INTO ` + e.table + ` (consumer, message_id, fingerprint, processed_at) VALUES (?1, ?2, ?3, ` + sqliteNowMicros + `)`
		}
		for _, id := range []string{"v1-a", "v1-b"} {
			if _, err := e.db.ExecContext(ctx, insert, "c", id, fp(id)); err != nil {
				t.Fatal(err)
			}
		}

		if err := e.store.Migrate(ctx); err != nil {
			t.Fatalf("Migrate from version 1: %v", err)
		}
		if err := e.store.Migrate(ctx); err != nil {
			t.Fatalf("Migrate again: %v", err)
		}
		var versions int
		if err := e.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+e.table+`_migrations`).Scan(&versions); err != nil || versions != len(migs) {
			t.Errorf("versions recorded: %d, %v; want %d", versions, err, len(migs))
		}
		if d == idemsql.MySQL {
			// MySQL commits each DDL statement: a migration can be applied
			// and its version not recorded (a connection lost in between).
			// Migration 002 runs again without error.
			if _, err := e.db.ExecContext(ctx, `DELETE FROM `+e.table+`_migrations WHERE version = 2`); err != nil {
				t.Fatal(err)
			}
			if err := e.store.Migrate(ctx); err != nil {
				t.Errorf("Migrate with 002 applied but not recorded: %v", err)
			}
		}
		for _, id := range []string{"v1-a", "v1-b"} {
			r := e.inspect("c", id)
			if r.State != idemdriver.StateCompleted || r.Token != 0 || r.Attempt != 1 || !r.LeaseExpiresAt.IsZero() || r.Error != "" || !bytes.Equal(r.Fingerprint, fp(id)) {
				t.Errorf("%s after the upgrade: %+v, want a completed record", id, r)
			}
		}
		// Transactional mode as before.
		c := e.consumer("c")
		for _, tt := range []struct {
			id   string
			want idem.Status
		}{{"v1-a", idem.Duplicate}, {"after", idem.Processed}, {"after", idem.Duplicate}} {
			out, err := c.Process(ctx, idem.Message{ID: tt.id, Payload: []byte(tt.id)}, e.effectHandler)
			if err != nil || out.Status != tt.want {
				t.Errorf("Process(%s) after the upgrade: %v, %v; want %v", tt.id, out.Status, err, tt.want)
			}
		}
		outs, err := c.ProcessBatch(ctx, []idem.Message{{ID: "v1-b", Payload: []byte("v1-b")}, {ID: "batch", Payload: []byte("batch")}}, func(ctx context.Context, tx *sql.Tx, msgs []idem.Message) error {
			for _, m := range msgs {
				if err := e.writeEffect(ctx, tx, m.ID); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil || len(outs) != 2 || outs[0].Status != idem.Duplicate || outs[1].Status != idem.Processed {
			t.Errorf("ProcessBatch after the upgrade: %v, %v", outs, err)
		}
		e.wantEffects("v1-a", 0)
		e.wantEffects("after", 1)
		e.wantEffects("batch", 1)
		// Lease mode on the upgraded table.
		lc, err := idem.NewLeaseConsumer(e.store, idem.Config{Name: "c", PurgeInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		defer lc.Close()
		out, err := lc.Process(ctx, idem.Message{ID: "lease", Payload: []byte("p")}, func(context.Context, *idem.Attempt) (idem.Result, error) {
			return idem.Result{Body: []byte("ok")}, nil
		})
		if err != nil || out.Status != idem.Processed {
			t.Errorf("LeaseConsumer.Process after the upgrade: %v, %v", out.Status, err)
		}
		out, err = lc.Process(ctx, idem.Message{ID: "v1-b", Payload: []byte("v1-b")}, nil)
		if err != nil || out.Status != idem.Duplicate {
			t.Errorf("LeaseConsumer.Process of a version-1 record: %v, %v; want Duplicate", out.Status, err)
		}
		// The old records are purged as before.
		if err := e.ageRecords(ctx, "c", []string{"v1-a", "v1-b"}, 30*24*time.Hour); err != nil {
			t.Fatal(err)
		}
		res, err := purge(ctx, e.store, &idem.PurgeParams{Consumer: "c", RetentionWindow: 7 * 24 * time.Hour, BatchSize: 10})
		if err != nil || res.Deleted != 2 {
			t.Errorf("Purge after the upgrade: %+v, %v; want the 2 version-1 records", res, err)
		}
	})
}

// appliedAt is a migrations-table time for d.
func appliedAt(d idemsql.Dialect) any {
	if d == idemsql.SQLite {
		return time.Now().UnixMicro()
	}
	return time.Now().UTC()
}

// TestLeasePurgeWhileBusy purges old lease records with recovery points
// while other messages are acquired, given steps, renewed, released and
// completed: neither side fails (no deadlock on MySQL's row and gap locks),
// and only the old records go.
func TestLeasePurgeWhileBusy(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("load test")
	}
	leaseVariants(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		s := e.store
		var old []string
		for i := range 60 {
			id := fmt.Sprintf("old-%03d", i)
			a := e.mustAcquire("c", id, fp(id), leaseLong)
			if err := s.SaveStep(ctx, &idemdriver.StepParams{Consumer: "c", MessageID: id, Token: a.Token, Step: "s", Result: []byte(id)}); err != nil {
				t.Fatal(err)
			}
			if err := s.Complete(ctx, &idemdriver.CompleteParams{Consumer: "c", MessageID: id, Token: a.Token}); err != nil {
				t.Fatal(err)
			}
			old = append(old, id)
		}
		if err := e.ageRecords(ctx, "c", old, 30*24*time.Hour); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		stop := make(chan struct{})
		var mu sync.Mutex
		var processed int
		progress := make(chan struct{}, 1) // a worker finished a message
		for w := range 8 {
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					id := fmt.Sprintf("new-%d-%d", w, i)
					a, err := s.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "c", MessageID: id, Fingerprint: fp(id), Lease: leaseLong})
					if err != nil || !a.Acquired {
						t.Errorf("Acquire %s: %+v, %v", id, a, err)
						return
					}
					for _, call := range []func() error{
						func() error {
							return s.SaveStep(ctx, &idemdriver.StepParams{Consumer: "c", MessageID: id, Token: a.Token, Step: "s", Result: []byte(id)})
						},
						func() error {
							return s.Renew(ctx, &idemdriver.RenewParams{Consumer: "c", MessageID: id, Token: a.Token, Lease: leaseLong})
						},
						func() error {
							return s.Release(ctx, &idemdriver.ReleaseParams{Consumer: "c", MessageID: id, Token: a.Token, Error: "retry"})
						},
					} {
						if err := call(); err != nil {
							t.Errorf("%s: %v", id, err)
							return
						}
					}
					a, err = s.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "c", MessageID: id, Fingerprint: fp(id), Lease: leaseLong})
					if err != nil || !a.Acquired || len(a.Steps) != 1 {
						t.Errorf("second Acquire %s: %+v, %v", id, a, err)
						return
					}
					if err := s.Complete(ctx, &idemdriver.CompleteParams{Consumer: "c", MessageID: id, Token: a.Token}); err != nil {
						t.Errorf("Complete %s: %v", id, err)
						return
					}
					mu.Lock()
					processed++
					mu.Unlock()
					select {
					case progress <- struct{}{}:
					default:
					}
				}
			})
		}
		// Batches of 2, one purge after another, until the old records are
		// gone and the workers have done some work alongside. Once they are
		// gone, each further purge waits for a worker to finish a message:
		// purges back to back would keep SQLite's one write lock from the
		// workers, whose busy wait (polling, not queued) could then run out.
		var purged int64
		timeout := time.NewTimer(30 * time.Second)
		defer timeout.Stop()
	purging:
		for {
			select {
			case <-timeout.C:
				t.Errorf("purged %d of %d old records in 30s", purged, len(old))
				break purging
			default:
			}
			res, err := purge(ctx, s, &idem.PurgeParams{Consumer: "c", RetentionWindow: 7 * 24 * time.Hour, BatchSize: 2})
			if err != nil {
				t.Errorf("Purge: %v", err)
				break
			}
			purged += res.Deleted
			mu.Lock()
			n := processed
			mu.Unlock()
			if purged >= int64(len(old)) && n >= 20 {
				break
			}
			if purged >= int64(len(old)) {
				select {
				case <-progress:
				case <-timeout.C:
					t.Errorf("the workers processed %d messages in 30s alongside the purges", n)
					break purging
				}
			}
		}
		close(stop)
		wg.Wait()
		if purged != int64(len(old)) {
			t.Errorf("purged %d, want %d", purged, len(old))
		}
		mu.Lock()
		defer mu.Unlock()
		e.wantRecords("c", processed)
		e.wantSteps("c", processed)
	})
}

// TestLeaseQualifiedTable runs lease mode, a migration re-run and a purge
// on a schema-qualified table (PostgreSQL: public.name; MySQL: the current
// database's name), whose steps table is qualified the same way.
func TestLeaseQualifiedTable(t *testing.T) {
	t.Parallel()
	for _, d := range []idemsql.Dialect{idemsql.Postgres, idemsql.MySQL} {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			db := openDB(t, d, envOptions{})
			schema := "public"
			if d == idemsql.MySQL {
				if err := db.QueryRow(`SELECT DATABASE()`).Scan(&schema); err != nil {
					t.Fatal(err)
				}
			}
			e := newEnv(t, d, envOptions{table: schema + "." + randomName("idem_q_")})
			ctx := t.Context()
			if err := e.store.Migrate(ctx); err != nil {
				t.Fatalf("Migrate again: %v", err)
			}
			a := e.mustAcquire("c", "m", fp("p"), leaseLong)
			if err := e.store.SaveStep(ctx, &idemdriver.StepParams{Consumer: "c", MessageID: "m", Token: a.Token, Step: "s"}); err != nil {
				t.Fatal(err)
			}
			if err := e.store.Complete(ctx, &idemdriver.CompleteParams{Consumer: "c", MessageID: "m", Token: a.Token, Result: []byte("r")}); err != nil {
				t.Fatal(err)
			}
			e.wantSteps("c", 1)
			if err := e.ageRecords(ctx, "c", []string{"m"}, 30*24*time.Hour); err != nil {
				t.Fatal(err)
			}
			if _, err := e.store.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "c", MessageID: "n", Fingerprint: fp("n"), Lease: leaseLong}); err != nil {
				t.Fatal(err)
			}
			res, err := purge(ctx, e.store, &idem.PurgeParams{Consumer: "c", RetentionWindow: 24 * time.Hour, BatchSize: 10})
			if err != nil || res.Deleted != 1 {
				t.Errorf("Purge: %+v, %v; want 1 deleted", res, err)
			}
			e.wantSteps("c", 0)
		})
	}
}
