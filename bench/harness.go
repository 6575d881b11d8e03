package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"os"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// options are the harness's settings (the command's flags).
type options struct {
	out         string  // folder for results.csv and throughput.png
	quick       bool    // small run, under a minute
	n           int     // distinct messages per throughput run
	dupFraction float64 // share of the messages published twice
	faultN      int     // distinct messages per fault run
	crashes     int     // crashes per crash run
	workers     int     // deliveries (or batches) handled at once
	rounds      int     // throughput runs per contender; medians are reported
	batchSizes  []int   // batch sizes of the idem-batch contenders
	brokers     []string
	stores      []string
	contenders  []string  // when set, only these contenders run (tests)
	verbose     bool      // progress to log
	log         io.Writer // progress lines; nil discards them
}

// defaults fills zero fields; quick mode uses small sizes.
func (o *options) defaults() {
	if o.n <= 0 {
		o.n = 5000
		if o.quick {
			o.n = 200
		}
	}
	if o.faultN <= 0 {
		o.faultN = 500
		if o.quick {
			o.faultN = 40
		}
	}
	if o.crashes <= 0 {
		o.crashes = 3
		if o.quick {
			o.crashes = 1
		}
	}
	if o.workers <= 0 {
		o.workers = 8
	}
	if o.rounds <= 0 {
		o.rounds = 3
		if o.quick {
			o.rounds = 1
		}
	}
	if len(o.batchSizes) == 0 {
		o.batchSizes = []int{10, 100}
		if o.quick {
			o.batchSizes = []int{10}
		}
	}
	if len(o.brokers) == 0 {
		o.brokers = []string{"nats", "kafka"}
	}
	if len(o.stores) == 0 {
		o.stores = []string{"sqlite"}
		if postgresURL() != "" {
			o.stores = append(o.stores, "postgres")
		}
	}
	if o.log == nil {
		o.log = io.Discard
	}
}

// errUsage matches errors in the options.
var errUsage = errors.New("invalid options")

func (o *options) validate() error {
	if o.dupFraction < 0 || o.dupFraction > 1 {
		return fmt.Errorf("%w: --dup-fraction %v is not between 0 and 1", errUsage, o.dupFraction)
	}
	for _, b := range o.brokers {
		if b != "nats" && b != "kafka" {
			return fmt.Errorf("%w: unknown broker %q (want nats, kafka)", errUsage, b)
		}
	}
	for _, s := range o.stores {
		if s != "sqlite" && s != "postgres" && s != "mysql" {
			return fmt.Errorf("%w: unknown store %q (want sqlite, postgres, mysql)", errUsage, s)
		}
		if s == "mysql" && os.Getenv(envMySQL) == "" {
			return fmt.Errorf("%w: --stores mysql needs %s", errUsage, envMySQL)
		}
		if s == "postgres" && postgresURL() == "" {
			return fmt.Errorf("%w: --stores postgres needs %s (preferred: durable settings) or %s (eval \"$(scripts/services)\" sets both)", errUsage, envPostgresDurable, envPostgres)
		}
	}
	for _, b := range o.batchSizes {
		if b < 1 {
			return fmt.Errorf("%w: batch size %d", errUsage, b)
		}
	}
	return nil
}

// contender is one way of consuming.
type contender struct {
	name  string // naive, best, best_checked, best_checked_batch10, idem, idem-outbox, idem-batch10, watermill-dedup, relay
	kind  string // naive, best, checked, checked-batch, idem, outbox, batch, watermill, relay
	batch int    // batch size (1 for per-message contenders)
}

func (o *options) contenderList() []contender {
	cs := []contender{{"naive", "naive", 1}, {"best", "best", 1}}
	cs = append(cs, checkedContenders(o.batchSizes)...)
	cs = append(cs, contender{"idem", "idem", 1}, contender{"idem-outbox", "outbox", 1})
	for _, b := range o.batchSizes {
		cs = append(cs, contender{"idem-batch" + strconv.Itoa(b), "batch", b})
	}
	cs = append(cs, contender{"watermill-dedup", "watermill", 1}, contender{"relay", "relay", 1})
	if len(o.contenders) > 0 {
		cs = slices.DeleteFunc(cs, func(c contender) bool { return !slices.Contains(o.contenders, c.name) })
	}
	return cs
}

// faultResult is what one run left in the side-effect table.
type faultResult struct {
	Ran     bool
	Double  int  // message IDs with more than one side-effect row
	Lost    int  // message IDs with none
	Timeout bool // the run did not settle in time; counts are as found
}

func (f faultResult) String() string {
	if !f.Ran {
		return "-"
	}
	s := fmt.Sprintf("%d / %d", f.Double, f.Lost)
	if f.Timeout {
		s += " (timeout)"
	}
	return s
}

// result is one contender on one broker and store.
type result struct {
	Broker, Store, Contender string
	Batch, Workers           int
	Messages, Deliveries     int // distinct messages; deliveries published (duplicates included)
	Elapsed                  time.Duration
	Throughput               float64 // deliveries acknowledged per second
	P50, P99                 time.Duration
	Rounds                   int    // throughput runs merged (see medianResult)
	Relayed                  int    // idem-outbox, relay: messages the outgoing destination holds after the run
	Err                      string // the throughput run failed
	Dup, Fail, Crash         faultResult
}

// harness holds the brokers and databases of one invocation.
type harness struct {
	o      options
	runID  string
	seq    atomic.Int64
	pgInfo string // PostgreSQL version and fsync setting, when used
	load0  string // the 1-minute load average when the run started
}

// describe says how the run was made, for the line under the table.
func (h *harness) describe(took time.Duration) string {
	o := h.o
	s := fmt.Sprintf("%d messages per throughput run (%.0f%% published twice), median of %d round(s); %d messages per fault run (%d crash(es)); %d workers; %s, GOMAXPROCS %d",
		o.n, o.dupFraction*100, o.rounds, o.faultN, o.crashes, o.workers, runtime.Version(), runtime.GOMAXPROCS(0))
	if h.pgInfo != "" {
		s += ", " + h.pgInfo
	}
	if l := loadAvg(); h.load0 != "" && l != "" {
		s += fmt.Sprintf("; load average (1 min) %s at the start, %s at the end", h.load0, l)
	}
	return s + fmt.Sprintf("; took %s.", took.Round(time.Second))
}

// loadAvg returns the machine's 1-minute load average as /proc/loadavg
// writes it, or "" where there is none (not Linux).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

func (h *harness) tag() string {
	return fmt.Sprintf("%s_%d", h.runID, h.seq.Add(1))
}

func (h *harness) logf(format string, args ...any) {
	fmt.Fprintf(h.o.log, format+"\n", args...)
}

// run runs every setup (broker x store) and returns the results in order.
func run(ctx context.Context, o options) ([]result, *harness, error) {
	o.defaults()
	if err := o.validate(); err != nil {
		return nil, nil, err
	}
	var rb [3]byte
	_, _ = rand.Read(rb[:])
	h := &harness{o: o, runID: hex.EncodeToString(rb[:]), load0: loadAvg()}
	var results []result
	for _, bname := range o.brokers {
		var b broker
		var err error
		switch bname {
		case "nats":
			b, err = newNATSBroker()
		case "kafka":
			b, err = newKafkaBroker(ctx)
		}
		if err != nil {
			return nil, nil, err
		}
		for _, sname := range o.stores {
			var db database
			switch sname {
			case "sqlite":
				db, err = newSQLiteDB(1)
			case "mysql":
				var my *mysqlDB
				my, err = newMySQLDB(ctx, o.workers*2+4)
				if err == nil {
					if v, verr := my.serverVersion(ctx); verr == nil {
						h.pgInfo = strings.TrimPrefix(h.pgInfo+", "+v, ", ")
					}
					db = my
				}
			case "postgres":
				var pg *postgresDB
				pg, err = newPostgresDB(ctx, postgresURL(), o.workers*2+4)
				if err == nil {
					v, fs, verr := pg.serverVersion(ctx)
					if verr == nil {
						h.pgInfo = fmt.Sprintf("PostgreSQL %s, fsync=%s", v, fs)
					}
					db = pg
				}
			}
			if err != nil {
				b.close()
				return nil, nil, err
			}
			rs, err := h.setup(ctx, b, db)
			db.close()
			if err != nil {
				b.close()
				return nil, nil, err
			}
			results = append(results, rs...)
		}
		b.close()
	}
	return results, h, nil
}

// setup runs every contender on one broker and store: the throughput runs
// one after another, then the fault runs of all contenders at once (they
// are not timed).
func (h *harness) setup(ctx context.Context, b broker, db database) ([]result, error) {
	cs := h.o.contenderList()
	if !db.hasBest() { // the hand-written consumer is PostgreSQL's only
		cs = slices.DeleteFunc(cs, func(c contender) bool { return c.kind == "best" })
	}
	results := make([]result, len(cs))
	// A discarded warm-up run, so the first contender does not pay for the
	// pool's connections, the page cache and the runtime's first growth.
	// Quick mode, which checks the harness rather than measures, skips it.
	if !h.o.quick {
		if _, err := h.throughput(ctx, b, db, contender{"naive", "naive", 1}, min(h.o.n, 1000)); err != nil {
			return nil, fmt.Errorf("%s/%s warm-up: %w", b.name(), db.name(), err)
		}
	}
	// Rounds go round-robin over the contenders, so that a slow spell of
	// a shared machine spreads over all of them; each metric is the median
	// of its rounds.
	runs := make([][]result, len(cs))
	for round := 1; round <= h.o.rounds; round++ {
		for i, c := range cs {
			n := h.o.n
			if c.kind == "relay" {
				n = h.relayN()
			}
			h.logf("%s/%s %s: throughput run %d/%d, %d messages", b.name(), db.name(), c.name, round, h.o.rounds, n)
			r, err := h.throughput(ctx, b, db, c, h.o.n)
			if err != nil {
				r.Err = err.Error()
				h.logf("  failed: %v", err)
			}
			r.Broker, r.Store, r.Contender, r.Batch, r.Workers = b.name(), db.name(), c.name, c.batch, h.o.workers
			runs[i] = append(runs[i], r)
		}
	}
	for i := range cs {
		results[i] = medianResult(runs[i])
	}
	h.logf("%s/%s: fault runs", b.name(), db.name())
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for i, c := range cs {
		if c.kind == "relay" { // no consumer to fault
			continue
		}
		for _, fault := range []string{"error", "crash"} {
			wg.Go(func() {
				fr, err := h.faultRun(ctx, b, db, c, fault)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					if firstErr == nil {
						firstErr = fmt.Errorf("%s/%s %s, %s fault: %w", b.name(), db.name(), c.name, fault, err)
					}
					return
				}
				if fault == "error" {
					results[i].Fail = fr
				} else {
					results[i].Crash = fr
				}
			})
		}
	}
	wg.Wait()
	return results, firstErr
}

// medianResult merges the rounds of one contender: throughput, elapsed time
// and latencies are each the median of the rounds that succeeded; the
// duplicates column is the worst round's (most double effects, then most
// lost). A failed round fails the result.
func medianResult(rs []result) result {
	out := rs[0]
	var tp []float64
	var el, p50, p99 []time.Duration
	for _, r := range rs {
		if r.Err != "" {
			return r
		}
		tp = append(tp, r.Throughput)
		el, p50, p99 = append(el, r.Elapsed), append(p50, r.P50), append(p99, r.P99)
		if r.Dup.Double > out.Dup.Double || (r.Dup.Double == out.Dup.Double && r.Dup.Lost > out.Dup.Lost) {
			out.Dup = r.Dup
		}
	}
	slices.Sort(tp)
	out.Throughput = tp[len(tp)/2]
	out.Elapsed, out.P50, out.P99 = percentile(el, 0.5), percentile(p50, 0.5), percentile(p99, 0.5)
	out.Rounds = len(rs)
	return out
}

// workload is the messages of one run.
type workload struct {
	ids  []string // distinct IDs in publish order
	dups []string // IDs published a second time, after all the others
}

func (h *harness) workload(tag string, n int, dupFraction float64) workload {
	w := workload{ids: make([]string, n)}
	for i := range w.ids {
		w.ids[i] = fmt.Sprintf("%s-%06d", tag, i)
	}
	nd := int(float64(n) * dupFraction)
	r := mrand.New(mrand.NewPCG(uint64(n), 7))
	for _, i := range r.Perm(n)[:nd] {
		w.dups = append(w.dups, w.ids[i])
	}
	return w
}

// payload is a message body of about 100 bytes.
func payload(id string) []byte {
	return fmt.Appendf(nil, `{"message_id":%q,"account":"acct-42","amount_cents":1999,"currency":"EUR"}`, id)
}

// publish publishes the workload with 16 concurrent publishers, the
// duplicates after the originals; a duplicate JetStream's dedupe window
// dropped is published again after the window. It returns the number of
// deliveries the broker holds.
func publish(ctx context.Context, ch channel, w workload) (int, error) {
	pub := func(ids []string) (dropped []string, err error) {
		var mu sync.Mutex
		var firstErr error
		next := atomic.Int64{}
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				for {
					i := int(next.Add(1)) - 1
					if i >= len(ids) {
						return
					}
					d, err := ch.publish(ctx, ids[i], payload(ids[i]))
					mu.Lock()
					if err != nil && firstErr == nil {
						firstErr = err
					}
					if d {
						dropped = append(dropped, ids[i])
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		return dropped, firstErr
	}
	if dropped, err := pub(w.ids); err != nil {
		return 0, err
	} else if len(dropped) > 0 {
		return 0, fmt.Errorf("broker dropped %d first publishes as duplicates", len(dropped))
	}
	rest := w.dups
	for tries := 0; len(rest) > 0; tries++ {
		if tries > 50 {
			return 0, fmt.Errorf("broker keeps dropping %d duplicates", len(rest))
		}
		var err error
		if tries > 0 {
			time.Sleep(150 * time.Millisecond)
		}
		if rest, err = pub(rest); err != nil {
			return 0, err
		}
	}
	return len(w.ids) + len(w.dups), nil
}

// loopFor returns the consumption loop settings of contender c.
func (h *harness) loopFor(c contender) loopConfig {
	// A fetch holds two units per worker, so deliveries do not wait long
	// between their fetch and their handling.
	return loopConfig{workers: h.o.workers, chunk: c.batch, retryDelay: 20 * time.Millisecond, fetchMax: 2 * c.batch * h.o.workers}
}

// start returns the function that runs one member (one process) of
// contender c until ctx ends (nil) or the crash fault kills it (errCrashed).
func (h *harness) start(ch channel, rdb runDB, c contender, f *faults, st *runStats, ob *outboxRun) (func(ctx context.Context) error, error) {
	cfg := h.loopFor(c)
	var w work
	var naive msgHandler
	switch c.kind {
	case "naive":
		w = perMessage(rdb.naive())
	case "best":
		w = perMessage(rdb.best())
	case "checked", "checked-batch":
		chk := checkedOf(rdb)
		if chk == nil {
			return nil, fmt.Errorf("%s: the store has no best_checked", c.name)
		}
		if c.kind == "checked" {
			w = perMessage(chk.one())
		} else {
			w = perBatch(chk.batch())
		}
	case "idem":
		hd, err := rdb.idem("bench-" + c.name)
		if err != nil {
			return nil, err
		}
		w = perMessage(hd)
	case "outbox":
		hd, err := rdb.idemOutbox("bench-"+c.name, ob.dest, ob.relay)
		if err != nil {
			return nil, err
		}
		w = perMessage(hd)
	case "batch":
		hd, err := rdb.idemBatch("bench-" + c.name)
		if err != nil {
			return nil, err
		}
		w = perBatch(hd)
	case "watermill":
		naive = rdb.naive()
	}
	return func(ctx context.Context) error {
		m, err := ch.member(ctx)
		if err != nil {
			return err
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			m.stop(sctx)
		}()
		if naive != nil {
			return runWatermill(ctx, ch, m, naive, cfg, f, st)
		}
		return consume(ctx, ch, m, w, cfg, f, st)
	}, nil
}

// supervise runs members one after another until ctx ends: a member the
// crash fault killed is replaced by a new one, as a process supervisor
// would restart a crashed consumer.
func supervise(ctx context.Context, startMember func(context.Context) error, log func(string, ...any)) {
	for ctx.Err() == nil {
		err := startMember(ctx)
		switch {
		case err == nil, errors.Is(err, errCrashed):
		case ctx.Err() == nil:
			log("  member failed: %v", err)
			select {
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
			}
		}
	}
}

// throughput publishes the workload (n messages, the duplicate fraction
// published twice), then consumes it and times from the first delivery
// handled to the last ack. Its side-effect table gives the "duplicates
// published" fault column.
func (h *harness) throughput(ctx context.Context, b broker, db database, c contender, n int) (result, error) {
	if c.kind == "relay" {
		return h.relayThroughput(ctx, b, db, c)
	}
	var r result
	tag := h.tag()
	ch, rdb, cleanup, err := openRun(ctx, b, db, tag)
	if err != nil {
		return r, err
	}
	defer cleanup()
	w := h.workload(tag, n, h.o.dupFraction)
	total, err := publish(ctx, ch, w)
	if err != nil {
		return r, fmt.Errorf("publish: %w", err)
	}
	r.Messages, r.Deliveries = len(w.ids), total
	st := newRunStats(total)
	var ob *outboxRun
	if c.kind == "outbox" {
		if ob, err = startOutbox(ctx, ch, rdb, len(w.ids)); err != nil {
			return r, err
		}
		defer ob.stop()
	}
	startMember, err := h.start(ch, rdb, c, nil, st, ob)
	if err != nil {
		return r, err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		supervise(rctx, startMember, h.logf)
	}()
	timeout := time.Duration(total)*20*time.Millisecond + 60*time.Second
	var runErr error
	select {
	case <-st.reached:
	case <-time.After(timeout):
		runErr = fmt.Errorf("only %d of %d deliveries acknowledged after %v", st.acked.Load(), total, timeout)
	case <-ctx.Done():
		runErr = ctx.Err()
	}
	cancel()
	<-done
	if runErr != nil {
		return r, runErr
	}
	r.Elapsed = st.elapsed()
	r.Throughput = float64(total) / r.Elapsed.Seconds()
	r.P50, r.P99 = percentile(st.lat, 0.50), percentile(st.lat, 0.99)
	if ob != nil {
		// Every message emitted one outgoing message: the relay must
		// deliver them all (JetStream drops a re-send of one ID).
		if r.Relayed, err = ob.waitHeld(ctx, len(w.ids), 60*time.Second); err != nil {
			return r, err
		}
	}
	r.Dup, err = h.count(ctx, rdb, w.ids)
	return r, err
}

// openRun creates the channel and the tables of a throughput run; done
// deletes them.
func openRun(ctx context.Context, b broker, db database, tag string) (channel, runDB, func(), error) {
	ch, err := b.newChannel(ctx, tag, 30*time.Second)
	if err != nil {
		return nil, nil, nil, err
	}
	rdb, err := db.newRun(ctx, tag, nil)
	if err != nil {
		ch.close()
		return nil, nil, nil, err
	}
	return ch, rdb, func() { rdb.close(); ch.close() }, nil
}

// faultRun publishes faultN messages and consumes them with one fault
// injected: "error" makes the handler fail on the first attempt at every
// 20th message (at least 3), after writing its row; "crash" kills the
// consumer right after it committed a message and before it acked it, the
// given number of times, and starts a new one each time. It waits until the
// broker has every message acknowledged (bounded), then counts.
func (h *harness) faultRun(ctx context.Context, b broker, db database, c contender, fault string) (faultResult, error) {
	tag := h.tag()
	// JetStream redelivers what a crashed consumer held after AckWait; it is
	// long enough that no delivery waiting for a worker on a loaded machine
	// times out (which would be a redelivery of its own, not the fault).
	ch, err := b.newChannel(ctx, tag, 5*time.Second)
	if err != nil {
		return faultResult{}, err
	}
	defer ch.close()
	f := &faults{}
	rdb, err := db.newRun(ctx, tag, f)
	if err != nil {
		return faultResult{}, err
	}
	defer rdb.close()
	w := h.workload(tag, h.o.faultN, 0)
	switch fault {
	case "error":
		step := 20
		if len(w.ids)/step < 3 {
			step = max(1, len(w.ids)/3)
		}
		for i := step / 2; i < len(w.ids); i += step {
			f.failOnce.Store(w.ids[i], struct{}{})
		}
	case "crash":
		for k := 1; k <= h.o.crashes; k++ {
			f.crash.Store(w.ids[len(w.ids)*k/(h.o.crashes+1)], struct{}{})
		}
	}
	if _, err := publish(ctx, ch, w); err != nil {
		return faultResult{}, fmt.Errorf("publish: %w", err)
	}
	st := newRunStats(-1)
	var ob *outboxRun
	if c.kind == "outbox" {
		if ob, err = startOutbox(ctx, ch, rdb, len(w.ids)); err != nil {
			return faultResult{}, err
		}
		defer ob.stop()
	}
	startMember, err := h.start(ch, rdb, c, f, st, ob)
	if err != nil {
		return faultResult{}, err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		supervise(rctx, startMember, h.logf)
	}()
	deadline := time.Now().Add(90 * time.Second)
	timedOut := false
	for {
		ok, err := ch.settled(ctx)
		if err == nil && ok && faultsFired(f) {
			break
		}
		if time.Now().After(deadline) {
			timedOut = true
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	cancel()
	<-done
	fr, err := h.count(ctx, rdb, w.ids)
	fr.Timeout = timedOut
	return fr, err
}

// faultsFired reports whether every injected fault has happened.
func faultsFired(f *faults) bool {
	left := false
	f.failOnce.Range(func(any, any) bool { left = true; return false })
	f.crash.Range(func(any, any) bool { left = true; return false })
	return !left
}

// count reads the side-effect table: IDs with more than one row, IDs with
// none.
func (h *harness) count(ctx context.Context, rdb runDB, ids []string) (faultResult, error) {
	rows, err := rdb.effects(ctx)
	if err != nil {
		return faultResult{}, err
	}
	fr := faultResult{Ran: true}
	for _, id := range ids {
		switch n := rows[id]; {
		case n == 0:
			fr.Lost++
		case n > 1:
			fr.Double++
		}
	}
	return fr, nil
}

// percentile returns the q-quantile of ds (nearest rank).
func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(q*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// splitList parses a comma-separated flag value.
func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
