package brokertest

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idemsql"
	_ "modernc.org/sqlite" // the side-effect database
)

// Timing of the suite. Waits are bounded and generous: the suite runs under
// -race on small, loaded machines.
const (
	// redelivery is StartOptions.Redelivery for most cases.
	redelivery = time.Second
	// lease is the lease-mode Config.Lease: short, so an InProgress
	// redelivery (RetryAfter is the lease left) comes back soon.
	lease = 3 * time.Second
	// waitLong bounds every wait for processing to happen.
	waitLong = 90 * time.Second
	// poll is the period of the bounded waits.
	poll = 20 * time.Millisecond
)

// consumerName is the idem consumer name used by every case.
const consumerName = "brokertest"

// mode is one claim mode of idem.
type mode struct {
	name  string
	lease bool
}

var modes = []mode{{name: "transactional"}, {name: "lease", lease: true}}

// record is one call of a member's Processor (or one message of a batch).
type record struct {
	member  int
	id      string
	payload []byte
	status  idem.Status
	err     error
	poison  bool
	done    bool // the call returned (or panicked: then Failed, err nil)
}

// recorder keeps every Process call the members made.
type recorder struct {
	mu   sync.Mutex
	recs []*record
}

func (r *recorder) begin(member int, msg idem.Message) *record {
	rec := &record{member: member, id: msg.ID, payload: bytes.Clone(msg.Payload)}
	r.mu.Lock()
	r.recs = append(r.recs, rec)
	r.mu.Unlock()
	return rec
}

func (r *recorder) end(rec *record, out idem.Outcome) {
	r.mu.Lock()
	rec.status, rec.err, rec.poison, rec.done = out.Status, out.Err, out.Poison, true
	r.mu.Unlock()
}

// filter returns copies of the records for which keep is true.
func (r *recorder) filter(keep func(*record) bool) []record {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []record
	for _, rec := range r.recs {
		if keep(rec) {
			out = append(out, *rec)
		}
	}
	return out
}

// count counts the records for which keep is true.
func (r *recorder) count(keep func(*record) bool) int { return len(r.filter(keep)) }

// processed returns how many records of each ID ended Processed.
func (r *recorder) processed() map[string]int {
	m := map[string]int{}
	for _, rec := range r.filter(func(rec *record) bool { return rec.done && rec.status == idem.Processed }) {
		m[rec.id]++
	}
	return m
}

// started counts the calls begun for id.
func (r *recorder) started(id string) int {
	return r.count(func(rec *record) bool { return rec.id == id })
}

// summary describes the statuses seen, for failure messages.
func (r *recorder) summary() string {
	counts := map[string]int{}
	inflight := 0
	for _, rec := range r.filter(func(*record) bool { return true }) {
		if !rec.done {
			inflight++
			continue
		}
		s := rec.status.String()
		if rec.poison {
			s += "(poison)"
		}
		counts[s]++
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%d ", k, counts[k])
	}
	fmt.Fprintf(&b, "in-flight=%d", inflight)
	return b.String()
}

// fixture is one case in one mode: a fresh Broker, a fresh SQLite database
// holding idem's table and the effects table, and the bound processors.
type fixture struct {
	t      *testing.T
	ctx    context.Context
	mode   mode
	broker Broker
	dsn    string // the SQLite database of idem's table and the effects
	db     *sql.DB
	proc   idem.Processor
	batch  idem.BatchProcessor // transactional mode only
	rec    recorder

	hookMu sync.Mutex
	hook   func(ctx context.Context, msg idem.Message) error

	memMu   sync.Mutex
	members []*member
}

// member is one started Member and what the fixture knows of it.
type member struct {
	idx     int
	m       Member
	stopped bool // stopped or crashed: cleanup leaves it alone
}

// newFixture builds the fixture of one case; everything is released by
// t.Cleanup.
func newFixture(t *testing.T, h Harness, md mode) *fixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	f := &fixture{t: t, ctx: ctx, mode: md}

	// synchronous(NORMAL) spares an fsync per commit; the suite simulates
	// crashes in process, so durability across power loss plays no part.
	f.dsn = idemsql.SQLiteDSN(filepath.Join(t.TempDir(), "effects.db")) + "&_pragma=synchronous(NORMAL)"
	db, store := f.openStore()
	f.db = db
	if err := store.Migrate(ctx); err != nil {
		t.Fatalf("brokertest: migrate: %v", err)
	}
	// effect_key is NULL in transactional mode (SQLite's UNIQUE allows many
	// NULLs), so a second run of a handler would leave a second row there;
	// in lease mode it is the Attempt.Key of the effect, as the pattern
	// says for effects outside the claim's transaction.
	if _, err := db.ExecContext(ctx, `CREATE TABLE effects (
		seq INTEGER PRIMARY KEY AUTOINCREMENT,
		message_id TEXT NOT NULL,
		effect_key TEXT UNIQUE,
		payload BLOB NOT NULL)`); err != nil {
		t.Fatalf("brokertest: create effects table: %v", err)
	}

	f.proc, f.batch = f.bind(store)

	f.broker = h.New(t)
	if f.broker == nil {
		t.Fatal("brokertest: Harness.New returned a nil Broker")
	}
	// Registered after the Broker's own cleanup, so it runs before it.
	t.Cleanup(f.stopAll)
	return f
}

// openStore opens another handle on the case's SQLite database and an
// idemsql store over it; the handle is closed at cleanup (if the case did
// not close it first).
func (f *fixture) openStore() (*sql.DB, *idemsql.Store) {
	f.t.Helper()
	db, err := sql.Open("sqlite", f.dsn)
	if err != nil {
		f.t.Fatalf("brokertest: open SQLite: %v", err)
	}
	db.SetMaxOpenConns(8)
	f.t.Cleanup(func() { db.Close() })
	store, err := idemsql.New(db, idemsql.SQLite, nil)
	if err != nil {
		f.t.Fatalf("brokertest: idemsql.New: %v", err)
	}
	return db, store
}

// bind returns the case's Processor over store, in the case's claim mode,
// and in transactional mode its BatchProcessor.
func (f *fixture) bind(store *idemsql.Store) (idem.Processor, idem.BatchProcessor) {
	f.t.Helper()
	cfg := idem.Config{Name: consumerName, PurgeInterval: -1}
	if f.mode.lease {
		cfg.Lease = lease
		lc, err := idem.NewLeaseConsumer(store, cfg)
		if err != nil {
			f.t.Fatalf("brokertest: NewLeaseConsumer: %v", err)
		}
		f.t.Cleanup(func() { lc.Close() })
		return idem.BindLease(lc, f.leaseHandler), nil
	}
	c, err := idem.NewConsumer[*sql.Tx](store, cfg)
	if err != nil {
		f.t.Fatalf("brokertest: NewConsumer: %v", err)
	}
	f.t.Cleanup(func() { c.Close() })
	return idem.Bind(c, f.txHandler), idem.BindBatch(c, f.batchHandler)
}

// setHook sets the fault injected into every handler run: in transactional
// mode after the effect row was written in the claim's transaction (so a
// failure must roll it back), in lease mode before the effect is written.
func (f *fixture) setHook(h func(ctx context.Context, msg idem.Message) error) {
	f.hookMu.Lock()
	f.hook = h
	f.hookMu.Unlock()
}

func (f *fixture) runHook(ctx context.Context, msg idem.Message) error {
	f.hookMu.Lock()
	h := f.hook
	f.hookMu.Unlock()
	if h == nil {
		return nil
	}
	return h(ctx, msg)
}

// txHandler is the transactional-mode handler: one row in the claim's tx,
// then the hook.
func (f *fixture) txHandler(ctx context.Context, tx *sql.Tx, msg idem.Message) error {
	if _, err := tx.ExecContext(ctx, `INSERT INTO effects (message_id, payload) VALUES (?, ?)`, msg.ID, msg.Payload); err != nil {
		return err
	}
	return f.runHook(ctx, msg)
}

// batchHandler is the batch-mode handler: one row per new message.
func (f *fixture) batchHandler(ctx context.Context, tx *sql.Tx, msgs []idem.Message) error {
	for _, msg := range msgs {
		if err := f.txHandler(ctx, tx, msg); err != nil {
			return err
		}
	}
	return nil
}

// leaseHandler is the lease-mode handler: the effect is written outside the
// claim, keyed by Attempt.Key so that a rerun writes it once.
func (f *fixture) leaseHandler(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
	if err := f.runHook(ctx, a.Message); err != nil {
		return idem.Result{}, err
	}
	_, err := f.db.ExecContext(ctx,
		`INSERT INTO effects (message_id, effect_key, payload) VALUES (?, ?, ?) ON CONFLICT (effect_key) DO NOTHING`,
		a.Message.ID, a.Key("effect"), a.Message.Payload)
	if err != nil {
		return idem.Result{}, err
	}
	return idem.Result{Body: []byte("done"), ContentType: "text/plain"}, nil
}

// around wraps one call of the bound Processor of a member.
type around func(ctx context.Context, msg idem.Message, next func(context.Context, idem.Message) (idem.Outcome, error)) (idem.Outcome, error)

// start starts a member whose Processor records every call and runs a
// (if not nil) around the bound Processor.
func (f *fixture) start(opts StartOptions, a around) *member {
	f.t.Helper()
	return f.startWith(opts, f.proc, a)
}

// recording returns the Processor of member idx: it records every call of
// proc, with a (if not nil) around it. A panic is recorded as a Failed
// outcome and goes on up to the adapter.
func (f *fixture) recording(idx int, proc idem.Processor, a around) idem.Processor {
	return idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (out idem.Outcome, err error) {
		rec := f.rec.begin(idx, msg)
		returned := false
		defer func() {
			if !returned {
				f.rec.end(rec, idem.Outcome{Status: idem.Failed})
			}
		}()
		if a != nil {
			out, err = a(ctx, msg, proc.Process)
		} else {
			out, err = proc.Process(ctx, msg)
		}
		returned = true
		f.rec.end(rec, out)
		return out, err
	})
}

// startWith is start with another bound Processor than the case's.
func (f *fixture) startWith(opts StartOptions, proc idem.Processor, a around) *member {
	f.t.Helper()
	mb := f.newMember()
	m, err := f.broker.Start(f.ctx, f.recording(mb.idx, proc, a), opts)
	if err != nil {
		f.t.Fatalf("brokertest: Start member %d: %v", mb.idx, err)
	}
	f.setMember(mb, m)
	return mb
}

// batchAround wraps one call of the bound BatchProcessor of a member.
type batchAround func(ctx context.Context, msgs []idem.Message, next func(context.Context, []idem.Message) ([]idem.Outcome, error)) ([]idem.Outcome, error)

// startBatch is start for a BatchBroker.
func (f *fixture) startBatch(bb BatchBroker, opts StartOptions, a batchAround) *member {
	f.t.Helper()
	mb := f.newMember()
	p := batchFunc(func(ctx context.Context, msgs []idem.Message) ([]idem.Outcome, error) {
		recs := make([]*record, len(msgs))
		for i, msg := range msgs {
			recs[i] = f.rec.begin(mb.idx, msg)
		}
		var outs []idem.Outcome
		var err error
		if a != nil {
			outs, err = a(ctx, msgs, f.batch.ProcessBatch)
		} else {
			outs, err = f.batch.ProcessBatch(ctx, msgs)
		}
		for i, rec := range recs {
			var out idem.Outcome
			if i < len(outs) {
				out = outs[i]
			}
			f.rec.end(rec, out)
		}
		return outs, err
	})
	m, err := bb.StartBatch(f.ctx, p, opts)
	if err != nil {
		f.t.Fatalf("brokertest: StartBatch member %d: %v", mb.idx, err)
	}
	f.setMember(mb, m)
	return mb
}

type batchFunc func(ctx context.Context, msgs []idem.Message) ([]idem.Outcome, error)

func (f batchFunc) ProcessBatch(ctx context.Context, msgs []idem.Message) ([]idem.Outcome, error) {
	return f(ctx, msgs)
}

func (f *fixture) newMember() *member {
	f.memMu.Lock()
	defer f.memMu.Unlock()
	mb := &member{idx: len(f.members) + 1}
	f.members = append(f.members, mb)
	return mb
}

func (f *fixture) setMember(mb *member, m Member) {
	if m == nil {
		f.t.Fatalf("brokertest: member %d: Start returned a nil Member", mb.idx)
	}
	f.memMu.Lock()
	mb.m = m
	f.memMu.Unlock()
}

// stop stops mb gracefully, failing the test if Stop fails or takes more
// than waitLong.
func (f *fixture) stop(mb *member) {
	f.t.Helper()
	f.memMu.Lock()
	mb.stopped = true
	f.memMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	if err := mb.m.Stop(ctx); err != nil {
		f.t.Fatalf("brokertest: Stop member %d: %v", mb.idx, err)
	}
}

// crash crashes mb.
func (f *fixture) crash(mb *member) {
	f.memMu.Lock()
	mb.stopped = true
	f.memMu.Unlock()
	mb.m.Crash()
}

// stopAll stops the members still running, at cleanup.
func (f *fixture) stopAll() {
	f.memMu.Lock()
	var live []*member
	for _, mb := range f.members {
		if !mb.stopped && mb.m != nil {
			mb.stopped = true
			live = append(live, mb)
		}
	}
	f.memMu.Unlock()
	for _, mb := range live {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := mb.m.Stop(ctx); err != nil {
			f.t.Errorf("brokertest: cleanup: Stop member %d: %v", mb.idx, err)
		}
		cancel()
	}
}

// msgs returns n messages with IDs prefix-000... and distinct payloads.
func msgs(prefix string, n int) []idem.Message {
	out := make([]idem.Message, n)
	for i := range out {
		id := fmt.Sprintf("%s-%03d", prefix, i)
		out[i] = idem.Message{ID: id, Payload: fmt.Appendf(nil, `{"id":%q,"n":%d}`, id, i)}
	}
	return out
}

// publish publishes every message, failing the test on an error. A
// publish the broker dropped as a repeat (ErrDeduped) went through.
func (f *fixture) publish(ms ...idem.Message) {
	f.t.Helper()
	for _, m := range ms {
		if err := f.broker.Publish(f.ctx, m.ID, m.Payload); err != nil && !errors.Is(err, ErrDeduped) {
			f.t.Fatalf("brokertest: Publish %q: %v", m.ID, err)
		}
	}
}

// publishLate publishes repeats of IDs published before that must reach
// the consumer: each one again, every poll, while the broker drops it as
// a repeat within its duplicate window (ErrDeduped), failing the test
// after waitLong.
func (f *fixture) publishLate(ms ...idem.Message) {
	f.t.Helper()
	for _, m := range ms {
		f.waitFor(waitLong, func() (bool, string) {
			err := f.broker.Publish(f.ctx, m.ID, m.Payload)
			if err != nil && !errors.Is(err, ErrDeduped) {
				f.t.Fatalf("brokertest: Publish %q: %v", m.ID, err)
			}
			return err == nil, fmt.Sprintf("the broker still drops a repeat of %q as a duplicate", m.ID)
		})
	}
}

// publishCarried publishes the messages the broker can carry and returns
// them; the others (ErrNotCarried) are left out and logged.
func (f *fixture) publishCarried(ms ...idem.Message) []idem.Message {
	f.t.Helper()
	var out []idem.Message
	for _, m := range ms {
		err := f.broker.Publish(f.ctx, m.ID, m.Payload)
		switch {
		case errors.Is(err, ErrNotCarried):
			f.t.Logf("brokertest: the broker cannot carry message ID %q (%d bytes); left out", m.ID, len(m.ID))
		case err != nil:
			f.t.Fatalf("brokertest: Publish %q: %v", m.ID, err)
		default:
			out = append(out, m)
		}
	}
	return out
}

// dedupeWindow is the broker's own duplicate window (PublishDeduper), or 0.
func (f *fixture) dedupeWindow() time.Duration {
	if d, ok := f.broker.(PublishDeduper); ok {
		return d.DedupeWindow()
	}
	return 0
}

// effects returns the effect rows: payloads by message ID.
func (f *fixture) effects() map[string][][]byte {
	f.t.Helper()
	rows, err := f.db.QueryContext(f.ctx, `SELECT message_id, payload FROM effects ORDER BY seq`)
	if err != nil {
		f.t.Fatalf("brokertest: read effects: %v", err)
	}
	defer rows.Close()
	out := map[string][][]byte{}
	for rows.Next() {
		var id string
		var p []byte
		if err := rows.Scan(&id, &p); err != nil {
			f.t.Fatalf("brokertest: read effects: %v", err)
		}
		out[id] = append(out[id], p)
	}
	if err := rows.Err(); err != nil {
		f.t.Fatalf("brokertest: read effects: %v", err)
	}
	return out
}

func rowCount(e map[string][][]byte) int {
	n := 0
	for _, ps := range e {
		n += len(ps)
	}
	return n
}

// waitFor polls cond until it holds, failing the test after d with
// "after d: <what cond last said>".
func (f *fixture) waitFor(d time.Duration, cond func() (bool, string)) {
	f.t.Helper()
	waitUntil(f.t, f.ctx, d, func() (bool, string) {
		ok, state := cond()
		if !ok {
			state += " (deliveries: " + f.rec.summary() + ")"
		}
		return ok, state
	})
}

// waitUntil polls cond every poll until it holds, failing t after d or when
// ctx ends with what cond last said.
func waitUntil(t testing.TB, ctx context.Context, d time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("brokertest: after %v: %s", d, state)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("brokertest: case timed out: %s", state)
		case <-time.After(poll):
		}
	}
}

// waitEffects waits until every message of want has its effect row.
func (f *fixture) waitEffects(want []idem.Message) {
	f.t.Helper()
	f.waitFor(waitLong, func() (bool, string) {
		e := f.effects()
		have := 0
		for _, m := range want {
			if len(e[m.ID]) > 0 {
				have++
			}
		}
		return have == len(want), fmt.Sprintf("%d of %d messages have an effect row (%d rows)", have, len(want), rowCount(e))
	})
}

// checkEffects asserts that the effects table holds exactly one row per
// message of want, with its payload byte for byte, and nothing else.
func (f *fixture) checkEffects(want []idem.Message) {
	f.t.Helper()
	e := f.effects()
	wantIDs := map[string]bool{}
	for _, m := range want {
		wantIDs[m.ID] = true
		ps := e[m.ID]
		switch {
		case len(ps) == 0:
			f.t.Errorf("brokertest: message %q has no effect row", m.ID)
		case len(ps) > 1:
			f.t.Errorf("brokertest: message %q has %d effect rows, want 1 (processed more than once)", m.ID, len(ps))
		case !bytes.Equal(ps[0], m.Payload):
			f.t.Errorf("brokertest: message %q effect payload %q, want %q", m.ID, ps[0], m.Payload)
		}
	}
	for id, ps := range e {
		if !wantIDs[id] {
			f.t.Errorf("brokertest: unexpected effect rows for message %q: %d", id, len(ps))
		}
	}
	if n := rowCount(e); n != len(want) {
		f.t.Errorf("brokertest: effects table has %d rows, want %d", n, len(want))
	}
	for id, n := range f.rec.processed() {
		if n > 1 {
			f.t.Errorf("brokertest: message %q had %d Processed outcomes, want at most 1", id, n)
		}
	}
}

// deadLetters reads the dead letter.
func (f *fixture) deadLetters() []DeadLetter {
	f.t.Helper()
	dls, err := f.broker.DeadLetters(f.ctx)
	if err != nil {
		f.t.Fatalf("brokertest: DeadLetters: %v", err)
	}
	return dls
}

// checkNoDeadLetters asserts the dead letter is empty.
func (f *fixture) checkNoDeadLetters() {
	f.t.Helper()
	for _, dl := range f.deadLetters() {
		f.t.Errorf("brokertest: unexpected dead letter: ID %q, payload %s, reason %q, error %q", dl.ID, short(dl.Payload), dl.Reason, dl.Error)
	}
}

// quiet waits d, a bounded quiet period in which nothing is expected to
// happen, ending early if the case's context ends.
func (f *fixture) quiet(d time.Duration) {
	select {
	case <-time.After(d):
	case <-f.ctx.Done():
	}
}

// expectedDL is a dead letter the suite expects: its ID, payload, the
// reason word (idem.Reason...) and an error whose text the dead letter's
// error text must contain. With again, further copies of it (the same ID,
// payload and reason) are expected too: an ID-less message redelivered
// because its ack deadline ran out while its first delivery was being
// dead-lettered is dead-lettered again, as nothing can tell the two
// deliveries apart.
type expectedDL struct {
	id      string
	payload []byte
	reason  string
	err     error
	again   bool
}

// checkDeadLetters waits for the dead letter to hold want, then asserts it
// holds exactly want: the IDs and payloads byte for byte, the reason word,
// and an error text that contains the expected error's.
func (f *fixture) checkDeadLetters(want []expectedDL) {
	f.t.Helper()
	f.waitFor(waitLong, func() (bool, string) {
		n := len(f.deadLetters())
		return n >= len(want), fmt.Sprintf("%d of %d dead letters", n, len(want))
	})
	// A short quiet period lets an extra dead letter show up.
	f.quiet(redelivery)
	got := f.deadLetters()
	used := make([]bool, len(got))
	for _, w := range want {
		found := false
		for i, dl := range got {
			if used[i] || dl.ID != w.id || !bytes.Equal(dl.Payload, w.payload) {
				continue
			}
			used[i], found = true, true
			if dl.Reason != w.reason {
				f.t.Errorf("brokertest: dead letter %q (%s) reason %q, want %q", dl.ID, short(dl.Payload), dl.Reason, w.reason)
			}
			if !strings.Contains(dl.Error, w.err.Error()) {
				f.t.Errorf("brokertest: dead letter %q (%s) error %q, want one containing %q", dl.ID, short(dl.Payload), dl.Error, w.err.Error())
			}
			if w.again {
				f.acceptCopies(got, used, dl)
			}
			break
		}
		if !found {
			f.t.Errorf("brokertest: dead letter lacks ID %q with payload %s (%s)", w.id, short(w.payload), w.reason)
		}
	}
	for i, dl := range got {
		if !used[i] {
			f.t.Errorf("brokertest: unexpected dead letter: ID %q, payload %s, reason %q, error %q", dl.ID, short(dl.Payload), dl.Reason, dl.Error)
		}
	}
}

// acceptCopies marks as used the dead letters of got that are copies of
// dl (the same ID, payload and reason), logging how many there were.
func (f *fixture) acceptCopies(got []DeadLetter, used []bool, dl DeadLetter) {
	n := 0
	for i, c := range got {
		if !used[i] && c.ID == dl.ID && c.Reason == dl.Reason && bytes.Equal(c.Payload, dl.Payload) {
			used[i] = true
			n++
		}
	}
	if n > 0 {
		f.t.Logf("brokertest: dead letter %q (%s) came %d more times (redelivered before its ack landed)", dl.ID, short(dl.Payload), n)
	}
}

// short quotes p, cut to 80 bytes, for failure messages.
func short(p []byte) string {
	if len(p) > 80 {
		return fmt.Sprintf("%q... (%d bytes)", p[:80], len(p))
	}
	return fmt.Sprintf("%q", p)
}

// ids returns the IDs of ms.
func ids(ms []idem.Message) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}

// runner is a Runner from Broker.NewConsumer whose Run calls run under a
// goroutine label of their own, so that the goroutines they start can be
// counted apart from every other case's.
type runner struct {
	Runner
	label string
}

var runnerSeq atomic.Int64

// labelKey is the goroutine label the suite puts on the Run calls it makes.
const labelKey = "brokertest-run"

// newRunner returns a consumer not yet running whose Processor records
// every call as member idx of a fresh member number (through a, if not nil).
func (f *fixture) newRunner(opts StartOptions, a around) (*runner, int) {
	f.t.Helper()
	mb := f.newMember() // no Member: stopAll leaves it to the case
	r, err := f.broker.NewConsumer(f.recording(mb.idx, f.proc, a), opts)
	if err != nil {
		f.t.Fatalf("brokertest: NewConsumer: %v", err)
	}
	if r == nil {
		f.t.Fatal("brokertest: NewConsumer returned a nil Runner")
	}
	rn := &runner{Runner: r, label: strconv.FormatInt(runnerSeq.Add(1), 10)}
	f.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = r.Stop(ctx)
	})
	return rn, mb.idx
}

// run calls Run in a goroutine carrying r's label and returns where its
// result arrives.
func (r *runner) run(ctx context.Context) <-chan error {
	done := make(chan error, 1)
	go pprof.Do(ctx, pprof.Labels(labelKey, r.label), func(ctx context.Context) {
		done <- r.Run(ctx)
	})
	return done
}

// goroutines counts the goroutines that carry r's label (those Run
// started, and Run itself), and returns their stacks.
func (r *runner) goroutines() (int, string) {
	var buf bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&buf, 1)
	want := fmt.Sprintf("# labels: {%q:%q}", labelKey, r.label)
	n := 0
	var stacks strings.Builder
	for _, block := range strings.Split(buf.String(), "\n\n") {
		if !strings.Contains(block, want) {
			continue
		}
		count, _, _ := strings.Cut(block, " ")
		c, err := strconv.Atoi(count)
		if err != nil {
			c = 1
		}
		n += c
		stacks.WriteString(block)
		stacks.WriteString("\n\n")
	}
	return n, stacks.String()
}

// result waits up to waitLong for a Run result.
func (f *fixture) result(what string, done <-chan error) error {
	f.t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(waitLong):
		f.t.Fatalf("brokertest: after %v: %s did not return", waitLong, what)
		return nil
	}
}

// any reports whether a record satisfies keep.
func (r *recorder) any(keep func(*record) bool) bool { return r.count(keep) > 0 }
