package soaktest

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"gocloud.dev/pubsub/rabbitpubsub"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemamqp"
	"github.com/idem-go/idem/broker/idemgocdk"
	"github.com/idem-go/idem/store/idemsql"
)

// The environment of the RabbitMQ pipelines' consumer processes.
const (
	mysqlEnv = "IDEM_SOAK_MYSQL"
	pgsqlEnv = "IDEM_SOAK_PGSQL"
	amqpEnv  = "IDEM_SOAK_AMQP"
)

// The consumer names of the RabbitMQ pipelines' stores.
const (
	mysqlConsumer = "soak-mysql"
	cdkConsumer   = "soak-gocdk"
)

// sqlStore opens a database/sql store of dialect on dsn through driver,
// with a transactional consumer called name.
func sqlStore(driver, dsn string, dialect idemsql.Dialect, name string, log *slog.Logger) (*sql.DB, *idem.Consumer[*sql.Tx], error) {
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return nil, nil, err
	}
	db.SetMaxOpenConns(8)
	db.SetConnMaxIdleTime(10 * time.Second)
	store, err := idemsql.New(db, dialect, nil)
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	c, err := idem.NewConsumer(store, idem.Config{Name: name, StoreTimeout: 2 * time.Second, PurgeInterval: -1, Logger: log})
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return db, c, nil
}

// countIn is the counting effect of a database/sql pipeline: a row per
// message in table, n = n + 1 on a second run (upsert as the dialect
// spells it).
func countIn(table string, dialect idemsql.Dialect) idem.Handler[*sql.Tx] {
	q := `INSERT INTO ` + table + ` (id) VALUES ($1) ON CONFLICT (id) DO UPDATE SET n = ` + table + `.n + 1`
	if dialect == idemsql.MySQL {
		q = `INSERT INTO ` + table + ` (id) VALUES (?) ON DUPLICATE KEY UPDATE n = n + 1`
	}
	return func(ctx context.Context, tx *sql.Tx, m idem.Message) error {
		_, err := tx.ExecContext(ctx, q, m.ID)
		return err
	}
}

// runMariaDBAMQP consumes soak-in from RabbitMQ into MariaDB: the same
// counting effect, in the claim's transaction. idemamqp dials again by
// itself after the connection is lost (Redial).
func runMariaDBAMQP(ctx context.Context, log *slog.Logger) error {
	db, c, err := sqlStore("mysql", os.Getenv(mysqlEnv), idemsql.MySQL, mysqlConsumer, log)
	if err != nil {
		return err
	}
	defer db.Close()
	defer c.Close()
	url := os.Getenv(amqpEnv)
	conn, err := dialAMQP(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	ac, err := idemamqp.NewConsumer(conn, idemamqp.Config{Processor: idem.Bind(c, countIn(mysqlEffect, idemsql.MySQL)),
		Queue: amqpIn, DeadLetter: amqpDead, Concurrency: 4, RetryDelay: 200 * time.Millisecond,
		Redial:               func(context.Context) (*amqp.Connection, error) { return dialAMQP(url) },
		MaxReconnectInterval: time.Second, Logger: log,
		HandlerTimeout: 20 * time.Second}) // a handler stalled on a black-holed MariaDB connection gives up
	if err != nil {
		return err
	}
	return ran(ac.Run(ctx))
}

// runPGSQLGoCDK consumes soak-cdk-in through the Go CDK (rabbitpubsub)
// into PostgreSQL through database/sql (pgx's stdlib driver). rabbitpubsub
// does not dial again: when its connection closes (a RabbitMQ fault) the
// process ends with a set-up error and is started again.
func runPGSQLGoCDK(ctx context.Context, log *slog.Logger) error {
	db, c, err := sqlStore("pgx", os.Getenv(pgsqlEnv), idemsql.Postgres, cdkConsumer, log)
	if err != nil {
		return err
	}
	defer db.Close()
	defer c.Close()
	conn, err := dialAMQP(os.Getenv(amqpEnv))
	if err != nil {
		return err
	}
	defer conn.Close()
	prefetch := 8
	sub := rabbitpubsub.OpenSubscription(conn, cdkIn, &rabbitpubsub.SubscriptionOptions{PrefetchCount: &prefetch})
	dead := rabbitpubsub.OpenTopic(conn, cdkDeadX, nil)
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = sub.Shutdown(sctx)
		_ = dead.Shutdown(sctx)
	}()
	gc, err := idemgocdk.NewConsumer(sub, idemgocdk.Config{Processor: idem.Bind(c, countIn(cdkEffect, idemsql.Postgres)),
		DeadLetter: dead, Concurrency: 4, RetryDelay: 200 * time.Millisecond, Logger: log,
		// A handler blocked on a black-holed PostgreSQL connection gives
		// up after this, and its message is redelivered, instead of being
		// held (rabbitpubsub has no ack deadline) past the drain.
		HandlerTimeout: 20 * time.Second})
	if err != nil {
		return err
	}
	// A closed connection ends Receive; watch it so that the process
	// restarts instead of waiting on a subscription that cannot recover.
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case e := <-closed:
			cancel(fmt.Errorf("%w: %v", errBrokerClosed, e))
		case <-rctx.Done():
		}
	}()
	err = gc.Run(rctx)
	if cause := context.Cause(rctx); ctx.Err() == nil && cause != nil {
		return cause // the connection closed: started again
	}
	if err != nil && conn.IsClosed() {
		return fmt.Errorf("%w: %v", errBrokerClosed, err)
	}
	return ran(err)
}
