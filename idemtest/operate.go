package idemtest

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// RunOperate runs the cases of [idemdriver.Operator], the operator's
// list and actions, on a lease store that implements it, with the
// LeaseSetups of h. Beyond the interface's contract it checks that a
// record made retryable is processed by the next delivery as attempt 1
// of a LeaseConsumer whose MaxAttempts it had reached, and that a
// released holder can no longer write. It also runs the cases of
// [idemdriver.ConsumerLister], [idemdriver.StepReader],
// [idemdriver.Inspector]'s Inspect and [idemdriver.Reopener], each skipped
// on a store that does not implement it.
func RunOperate(t *testing.T, h LeaseHarness) {
	t.Helper()
	if h.New == nil {
		t.Fatal("idemtest: LeaseHarness.New is nil")
	}
	nonce := newNonce()
	for _, c := range []leaseCase{
		{"ListFailedPaged", testOperateListFailed},
		{"ListScanBound", testOperateScanBound},
		{"RetryPoisoned", testOperateRetry},
		{"ReleaseStuckLease", testOperateRelease},
		{"BadInput", testOperateBadInput},
		{"Consumers", testOperateConsumers},
		{"Steps", testOperateSteps},
		{"Inspect", testOperateInspect},
		{"ConcurrentActions", testOperateConcurrent},
		{"Reopen", testOperateReopen},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := newLeaseBundle(t, h, nonce, "operate."+c.name)
			if _, ok := b.s.Store.(idemdriver.Operator); !ok {
				t.Fatalf("idemtest: store %T does not implement idemdriver.Operator", b.s.Store)
			}
			c.run(t, b)
		})
	}
}

func (b *leaseBundle) ops() idemdriver.Operator { return b.s.Store.(idemdriver.Operator) }

// poison acquires msg and releases it terminally with errText: a failed record.
func (b *leaseBundle) poison(consumer, id, errText string) {
	b.t.Helper()
	msg := idem.Message{ID: id, Payload: []byte("p:" + id)}
	res := b.mustAcquire("poison "+id, consumer, msg, longLease, 1)
	if err := b.s.Store.Release(b.ctx, &idemdriver.ReleaseParams{Consumer: consumer, MessageID: id, Token: res.Token, Error: errText, Terminal: true}); err != nil {
		b.t.Fatalf("Release(%q, terminal): %v", id, err)
	}
}

// complete acquires msg and completes it.
func (b *leaseBundle) complete(consumer, id string) {
	b.t.Helper()
	msg := idem.Message{ID: id, Payload: []byte("p:" + id)}
	res := b.mustAcquire("complete "+id, consumer, msg, longLease, 1)
	if err := b.s.Store.Complete(b.ctx, &idemdriver.CompleteParams{Consumer: consumer, MessageID: id, Token: res.Token}); err != nil {
		b.t.Fatalf("Complete(%q): %v", id, err)
	}
}

// listAll follows the pages of p to the end and returns every record,
// checking that each page is newest first and ends where the next begins.
func (b *leaseBundle) listAll(p idemdriver.ListRecordsParams) []idemdriver.Record {
	b.t.Helper()
	var all []idemdriver.Record
	for pages := 0; ; pages++ {
		if pages > 1000 {
			b.t.Fatalf("ListRecords: more than 1000 pages; the cursor does not advance")
		}
		q := p
		page, err := b.ops().ListRecords(b.ctx, &q)
		if err != nil {
			b.t.Fatalf("ListRecords(%+v): %v", p, err)
		}
		if len(page.Records) > q.Limit {
			b.t.Errorf("ListRecords: %d records, want at most Limit %d", len(page.Records), q.Limit)
		}
		for _, r := range page.Records {
			if r.State != p.State || r.Consumer != p.Consumer {
				b.t.Errorf("ListRecords(%v): got %q of consumer %q in state %v", p.State, r.MessageID, r.Consumer, r.State)
			}
			if n := len(all); n > 0 && !olderThan(r, all[n-1]) {
				b.t.Errorf("ListRecords: %q (%v) after %q (%v): want newest first, ties by message ID descending",
					r.MessageID, r.ProcessedAt, all[n-1].MessageID, all[n-1].ProcessedAt)
			}
			all = append(all, r)
		}
		if page.Next == "" {
			return all
		}
		p.Cursor = page.Next
	}
}

func olderThan(a, b idemdriver.Record) bool {
	return a.ProcessedAt.Before(b.ProcessedAt) || a.ProcessedAt.Equal(b.ProcessedAt) && a.MessageID < b.MessageID
}

func ids(recs []idemdriver.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.MessageID
	}
	slices.Sort(out)
	return out
}

// Failed records are listed newest first, page by page, each once, with
// their error text and attempt; in-progress, completed and other
// consumers' records are not.
func testOperateListFailed(t *testing.T, b *leaseBundle) {
	c, other := b.name("c"), b.name("other")
	var want []string
	for i := range 7 {
		id := fmt.Sprintf("f-%d", i)
		b.poison(c, id, "boom "+id)
		want = append(want, id)
		b.complete(c, fmt.Sprintf("ok-%d", i))
	}
	b.acquire("held", c, idem.Message{ID: "held", Payload: []byte("p:held")}, longLease)
	b.poison(other, "f-other", "other")
	got := b.listAll(idemdriver.ListRecordsParams{Consumer: c, State: idemdriver.StateFailed, Limit: 3})
	if !slices.Equal(ids(got), want) {
		t.Errorf("failed records listed %v, want %v", ids(got), want)
	}
	for _, r := range got {
		if r.Error != "boom "+r.MessageID || r.Attempt != 1 || r.Token < 1 || len(r.Fingerprint) == 0 {
			t.Errorf("record %q: error %q, attempt %d, token %d, fingerprint %x; want error %q, attempt 1, a token and a fingerprint",
				r.MessageID, r.Error, r.Attempt, r.Token, r.Fingerprint, "boom "+r.MessageID)
		}
	}
	_, err := b.ops().ListRecords(b.ctx, &idemdriver.ListRecordsParams{Consumer: c, State: idemdriver.StateInProgress})
	if errors.Is(err, idemdriver.ErrUnsupported) {
		t.Logf("the store cannot list the records in progress: %v", err)
		return
	}
	held := b.listAll(idemdriver.ListRecordsParams{Consumer: c, State: idemdriver.StateInProgress})
	if len(held) != 1 || held[0].MessageID != "held" || held[0].Token != 1 || held[0].Attempt != 1 || held[0].LeaseExpiresAt.IsZero() {
		t.Errorf("in-progress records = %+v, want one: held, token 1, attempt 1, with its lease's end", held)
	}
}

// A page examines at most Scan records: a failed record behind many
// completed ones is reached through pages that may be empty but carry a
// cursor, and is listed once. A store that finds failed records through
// an index of them (PostgreSQL, SQLite) examines no completed record:
// its first page holds the failed record and nothing follows. Either way,
// the first page holds the record or a cursor to go on from. Leases in
// progress are found through a window of Scan records on every store.
func testOperateScanBound(t *testing.T, b *leaseBundle) {
	c := b.name("c")
	b.poison(c, "old-failed", "x")
	for i := range 6 {
		b.complete(c, fmt.Sprintf("ok-%d", i))
	}
	p := idemdriver.ListRecordsParams{Consumer: c, State: idemdriver.StateFailed, Limit: 1, Scan: 2}
	first, err := b.ops().ListRecords(b.ctx, &p)
	if err != nil {
		t.Fatalf("ListRecords: %v", err)
	}
	if first.Next == "" && !slices.Equal(ids(first.Records), []string{"old-failed"}) {
		t.Errorf("first page of Scan 2 over 7 records: %v and no cursor; want [old-failed] or a cursor to go on from", ids(first.Records))
	}
	// Leases in progress are found by a window of Scan records on every
	// store: the first page of those holds no record but a cursor.
	b.acquire("a-held", c, idem.Message{ID: "a-held", Payload: []byte("p:a-held")}, longLease)
	for i := range 3 {
		b.complete(c, fmt.Sprintf("ok-later-%d", i))
	}
	held, err := b.ops().ListRecords(b.ctx, &idemdriver.ListRecordsParams{Consumer: c, State: idemdriver.StateInProgress, Limit: 1, Scan: 2})
	if errors.Is(err, idemdriver.ErrUnsupported) {
		return
	}
	if err != nil {
		t.Fatalf("ListRecords (in progress): %v", err)
	}
	if len(held.Records) != 0 || held.Next == "" {
		t.Errorf("first page of leases in progress, Scan 2, behind 3 completed records: %v, cursor %q; want none and a cursor", ids(held.Records), held.Next)
	}
	if got := b.listAll(idemdriver.ListRecordsParams{Consumer: c, State: idemdriver.StateInProgress, Limit: 1, Scan: 2}); !slices.Equal(ids(got), []string{"a-held"}) {
		t.Errorf("leases in progress listed %v, want [a-held]", ids(got))
	}
	got := b.listAll(idemdriver.ListRecordsParams{Consumer: c, State: idemdriver.StateFailed, Limit: 1, Scan: 2})
	if !slices.Equal(ids(got), []string{"old-failed"}) {
		t.Errorf("failed records listed %v, want [old-failed]", ids(got))
	}
}

// A poisoned record made retryable is processed by the next delivery as
// attempt 1 of a consumer whose MaxAttempts it had used up; a second
// retry changes nothing, and a retry of the completed record is refused.
func testOperateRetry(t *testing.T, b *leaseBundle) {
	c := b.consumer("c", idem.Config{MaxAttempts: 1})
	msg := idem.Message{ID: "pay-1", Payload: []byte(`{"amount":1}`)}
	var runs int
	fail := true
	h := func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
		runs++
		if fail {
			return idem.Result{}, errBoom
		}
		if a.Number != 1 {
			t.Errorf("retried delivery ran as attempt %d, want 1 (a fresh round)", a.Number)
		}
		return idem.Result{Body: []byte("done")}, nil
	}
	b.process("first delivery", c, msg, h, idem.Failed, errBoom)
	b.process("redelivery of the poisoned message", c, msg, h, idem.Failed, idem.ErrPoison)
	if runs != 1 {
		t.Fatalf("handler ran %d times before the retry, want 1", runs)
	}
	res, err := b.ops().RetryRecord(b.ctx, c.Name(), msg.ID)
	if err != nil || !res.Changed {
		t.Fatalf("RetryRecord: %+v, %v; want Changed", res, err)
	}
	if r := res.Record; r.State != idemdriver.StateInProgress || r.Attempt != 0 || r.Error == "" {
		t.Errorf("retried record: state %v, attempt %d, error %q; want in_progress, attempt 0, the error kept", r.State, r.Attempt, r.Error)
	}
	again, err := b.ops().RetryRecord(b.ctx, c.Name(), msg.ID)
	if err != nil || again.Changed {
		t.Errorf("second RetryRecord: %+v, %v; want Changed false and no error", again, err)
	}
	fail = false
	b.process("delivery after the retry", c, msg, h, idem.Processed, nil)
	b.process("duplicate after the retry", c, msg, h, idem.Duplicate, nil)
	if runs != 2 {
		t.Errorf("handler ran %d times, want 2: once before the retry, once after", runs)
	}
	if _, err := b.ops().RetryRecord(b.ctx, c.Name(), msg.ID); !errors.Is(err, idemdriver.ErrWrongState) {
		t.Errorf("RetryRecord of the completed record: %v, want ErrWrongState", err)
	}
	b.process("duplicate after the refused retry", c, msg, h, idem.Duplicate, nil)
	if _, err := b.ops().RetryRecord(b.ctx, c.Name(), "missing"); !errors.Is(err, idemdriver.ErrNotFound) {
		t.Errorf("RetryRecord of a missing record: %v, want ErrNotFound", err)
	}
	b.wantRecords("after the retries", c.Name(), 1)
}

// Releasing a stuck lease ends it for its holder (whose Complete is then
// refused) and lets the next delivery take over; a second release
// changes nothing; a token the record never had, or a completed record,
// is refused.
func testOperateRelease(t *testing.T, b *leaseBundle) {
	c := b.name("c")
	msg := idem.Message{ID: "stuck", Payload: []byte("p")}
	held := b.mustAcquire("stuck attempt", c, msg, longLease, 1)
	if _, err := b.ops().ReleaseLease(b.ctx, &idemdriver.ReleaseLeaseParams{Consumer: c, MessageID: msg.ID, Token: held.Token + 5}); !errors.Is(err, idemdriver.ErrWrongState) {
		t.Errorf("ReleaseLease of a token never held: %v, want ErrWrongState", err)
	}
	p := &idemdriver.ReleaseLeaseParams{Consumer: c, MessageID: msg.ID, Token: held.Token}
	res, err := b.ops().ReleaseLease(b.ctx, p)
	if err != nil || !res.Changed || res.Record.State != idemdriver.StateInProgress {
		t.Fatalf("ReleaseLease: %+v, %v; want Changed, the record in progress", res, err)
	}
	again, err := b.ops().ReleaseLease(b.ctx, p)
	if err != nil || again.Changed {
		t.Errorf("second ReleaseLease: %+v, %v; want Changed false and no error", again, err)
	}
	err = b.s.Store.Complete(b.ctx, &idemdriver.CompleteParams{Consumer: c, MessageID: msg.ID, Token: held.Token})
	if !errors.Is(err, idemdriver.ErrLeaseLost) {
		t.Errorf("released holder's Complete: %v, want ErrLeaseLost", err)
	}
	err = b.s.Store.SaveStep(b.ctx, &idemdriver.StepParams{Consumer: c, MessageID: msg.ID, Token: held.Token, Step: "charge", Result: []byte("late")})
	if !errors.Is(err, idemdriver.ErrLeaseLost) {
		t.Errorf("released holder's SaveStep: %v, want ErrLeaseLost", err)
	}
	next := b.mustAcquire("delivery after the release", c, msg, longLease, 2)
	// The released holder, still running beside the next one, can
	// neither save a step nor complete.
	err = b.s.Store.SaveStep(b.ctx, &idemdriver.StepParams{Consumer: c, MessageID: msg.ID, Token: held.Token, Step: "charge", Result: []byte("late")})
	if !errors.Is(err, idemdriver.ErrLeaseLost) {
		t.Errorf("released holder's SaveStep beside the next holder: %v, want ErrLeaseLost", err)
	}
	err = b.s.Store.Complete(b.ctx, &idemdriver.CompleteParams{Consumer: c, MessageID: msg.ID, Token: held.Token})
	if !errors.Is(err, idemdriver.ErrLeaseLost) {
		t.Errorf("released holder's Complete beside the next holder: %v, want ErrLeaseLost", err)
	}
	if again, err := b.ops().ReleaseLease(b.ctx, p); err != nil || again.Changed {
		t.Errorf("ReleaseLease of the old token after a takeover: %+v, %v; want Changed false", again, err)
	}
	if err := b.s.Store.Complete(b.ctx, &idemdriver.CompleteParams{Consumer: c, MessageID: msg.ID, Token: next.Token}); err != nil {
		t.Fatalf("new holder's Complete: %v", err)
	}
	if _, err := b.ops().ReleaseLease(b.ctx, &idemdriver.ReleaseLeaseParams{Consumer: c, MessageID: msg.ID, Token: next.Token}); !errors.Is(err, idemdriver.ErrWrongState) {
		t.Errorf("ReleaseLease of a completed record: %v, want ErrWrongState", err)
	}
	b.wantNotAcquired("after the refused release", b.acquire("after", c, msg, longLease), idemdriver.StateCompleted)
	if _, err := b.ops().ReleaseLease(b.ctx, &idemdriver.ReleaseLeaseParams{Consumer: c, MessageID: "missing", Token: 1}); !errors.Is(err, idemdriver.ErrNotFound) {
		t.Errorf("ReleaseLease of a missing record: %v, want ErrNotFound", err)
	}
}

// A store that lists its consumers lists each one with records once,
// with its oldest and newest record's time.
func testOperateConsumers(t *testing.T, b *leaseBundle) {
	cl, ok := b.s.Store.(idemdriver.ConsumerLister)
	if !ok {
		t.Skipf("store %T does not implement idemdriver.ConsumerLister", b.s.Store)
	}
	c1, c2 := b.name("a"), b.name("b")
	b.complete(c1, "m-1")
	b.complete(c1, "m-2")
	b.poison(c2, "m-1", "x")
	all, err := cl.Consumers(b.ctx)
	if err != nil {
		t.Fatalf("Consumers: %v", err)
	}
	found := map[string]idemdriver.ConsumerStats{}
	for i, c := range all {
		if i > 0 && all[i-1].Consumer >= c.Consumer {
			t.Errorf("Consumers: %q after %q, want byte order", c.Consumer, all[i-1].Consumer)
		}
		found[c.Consumer] = c
	}
	for _, name := range []string{c1, c2} {
		c, ok := found[name]
		if !ok || c.Oldest.IsZero() || c.Newest.Before(c.Oldest) {
			t.Errorf("consumer %q: %+v (listed %v), want its oldest and newest record times", name, c, ok)
		}
	}
}

// Actions run at once on one record (two operators, a retried request)
// change it once: of 8 retries of a failed record exactly one reports
// Changed, and likewise of 8 releases of one lease and (on a
// [idemdriver.Reopener]) of 8 reopens of one completed record by its
// token, whose recovery points are gone after them.
func testOperateConcurrent(t *testing.T, b *leaseBundle) {
	c := b.name("c")
	b.poison(c, "failed", "x")
	held := b.mustAcquire("held", c, idem.Message{ID: "held", Payload: []byte("p")}, longLease, 1)
	const n = 8
	count := func(what string, act func() (idemdriver.ActionResult, error)) {
		var (
			wg      sync.WaitGroup
			start   = make(chan struct{})
			changed atomic.Int32
		)
		for range n {
			wg.Go(func() {
				<-start
				res, err := act()
				if err != nil {
					t.Errorf("%s: %v", what, err)
				}
				if res.Changed {
					changed.Add(1)
				}
			})
		}
		close(start)
		wg.Wait()
		if got := changed.Load(); got != 1 {
			t.Errorf("%d concurrent %s: %d changed the record, want 1", n, what, got)
		}
	}
	count("retries", func() (idemdriver.ActionResult, error) { return b.ops().RetryRecord(b.ctx, c, "failed") })
	count("releases", func() (idemdriver.ActionResult, error) {
		return b.ops().ReleaseLease(b.ctx, &idemdriver.ReleaseLeaseParams{Consumer: c, MessageID: "held", Token: held.Token})
	})
	if ro, ok := b.s.Store.(idemdriver.Reopener); ok {
		token := b.completedWithStep(c, "done")
		count("reopens", func() (idemdriver.ActionResult, error) {
			return ro.ReopenRecord(b.ctx, &idemdriver.ReopenRecordParams{Consumer: c, MessageID: "done", Token: token})
		})
		if next := b.mustAcquire("delivery after the reopens", c, idem.Message{ID: "done", Payload: []byte("p")}, longLease, 1); len(next.Steps) != 0 {
			t.Errorf("the delivery after the reopens found steps %v, want none", next.Steps)
		}
	}
}

// A store that reads recovery points returns each saved step once, by
// name, byte for byte, and none for a record without any.
func testOperateSteps(t *testing.T, b *leaseBundle) {
	sr, ok := b.s.Store.(idemdriver.StepReader)
	if !ok {
		t.Skipf("store %T does not implement idemdriver.StepReader", b.s.Store)
	}
	c := b.name("c")
	res := b.mustAcquire("stepped", c, idem.Message{ID: "m", Payload: []byte("p")}, longLease, 1)
	for _, st := range []idemdriver.Step{{Name: "charge", Result: everyByte()}, {Name: "a-email", Result: []byte{}}} {
		if err := b.s.Store.SaveStep(b.ctx, &idemdriver.StepParams{Consumer: c, MessageID: "m", Token: res.Token, Step: st.Name, Result: st.Result}); err != nil {
			t.Fatalf("SaveStep(%q): %v", st.Name, err)
		}
	}
	got, err := sr.Steps(b.ctx, c, "m")
	if err != nil || len(got) != 2 || got[0].Name != "a-email" || len(got[0].Result) != 0 || got[1].Name != "charge" || string(got[1].Result) != string(everyByte()) {
		t.Errorf("Steps = %+v, %v; want a-email (empty) and charge (every byte value)", got, err)
	}
	if none, err := sr.Steps(b.ctx, c, "missing"); err != nil || len(none) != 0 {
		t.Errorf("Steps of a missing record = %+v, %v; want none", none, err)
	}
}

// Bad parameters are refused with typed errors before anything runs.
func testOperateBadInput(t *testing.T, b *leaseBundle) {
	c := b.name("c")
	for _, tc := range []struct {
		p    idemdriver.ListRecordsParams
		want error
	}{
		{idemdriver.ListRecordsParams{Consumer: "", State: idemdriver.StateFailed}, idemdriver.ErrInvalidConsumerName},
		{idemdriver.ListRecordsParams{Consumer: c, State: idemdriver.StateCompleted}, idemdriver.ErrInvalidConfig},
		{idemdriver.ListRecordsParams{Consumer: c, State: idemdriver.StateFailed, Limit: idemdriver.MaxPageSize + 1}, idemdriver.ErrInvalidConfig},
		{idemdriver.ListRecordsParams{Consumer: c, State: idemdriver.StateFailed, Limit: 10, Scan: 5}, idemdriver.ErrInvalidConfig},
		{idemdriver.ListRecordsParams{Consumer: c, State: idemdriver.StateFailed, Cursor: "not a cursor"}, idemdriver.ErrInvalidCursor},
	} {
		if _, err := b.ops().ListRecords(b.ctx, &tc.p); !errors.Is(err, tc.want) {
			t.Errorf("ListRecords(%+v): %v, want %v", tc.p, err, tc.want)
		}
	}
	for _, cur := range forgedCursors() {
		p := idemdriver.ListRecordsParams{Consumer: c, State: idemdriver.StateFailed, Cursor: cur}
		if _, err := b.ops().ListRecords(b.ctx, &p); !errors.Is(err, idemdriver.ErrInvalidCursor) {
			t.Errorf("ListRecords(cursor %q): %v, want ErrInvalidCursor", cur, err)
		}
	}
	if _, err := b.ops().ReleaseLease(b.ctx, &idemdriver.ReleaseLeaseParams{Consumer: c, MessageID: "m", Token: 0}); !errors.Is(err, idemdriver.ErrInvalidConfig) {
		t.Errorf("ReleaseLease of token 0: %v, want ErrInvalidConfig", err)
	}
	if _, err := b.ops().RetryRecord(b.ctx, c, ""); !errors.Is(err, idemdriver.ErrMissingMessageID) {
		t.Errorf("RetryRecord of an empty ID: %v, want ErrMissingMessageID", err)
	}
}

// forgedCursors are cursors no list returns, each well-formed base64 of
// "microseconds.key": a time beyond what a store holds (either way), and
// a key that is not valid text (a NUL byte, invalid UTF-8, too long).
func forgedCursors() []string {
	var out []string
	for _, raw := range []string{
		"9223372036854775807.x", "-9223372036854775808.x", "-1.x", "253402300800000001.x",
		"1764979200000000.a\x00b", "1764979200000000.a\xffb", "1764979200000000." + strings.Repeat("k", 300),
	} {
		out = append(out, base64.RawURLEncoding.EncodeToString([]byte(raw)))
	}
	return out
}

// RunOutboxOperate runs the cases of [idemdriver.OutboxOperator] on an
// outbox store that implements it, with the Setups of h.
func RunOutboxOperate[TTx any](t *testing.T, h Harness[TTx]) {
	t.Helper()
	if h.New == nil {
		t.Fatal("idemtest: Harness.New is nil")
	}
	nonce := newNonce()
	t.Run("FailedRetried", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t, h, nonce, "OutboxOperate")
		if _, ok := b.s.Store.(idemdriver.OutboxOperator); !ok {
			t.Fatalf("idemtest: store %T does not implement idemdriver.OutboxOperator", b.s.Store)
		}
		testOutboxOperate(t, b)
	})
}

// Rows failed for good are grouped by error text and listed newest
// first, page by page; a retried row is claimed again, once, and a
// second retry or a retry of a sent row changes nothing.
func testOutboxOperate[TTx any](t *testing.T, b *bundle[TTx]) {
	ops := b.s.Store.(idemdriver.OutboxOperator)
	store := b.outboxOf()
	ids := b.emitNamed(3)[:3] // r-0000 .. r-0002 come first in sequence order
	all, err := store.ClaimOutgoing(b.ctx, &idemdriver.ClaimOutgoingParams{Limit: 1000, Lease: longLease})
	if err != nil {
		t.Fatalf("ClaimOutgoing: %v", err)
	}
	var rows []idemdriver.FailedRow
	var sent []string
	for _, r := range all {
		switch {
		case r.ID == ids[0]:
			rows = append(rows, idemdriver.FailedRow{ID: r.ID, Attempt: r.Attempts, Permanent: true, Error: "too large"})
		case r.ID == ids[1] || r.ID == ids[2]:
			rows = append(rows, idemdriver.FailedRow{ID: r.ID, Attempt: r.Attempts, Permanent: true, Error: "no route"})
		default:
			sent = append(sent, r.ID)
		}
	}
	if err := store.MarkFailed(b.ctx, &idemdriver.MarkFailedParams{Rows: rows}); err != nil {
		t.Fatalf("MarkFailed: %v", err)
	}
	if err := store.MarkSent(b.ctx, &idemdriver.MarkSentParams{IDs: sent}); err != nil {
		t.Fatalf("MarkSent: %v", err)
	}
	groups, err := ops.OutboxFailures(b.ctx, 10)
	if err != nil {
		t.Fatalf("OutboxFailures: %v", err)
	}
	counts := map[string]int64{}
	for _, g := range groups {
		counts[g.Error] = g.Count
		if g.Newest.Before(g.Oldest) || g.Newest.IsZero() {
			t.Errorf("group %q: newest %v before oldest %v", g.Error, g.Newest, g.Oldest)
		}
	}
	if len(groups) != 2 || counts["too large"] != 1 || counts["no route"] != 2 {
		t.Errorf("OutboxFailures = %+v, want too large: 1, no route: 2", groups)
	}
	var listed []string
	p := idemdriver.ListOutgoingParams{Limit: 1}
	for pages := 0; pages < 10; pages++ {
		q := p
		page, err := ops.ListFailedOutgoing(b.ctx, &q)
		if err != nil {
			t.Fatalf("ListFailedOutgoing: %v", err)
		}
		for _, r := range page.Rows {
			listed = append(listed, r.ID)
			if r.Destination != "d" || string(r.Payload) != r.ID || r.FailedAt.IsZero() || r.Error == "" {
				t.Errorf("failed row %+v: want destination d, its ID as payload, a failure time and an error", r)
			}
		}
		if page.Next == "" {
			break
		}
		p.Cursor = page.Next
	}
	slices.Sort(listed)
	if !slices.Equal(listed, ids) {
		t.Errorf("failed rows listed %v, want %v", listed, ids)
	}
	for _, cur := range forgedCursors() {
		if _, err := ops.ListFailedOutgoing(b.ctx, &idemdriver.ListOutgoingParams{Cursor: cur}); !errors.Is(err, idemdriver.ErrInvalidCursor) {
			t.Errorf("ListFailedOutgoing(cursor %q): %v, want ErrInvalidCursor", cur, err)
		}
	}
	for _, e := range []string{"a\x00b", "a\xffb"} {
		if _, err := ops.ListFailedOutgoing(b.ctx, &idemdriver.ListOutgoingParams{Error: e}); !errors.Is(err, idemdriver.ErrInvalidConfig) {
			t.Errorf("ListFailedOutgoing(error text %q): %v, want ErrInvalidConfig", e, err)
		}
	}
	only, err := ops.ListFailedOutgoing(b.ctx, &idemdriver.ListOutgoingParams{Error: "too large"})
	if err != nil || len(only.Rows) != 1 || only.Rows[0].ID != ids[0] {
		t.Errorf("ListFailedOutgoing(too large) = %+v, %v; want %s alone", only, err, ids[0])
	}

	res, err := ops.RetryOutgoing(b.ctx, ids[0])
	if err != nil || !res.Changed {
		t.Fatalf("RetryOutgoing: %+v, %v; want Changed", res, err)
	}
	if again, err := ops.RetryOutgoing(b.ctx, ids[0]); err != nil || again.Changed {
		t.Errorf("second RetryOutgoing: %+v, %v; want Changed false and no error", again, err)
	}
	claimed, err := store.ClaimOutgoing(b.ctx, &idemdriver.ClaimOutgoingParams{Limit: 1000, Lease: longLease})
	if err != nil {
		t.Fatalf("ClaimOutgoing after the retry: %v", err)
	}
	if len(claimed) != 1 || claimed[0].ID != ids[0] {
		t.Fatalf("claimed after the retry: %d rows, want %s alone", len(claimed), ids[0])
	}
	if err := store.MarkSent(b.ctx, &idemdriver.MarkSentParams{IDs: []string{ids[0]}, Keep: true}); err != nil {
		t.Fatalf("MarkSent(Keep): %v", err)
	}
	if _, err := ops.RetryOutgoing(b.ctx, ids[0]); !errors.Is(err, idemdriver.ErrWrongState) {
		t.Errorf("RetryOutgoing of a row kept sent: %v, want ErrWrongState", err)
	}
	if err := store.MarkSent(b.ctx, &idemdriver.MarkSentParams{IDs: []string{ids[0]}}); err != nil {
		t.Fatalf("MarkSent: %v", err)
	}
	if _, err := ops.RetryOutgoing(b.ctx, ids[0]); !errors.Is(err, idemdriver.ErrNotFound) {
		t.Errorf("RetryOutgoing of a row sent and deleted: %v, want ErrNotFound", err)
	}
	if _, err := ops.RetryOutgoing(b.ctx, "missing"); !errors.Is(err, idemdriver.ErrNotFound) {
		t.Errorf("RetryOutgoing of a missing row: %v, want ErrNotFound", err)
	}
	if s := b.stats(); s.Pending != 0 || s.Failed != 2 {
		t.Errorf("outbox stats = %+v, want 0 pending and 2 failed", s)
	}
	if _, err := ops.RetryOutgoing(b.ctx, ids[1]); err != nil {
		t.Fatalf("RetryOutgoing(%s): %v", ids[1], err)
	}
	backlog, err := ops.OutboxBacklog(b.ctx)
	if err != nil || backlog.Pending != 1 || backlog.Failed != 1 || backlog.OldestPending < 0 {
		t.Errorf("OutboxBacklog = %+v, %v; want 1 pending and 1 failed", backlog, err)
	}
}
