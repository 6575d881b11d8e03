package soaktest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemkafka"
	"github.com/idem-go/idem/broker/idemnats"
	"github.com/idem-go/idem/broker/idemredisstream"
	"github.com/idem-go/idem/internal/faultproxy"
	"github.com/idem-go/idem/internal/ownservice"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/idem-go/idem/store/idemredis"
	"github.com/idem-go/idem/store/idemsql"
)

// proxyFaults are the faults of the proxy between a consumer and server:
// stall every open connection, or cut the server's answers for a while.
func proxyFaults(server string, p *faultproxy.Proxy) []fault {
	return []fault{
		{kind: "stall " + server + " connections", do: func(*rand.Rand) (string, error) {
			return fmt.Sprintf("%d stalled", p.Stall()), nil
		}},
		{kind: "cut " + server + " answers", do: func(rng *rand.Rand) (string, error) {
			d := time.Duration(100+rng.IntN(1400)) * time.Millisecond
			before := p.Cuts()
			p.CutAnswers(d)
			time.Sleep(d)
			return fmt.Sprintf("for %v, %d connections cut", d, p.Cuts()-before), nil
		}},
	}
}

// serviceKill is the fault that SIGKILLs a private server of
// scripts/services and starts it again in the background (PostgreSQL
// takes seconds, RabbitMQ up to half a minute on a loaded machine), so
// that the schedule goes on with the other servers' faults meanwhile; a
// kill of a server still restarting is skipped.
func serviceKill(s *ownservice.Service) fault {
	return fault{kind: "kill " + s.Name, do: func(*rand.Rand) (string, error) {
		if !restarts.begin(s.Name) {
			return "skipped: still restarting", nil
		}
		if err := killServer(s); err != nil {
			restarts.end(s.Name, 0, err)
			return "", err
		}
		start := time.Now()
		go func() {
			err := s.Restart()
			restarts.end(s.Name, time.Since(start), err)
		}()
		return "restarting in the background", nil
	}}
}

// killServer SIGKILLs s's main process; for PostgreSQL, its backends
// too, as a crash of the whole server does. Killed alone, the postmaster
// leaves its backends running: one in the middle of a long statement
// (the soak saw relay claims run for minutes after their clients had
// given up, with no postmaster left to pass on a cancel) holds the
// shared memory, and the server cannot start again until it ends.
func killServer(s *ownservice.Service) error {
	if s.Name != "postgres-durable" {
		return s.Kill()
	}
	data := filepath.Join(s.Dir, "postgres-durable", "data")
	// Every PostgreSQL process works in the data directory.
	procs := inDir(data)
	if err := ownservice.KillPIDFile(filepath.Join(data, "postmaster.pid")); err != nil {
		return err
	}
	for _, pid := range append(procs, inDir(data)...) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	return nil
}

// inDir returns the pids of the processes whose working directory is dir.
func inDir(dir string) []int {
	cwds, _ := filepath.Glob("/proc/[0-9]*/cwd")
	var pids []int
	for _, cwd := range cwds {
		if d, err := os.Readlink(cwd); err == nil && d == dir {
			if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(cwd))); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// restarts tracks the servers restarting in the background.
var restarts = &background{busy: map[string]bool{}}

type background struct {
	mu    sync.Mutex
	cond  *sync.Cond
	busy  map[string]bool
	times map[string][]time.Duration
	errs  []error
}

// begin marks name restarting, or reports false if it already is.
func (b *background) begin(name string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.busy[name] {
		return false
	}
	b.busy[name] = true
	return true
}

// end marks name restarted after d, or failed with err.
func (b *background) end(name string, d time.Duration, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.busy, name)
	if err != nil {
		b.errs = append(b.errs, fmt.Errorf("restart %s: %w", name, err))
	} else {
		if b.times == nil {
			b.times = map[string][]time.Duration{}
		}
		b.times[name] = append(b.times[name], d)
	}
	if b.cond != nil {
		b.cond.Broadcast()
	}
}

// wait waits until no server is restarting, and returns the restart
// times by server and the failures.
func (b *background) wait() (map[string][]time.Duration, []error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cond == nil {
		b.cond = sync.NewCond(&b.mu)
	}
	for len(b.busy) > 0 {
		b.cond.Wait()
	}
	return b.times, b.errs
}

// rows is what pgx.Rows and *sql.Rows have in common.
type rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// readCounts reads (id, n) rows into a map, for the result of a query
// that failed with err or returned rs (read to the end, which closes it).
func readCounts[R rows](rs R, err error) (map[string]int, error) {
	if err != nil {
		return nil, err
	}
	n := map[string]int{}
	for rs.Next() {
		var id string
		var c int
		if err := rs.Scan(&id, &c); err != nil {
			return nil, err
		}
		n[id] = c
	}
	return n, rs.Err()
}

// --- PostgreSQL + NATS JetStream, with the outbox ---

type pgNATS struct {
	pg, nats *ownservice.Service
	// The consumer reaches each server through a proxy.
	pgProxy, natsProxy *faultproxy.Proxy
	pgURL, natsURL     string
	pool               *pgxpool.Pool
	js                 jetstream.JetStream
	stream             jetstream.Stream
	cons               jetstream.Consumer
	prod               *idemnats.Producer
}

func startPGNATS(t *testing.T, pg, nats *ownservice.Service) *pgNATS {
	ctx := t.Context()
	p := &pgNATS{pg: pg, nats: nats}
	p.pgProxy, p.pgURL = faultproxy.URL(t, p.pg.URL)
	p.natsProxy, p.natsURL = faultproxy.URL(t, p.nats.URL)
	var err error
	if p.pool, err = pgxpool.New(context.Background(), p.pg.URL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.pool.Close)
	store, err := idempgxv5.New(p.pool, nil)
	if err == nil {
		err = store.Migrate(ctx)
	}
	if err == nil {
		_, err = p.pool.Exec(ctx, `CREATE TABLE soak_effects (id text PRIMARY KEY, n int NOT NULL DEFAULT 1);
			CREATE TABLE soak_keys (k text PRIMARY KEY, n bigint NOT NULL DEFAULT 0)`)
	}
	for i := range orderKeys {
		if err == nil {
			_, err = p.pool.Exec(ctx, `INSERT INTO soak_keys (k) VALUES ($1)`, fmt.Sprintf("k%d", i))
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if p.js, err = connectNATS(p.nats.URL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.js.Conn().Close)
	p.stream, err = p.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: natsStream,
		Subjects: []string{natsIn, natsOut, natsDead}, Storage: jetstream.FileStorage})
	if err == nil {
		p.cons, err = p.stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: natsDurable,
			FilterSubject: natsIn, AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second})
	}
	if err != nil {
		t.Fatal(err)
	}
	p.prod = idemnats.NewProducer(p.js)
	return p
}

func (p *pgNATS) name() string { return "pg-nats" }

func (p *pgNATS) env() []string {
	return []string{pgEnv + "=" + p.pgURL, natsEnv + "=" + p.natsURL}
}

func (p *pgNATS) publish(ctx context.Context, id string, payload []byte) error {
	_, err := p.prod.Publish(ctx, natsIn, payload, idemnats.WithMessageID(id))
	return err
}

func (p *pgNATS) faults() []fault {
	return append(append(proxyFaults("postgres", p.pgProxy), proxyFaults("nats", p.natsProxy)...),
		serviceKill(p.pg), serviceKill(p.nats))
}

func (p *pgNATS) drained(ctx context.Context, ids []string) (bool, string) {
	var effects, outbox int
	err := p.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM soak_effects), (SELECT count(*) FROM idem_processed_outbox)`).Scan(&effects, &outbox)
	if err != nil {
		return false, err.Error()
	}
	info, err := p.cons.Info(ctx)
	if err != nil {
		return false, err.Error()
	}
	why := fmt.Sprintf("%d of %d effects, %d outbox rows unsent, %d messages pending and %d unacked in JetStream",
		effects, len(ids), outbox, info.NumPending, info.NumAckPending)
	return effects >= len(ids) && outbox == 0 && info.NumPending == 0 && info.NumAckPending == 0, why
}

func (p *pgNATS) check(ctx context.Context, ids []string, r *result) {
	rows, err := p.pool.Query(ctx, `SELECT id, n FROM soak_effects`)
	n, err := readCounts(rows, err)
	if err != nil {
		r.problem("read effects: %v", err)
		return
	}
	r.effectCounts(ids, n)
	for _, c := range []string{"dead letters", "outbox resends", "outbox out of order", "outbox lost"} {
		r.count(c, 0)
	}

	// The outbox: per key, the numbers 1..N of soak_keys, each first
	// seen in order in the stream (a resend of one already seen counts
	// apart, it is the relay's at-least-once).
	want := map[string]int64{}
	rows, err = p.pool.Query(ctx, `SELECT k, n FROM soak_keys`)
	if err == nil {
		for rows.Next() {
			var k string
			var c int64
			if err = rows.Scan(&k, &c); err != nil {
				break
			}
			want[k] = c
		}
		err = errors.Join(err, rows.Err())
	}
	if err != nil {
		r.problem("read keys: %v", err)
		return
	}
	info, err := p.stream.Info(ctx, jetstream.WithSubjectFilter(">"))
	if err != nil {
		r.problem("stream info: %v", err)
		return
	}
	if dead := info.State.Subjects[natsDead]; dead != 0 {
		r.count("dead letters", int(dead))
		r.problem("%d messages dead-lettered", dead)
	}
	total := int(info.State.Subjects[natsOut])
	oc, err := p.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{natsOut}})
	if err != nil {
		r.problem("read the outbox's messages: %v", err)
		return
	}
	seen := map[string]bool{}
	last := map[string]int64{}
	for got := 0; got < total; {
		batch, err := oc.Fetch(min(500, total-got), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			r.problem("read the outbox's messages: %v", err)
			return
		}
		before := got
		for m := range batch.Messages() {
			got++
			id := m.Headers().Get("Nats-Msg-Id")
			if seen[id] {
				r.count("outbox resends", 1)
				continue
			}
			seen[id] = true
			k := m.Headers().Get(keyHeader)
			v, _ := strconv.ParseInt(string(m.Data()), 10, 64)
			if v != last[k]+1 {
				r.count("outbox out of order", 1)
				r.problem("outbox key %s: %d sent after %d", k, v, last[k])
			}
			last[k] = max(last[k], v)
		}
		if got == before {
			r.problem("read the outbox's messages: %d of %d", got, total)
			return
		}
	}
	r.count("outbox sent", len(seen))
	for k, n := range want {
		if last[k] != n {
			r.count("outbox lost", int(n-last[k]))
			r.problem("outbox key %s: %d emitted, last sent %d", k, n, last[k])
		}
	}
}

// --- SQLite + Kafka (kfake) ---

type sqliteKafka struct {
	path, control string
	db            *sql.DB
	kafkaPort     int
	kafkaDir      string
	cl            *kgo.Client
	prod          *idemkafka.Producer

	mu    sync.Mutex
	kafka *kfake.Cluster
}

// openKafka starts the kfake broker on its port, keeping its data in its
// folder, so that a restart finds the topics, records and offsets.
func (p *sqliteKafka) openKafka() error {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(p.kafkaPort), kfake.DataDir(p.kafkaDir),
		kfake.SeedTopics(4, kafkaIn, kafkaDead))
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.kafka = c
	p.mu.Unlock()
	return nil
}

func (p *sqliteKafka) closeKafka() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.kafka.Close()
}

func startSQLiteKafka(t *testing.T, dir string) *sqliteKafka {
	ports, err := ownservice.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	p := &sqliteKafka{path: filepath.Join(dir, "soak.db"), control: filepath.Join(dir, "sqlite.control"),
		kafkaPort: ports[0], kafkaDir: filepath.Join(dir, "kafka")}
	if err := p.openKafka(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.closeKafka)
	p.db = openSQL(t, "sqlite", idemsql.SQLiteDSN(p.path), idemsql.SQLite, "soak_effects")
	if p.cl, err = kgo.NewClient(kgo.SeedBrokers(p.kafkaAddr())); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.cl.Close)
	p.prod = idemkafka.NewProducer(p.cl, idemkafka.ProducerConfig{})
	return p
}

func (p *sqliteKafka) name() string { return "sqlite-kafka" }

func (p *sqliteKafka) env() []string {
	return []string{sqliteEnv + "=" + p.path, controlEnv + "=" + p.control,
		kafkaEnv + "=" + p.kafkaAddr()}
}

func (p *sqliteKafka) kafkaAddr() string { return fmt.Sprintf("127.0.0.1:%d", p.kafkaPort) }

func (p *sqliteKafka) publish(ctx context.Context, id string, payload []byte) error {
	_, err := p.prod.Publish(ctx, kafkaIn, payload, idemkafka.WithMessageID(id), idemkafka.WithKey([]byte(id)))
	return err
}

func (p *sqliteKafka) faults() []fault {
	return []fault{{kind: "restart kafka (kfake)", do: func(*rand.Rand) (string, error) {
		start := time.Now()
		p.closeKafka()
		if err := p.openKafka(); err != nil {
			return "", err
		}
		return fmt.Sprintf("back in %v", time.Since(start).Round(time.Millisecond)), nil
	}}, {kind: "sqlite disk full", do: func(rng *rand.Rand) (string, error) {
		d := time.Duration(300+rng.IntN(2700)) * time.Millisecond
		if err := os.WriteFile(p.control, []byte("full"), 0o644); err != nil {
			return "", err
		}
		applied := "not applied (consumer restarting)"
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if b, _ := os.ReadFile(p.control + ".ack"); string(b) == "full" {
				applied = "applied"
				break
			}
		}
		time.Sleep(d)
		return fmt.Sprintf("%s, for %v", applied, d), os.WriteFile(p.control, []byte("ok"), 0o644)
	}}}
}

func (p *sqliteKafka) drained(ctx context.Context, ids []string) (bool, string) {
	var effects int
	if err := p.db.QueryRowContext(ctx, `SELECT count(*) FROM soak_effects`).Scan(&effects); err != nil {
		return false, err.Error()
	}
	return effects >= len(ids), fmt.Sprintf("%d of %d effects", effects, len(ids))
}

func (p *sqliteKafka) check(ctx context.Context, ids []string, r *result) {
	if !sqlEffects(ctx, p.db, "soak_effects", ids, r) {
		return
	}
	ends, err := kadm.NewClient(p.cl).ListEndOffsets(ctx, kafkaDead)
	if err != nil {
		r.problem("dead-letter topic: %v", err)
		return
	}
	dead := 0
	ends.Each(func(o kadm.ListedOffset) { dead += int(o.Offset) })
	if dead != 0 {
		r.count("dead letters", dead)
		r.problem("%d messages dead-lettered", dead)
	}
	logs, _ := filepath.Glob(filepath.Join(filepath.Dir(p.path), p.name()+"-*.log"))
	full := 0
	for _, log := range logs {
		b, _ := os.ReadFile(log)
		full += strings.Count(string(b), "database or disk is full")
	}
	r.count("SQLITE_FULL errors logged", full)
}

// --- Redis lease store + Redis Streams ---

// redisServer is a private redis-server run by the test itself (the
// scripts/services one keeps no data), with an append-only file fsync'd
// on every write: a SIGKILL loses nothing it acknowledged.
type redisServer struct {
	port int
	dir  string
	cmd  *exec.Cmd
}

func (s *redisServer) start() error {
	s.cmd = exec.Command("redis-server", "--bind", "127.0.0.1", "--port", strconv.Itoa(s.port), "--dir", s.dir,
		"--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no",
		"--logfile", filepath.Join(s.dir, "redis.log"))
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return err
	}
	rdb := redis.NewClient(&redis.Options{Addr: s.addr(), MaxRetries: -1})
	defer rdb.Close()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if err := rdb.Ping(context.Background()).Err(); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s: %w", s.addr(), err)
		}
	}
}

func (s *redisServer) addr() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }

func (s *redisServer) kill() error {
	if err := s.cmd.Process.Kill(); err != nil {
		return err
	}
	_ = s.cmd.Wait()
	return nil
}

type redisLease struct {
	srv      *redisServer
	proxy    *faultproxy.Proxy
	rdb      *redis.Client
	prod     *idemredisstream.Producer
	provider *provider
	http     *httptest.Server
}

func startRedisLease(t *testing.T) *redisLease {
	if os.Geteuid() != 0 {
		t.Skip("the soak's other servers need root (scripts/services)")
	}
	ports, err := ownservice.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	p := &redisLease{srv: &redisServer{port: ports[0], dir: t.TempDir()}, provider: newProvider()}
	if err := p.srv.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.srv.kill() })
	p.proxy = faultproxy.New(t, p.srv.addr())
	p.rdb = redis.NewClient(&redis.Options{Addr: p.srv.addr()})
	t.Cleanup(func() { p.rdb.Close() })
	p.prod = idemredisstream.NewProducer(p.rdb, idemredisstream.ProducerConfig{})
	p.http = httptest.NewServer(p.provider)
	t.Cleanup(p.http.Close)
	return p
}

func (p *redisLease) name() string { return "redis-lease" }

func (p *redisLease) env() []string {
	return []string{redisEnv + "=redis://" + p.proxy.Addr(), providerEnv + "=" + p.http.URL}
}

func (p *redisLease) publish(ctx context.Context, id string, payload []byte) error {
	_, err := p.prod.Publish(ctx, redisIn, payload, idemredisstream.WithMessageID(id))
	return err
}

func (p *redisLease) faults() []fault {
	return append(proxyFaults("redis", p.proxy), fault{kind: "kill redis", do: func(*rand.Rand) (string, error) {
		start := time.Now()
		if err := p.srv.kill(); err != nil {
			return "", err
		}
		if err := p.srv.start(); err != nil {
			return "", err
		}
		return fmt.Sprintf("back in %v", time.Since(start).Round(time.Millisecond)), nil
	}})
}

func (p *redisLease) drained(ctx context.Context, ids []string) (bool, string) {
	charged := 0
	for _, id := range ids {
		if p.provider.effects(idem.DeriveKey(leaseConsumer, id, "charge")) > 0 {
			charged++
		}
	}
	groups, err := p.rdb.XInfoGroups(ctx, redisIn).Result()
	if err != nil {
		return false, err.Error()
	}
	pending, lag := int64(0), int64(0)
	for _, g := range groups {
		pending += g.Pending
		lag += g.Lag
	}
	return charged == len(ids) && len(groups) == 1 && pending == 0 && lag == 0,
		fmt.Sprintf("%d of %d charged, %d groups, %d entries pending, lag %d", charged, len(ids), len(groups), pending, lag)
}

func (p *redisLease) check(ctx context.Context, ids []string, r *result) {
	leaseVerdict(p.provider, leaseConsumer, ids, r)
	if dead, err := p.rdb.XLen(ctx, redisDead).Result(); err != nil || dead != 0 {
		r.count("dead letters", int(dead))
		r.problem("%d messages dead-lettered (%v)", dead, err)
	}
	// Every message is completed in the store: processing it again is a
	// Duplicate, the handler never runs.
	store, err := idemredis.New(p.rdb, nil)
	if err != nil {
		r.problem("store: %v", err)
		return
	}
	lc, err := idem.NewLeaseConsumer(store, idem.Config{Name: leaseConsumer, PurgeInterval: -1})
	if err != nil {
		r.problem("store: %v", err)
		return
	}
	defer lc.Close()
	for i, id := range ids {
		out, err := lc.Process(ctx, idem.Message{ID: id, Payload: fmt.Appendf(nil, "k%d", (i+1)%orderKeys)},
			func(context.Context, *idem.Attempt) (idem.Result, error) {
				return idem.Result{}, errors.New("not completed")
			})
		if err != nil || out.Status != idem.Duplicate {
			r.count("not completed in the store", 1)
			r.problem("%s: processing it again gives %v (%v), want Duplicate", id, out.Status, err)
		}
	}
}

// leaseVerdict adds the verdict of a lease-mode pipeline whose effect is
// a charge at prov under the key of consumer's step "charge": one effect
// per message, repeated calls counted apart, no completion reported twice
// or with a token lower than one the provider saw for the message.
func leaseVerdict(prov *provider, consumer string, ids []string, r *result) {
	n := map[string]int{}
	keys := map[string]string{}
	for _, id := range ids {
		k := idem.DeriveKey(consumer, id, "charge")
		keys[id] = k
		if e := prov.effects(k); e > 0 {
			n[id] = e
		}
	}
	r.effectCounts(ids, n)
	r.count("fenced completions", 0)
	r.count("dead letters", 0)
	calls, completed, maxToken := prov.snapshot()
	repeated := 0
	for _, c := range calls {
		repeated += c - 1
	}
	r.count("provider calls repeated", repeated)
	reports := 0
	for id, tokens := range completed {
		reports += len(tokens)
		if len(tokens) > 1 {
			r.problem("%s: completed %d times (tokens %v)", id, len(tokens), tokens)
		}
		for _, tok := range tokens {
			if m := maxToken[keys[id]]; tok < m {
				r.count("fenced completions", 1)
				r.problem("%s: completed with token %d after the provider saw token %d", id, tok, m)
			}
		}
	}
	r.count("completions reported", reports)
}
