package idemsql_test

import (
	"context"
	"database/sql"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idemsql"
)

// TestSQLiteLeaseBatchesRunPreparedStatements checks that SQLite's lease
// batches prepare their statements once and that the prepared ones do
// what the statements do: two rounds of claims (with a recovery point)
// and completions, then every record is completed with its result and a
// claim again finds it so.
func TestSQLiteLeaseBatchesRunPreparedStatements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newEnv(t, idemsql.SQLite, envOptions{}).store
	claim := func(ids ...string) []*idemdriver.AcquireParams {
		ps := make([]*idemdriver.AcquireParams, len(ids))
		for i, id := range ids {
			ps[i] = &idemdriver.AcquireParams{Consumer: "c", MessageID: id, Fingerprint: []byte("f"), Lease: time.Minute, StepPrefix: "run:"}
		}
		return ps
	}
	for round := range 2 {
		ids := []string{fmt.Sprintf("a%d", round), fmt.Sprintf("b%d", round), fmt.Sprintf("c%d", round)}
		res, errs, err := s.AcquireBatch(ctx, claim(ids...))
		if err != nil {
			t.Fatal(err)
		}
		cs := make([]*idemdriver.CompleteParams, len(ids))
		for i, r := range res {
			if errs[i] != nil || !r.Acquired || r.Token != 1 {
				t.Fatalf("round %d, claim of %s: %+v, %v; want acquired with token 1", round, ids[i], r, errs[i])
			}
			cs[i] = &idemdriver.CompleteParams{Consumer: "c", MessageID: ids[i], Token: r.Token, Result: []byte("r-" + ids[i]), ContentType: "text/plain"}
		}
		cerrs, err := s.CompleteBatch(ctx, cs)
		if err != nil {
			t.Fatal(err)
		}
		for i, e := range cerrs {
			if e != nil {
				t.Fatalf("round %d, completion of %s: %v", round, ids[i], e)
			}
		}
		if n := idemsql.PreparedStatements(s); n != 7 {
			t.Fatalf("round %d: %d lease statements prepared, want 7", round, n)
		}
		again, errs, err := s.AcquireBatch(ctx, claim(ids...))
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range again {
			if errs[i] != nil || r.Acquired || r.State != idemdriver.StateCompleted || string(r.Result) != "r-"+ids[i] {
				t.Fatalf("round %d, second claim of %s: %+v, %v; want completed with its result", round, ids[i], r, errs[i])
			}
		}
	}
}

// TestSQLiteBatchClaimRecoveryPoints checks SQLite's batch claim (one
// statement for the batch's records, one for their recovery points, the
// rest element by element): a batch of new messages, one message twice,
// an ID that JSON escapes and a
// record taken over after its lease ran out is claimed as single
// Acquires claim; each claim saved the recovery point of its token, which
// a later takeover of each record reads back, and the takeover's own
// recovery points are read back by the next one; so too on the path of
// an SQLite without that statement (element by element).
func TestSQLiteBatchClaimRecoveryPoints(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"one statement", "element by element"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, idemsql.SQLite, envOptions{})
			if path == "element by element" {
				idemsql.WithoutSQLiteBatchStatement(e.store)
			}
			testSQLiteBatchClaimRecoveryPoints(t, e)
		})
	}
}

func testSQLiteBatchClaimRecoveryPoints(t *testing.T, e *env) {
	ctx, s := context.Background(), e.store
	ids := []string{"a", "b", "a", `q"<&\\é`, "d", "c"}
	claim := func() ([]idemdriver.AcquireResult, []error) {
		ps := make([]*idemdriver.AcquireParams, len(ids))
		for i, id := range ids {
			ps[i] = &idemdriver.AcquireParams{Consumer: "c", MessageID: id, Fingerprint: []byte("f"), Lease: time.Hour, StepPrefix: "run:"}
		}
		res, errs, err := s.AcquireBatch(ctx, ps)
		if err != nil {
			t.Fatal(err)
		}
		return res, errs
	}
	expireAll := func() {
		if _, err := e.db.ExecContext(ctx, "UPDATE "+e.table+" SET lease_expires_at = 0"); err != nil {
			t.Fatal(err)
		}
	}
	for round := int64(1); round <= 3; round++ {
		res, errs := claim()
		for i, id := range ids {
			r := res[i]
			if errs[i] != nil {
				t.Fatalf("round %d, %q: error %v", round, id, errs[i])
			}
			if i == 2 { // the second "a": held by the first
				if r.Acquired || r.State != idemdriver.StateInProgress {
					t.Fatalf("round %d, second %q: %+v; want not acquired, in progress", round, id, r)
				}
				continue
			}
			if !r.Acquired || r.Token != round || r.Attempt != int(round) {
				t.Fatalf("round %d, %q: %+v; want acquired, token and attempt %d", round, id, r, round)
			}
			// Each earlier claim saved its recovery point, with an empty
			// result; the takeover reads them all.
			want := map[string]string{}
			for tok := int64(1); tok < round; tok++ {
				want[idemdriver.PrefixStep("run:", tok)] = ""
			}
			if len(r.Steps) != len(want) {
				t.Fatalf("round %d, %q: steps %q; want %q", round, id, r.Steps, want)
			}
			for name, v := range want {
				if got, ok := r.Steps[name]; !ok || string(got) != v {
					t.Fatalf("round %d, %q: steps %q; want %q", round, id, r.Steps, want)
				}
			}
		}
		expireAll()
	}
	var n int
	if err := e.db.QueryRowContext(ctx, "SELECT count(*) FROM "+e.table+"_steps").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if want := 3 * (len(ids) - 1); n != want {
		t.Errorf("%d recovery points stored, want %d (one a claim)", n, want)
	}
}

// TestClaimsRunPreparedStatements checks, on MySQL and SQLite, that a
// transactional claim and its read of a duplicate's record run from their
// text the first time, are prepared once at the next Begin, and then give
// the same results from the prepared statements: a new message claimed,
// a duplicate with its stored fingerprint, a claim with a lock timeout of
// its own (another text on MySQL), and the records that committed.
func TestClaimsRunPreparedStatements(t *testing.T) {
	t.Parallel()
	for _, d := range []idemsql.Dialect{idemsql.SQLite, idemsql.MySQL} {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := newEnv(t, d, envOptions{})
			s := e.store
			base := idemsql.PreparedStatements(s)
			claim := func(step, id string, fp string, lockTimeout time.Duration, wantClaimed bool, wantPrepared int) {
				t.Helper()
				tx, err := s.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer s.Rollback(ctx, tx)
				if n := idemsql.PreparedStatements(s) - base; n != wantPrepared {
					t.Fatalf("%s: %d claim statements prepared, want %d", step, n, wantPrepared)
				}
				res, err := s.ClaimTx(ctx, tx, &idemdriver.ClaimParams{Consumer: "c", MessageID: id, Fingerprint: []byte(fp), LockTimeout: lockTimeout})
				if err != nil {
					t.Fatalf("%s: %v", step, err)
				}
				if res.Claimed != wantClaimed || (!wantClaimed && (string(res.Fingerprint) != "fp-"+id || res.State != idemdriver.StateCompleted)) {
					t.Fatalf("%s: %+v; want Claimed %v (else fingerprint fp-%s, completed)", step, res, wantClaimed, id)
				}
				if wantClaimed {
					if err := s.Commit(ctx, tx); err != nil {
						t.Fatal(err)
					}
				}
			}
			claim("first claim, from the text", "m-1", "fp-m-1", 0, true, 0)
			claim("duplicate, the claim prepared", "m-1", "other", 0, false, 1)
			claim("duplicate, the read prepared too", "m-1", "other", 0, false, 2)
			claim("new, prepared", "m-2", "fp-m-2", 0, true, 2)
			claim("new with a lock timeout", "m-3", "fp-m-3", 3*time.Second, true, 2)
			wantLockText := 2 // SQLite's claim ignores the lock timeout: the same text
			if d == idemsql.MySQL {
				wantLockText = 3
			}
			claim("duplicate with a lock timeout", "m-3", "other", 3*time.Second, false, wantLockText)
			e.wantRecords("c", 3)
		})
	}
}

// TestPrepareWaitsWithoutBlockingClaims checks that a Begin preparing the
// statements claims asked for, while it waits for the one connection of
// the pool, does not stop the transaction holding that connection from
// claiming (which records statements to prepare too): the transaction
// claims, commits, and then the Begin gets the connection. With a pool
// of one connection on SQLite, as the bench harness runs it.
func TestPrepareWaitsWithoutBlockingClaims(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e := newEnv(t, idemsql.SQLite, envOptions{})
	e.db.SetMaxOpenConns(1)
	s := e.store
	claim := func(tx *sql.Tx, id string) {
		t.Helper()
		res, err := s.ClaimTx(ctx, tx, &idemdriver.ClaimParams{Consumer: "c", MessageID: id, Fingerprint: []byte("fp")})
		if err != nil || !res.Claimed {
			t.Fatalf("claim of %s: %+v, %v; want claimed", id, res, err)
		}
	}
	tx, err := e.db.BeginTx(ctx, nil) // holds the only connection
	if err != nil {
		t.Fatal(err)
	}
	claim(tx, "m-1") // from the text: the claim is to be prepared
	waits := e.db.Stats().WaitCount
	begun := make(chan error, 1)
	go func() {
		tx2, err := s.Begin(ctx) // prepares, waiting for the connection
		if err == nil {
			err = s.Rollback(ctx, tx2)
		}
		begun <- err
	}()
	for e.db.Stats().WaitCount == waits { // until Begin waits for the connection
		if ctx.Err() != nil {
			t.Fatal("Begin never waited for the connection")
		}
		runtime.Gosched()
	}
	claim(tx, "m-2")
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-begun; err != nil {
		t.Fatalf("Begin: %v", err)
	}
	if n := idemsql.PreparedStatements(s); n < 1 {
		t.Fatalf("%d statements prepared after the Begin, want the claim", n)
	}
	e.wantRecords("c", 2)
}
