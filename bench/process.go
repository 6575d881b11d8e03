package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idem-go/idem"
)

// The --process mode measures what the guarantee costs on the store alone,
// with no broker: the cases of store/idempgxv5's BenchmarkProcess, on every
// store the harness knows, in one process and one run, so that every ratio
// compares two cases measured moments apart under the same load:
//
//   - best_checked: the hand-written consumer with idem's guarantee
//     (checked.go), one new message at a time;
//   - idem: idem.Bind in transactional mode, the same side-effect row;
//   - best_checked_duplicate, duplicate: the same two redelivering
//     messages already processed (1,000 of them, in turn);
//   - best_checked_batch100, idem_batch100: batches of 100 new messages,
//     the side effects written with one statement;
//   - best_outbox1, idem_outbox1: best_checked and idem that also emit one
//     outgoing message, sent and deleted by a relay in the timed section
//     (process_outbox.go).
//
// Each case runs --workers goroutines for a fixed time on a pool of as
// many connections (SQLite: one). Rounds go over every store and case in
// turn; a case and the reference it is compared with run one after the
// other, the reference first in odd rounds and second in even ones, so
// that neither always inherits the state the other left (a database's
// caches, its log, a burst of another process's load). Before each
// case's timed section, SQLite's WAL is checkpointed and truncated
// (PRAGMA wal_checkpoint(TRUNCATE)): every case starts with an empty
// WAL, and none pays for the checkpoint of frames another case wrote
// (SQLite checkpoints in the commit that takes the WAL past 1,000
// pages). Beside throughput, each case reports per message: the harness
// process's CPU time (getrusage: the client, and for SQLite the database
// engine too), its heap allocations and bytes (runtime.MemStats), the
// server's CPU (PostgreSQL: the postmaster and all its children;
// MariaDB: the mariadbd process; read from /proc, so only for a server on
// this machine), and what the store writes to its log: PostgreSQL's WAL
// (pg_current_wal_lsn), MariaDB's redo log (Innodb_os_log_written), and
// for SQLite every byte the process writes (/proc/self/io wchar: WAL
// frames and checkpoints). It also reports the CPU the rest of the
// machine used meanwhile, in cores (others-cores: all CPUs' busy time
// from /proc/stat, less the harness's and the server's), and each
// throughput ratio per free core as well (free-x-<reference>: each
// case's msgs/s divided by the cores the rest of the machine left it),
// which on a shared machine cancels most of the swing of the raw ratio.
// Every result line has go test -bench's format, so
// `go run ./bench/capacity summary FILE` reads it too.

// envProcessProfile, when set, names the file the --process mode writes
// a CPU profile of its rounds to (seeding left out), for go tool pprof.
const envProcessProfile = "IDEM_BENCH_PROCESS_CPUPROFILE"

// envProcessMemProfile, when set, names the file the --process mode
// writes a heap profile to after its rounds, with every allocation
// recorded (runtime.MemProfileRate 1), and the same profile taken after
// seeding to path + ".seeded": go tool pprof -sample_index=alloc_objects
// -diff_base=PATH.seeded PATH counts the rounds' allocations, per case
// when it is run alone (--contenders).
const envProcessMemProfile = "IDEM_BENCH_PROCESS_MEMPROFILE"

// processOptions are the settings of the --process mode.
type processOptions struct {
	caseTime time.Duration // timed section of each case in each round
	rounds   int
	workers  int
	stores   []string // postgres, postgres-sql, mysql, sqlite
	cases    []string // when set, only these cases
}

// processCases are the cases of a round, in pairs of a reference and the
// case compared with it: roundCases puts the reference of each pair
// first in odd rounds and second in even ones. A case's other
// references (idem for idem_batch100 and idem_outbox1, best_checked for
// best_outbox1) are in earlier pairs.
var processCases = []string{"best_checked", "idem", "best_checked_duplicate", "duplicate", "best_checked_batch100", "idem_batch100", "best_outbox1", "idem_outbox1"}

// processRefs maps a case to the cases of the same store and round its
// throughput and CPU are compared with.
var processRefs = map[string][]string{
	"idem":          {"best_checked"},
	"duplicate":     {"best_checked_duplicate"},
	"idem_batch100": {"best_checked_batch100", "idem"},
	"best_outbox1":  {"best_checked"},
	"idem_outbox1":  {"best_outbox1", "idem"},
}

// roundCases returns the cases of round (from 1) in the order they run:
// processCases, with the two cases of each pair swapped in even rounds.
func roundCases(round int) []string {
	cs := slices.Clone(processCases)
	if round%2 == 0 {
		for i := 0; i+1 < len(cs); i += 2 {
			cs[i], cs[i+1] = cs[i+1], cs[i]
		}
	}
	return cs
}

// processSeeded is how many messages the duplicate cases redeliver.
const processSeeded = 1000

// processBatch is the batch cases' size.
const processBatch = 100

// meter reads a store's steady counters: the server's CPU time and the
// bytes written to its log, each with whether it could be read.
type meter interface {
	read(ctx context.Context) (cpu time.Duration, cpuOK bool, log int64, logOK bool)
	// logUnit names the log bytes' metric: wal-B/msg, redo-B/msg or
	// write-B/msg.
	logUnit() string
}

// processStore is one store of the --process mode: its run's handlers and
// its meter.
type processStore struct {
	name  string
	db    database
	rdb   runDB
	chk   checkedRun
	meter meter
	// settle, when set, runs before each case's timed section (SQLite:
	// the WAL checkpointed and truncated).
	settle func(ctx context.Context) error
}

// sample is one case's measurement in one round.
type sample struct {
	store, name string
	round       int
	msgs        int
	elapsed     time.Duration
	client      time.Duration // this process's CPU
	server      time.Duration // -1 when not measured
	log         int64         // -1 when not measured
	logUnit     string
	mallocs     uint64
	allocBytes  uint64
	machine     time.Duration // every CPU's busy time; -1 when not measured
}

func (s sample) rate() float64 { return float64(s.msgs) / s.elapsed.Seconds() }

func (s sample) perMsg(d time.Duration) float64 {
	return float64(d.Nanoseconds()) / 1e3 / float64(s.msgs)
}

// others is the CPU, in cores, that the rest of the machine used during
// the timed section: every CPU's busy time less the client's and the
// server's; false when /proc/stat was not read.
func (s sample) others() (float64, bool) {
	if s.machine < 0 {
		return 0, false
	}
	rest := s.machine - s.client
	if s.server > 0 {
		rest -= s.server
	}
	return max(0, rest.Seconds()/s.elapsed.Seconds()), true
}

// freeRatio is s's throughput over r's, each per core the rest of the
// machine left free (runtime.NumCPU() less others, at least 0.05): on a
// shared machine the other processes' load during each case, which moves
// the raw ratio most, cancels out. False when either's others is not
// known.
func (s sample) freeRatio(r sample) (float64, bool) {
	so, ok1 := s.others()
	ro, ok2 := r.others()
	if !ok1 || !ok2 {
		return 0, false
	}
	n := float64(runtime.NumCPU())
	return (s.rate() / max(0.05, n-so)) / (r.rate() / max(0.05, n-ro)), true
}

// cpu is the client and server CPU per message in µs, or the client's
// alone where the server was not measured (SQLite has none).
func (s sample) cpu() float64 {
	if s.server < 0 {
		return s.perMsg(s.client)
	}
	return s.perMsg(s.client + s.server)
}

// runProcess is the --process mode: it prints one go test -bench line per
// case and round, then a summary of the ratios and counters.
func runProcess(ctx context.Context, stdout, log io.Writer, o processOptions) error {
	if log == nil {
		log = io.Discard
	}
	for _, c := range o.cases {
		if !slices.Contains(processCases, c) {
			return fmt.Errorf("%w: --contenders: unknown case %q for --process (want %s)", errUsage, c, strings.Join(processCases, ", "))
		}
	}
	if o.caseTime <= 0 || o.rounds <= 0 || o.workers <= 0 {
		return fmt.Errorf("%w: --process %v, --rounds %d, --workers %d must be positive", errUsage, o.caseTime, o.rounds, o.workers)
	}
	if path := os.Getenv(envProcessMemProfile); path != "" {
		runtime.MemProfileRate = 1
		defer func() {
			if err := writeHeapProfile(path); err != nil {
				fmt.Fprintf(log, "%s: %v\n", envProcessMemProfile, err)
			}
		}()
	}
	var stores []*processStore
	defer func() {
		for _, s := range stores {
			s.rdb.close()
			s.db.close()
		}
	}()
	for _, name := range o.stores {
		s, err := openProcessStore(ctx, name, o.workers)
		if err != nil {
			return err
		}
		stores = append(stores, s)
		fmt.Fprintf(log, "%s: seeding\n", name)
		if err := s.seed(ctx); err != nil {
			return fmt.Errorf("%s: seed: %w", name, err)
		}
	}
	if path := os.Getenv(envProcessMemProfile); path != "" {
		if err := writeHeapProfile(path + ".seeded"); err != nil {
			return err
		}
	}
	if path := os.Getenv(envProcessProfile); path != "" {
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	fmt.Fprintf(stdout, "load-before %s\n", loadAvg())
	fmt.Fprintf(stdout, "workers %d, %v per case, %d rounds, GOMAXPROCS %d\n", o.workers, o.caseTime, o.rounds, runtime.GOMAXPROCS(0))
	hOne, hBatch := harnessAllocs()
	fmt.Fprintf(stdout, "harness allocations per message, in every allocs/msg: %.1f one at a time, %.1f in batches\n", hOne, hBatch)
	var all []sample
	for round := 1; round <= o.rounds; round++ {
		for _, s := range stores {
			// A store's lines of a round are written after its last
			// case, in processCases's order, each with its ratios.
			measured := len(all)
			for _, c := range roundCases(round) {
				if len(o.cases) > 0 && !slices.Contains(o.cases, c) {
					continue
				}
				op, perOp, ok := s.op(c)
				var rel *outboxRelay
				if !ok {
					var err error
					if op, rel, ok, err = s.outboxCase(ctx, c, c+"-"+strconv.FormatInt(time.Now().UnixNano(), 36)+"-"); err != nil {
						return fmt.Errorf("%s %s: %w", s.name, c, err)
					}
					perOp = 1
				}
				if !ok {
					continue
				}
				fmt.Fprintf(log, "round %d/%d: %s %s\n", round, o.rounds, s.name, c)
				sm, err := s.measure(ctx, op, perOp, o, rel)
				if rel != nil {
					rel.stop()
				}
				if err != nil {
					return fmt.Errorf("%s %s: %w", s.name, c, err)
				}
				sm.store, sm.name, sm.round = s.name, c, round
				all = append(all, sm)
			}
			for _, c := range processCases {
				if sm, ok := findSample(all[measured:], s.name, c, round); ok {
					writeSample(stdout, sm, all)
				}
			}
		}
	}
	fmt.Fprintf(stdout, "load-after %s\n\n", loadAvg())
	writeProcessSummary(stdout, all)
	return nil
}

// writeHeapProfile writes the heap profile, with its allocations since
// the start, to path.
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	runtime.GC() // the profile's allocation counts are as of the last GC
	if err := pprof.WriteHeapProfile(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// openProcessStore opens store name with a pool of workers connections
// (SQLite: one) and the tables of one run.
func openProcessStore(ctx context.Context, name string, workers int) (*processStore, error) {
	s := &processStore{name: name}
	var err error
	switch name {
	case "postgres":
		var pg *postgresDB
		if pg, err = newPostgresDB(ctx, postgresURL(), workers); err == nil {
			s.db, s.meter = pg, &pgMeter{query: func(ctx context.Context, q string, dest ...any) error {
				return pg.pool.QueryRow(ctx, q).Scan(dest...)
			}}
		}
	case "postgres-sql":
		var pg *pgsqlDB
		if pg, err = newPGSQLDB(ctx, postgresURL(), workers); err == nil {
			s.db, s.meter = pg, &pgMeter{query: func(ctx context.Context, q string, dest ...any) error {
				return pg.db.QueryRowContext(ctx, q).Scan(dest...)
			}}
		}
	case "mysql":
		var my *mysqlDB
		if my, err = newMySQLDB(ctx, workers); err == nil {
			s.db, s.meter = my, &mysqlMeter{db: my.db}
		}
	case "sqlite":
		var lite *sqliteDB
		if lite, err = newSQLiteDB(1); err == nil {
			s.db, s.meter = lite, selfWriteMeter{}
			s.settle = s.checkpointWAL
		}
	default:
		return nil, fmt.Errorf("%w: unknown store %q (want postgres, postgres-sql, mysql, sqlite)", errUsage, name)
	}
	if err != nil {
		return nil, err
	}
	var rb [3]byte
	_, _ = rand.Read(rb[:])
	if s.rdb, err = s.db.newRun(ctx, fmt.Sprintf("p%x", rb), nil); err != nil {
		s.db.close()
		return nil, err
	}
	s.chk = checkedOf(s.rdb)
	return s, nil
}

// checkpointWAL checkpoints SQLite's WAL into the database file and
// truncates it (PRAGMA wal_checkpoint(TRUNCATE)), on the run's database
// (best_checked's and idem's tables share it). It runs outside the timed
// section, with no transaction open (an outbox case's relay may be
// reading: the checkpoint then stops at its snapshot, and reports busy,
// which is not an error).
func (s *processStore) checkpointWAL(ctx context.Context) error {
	c, ok := s.chk.(*sqlChecked)
	if !ok {
		return nil
	}
	var busy, logFrames, done int64
	return c.db.QueryRowContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`).Scan(&busy, &logFrames, &done)
}

// seed processes 10,000 messages of history through each of idem and
// best_checked (batches of 100), and the messages the duplicate cases
// redeliver, so that the cases measure tables that are not empty.
func (s *processStore) seed(ctx context.Context) error {
	ib, err := s.rdb.idemBatch("bench")
	if err != nil {
		return err
	}
	run := func(h batchHandler, ids []string) error {
		for len(ids) > 0 {
			chunk := ids[:min(processBatch, len(ids))]
			ids = ids[len(chunk):]
			msgs := make([]idem.Message, len(chunk))
			for i, id := range chunk {
				msgs[i] = idem.Message{ID: id, Payload: payload(id)}
			}
			for i, ack := range h(ctx, msgs) {
				if !ack {
					return fmt.Errorf("message %s not processed", msgs[i].ID)
				}
			}
		}
		return nil
	}
	ids := make([]string, 0, 10000+processSeeded)
	for i := range 10000 {
		ids = append(ids, "h-"+strconv.Itoa(i))
	}
	for i := range processSeeded {
		ids = append(ids, dupID(i))
	}
	if err := run(ib, ids); err != nil {
		return err
	}
	if s.chk != nil {
		return run(s.chk.batch(), ids)
	}
	return nil
}

func dupID(i int) string { return "dup-" + strconv.Itoa(i) }

// oneOp is the operation of a case that handles one message at a time
// with h: the i-th message has ID id(i) and that ID's payload.
func oneOp(h msgHandler, id func(i int64) string) func(ctx context.Context, i int64) error {
	return func(ctx context.Context, i int64) error {
		m := id(i)
		ack, err := h(ctx, idem.Message{ID: m, Payload: payload(m)})
		if err == nil && !ack {
			err = fmt.Errorf("message %s not acknowledged", m)
		}
		return err
	}
}

// batchOp is the operation of a batch case: the i-th batch is the
// messages prefix + i×processBatch ... handled with h.
func batchOp(h batchHandler, prefix string) func(ctx context.Context, i int64) error {
	return func(ctx context.Context, i int64) error {
		msgs := make([]idem.Message, processBatch)
		for k := range msgs {
			id := prefix + strconv.FormatInt(i*processBatch+int64(k), 10)
			msgs[k] = idem.Message{ID: id, Payload: payload(id)}
		}
		for k, ack := range h(ctx, msgs) {
			if !ack {
				return fmt.Errorf("message %s of a batch not processed", msgs[k].ID)
			}
		}
		return nil
	}
}

// harnessAllocs returns the heap allocations per message the harness
// itself makes (the ID, the payload, the batch's slice and acks), one
// message at a time and in batches, measured with handlers that do
// nothing: they are part of every case's allocs/msg, on both sides of
// each ratio.
func harnessAllocs() (one, batch float64) {
	ctx := context.Background()
	const n = 20000
	measureOp := func(op func(ctx context.Context, i int64) error, ops int) float64 {
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		for i := range ops {
			_ = op(ctx, int64(i))
		}
		runtime.ReadMemStats(&m1)
		return float64(m1.Mallocs-m0.Mallocs) / n
	}
	ack := func(context.Context, idem.Message) (bool, error) { return true, nil }
	acks := func(_ context.Context, msgs []idem.Message) []bool {
		out := make([]bool, len(msgs))
		for i := range out {
			out[i] = true
		}
		return out
	}
	one = measureOp(oneOp(ack, func(i int64) string { return "h-" + strconv.FormatInt(i, 10) }), n)
	batch = measureOp(batchOp(acks, "h-"), n/processBatch)
	return one, batch
}

// op returns case c's operation on the store (the i-th of the timed
// section) and how many messages one operation handles; false when the
// store does not have the case (a store without best_checked).
func (s *processStore) op(c string) (func(ctx context.Context, i int64) error, int, bool) {
	prefix := c + "-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-"
	one := oneOp
	batch := func(h batchHandler) func(ctx context.Context, i int64) error { return batchOp(h, prefix) }
	fresh := func(i int64) string { return prefix + strconv.FormatInt(i, 10) }
	dup := func(i int64) string { return dupID(int(i % processSeeded)) }
	if strings.HasPrefix(c, "best_checked") && s.chk == nil {
		return nil, 0, false
	}
	switch c {
	case "best_checked":
		return one(s.chk.one(), fresh), 1, true
	case "best_checked_duplicate":
		return one(s.chk.one(), dup), 1, true
	case "best_checked_batch100":
		return batch(s.chk.batch()), processBatch, true
	case "idem", "duplicate":
		h, err := s.rdb.idem("bench")
		if err != nil {
			return func(context.Context, int64) error { return err }, 1, true
		}
		if c == "duplicate" {
			return one(h, dup), 1, true
		}
		return one(h, fresh), 1, true
	case "idem_batch100":
		h, err := s.rdb.idemBatch("bench")
		if err != nil {
			return func(context.Context, int64) error { return err }, processBatch, true
		}
		return batch(h), processBatch, true
	}
	return nil, 0, false
}

// measure runs op on o.workers goroutines for o.caseTime and reads the
// counters around it.
// With rel (an outbox case), the timed section also waits for rel to
// drain: every emitted message published and its row deleted.
func (s *processStore) measure(ctx context.Context, op func(ctx context.Context, i int64) error, perOp int, o processOptions, rel *outboxRelay) (sample, error) {
	sm := sample{server: -1, log: -1, logUnit: s.meter.logUnit()}
	// One untimed operation per worker first (negative indices: new
	// messages in every case), so that the pool's connections are open
	// and the statements prepared.
	var warm sync.WaitGroup
	warmErr := make([]error, o.workers)
	for k := range o.workers {
		warm.Go(func() { warmErr[k] = op(ctx, -1-int64(k)) })
	}
	warm.Wait()
	if err := errors.Join(warmErr...); err != nil {
		return sm, err
	}
	if s.settle != nil {
		if err := s.settle(ctx); err != nil {
			return sm, err
		}
	}
	runtime.GC()
	var ms0, ms1 runtime.MemStats
	srv0, srvOK0, log0, logOK0 := s.meter.read(ctx)
	mach0, machOK0 := machineBusy()
	cli0 := processCPU()
	runtime.ReadMemStats(&ms0)
	var (
		next  atomic.Int64
		done  atomic.Int64
		wg    sync.WaitGroup
		mu    sync.Mutex
		opErr error
	)
	next.Store(0)
	deadline := time.Now().Add(o.caseTime)
	start := time.Now()
	for range o.workers {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				if err := op(ctx, next.Add(1)-1); err != nil {
					mu.Lock()
					if opErr == nil {
						opErr = err
					}
					mu.Unlock()
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	if rel != nil && opErr == nil {
		opErr = rel.drain(ctx, time.Minute+10*o.caseTime)
	}
	sm.elapsed = time.Since(start)
	runtime.ReadMemStats(&ms1)
	cli1 := processCPU()
	mach1, machOK1 := machineBusy()
	srv1, srvOK1, log1, logOK1 := s.meter.read(ctx)
	if opErr != nil {
		return sm, opErr
	}
	sm.msgs = int(done.Load()) * perOp
	if sm.msgs == 0 {
		return sm, errors.New("no operation finished in the timed section")
	}
	sm.client = cli1 - cli0
	if srvOK0 && srvOK1 {
		sm.server = srv1 - srv0
	}
	if logOK0 && logOK1 {
		sm.log = log1 - log0
	}
	sm.mallocs, sm.allocBytes = ms1.Mallocs-ms0.Mallocs, ms1.TotalAlloc-ms0.TotalAlloc
	sm.machine = -1
	if machOK0 && machOK1 {
		sm.machine = mach1 - mach0
	}
	return sm, nil
}

// writeSample writes sm as a go test -bench result line, with its ratios
// to the reference cases of the same store and round (x-<case>) and, for
// postgres-sql, to the same case on postgres (x-postgres).
func writeSample(w io.Writer, sm sample, all []sample) {
	var b strings.Builder
	fmt.Fprintf(&b, "BenchmarkProcess/%s/%s#%02d\t%d\t%.0f ns/op\t%.0f msgs/s\t%.1f client-us/msg",
		sm.store, sm.name, sm.round-1, sm.msgs, float64(sm.elapsed.Nanoseconds())/float64(sm.msgs), sm.rate(), sm.perMsg(sm.client))
	if sm.server >= 0 {
		fmt.Fprintf(&b, "\t%.1f server-us/msg", sm.perMsg(sm.server))
	}
	fmt.Fprintf(&b, "\t%.1f cpu-us/msg", sm.cpu())
	if sm.log >= 0 {
		fmt.Fprintf(&b, "\t%.1f %s", float64(sm.log)/float64(sm.msgs), sm.logUnit)
	}
	fmt.Fprintf(&b, "\t%.1f allocs/msg\t%.0f B/msg", float64(sm.mallocs)/float64(sm.msgs), float64(sm.allocBytes)/float64(sm.msgs))
	if o, ok := sm.others(); ok {
		fmt.Fprintf(&b, "\t%.2f others-cores", o)
	}
	for _, ref := range processRefs[sm.name] {
		if r, ok := findSample(all, sm.store, ref, sm.round); ok {
			fmt.Fprintf(&b, "\t%.3f x-%s\t%.3f cpu-x-%s", sm.rate()/r.rate(), ref, sm.cpu()/r.cpu(), ref)
			if f, ok := sm.freeRatio(r); ok {
				fmt.Fprintf(&b, "\t%.3f free-x-%s", f, ref)
			}
		}
	}
	if sm.store == "postgres-sql" {
		if r, ok := findSample(all, "postgres", sm.name, sm.round); ok {
			fmt.Fprintf(&b, "\t%.3f x-postgres\t%.3f cpu-x-postgres", sm.rate()/r.rate(), sm.cpu()/r.cpu())
		}
	}
	b.WriteByte('\n')
	_, _ = io.WriteString(w, b.String())
}

func findSample(all []sample, store, name string, round int) (sample, bool) {
	for _, s := range all {
		if s.store == store && s.name == name && s.round == round {
			return s, true
		}
	}
	return sample{}, false
}

// writeProcessSummary writes, per store and case, the medians (min–max)
// over the rounds of throughput, CPU, log bytes and allocations per
// message, and of each per-round ratio.
func writeProcessSummary(w io.Writer, all []sample) {
	fmt.Fprintln(w, "| store | case | rounds | msgs/s | × reference (per round) | × reference per free core | CPU µs/msg (server) | CPU × reference | log B/msg | allocs/msg | others' CPU (cores) |")
	fmt.Fprintln(w, "|---|---|---:|---:|---|---|---:|---|---:|---:|---:|")
	type key struct{ store, name string }
	var order []key
	seen := map[key]bool{}
	for _, s := range all {
		k := key{s.store, s.name}
		if !seen[k] {
			seen[k] = true
			order = append(order, k)
		}
	}
	for _, k := range order {
		var rate, cpu, srv, logB, allocs, others []float64
		ratios := map[string][]float64{}
		cpuRatios := map[string][]float64{}
		freeRatios := map[string][]float64{}
		var refs []string
		refs = append(refs, processRefs[k.name]...)
		if k.store == "postgres-sql" {
			refs = append(refs, "postgres")
		}
		unit := ""
		for _, s := range all {
			if s.store != k.store || s.name != k.name {
				continue
			}
			rate = append(rate, s.rate())
			cpu = append(cpu, s.cpu())
			if s.server >= 0 {
				srv = append(srv, s.perMsg(s.server))
			}
			if s.log >= 0 {
				logB = append(logB, float64(s.log)/float64(s.msgs))
				unit = strings.TrimSuffix(s.logUnit, "-B/msg") + " "
			}
			allocs = append(allocs, float64(s.mallocs)/float64(s.msgs))
			if o, ok := s.others(); ok {
				others = append(others, o)
			}
			for _, ref := range refs {
				rs, rn := k.store, ref
				if ref == "postgres" {
					rs, rn = "postgres", k.name
				}
				if r, ok := findSample(all, rs, rn, s.round); ok {
					ratios[ref] = append(ratios[ref], s.rate()/r.rate())
					cpuRatios[ref] = append(cpuRatios[ref], s.cpu()/r.cpu())
					if f, ok := s.freeRatio(r); ok {
						freeRatios[ref] = append(freeRatios[ref], f)
					}
				}
			}
		}
		var rt, ct, ft []string
		for _, ref := range refs {
			if len(ratios[ref]) > 0 {
				rt = append(rt, fmt.Sprintf("%s (%s)", spread(ratios[ref], 2), ref))
				ct = append(ct, fmt.Sprintf("%s (%s)", spread(cpuRatios[ref], 2), ref))
			}
			if len(freeRatios[ref]) > 0 {
				ft = append(ft, fmt.Sprintf("%s (%s)", spread(freeRatios[ref], 2), ref))
			}
		}
		cpuCell := spread(cpu, 0)
		if len(srv) > 0 {
			cpuCell += fmt.Sprintf(" (%.0f)", median(srv))
		}
		logCell := "-"
		if len(logB) > 0 {
			logCell = fmt.Sprintf("%s%.0f", unit, median(logB))
		}
		othersCell := "-"
		if len(others) > 0 {
			othersCell = spread(others, 2)
		}
		fmt.Fprintf(w, "| %s | %s | %d | %s | %s | %s | %s | %s | %s | %.1f | %s |\n", k.store, k.name, len(rate), spread(rate, 0),
			dashIfEmpty(strings.Join(rt, "; ")), dashIfEmpty(strings.Join(ft, "; ")), cpuCell, dashIfEmpty(strings.Join(ct, "; ")), logCell, median(allocs), othersCell)
	}
}

// dashIfEmpty is s, or "-" for an empty cell.
func dashIfEmpty(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// spread formats vs (not empty) as "median (min–max)".
func spread(vs []float64, prec int) string {
	s := slices.Clone(vs)
	slices.Sort(s)
	return fmt.Sprintf("%.*f (%.*f–%.*f)", prec, median(s), prec, s[0], prec, s[len(s)-1])
}

// processCPU is this process's user and system CPU time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(syscall.TimevalToNsec(ru.Utime) + syscall.TimevalToNsec(ru.Stime))
}

// machineBusy is the busy time of all the machine's CPUs since boot: the
// first line of /proc/stat (clock ticks of 1/100 s) less its idle and
// iowait fields.
func machineBusy() (time.Duration, bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return 0, false
	}
	var busy int64
	for i, v := range f[1:] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, false
		}
		// user nice system idle iowait irq softirq steal guest guest_nice:
		// guest time is counted in user already.
		if i == 3 || i == 4 || i >= 8 {
			continue
		}
		busy += n
	}
	return time.Duration(busy) * 10 * time.Millisecond, true
}

// procStat returns process pid's parent and its user and system CPU time,
// from /proc/pid/stat (fields 4, 14 and 15; clock ticks of 1/100 s).
func procStat(pid int) (ppid int, cpu time.Duration, ok bool) {
	pp, cpu, _, ok := procStatReaped(pid)
	return pp, cpu, ok
}

// procStatReaped is procStat with, in reaped, the user and system CPU
// time of pid's children that exited and that it waited for (fields 16
// and 17).
func procStatReaped(pid int) (ppid int, cpu, reaped time.Duration, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 15 {
		return 0, 0, 0, false
	}
	pp, err := strconv.Atoi(f[1])
	if err != nil {
		return 0, 0, 0, false
	}
	var ticks [4]int64 // utime, stime, cutime, cstime
	for k := range ticks {
		if ticks[k], err = strconv.ParseInt(f[11+k], 10, 64); err != nil {
			return 0, 0, 0, false
		}
	}
	tick := 10 * time.Millisecond
	return pp, time.Duration(ticks[0]+ticks[1]) * tick, time.Duration(ticks[2]+ticks[3]) * tick, true
}

// treeCPU is the CPU time of process root and its children (PostgreSQL's
// postmaster and its backends and background processes), those that
// exited included: the postmaster waits for its children, and the kernel
// then adds their time to its own children's (cutime, cstime), so the
// total does not fall when another client's backend exits during a case.
func treeCPU(root int) (time.Duration, bool) {
	_, total, reaped, ok := procStatReaped(root)
	if !ok {
		return 0, false
	}
	total += reaped
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pp, cpu, ok := procStat(pid); ok && pp == root {
			total += cpu
		}
	}
	return total, true
}

// pidFile reads the process ID on the first line of path.
func pidFile(path string) (int, bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(sc.Text()))
	return pid, err == nil
}

// pgMeter reads PostgreSQL's CPU (the postmaster, parent of a backend of
// the pool, and all its children) and WAL position.
type pgMeter struct {
	query func(ctx context.Context, q string, dest ...any) error
	pid   int // the postmaster; 0 before the first read, -1 when unreadable
}

func (m *pgMeter) logUnit() string { return "wal-B/msg" }

func (m *pgMeter) read(ctx context.Context) (time.Duration, bool, int64, bool) {
	if m.pid == 0 {
		m.pid = -1
		var backend int
		if m.query(ctx, `SELECT pg_backend_pid()`, &backend) == nil {
			if pp, _, ok := procStat(backend); ok {
				m.pid = pp
			}
		}
	}
	var cpu time.Duration
	cpuOK := false
	if m.pid > 0 {
		cpu, cpuOK = treeCPU(m.pid)
	}
	var lsn int64
	err := m.query(ctx, `SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint`, &lsn)
	return cpu, cpuOK, lsn, err == nil
}

// mysqlMeter reads MariaDB's CPU (the process of @@pid_file) and the
// bytes written to its redo log (Innodb_os_log_written).
type mysqlMeter struct {
	db  *sql.DB
	pid int // 0 before the first read, -1 when unreadable
}

func (m *mysqlMeter) logUnit() string { return "redo-B/msg" }

func (m *mysqlMeter) read(ctx context.Context) (time.Duration, bool, int64, bool) {
	if m.pid == 0 {
		m.pid = -1
		var path string
		if m.db.QueryRowContext(ctx, `SELECT @@pid_file`).Scan(&path) == nil {
			if pid, ok := pidFile(path); ok {
				m.pid = pid
			}
		}
	}
	var cpu time.Duration
	cpuOK := false
	if m.pid > 0 {
		_, cpu, cpuOK = procStat(m.pid)
	}
	var name string
	var n int64
	err := m.db.QueryRowContext(ctx, `SHOW GLOBAL STATUS LIKE 'Innodb_os_log_written'`).Scan(&name, &n)
	return cpu, cpuOK, n, err == nil
}

// selfWriteMeter is SQLite's: no server; the bytes this process wrote
// (/proc/self/io wchar), which with SQLite in the process are its WAL
// frames and checkpoints (and the harness's own output, a few lines).
type selfWriteMeter struct{}

func (selfWriteMeter) logUnit() string { return "write-B/msg" }

func (selfWriteMeter) read(context.Context) (time.Duration, bool, int64, bool) {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0, false, 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "wchar: "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return 0, false, n, err == nil
		}
	}
	return 0, false, 0, false
}
