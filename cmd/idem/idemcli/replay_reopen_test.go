package idemcli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemhttp"
)

// reopenStore is what the replay of a reopened record needs of a store:
// the lease engine (for idem consume's Deliverer), the operator's reads
// and actions, and the recovery points.
type reopenStore interface {
	idemdriver.LeaseStore
	console.Store
	idemdriver.Reopener
	idemdriver.StepReader
}

// reopenStores opens each real store the replay runs on: PostgreSQL
// and SQLite (a table of their own, `idem migrate`) and Redis (a key
// prefix of its own), MariaDB (a table of its own).
func reopenStores(t *testing.T) map[string]func(t *testing.T) reopenStore {
	return map[string]func(t *testing.T) reopenStore{
		"postgres": func(t *testing.T) reopenStore {
			_, st := migratedPG(t, serviceURL(t, "IDEM_TEST_POSTGRES_URL"))
			return st.store
		},
		"sqlite": func(t *testing.T) reopenStore {
			_, st := migratedSQLite(t)
			return st.store
		},
		"mariadb": func(t *testing.T) reopenStore {
			cfg, err := mysql.ParseDSN(serviceURL(t, "IDEM_TEST_MYSQL_URL"))
			if err != nil {
				t.Fatalf("IDEM_TEST_MYSQL_URL: %v", err)
			}
			storeURL := fmt.Sprintf("mysql://%s:%s@%s/%s", cfg.User, cfg.Passwd, cfg.Addr, cfg.DBName)
			table := "idem_reopen_" + randSuffix()
			if code, _, stderr := run(t, "migrate", "--store", storeURL, "--table", table); code != 0 {
				t.Fatalf("migrate: exit %d: %s", code, stderr)
			}
			st, err := openSQLStore(t.Context(), storeURL, table)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				for _, tb := range []string{table + "_steps", table, table + "_migrations", table + "_runs", table + "_outbox"} {
					_, _ = st.db.Exec("DROP TABLE IF EXISTS " + tb)
				}
				st.db.Close()
			})
			return st.store
		},
		"redis": func(t *testing.T) reopenStore {
			prefix := "idem-test-reopen-" + randSuffix() + ":"
			rs, err := openRedisStore(t.Context(), serviceURL(t, "IDEM_TEST_REDIS_URL"), prefix)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				ctx := context.Background()
				iter := rs.client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
				for iter.Next(ctx) {
					rs.client.Del(ctx, iter.Val())
				}
				rs.client.Close()
			})
			return rs.store
		},
	}
}

// migratedSQLite migrates a SQLite file of the test's own (`idem
// migrate`) and returns its store URL and the store open on it, closed
// when the test ends.
func migratedSQLite(t *testing.T) (string, *sqlStore) {
	t.Helper()
	storeURL := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	if code, _, stderr := run(t, "migrate", "--store", storeURL); code != 0 {
		t.Fatalf("migrate: exit %d: %s", code, stderr)
	}
	st, err := openSQLStore(t.Context(), storeURL, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.db.Close() })
	return storeURL, st
}

// replayBroker holds one dead letter at position "1" and keeps the
// copies republished; while fail is set, a republish fails.
type replayBroker struct {
	dl     console.DeadLetter
	fail   atomic.Bool
	mu     sync.Mutex
	copies []console.DeadLetter
}

func (b *replayBroker) Where() string { return "test broker" }

func (b *replayBroker) Newest(context.Context, string, string, int) ([]console.DeadLetter, string, error) {
	return []console.DeadLetter{b.dl}, "", nil
}

func (b *replayBroker) Get(_ context.Context, _, pos string) (console.DeadLetter, error) {
	if pos != b.dl.Position {
		return console.DeadLetter{}, console.ErrNoDeadLetter
	}
	return b.dl, nil
}

func (b *replayBroker) Replayable(context.Context, console.DeadLetter) error { return nil }

func (b *replayBroker) Republish(_ context.Context, dl console.DeadLetter) (string, error) {
	if b.fail.Load() {
		return "", errors.New("test broker: connection refused")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.copies = append(b.copies, dl)
	return "copy", nil
}

func (b *replayBroker) published() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.copies)
}

// reopenCase is message order-1 of a consumer of st, which the Deliverer
// dead-lettered because the service answered 422; status is the
// service's next answer, calls counts the calls the service received.
type reopenCase struct {
	t        *testing.T
	st       reopenStore
	consumer string
	d        *idemhttp.Deliverer
	broker   *replayBroker
	msg      idem.Message
	status   atomic.Int64
	calls    atomic.Int64
	// hold, when set before a call, is called inside the service (the
	// call is in flight until it returns).
	hold func()
}

func newReopenCase(t *testing.T, st reopenStore) *reopenCase {
	t.Helper()
	c := &reopenCase{t: t, st: st, consumer: "orders-" + randSuffix(), msg: idem.Message{ID: "order-1", Payload: []byte(`{"order":1}`)}}
	lc, err := idem.NewLeaseConsumer(st, idem.Config{Name: c.consumer, PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lc.Close() })
	c.status.Store(http.StatusUnprocessableEntity)
	target, _ := url.Parse("http://service.test/orders")
	c.d, err = idemhttp.NewDeliverer(lc, idemhttp.DelivererOptions{Target: target, Transport: reopenTransport(func(r *http.Request) (*http.Response, error) {
		c.calls.Add(1)
		_, _ = io.ReadAll(r.Body)
		if c.hold != nil {
			c.hold()
		}
		return &http.Response{StatusCode: int(c.status.Load()), Header: http.Header{}, Body: io.NopCloser(strings.NewReader("answer"))}, nil
	})})
	if err != nil {
		t.Fatal(err)
	}
	if s := c.deliver(c.msg); s.Action != idem.DeadLetter || s.Reason != idem.ReasonPermanent {
		t.Fatalf("first delivery: %v %s (%v), want a dead letter, reason permanent", s.Action, s.Reason, s.Err)
	}
	c.broker = &replayBroker{dl: console.DeadLetter{Position: "1", Destination: "orders.dead", Source: "orders", MessageID: c.msg.ID,
		Reason: idem.ReasonPermanent, Payload: c.msg.Payload}}
	return c
}

type reopenTransport func(*http.Request) (*http.Response, error)

func (f reopenTransport) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func (c *reopenCase) deliver(m idem.Message) idem.Settlement {
	return idem.Guard(c.t.Context(), c.d, m).Settle(0)
}

func (c *reopenCase) replay(force bool) (console.ActionView, error) {
	return c.replayAt(force, time.Now)
}

// replayAt replays with now as the console's clock.
func (c *reopenCase) replayAt(force bool, now func() time.Time) (console.ActionView, error) {
	a := console.Action{Kind: console.ActionReplay, Consumer: c.consumer, DeadLetter: "orders.dead", Position: "1", Force: force}
	return console.Replay(c.t.Context(), c.st, c.broker, a, now)
}

func (c *reopenCase) record() idemdriver.Record {
	c.t.Helper()
	rec, err := c.st.Inspect(c.t.Context(), c.consumer, c.msg.ID)
	if err != nil {
		c.t.Fatalf("Inspect: %v", err)
	}
	return rec
}

// wantSuccess checks that the record holds the service's 2xx answer and
// the service was called calls times.
func (c *reopenCase) wantSuccess(what string, calls int64) {
	c.t.Helper()
	rec := c.record()
	if reason, dead := idemhttp.DeadLetterAnswer(rec.ContentType, rec.Result); rec.State != idemdriver.StateCompleted || dead || len(rec.Result) == 0 {
		c.t.Errorf("%s: record %v, token %d, dead-letter answer %q %v; want completed with the success", what, rec.State, rec.Token, reason, dead)
	}
	if n := c.calls.Load(); n != calls {
		c.t.Errorf("%s: service called %d times, want %d", what, n, calls)
	}
}

// TestReplayReopenRaces replays, on each real store, a dead letter whose
// record idem consume completed with a 422, while other replays and a
// redelivery race it: of concurrent replays (a console double-click and
// the CLI) exactly one reopens and publishes; the copy and a redelivery
// of the original, delivered at once, call the fixed service once
// between them; afterwards the record holds the success, and a replay,
// forced or not, is refused and publishes nothing.
func TestReplayReopenRaces(t *testing.T) {
	for name, open := range reopenStores(t) {
		t.Run(name, func(t *testing.T) {
			c := newReopenCase(t, open(t))
			c.status.Store(http.StatusOK)
			const n = 6
			var (
				wg    sync.WaitGroup
				start = make(chan struct{})
				errs  = make([]error, n)
			)
			for i := range n {
				wg.Go(func() {
					<-start
					_, errs[i] = c.replay(false)
				})
			}
			close(start)
			wg.Wait()
			var ok int
			for i, err := range errs {
				switch {
				case err == nil:
					ok++
				case !errors.Is(err, console.ErrNotReplayable):
					t.Errorf("replay %d: %v, want refused (ErrNotReplayable) or replayed", i, err)
				}
			}
			if ok != 1 || c.broker.published() != 1 {
				t.Fatalf("%d concurrent replays: %d replayed, %d copies; want exactly one of each (errors %v)", n, ok, c.broker.published(), errs)
			}
			if rec := c.record(); rec.State != idemdriver.StateInProgress || len(rec.Result) != 0 || rec.Attempt != 0 {
				t.Errorf("record after the replays: %v, attempt %d, result %q; want reopened", rec.State, rec.Attempt, rec.Result)
			}
			if steps, err := c.st.Steps(t.Context(), c.consumer, c.msg.ID); err != nil || len(steps) != 0 {
				t.Errorf("recovery points after the reopen: %v, %v; want none", steps, err)
			}

			// The copy and a redelivery of the original at once: one calls.
			var settled [2]idem.Settlement
			start = make(chan struct{})
			for i := range settled {
				wg.Go(func() {
					<-start
					settled[i] = c.deliver(c.msg)
				})
			}
			close(start)
			wg.Wait()
			for i, s := range settled {
				if s.Action == idem.DeadLetter {
					t.Errorf("delivery %d after the reopen: dead-lettered (%s, %v)", i, s.Reason, s.Err)
				}
			}
			// Whichever was held off is delivered again: a duplicate.
			if s := c.deliver(c.msg); s.Action != idem.Ack {
				t.Errorf("delivery after the race: %v %s (%v), want acked", s.Action, s.Reason, s.Err)
			}
			c.wantSuccess("after the copy and the redelivery", 2)

			for _, force := range []bool{false, true} {
				if _, err := c.replay(force); !errors.Is(err, console.ErrNotReplayable) || !strings.Contains(err.Error(), "processed") {
					t.Errorf("replay (force %v) of the record holding a success: %v, want refused as processed", force, err)
				}
			}
			if got := c.broker.published(); got != 1 {
				t.Errorf("copies after the refused replays: %d, want 1", got)
			}
			c.wantSuccess("after the refused replays", 2)
		})
	}
}

// TestReplayReopenPublishFails: when the broker refuses the copy after
// the record was reopened, the replay fails saying a forced replay
// publishes it (ErrForceable); the record stays reopened, the service
// uncalled; an unforced replay is refused, a forced one publishes the
// copy, which calls the fixed service once.
func TestReplayReopenPublishFails(t *testing.T) {
	for name, open := range reopenStores(t) {
		t.Run(name, func(t *testing.T) {
			c := newReopenCase(t, open(t))
			c.status.Store(http.StatusOK)
			c.broker.fail.Store(true)
			_, err := c.replay(false)
			if !errors.Is(err, console.ErrForceable) || !strings.Contains(err.Error(), "replay with force") {
				t.Fatalf("replay whose publish fails: %v, want an error saying to replay with force", err)
			}
			if rec := c.record(); rec.State != idemdriver.StateInProgress || len(rec.Result) != 0 {
				t.Errorf("record after the failed publish: %v, result %q; want reopened", rec.State, rec.Result)
			}
			c.broker.fail.Store(false)
			if _, err := c.replay(false); !errors.Is(err, console.ErrForceable) || c.broker.published() != 0 {
				t.Errorf("unforced replay of the reopened record: %v, %d copies; want refused as forceable, none", err, c.broker.published())
			}
			if c.calls.Load() != 1 {
				t.Errorf("service called %d times before the copy, want 1", c.calls.Load())
			}
			if _, err := c.replay(true); err != nil || c.broker.published() != 1 {
				t.Fatalf("forced replay: %v, %d copies; want one copy", err, c.broker.published())
			}
			if s := c.deliver(c.msg); s.Action != idem.Ack || s.Reason != idem.ReasonProcessed {
				t.Errorf("the copy: %v %s (%v), want acked, processed", s.Action, s.Reason, s.Err)
			}
			c.wantSuccess("after the forced replay", 2)
		})
	}
}

// completedWithSteps acquires id by acq, saves steps recovery points
// (s0000, s0001, ...) and completes it with result; it returns the
// completing token.
func completedWithSteps(t *testing.T, st reopenStore, acq *idemdriver.AcquireParams, steps int, result string) int64 {
	t.Helper()
	ctx := t.Context()
	held, err := st.Acquire(ctx, acq)
	if err != nil || !held.Acquired {
		t.Fatalf("Acquire(%q): %+v, %v", acq.MessageID, held, err)
	}
	for i := range steps {
		if err := st.SaveStep(ctx, &idemdriver.StepParams{Consumer: acq.Consumer, MessageID: acq.MessageID, Token: held.Token, Step: fmt.Sprintf("s%04d", i), Result: []byte("x")}); err != nil {
			t.Fatalf("SaveStep %d: %v", i, err)
		}
	}
	if err := st.Complete(ctx, &idemdriver.CompleteParams{Consumer: acq.Consumer, MessageID: acq.MessageID, Token: held.Token, Result: []byte(result), ContentType: "text/plain"}); err != nil {
		t.Fatalf("Complete(%q): %v", acq.MessageID, err)
	}
	return held.Token
}

// TestReopenManySteps: a record with many recovery points, completed,
// is reopened with every point deleted in the same write, and the next
// attempt (a takeover of the reopened record) sees none; a holder of the
// token that completed it owns nothing after the reopen.
func TestReopenManySteps(t *testing.T) {
	const steps = 2000
	for name, open := range reopenStores(t) {
		t.Run(name, func(t *testing.T) {
			st := open(t)
			ctx := t.Context()
			consumer := "steps-" + randSuffix()
			acq := &idemdriver.AcquireParams{Consumer: consumer, MessageID: "m", Fingerprint: []byte("0123456789abcdef0123456789abcdef"), Lease: time.Minute}
			token := completedWithSteps(t, st, acq, steps, "r")
			res, err := st.ReopenRecord(ctx, &idemdriver.ReopenRecordParams{Consumer: consumer, MessageID: "m", Token: token})
			if err != nil || !res.Changed {
				t.Fatalf("ReopenRecord: %+v, %v", res, err)
			}
			if got, err := st.Steps(ctx, consumer, "m"); err != nil || len(got) != 0 {
				t.Errorf("recovery points after the reopen: %d, %v; want none of %d", len(got), err, steps)
			}
			stale := []error{
				st.Complete(ctx, &idemdriver.CompleteParams{Consumer: consumer, MessageID: "m", Token: token, Result: []byte("late")}),
				st.SaveStep(ctx, &idemdriver.StepParams{Consumer: consumer, MessageID: "m", Token: token, Step: "late", Result: []byte("x")}),
				st.Renew(ctx, &idemdriver.RenewParams{Consumer: consumer, MessageID: "m", Token: token, Lease: time.Minute}),
				st.Release(ctx, &idemdriver.ReleaseParams{Consumer: consumer, MessageID: "m", Token: token, Error: "late"}),
			}
			for i, err := range stale {
				if !errors.Is(err, idemdriver.ErrLeaseLost) {
					t.Errorf("stale holder's operation %d after the reopen: %v, want ErrLeaseLost", i, err)
				}
			}
			again, err := st.Acquire(ctx, acq)
			if err != nil || !again.Acquired || again.Attempt != 1 || len(again.Steps) != 0 {
				t.Errorf("Acquire after the reopen: acquired %v, attempt %d, %d steps, %v; want attempt 1 without steps", again.Acquired, again.Attempt, len(again.Steps), err)
			}
			if rec, err := st.Inspect(ctx, consumer, "m"); err != nil || rec.State != idemdriver.StateInProgress || rec.Token != again.Token || len(rec.Result) != 0 {
				t.Errorf("record after the takeover: %+v, %v", rec, err)
			}
		})
	}
}

// TestReopenRacesAcquire runs a reopen and a delivery's Acquire of the
// same completed record at once, many times, on each real store: the
// Acquire either finds the record completed with its old result (it ran
// first: a duplicate) or takes over the reopened record as attempt 1
// under a later token, without the old recovery points, or (PostgreSQL,
// when its clock reading preceded the reopen's) reports it in progress, and
// the next Acquire takes it over; the record is never completed without
// its result.
func TestReopenRacesAcquire(t *testing.T) {
	const rounds = 40
	for name, open := range reopenStores(t) {
		t.Run(name, func(t *testing.T) {
			st := open(t)
			ctx := t.Context()
			consumer := "race-" + randSuffix()
			var dup, took, heldOff int
			for i := range rounds {
				id := fmt.Sprintf("m-%d", i)
				acq := &idemdriver.AcquireParams{Consumer: consumer, MessageID: id, Fingerprint: []byte("0123456789abcdef0123456789abcdef"), Lease: time.Minute, StepPrefix: "run-"}
				token := completedWithSteps(t, st, acq, 1, "422")
				var (
					wg     sync.WaitGroup
					start  = make(chan struct{})
					reopen idemdriver.ActionResult
					rerr   error
					got    idemdriver.AcquireResult
					aerr   error
				)
				wg.Go(func() {
					<-start
					reopen, rerr = st.ReopenRecord(ctx, &idemdriver.ReopenRecordParams{Consumer: consumer, MessageID: id, Token: token})
				})
				wg.Go(func() {
					<-start
					got, aerr = st.Acquire(ctx, acq)
				})
				close(start)
				wg.Wait()
				if rerr != nil || !reopen.Changed {
					t.Fatalf("round %d: ReopenRecord: %+v, %v; want it changed", i, reopen, rerr)
				}
				if aerr != nil {
					t.Fatalf("round %d: Acquire: %v", i, aerr)
				}
				switch {
				case got.Acquired:
					took++
					if got.Attempt != 1 || got.Token <= token+1 {
						t.Errorf("round %d: takeover of the reopened record: attempt %d, token %d; want attempt 1 under a token after %d", i, got.Attempt, got.Token, token+1)
					}
					for step := range got.Steps {
						if !strings.HasPrefix(step, "run-") || step == "run-"+fmt.Sprint(token) {
							t.Errorf("round %d: takeover found the old recovery point %q", i, step)
						}
					}
				case got.State == idemdriver.StateCompleted:
					dup++
					if string(got.Result) != "422" {
						t.Errorf("round %d: Acquire found the record completed with result %q, want the old one", i, got.Result)
					}
				case got.State == idemdriver.StateInProgress:
					// PostgreSQL: the Acquire's now() (its transaction's
					// start) was read before the reopen's, which ended the
					// lease, and its snapshot after the reopen committed:
					// the lease looks unended, held off as for an attempt
					// in flight (the delivery is retried). A Release ends
					// leases the same way.
					heldOff++
					again, err := st.Acquire(ctx, acq)
					if err != nil || !again.Acquired || again.Attempt != 1 || len(again.Steps) != 0 {
						t.Errorf("round %d: Acquire after the one held off: %+v, %v; want attempt 1 without steps", i, again, err)
					}
					got = again
				default:
					t.Errorf("round %d: Acquire neither acquired nor found the record completed or in progress: %+v", i, got)
				}
				rec, err := st.Inspect(ctx, consumer, id)
				if err != nil || rec.State == idemdriver.StateCompleted || len(rec.Result) != 0 {
					t.Errorf("round %d: record after the race: %+v, %v; want in progress without a result", i, rec, err)
				}
				if !got.Acquired {
					if steps, err := st.Steps(ctx, consumer, id); err != nil || len(steps) != 0 {
						t.Errorf("round %d: recovery points after the reopen: %v, %v; want none", i, steps, err)
					}
				}
			}
			t.Logf("%d rounds: %d duplicates (the Acquire first), %d takeovers, %d held off", rounds, dup, took, heldOff)
		})
	}
}

// racingStore is a store on which, between a replay's read and its
// reopen, other runs: another replay's reopen and its copy's delivery.
type racingStore struct {
	reopenStore
	other func()
}

func (s racingStore) ReopenRecord(ctx context.Context, p *idemdriver.ReopenRecordParams) (idemdriver.ActionResult, error) {
	s.other()
	return s.reopenStore.ReopenRecord(ctx, p)
}

// TestForcedReplayDuringTheCopysCall: a forced replay that read the
// record completed with the 422, and reopens it after another replay did
// and that replay's copy is calling the service (a live lease), publishes
// a second copy, saying that another replay reopened the record (not
// that it did); delivered while the call is in flight the copy is held
// off, then dropped as a duplicate: the service is called once after the
// fix.
func TestForcedReplayDuringTheCopysCall(t *testing.T) {
	for name, open := range reopenStores(t) {
		t.Run(name, func(t *testing.T) {
			c := newReopenCase(t, open(t))
			c.status.Store(http.StatusOK)
			entered, release := make(chan struct{}), make(chan struct{})
			c.hold = func() {
				close(entered)
				<-release
			}
			var wg sync.WaitGroup
			var first idem.Settlement
			c.st = racingStore{c.st, func() {
				rec := c.record()
				if _, err := c.st.(racingStore).reopenStore.ReopenRecord(t.Context(), &idemdriver.ReopenRecordParams{Consumer: c.consumer, MessageID: c.msg.ID, Token: rec.Token}); err != nil {
					t.Fatalf("the other replay's reopen: %v", err)
				}
				wg.Go(func() { first = c.deliver(c.msg) })
				<-entered
			}}
			v, err := c.replay(true)
			if err != nil || c.broker.published() != 1 {
				t.Fatalf("forced replay: %+v, %v, %d copies; want one copy", v, err, c.broker.published())
			}
			if strings.Contains(v.Message, "was reopened:") || !strings.Contains(v.Message, "another replay") {
				t.Errorf("forced replay that reopened nothing says: %s; want it to name the other replay's reopen, not its own", v.Message)
			}
			c.hold = nil
			if s := c.deliver(c.msg); s.Action == idem.DeadLetter || s.Action == idem.Ack {
				t.Errorf("the forced copy while the first calls: %v %s (%v), want held off", s.Action, s.Reason, s.Err)
			}
			close(release)
			wg.Wait()
			if first.Action != idem.Ack || first.Reason != idem.ReasonProcessed {
				t.Errorf("the first copy: %v %s (%v), want acked, processed", first.Action, first.Reason, first.Err)
			}
			if s := c.deliver(c.msg); s.Action != idem.Ack {
				t.Errorf("the forced copy again: %v %s (%v), want acked as a duplicate", s.Action, s.Reason, s.Err)
			}
			c.wantSuccess("after both copies", 2)
		})
	}
}

// TestForcedReplayConsoleClockBehind: the console's clock runs behind
// the store's. A record reopened (its publish failed) has no attempt
// holding it, though its lease "ended" at the store's now, which is
// after the console's: a forced replay publishes the copy rather than
// refusing it as held by attempt 0.
func TestForcedReplayConsoleClockBehind(t *testing.T) {
	behind := func() time.Time { return time.Now().Add(-time.Minute) }
	for name, open := range reopenStores(t) {
		t.Run(name, func(t *testing.T) {
			c := newReopenCase(t, open(t))
			c.status.Store(http.StatusOK)
			c.broker.fail.Store(true)
			if _, err := c.replayAt(false, behind); !errors.Is(err, console.ErrForceable) {
				t.Fatalf("replay whose publish fails: %v, want forceable", err)
			}
			c.broker.fail.Store(false)
			if _, err := c.replayAt(true, behind); err != nil || c.broker.published() != 1 {
				t.Fatalf("forced replay with the console's clock behind: %v, %d copies; want one copy", err, c.broker.published())
			}
			if s := c.deliver(c.msg); s.Action != idem.Ack || s.Reason != idem.ReasonProcessed {
				t.Errorf("the copy: %v %s (%v), want acked, processed", s.Action, s.Reason, s.Err)
			}
			c.wantSuccess("after the forced replay", 2)
		})
	}
}
