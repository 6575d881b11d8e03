package idempgxv5_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// batchRecord is a record of the processed table as the set-based batch
// tests check it.
type batchRecord struct {
	id                    string
	state, token, attempt int64
	fp                    string // the fingerprint's first byte, as "a"
	live                  bool   // lease_expires_at > now()
	result, contentType   string
}

func (r batchRecord) String() string {
	return fmt.Sprintf("%s state %d token %d attempt %d fp %s live %v result %q %q", r.id, r.state, r.token, r.attempt, r.fp, r.live, r.result, r.contentType)
}

// batchRecords reads consumer's records on the processed table t (either
// shape), by message ID.
func batchRecords(t *testing.T, pool *pgxpool.Pool, table, consumer string, fps map[string]string) []batchRecord {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT message_id, COALESCE(state, 2)::bigint, COALESCE(token, 0), COALESCE(attempt, 1)::bigint, fingerprint,
		lease_expires_at > now(), COALESCE(result, ''), COALESCE(content_type, '')
		FROM `+recordsFrom(t, pool, table)+` WHERE consumer = $1 ORDER BY message_id`, consumer)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (batchRecord, error) {
		var (
			r     batchRecord
			f     []byte
			res   []byte
			lease *bool
		)
		err := row.Scan(&r.id, &r.state, &r.token, &r.attempt, &f, &lease, &res, &r.contentType)
		r.fp, r.live, r.result = fps[string(f)], lease != nil && *lease, string(res)
		return r, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// One AcquireBatch of elements in every state a record can be in, given
// out of key order, and one CompleteBatch with stale, wrong, repeated and
// absent tokens, on a table of each shape: each element's outcome is the
// single call's, and the rows afterwards are exactly those the single
// calls in order would leave.
func TestLeaseBatchSetOutcomes(t *testing.T) {
	t.Parallel()
	t.Run("v2", func(t *testing.T) {
		t.Parallel()
		b := setup(t, poolOpts{})
		testLeaseBatchSetOutcomes(t, b.store, b.pool, b.table)
	})
	t.Run("v1", func(t *testing.T) {
		t.Parallel()
		u := upgradeTable(t, upgradeVariant{name: "default"}, consumerKeysVersion)
		testLeaseBatchSetOutcomes(t, u.store, u.pool, u.table)
	})
}

func testLeaseBatchSetOutcomes(t *testing.T, s *idempgxv5.Store, pool *pgxpool.Pool, table string) {
	ctx := t.Context()
	const c = "c"
	fps := map[string]string{string(fp("x")): "x", string(fp("a")): "a"}
	acquire := func(id, f string) idemdriver.AcquireResult {
		t.Helper()
		r, err := s.Acquire(ctx, &idemdriver.AcquireParams{Consumer: c, MessageID: id, Fingerprint: fp(f), Lease: time.Minute})
		if err != nil || !r.Acquired {
			t.Fatalf("acquire %s: %+v, %v", id, r, err)
		}
		return r
	}
	expire := func(id string) {
		t.Helper()
		if _, err := pool.Exec(ctx, `UPDATE `+table+` SET lease_expires_at = now() - interval '1 second' WHERE message_id = $1`, id); err != nil {
			t.Fatal(err)
		}
	}
	done := acquire("done", "x")
	if err := s.Complete(ctx, &idemdriver.CompleteParams{Consumer: c, MessageID: "done", Token: done.Token, Result: []byte("r-done"), ContentType: "text/plain"}); err != nil {
		t.Fatal(err)
	}
	acquire("live", "x")
	acquire("expired", "x")
	expire("expired")
	acquire("otherfp", "a")
	expire("otherfp")
	failed := acquire("failed", "x")
	if err := s.Release(ctx, &idemdriver.ReleaseParams{Consumer: c, MessageID: "failed", Token: failed.Token, Error: "boom", Terminal: true}); err != nil {
		t.Fatal(err)
	}

	ids := []string{"new-2", "expired", "live", "done", "otherfp", "new-1", "failed", "new-1"}
	ps := make([]*idemdriver.AcquireParams, len(ids))
	for i, id := range ids {
		ps[i] = &idemdriver.AcquireParams{Consumer: c, MessageID: id, Fingerprint: fp("x"), Lease: time.Minute}
	}
	res, errs, err := s.AcquireBatch(ctx, ps)
	if err != nil {
		t.Fatalf("AcquireBatch: %v", err)
	}
	for i, e := range errs {
		if e != nil {
			t.Errorf("element %d (%s): %v", i, ids[i], e)
		}
	}
	acquired := func(i int, token, attempt int64) {
		t.Helper()
		if r := res[i]; !r.Acquired || r.Token != token || int64(r.Attempt) != attempt || len(r.Steps) != 0 {
			t.Errorf("%s (element %d) = %+v; want acquired, token %d, attempt %d, no recovery points", ids[i], i, r, token, attempt)
		}
	}
	acquired(0, 1, 1) // new-2
	acquired(1, 2, 2) // expired: taken over
	acquired(5, 1, 1) // new-1
	if r := res[2]; r.Acquired || r.State != idemdriver.StateInProgress || r.LeaseRemaining <= 0 || r.LeaseRemaining > time.Minute {
		t.Errorf("live = %+v; want in progress, a remaining lease in (0, 1m]", r)
	}
	if r := res[3]; r.Acquired || r.State != idemdriver.StateCompleted || string(r.Result) != "r-done" || r.ContentType != "text/plain" || r.Attempt != 1 {
		t.Errorf("done = %+v; want completed with r-done, text/plain, attempt 1", r)
	}
	if r := res[4]; r.Acquired || r.State != idemdriver.StateInProgress || string(r.Fingerprint) != string(fp("a")) || r.LeaseRemaining != 0 {
		t.Errorf("otherfp = %+v; want in progress with fingerprint a, its lease ended, not taken over", r)
	}
	if r := res[6]; r.Acquired || r.State != idemdriver.StateFailed || r.Error != "boom" {
		t.Errorf("failed = %+v; want failed with error boom", r)
	}
	if r := res[7]; r.Acquired || r.State != idemdriver.StateInProgress || r.LeaseRemaining <= 0 {
		t.Errorf("new-1 a second time = %+v; want in progress (held by the batch's first new-1)", r)
	}
	want := []string{
		"done state 2 token 1 attempt 1 fp x live false result \"r-done\" \"text/plain\"",
		"expired state 1 token 2 attempt 2 fp x live true result \"\" \"\"",
		"failed state 3 token 2 attempt 1 fp x live false result \"\" \"\"",
		"live state 1 token 1 attempt 1 fp x live true result \"\" \"\"",
		"new-1 state 1 token 1 attempt 1 fp x live true result \"\" \"\"",
		"new-2 state 1 token 1 attempt 1 fp x live true result \"\" \"\"",
		"otherfp state 1 token 1 attempt 1 fp a live false result \"\" \"\"",
	}
	checkRecords := func(what string, want []string) {
		t.Helper()
		var got []string
		for _, r := range batchRecords(t, pool, table, c, fps) {
			got = append(got, r.String())
		}
		if !slices.Equal(got, want) {
			t.Errorf("records after %s:\n%s\nwant\n%s", what, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
	checkRecords("AcquireBatch", want)

	cps := []*idemdriver.CompleteParams{
		{Consumer: c, MessageID: "new-1", Token: 1, Result: []byte("r1"), ContentType: "application/json"},
		{Consumer: c, MessageID: "expired", Token: 1, Result: []byte("stale")}, // taken over: lost
		{Consumer: c, MessageID: "done", Token: 1, Result: []byte("again")},    // completed already: lost
		{Consumer: c, MessageID: "expired", Token: 2, Result: []byte("r-exp")},
		{Consumer: c, MessageID: "live", Token: 1},
		{Consumer: c, MessageID: "new-2", Token: 1, Result: []byte("r2")},
		{Consumer: c, MessageID: "new-2", Token: 1, Result: []byte("r2 again")}, // completed by the element before: lost
		{Consumer: c, MessageID: "otherfp", Token: 7},                           // not its token: lost
		{Consumer: c, MessageID: "absent", Token: 1},                            // no record: lost
		{Consumer: c, MessageID: "failed", Token: 2},                            // failed: lost
	}
	cerrs, err := s.CompleteBatch(ctx, cps)
	if err != nil {
		t.Fatalf("CompleteBatch: %v", err)
	}
	lost := map[int]bool{1: true, 2: true, 6: true, 7: true, 8: true, 9: true}
	for i, e := range cerrs {
		if lost[i] != errors.Is(e, idem.ErrLeaseLost) || (!lost[i] && e != nil) {
			t.Errorf("completion %d (%s, token %d) = %v; want lost %v", i, cps[i].MessageID, cps[i].Token, e, lost[i])
		}
	}
	checkRecords("CompleteBatch", []string{
		want[0],
		"expired state 2 token 2 attempt 2 fp x live false result \"r-exp\" \"\"",
		want[2],
		"live state 2 token 1 attempt 1 fp x live false result \"\" \"\"",
		"new-1 state 2 token 1 attempt 1 fp x live false result \"r1\" \"application/json\"",
		"new-2 state 2 token 1 attempt 1 fp x live false result \"r2\" \"\"",
		want[6],
	})
}

// Two AcquireBatches and then two CompleteBatches of the same records,
// given in opposite orders and started together, many times: the
// statements lock their rows in one order, so neither waits for the
// other in a cycle (no deadlock error), and each record is acquired once
// and completed once.
func TestLeaseBatchSetOppositeOrders(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, poolOpts{})
	const n, rounds = 40, 15
	for round := range rounds {
		ids := make([]string, n)
		for i := range ids {
			ids[i] = fmt.Sprintf("r%d-m%02d", round, i)
		}
		rev := slices.Clone(ids)
		slices.Reverse(rev)
		acq := func(ids []string) []*idemdriver.AcquireParams {
			ps := make([]*idemdriver.AcquireParams, len(ids))
			for i, id := range ids {
				ps[i] = &idemdriver.AcquireParams{Consumer: "c", MessageID: id, Fingerprint: fp("x"), Lease: time.Minute}
			}
			return ps
		}
		var (
			wg    sync.WaitGroup
			start = make(chan struct{})
			res   [2][]idemdriver.AcquireResult
			errs  [2]error
		)
		for k, order := range [][]string{ids, rev} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				var es []error
				res[k], es, errs[k] = b.store.AcquireBatch(ctx, acq(order))
				errs[k] = errors.Join(errs[k], errors.Join(es...))
			}()
		}
		close(start)
		wg.Wait()
		if err := errors.Join(errs[:]...); err != nil {
			t.Fatalf("round %d: AcquireBatch: %v", round, err)
		}
		for i := range ids {
			a, r := res[0][i], res[1][n-1-i]
			if a.Acquired == r.Acquired {
				t.Fatalf("round %d: %s acquired by the first batch %v, by the second %v; want exactly one", round, ids[i], a.Acquired, r.Acquired)
			}
			if !a.Acquired && a.State != idemdriver.StateInProgress || !r.Acquired && r.State != idemdriver.StateInProgress {
				t.Fatalf("round %d: %s not acquired but not in progress: %+v, %+v", round, ids[i], a, r)
			}
		}
		comp := func(ids []string) []*idemdriver.CompleteParams {
			ps := make([]*idemdriver.CompleteParams, len(ids))
			for i, id := range ids {
				ps[i] = &idemdriver.CompleteParams{Consumer: "c", MessageID: id, Token: 1, Result: []byte(id)}
			}
			return ps
		}
		var cerrs [2][]error
		start = make(chan struct{})
		for k, order := range [][]string{ids, rev} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				cerrs[k], errs[k] = b.store.CompleteBatch(ctx, comp(order))
			}()
		}
		close(start)
		wg.Wait()
		if err := errors.Join(errs[:]...); err != nil {
			t.Fatalf("round %d: CompleteBatch: %v", round, err)
		}
		for i := range ids {
			a, r := cerrs[0][i], cerrs[1][n-1-i]
			if (a == nil) == (r == nil) || !errors.Is(errors.Join(a, r), idem.ErrLeaseLost) {
				t.Fatalf("round %d: %s completed by the first batch: %v, the second: %v; want one nil, one ErrLeaseLost", round, ids[i], a, r)
			}
		}
	}
	var completed int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.table+` WHERE state = 2 AND result = convert_to(message_id, 'UTF8')`).Scan(&completed); err != nil {
		t.Fatal(err)
	}
	if completed != n*rounds {
		t.Errorf("%d records completed with their result, want %d", completed, n*rounds)
	}
}
