package soaktest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	amqp "github.com/rabbitmq/amqp091-go"
	"gocloud.dev/pubsub"
	"gocloud.dev/pubsub/rabbitpubsub"

	"github.com/idem-go/idem/broker/idemamqp"
	"github.com/idem-go/idem/broker/idemgocdk"
	"github.com/idem-go/idem/internal/faultproxy"
	"github.com/idem-go/idem/internal/ownservice"
	"github.com/idem-go/idem/store/idemsql"
)

// The RabbitMQ names of the mariadb-amqp pipeline (a queue through the
// default exchange) and of the pgsql-gocdk pipeline (the Go CDK's topics
// are fanout exchanges, its subscriptions queues bound to them).
const (
	amqpIn      = "soak-in"
	amqpDead    = "soak-dead"
	cdkTopic    = "soak-cdk"
	cdkIn       = "soak-cdk-in"
	cdkDeadX    = "soak-cdk-dead"
	cdkDeadQ    = "soak-cdk-dead"
	mysqlEffect = "soak_effects"
	cdkEffect   = "soak_effects_cdk"
)

// dialAMQP connects to url with 2-second heartbeats, so that a stalled
// connection is noticed and closed within a few seconds.
func dialAMQP(url string) (*amqp.Connection, error) {
	return amqp.DialConfig(url, amqp.Config{Heartbeat: 2 * time.Second, Dial: amqp.DefaultDial(3 * time.Second)})
}

// declareAMQP declares every queue and exchange of both RabbitMQ
// pipelines, durable.
func declareAMQP(conn *amqp.Connection) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	// rabbitpubsub publishes transient messages (no delivery mode), which
	// a classic queue loses when RabbitMQ is killed, confirmed or not (the
	// soak saw it): the Go CDK's queues are quorum queues, which keep
	// every message on disk.
	quorum := amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}
	for q, args := range map[string]amqp.Table{amqpIn: nil, amqpDead: nil, cdkIn: quorum, cdkDeadQ: quorum} {
		if _, err := ch.QueueDeclare(q, true, false, false, false, args); err != nil {
			return err
		}
	}
	for x, q := range map[string]string{cdkTopic: cdkIn, cdkDeadX: cdkDeadQ} {
		if err := ch.ExchangeDeclare(x, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
			return err
		}
		if err := ch.QueueBind(q, "", x, false, nil); err != nil {
			return err
		}
	}
	return nil
}

// rabbit is the private RabbitMQ both RabbitMQ pipelines share, and the
// test's own connection to it (made again after the server is killed).
type rabbit struct {
	svc        *ownservice.Service
	proxy      *faultproxy.Proxy
	proxiedURL string

	mu   sync.Mutex
	conn *amqp.Connection
}

// connection returns the test's connection, dialled again if it closed.
func (r *rabbit) connection() (*amqp.Connection, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conn != nil && !r.conn.IsClosed() {
		return r.conn, nil
	}
	conn, err := dialAMQP(r.svc.URL)
	if err != nil {
		return nil, err
	}
	r.conn = conn
	return conn, nil
}

// queue returns the messages ready in q (not those delivered and
// unacknowledged: AMQP does not count those).
func (r *rabbit) queue(q string) (int, error) {
	conn, err := r.connection()
	if err != nil {
		return 0, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
	return st.Messages, err
}

func (r *rabbit) faults() []fault {
	return append(proxyFaults("rabbitmq", r.proxy), serviceKill(r.svc))
}

// mariadb is the private MariaDB of the mariadb-amqp pipeline: scripts/
// services knows its pid file but ownservice.Kill does not.
type mariadb struct {
	svc *ownservice.Service
}

func (m mariadb) fault() fault {
	return fault{kind: "kill mariadb", do: func(*rand.Rand) (string, error) {
		start := time.Now()
		if err := ownservice.KillPIDFile(filepath.Join(m.svc.Dir, "mariadb", "mariadbd.pid")); err != nil {
			return "", err
		}
		if err := m.svc.Restart(); err != nil {
			return "", err
		}
		return fmt.Sprintf("back in %v", time.Since(start).Round(time.Millisecond)), nil
	}}
}

// --- MariaDB (database/sql) + RabbitMQ (idemamqp), transactional ---

type mariadbAMQP struct {
	my       mariadb
	rmq      *rabbit
	proxy    *faultproxy.Proxy
	dsn      string // the consumers', through the proxy
	db       *sql.DB
	prod     *idemamqp.Producer
	prodOnce sync.Once
}

// startMariaDBAMQP sets up the pipeline on the started servers: the
// store's tables and the effect's in MariaDB, the queues in RabbitMQ.
func startMariaDBAMQP(t *testing.T, my *ownservice.Service, rmq *rabbit) *mariadbAMQP {
	cfg, err := mysql.ParseDSN(my.URL)
	if err != nil {
		t.Fatal(err)
	}
	p := &mariadbAMQP{my: mariadb{svc: my}, rmq: rmq, db: openSQL(t, "mysql", my.URL, idemsql.MySQL, mysqlEffect)}
	p.proxy = faultproxy.New(t, cfg.Addr)
	cfg.Addr = p.proxy.Addr()
	// Stalls: the driver gives up on a connection silent for 5s; the
	// server ends a session idle inside a transaction after 3s (it holds
	// the claim's row locks), and a stalled idle one after 20s.
	cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout = 3*time.Second, 5*time.Second, 5*time.Second
	cfg.Params = map[string]string{"idle_transaction_timeout": "3", "wait_timeout": "20", "innodb_lock_wait_timeout": "10"}
	p.dsn = cfg.FormatDSN()
	conn, err := rmq.connection()
	if err == nil {
		err = declareAMQP(conn)
	}
	if err != nil {
		t.Fatal(err)
	}
	p.prod = idemamqp.NewProducer(conn, idemamqp.ProducerConfig{Redial: func(context.Context) (*amqp.Connection, error) {
		return dialAMQP(rmq.svc.URL)
	}})
	t.Cleanup(func() { p.prod.Close() })
	return p
}

func (p *mariadbAMQP) name() string { return "mariadb-amqp" }

func (p *mariadbAMQP) env() []string {
	return []string{mysqlEnv + "=" + p.dsn, amqpEnv + "=" + p.rmq.proxiedURL}
}

func (p *mariadbAMQP) publish(ctx context.Context, id string, payload []byte) error {
	_, err := p.prod.Publish(ctx, amqpIn, payload, idemamqp.WithMessageID(id))
	return err
}

func (p *mariadbAMQP) faults() []fault {
	return append(append(proxyFaults("mariadb", p.proxy), p.my.fault()), p.rmq.faults()...)
}

func (p *mariadbAMQP) drained(ctx context.Context, ids []string) (bool, string) {
	return sqlDrained(ctx, p.db, mysqlEffect, p.rmq, amqpIn, ids)
}

func (p *mariadbAMQP) check(ctx context.Context, ids []string, r *result) {
	sqlCheck(ctx, p.db, mysqlEffect, p.rmq, amqpIn, amqpDead, ids, r)
}

// openSQL opens the test's handle on a database/sql store, migrates it
// and creates the counting table (id, n).
func openSQL(t *testing.T, driver, dsn string, dialect idemsql.Dialect, table string) *sql.DB {
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	store, err := idemsql.New(db, dialect, nil)
	if err == nil {
		err = store.Migrate(t.Context())
	}
	if err == nil {
		_, err = db.ExecContext(t.Context(), `CREATE TABLE `+table+` (id VARCHAR(64) PRIMARY KEY, n INT NOT NULL DEFAULT 1)`)
	}
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// sqlEffects adds the verdict of the counting table and the count of dead
// letters (0 so far); it reports false when the table cannot be read.
func sqlEffects(ctx context.Context, db *sql.DB, table string, ids []string, r *result) bool {
	rows, err := db.QueryContext(ctx, `SELECT id, n FROM `+table)
	n, err := readCounts(rows, err)
	if err != nil {
		r.problem("read effects: %v", err)
		return false
	}
	r.effectCounts(ids, n)
	r.count("dead letters", 0)
	return true
}

// sqlDrained reports whether table counts an effect for every message of
// ids and queue q has no message ready.
func sqlDrained(ctx context.Context, db *sql.DB, table string, rmq *rabbit, q string, ids []string) (bool, string) {
	var effects int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM `+table).Scan(&effects); err != nil {
		return false, err.Error()
	}
	ready, err := rmq.queue(q)
	if err != nil {
		return false, err.Error()
	}
	return effects >= len(ids) && ready == 0, fmt.Sprintf("%d of %d effects, %d ready in %s", effects, len(ids), ready, q)
}

// sqlCheck adds the verdict of a counting table, the dead-letter queue
// and the input queue (after the consumers stopped, a delivery never
// settled is back in it).
func sqlCheck(ctx context.Context, db *sql.DB, table string, rmq *rabbit, in, dead string, ids []string, r *result) {
	if !sqlEffects(ctx, db, table, ids, r) {
		return
	}
	r.count("left in the queue", 0)
	if d, err := rmq.queue(dead); err != nil || d != 0 {
		r.count("dead letters", d)
		r.problem("%d messages dead-lettered (%v)", d, err)
	}
	if left, err := rmq.queue(in); err != nil || left != 0 {
		r.count("left in the queue", left)
		r.problem("%d messages left in %s after the drain (%v)", left, in, err)
	}
}

// --- PostgreSQL (database/sql, pgx's stdlib) + Go CDK over RabbitMQ ---

type pgsqlGoCDK struct {
	pg   *pgNATS // the same private PostgreSQL and proxy
	rmq  *rabbit
	dsn  string
	db   *sql.DB
	prod *idemgocdk.Producer

	mu    sync.Mutex
	conn  *amqp.Connection // the topic's
	topic *pubsub.Topic
}

func startPGSQLGoCDK(t *testing.T, pg *pgNATS, rmq *rabbit) *pgsqlGoCDK {
	p := &pgsqlGoCDK{pg: pg, rmq: rmq, prod: idemgocdk.NewProducer(idemgocdk.ProducerConfig{})}
	// As runPGNATS sets them on its pool: the server ends a session
	// stalled inside a transaction after 3s, an idle one after 20s.
	p.dsn = pg.pgURL + "&idle_in_transaction_session_timeout=3000&idle_session_timeout=20000"
	// The pgx store of pg-nats migrated the same tables (idemsql's
	// PostgreSQL dialect shares its schema); this one keeps its effects
	// apart, and its records under its own consumer name.
	p.db = openSQL(t, "pgx", pg.pg.URL, idemsql.Postgres, cdkEffect)
	t.Cleanup(func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.topic != nil {
			_ = p.topic.Shutdown(context.Background())
		}
	})
	return p
}

func (p *pgsqlGoCDK) name() string { return "pgsql-gocdk" }

func (p *pgsqlGoCDK) env() []string {
	return []string{pgsqlEnv + "=" + p.dsn, amqpEnv + "=" + p.rmq.proxiedURL}
}

// publish sends through a Go CDK topic on the test's own connection,
// opened again after a failure (rabbitpubsub does not reconnect).
func (p *pgsqlGoCDK) publish(ctx context.Context, id string, payload []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.topic == nil || p.conn.IsClosed() {
		if p.topic != nil {
			_ = p.topic.Shutdown(ctx)
			p.topic = nil
		}
		conn, err := dialAMQP(p.rmq.svc.URL)
		if err != nil {
			return err
		}
		p.conn, p.topic = conn, rabbitpubsub.OpenTopic(conn, cdkTopic, nil)
	}
	_, err := p.prod.Send(ctx, p.topic, &pubsub.Message{Body: payload}, id)
	if err != nil {
		// A failed send may leave the topic unusable: start again.
		_ = p.topic.Shutdown(ctx)
		_ = p.conn.Close()
		p.topic = nil
	}
	return err
}

// faults: the servers' are pg-nats's (PostgreSQL) and mariadb-amqp's
// (RabbitMQ).
func (p *pgsqlGoCDK) faults() []fault { return nil }

func (p *pgsqlGoCDK) drained(ctx context.Context, ids []string) (bool, string) {
	return sqlDrained(ctx, p.db, cdkEffect, p.rmq, cdkIn, ids)
}

func (p *pgsqlGoCDK) check(ctx context.Context, ids []string, r *result) {
	sqlCheck(ctx, p.db, cdkEffect, p.rmq, cdkIn, cdkDeadQ, ids, r)
}

// startServers starts the private servers of scripts/services the
// pipelines need, at once (RabbitMQ alone takes several seconds), and
// returns them by name.
func startServers(t *testing.T, names ...string) map[string]*ownservice.Service {
	t.Helper()
	var mu sync.Mutex
	got := map[string]*ownservice.Service{}
	var wg sync.WaitGroup
	for _, name := range names {
		// ownservice.Start may t.Fatal or t.Skip, which ends only its
		// goroutine: the test's goroutine looks at the outcome after.
		wg.Go(func() {
			s := ownservice.Start(t, name)
			mu.Lock()
			got[name] = s
			mu.Unlock()
		})
	}
	wg.Wait()
	switch {
	case t.Skipped():
		t.SkipNow()
	case t.Failed() || len(got) != len(names):
		t.FailNow()
	}
	return got
}

// errBrokerClosed ends a Go CDK consumer whose RabbitMQ connection
// closed: rabbitpubsub does not reconnect, the process is started again.
var errBrokerClosed = errors.New("rabbitmq connection closed")
