package idemsql_test

import (
	"context"
	"database/sql"
	"strconv"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/faultproxy"
	"github.com/idem-go/idem/store/idemsql"
)

// TestStalledConnectionsMariaDB is store/idempgxv5's TestStalledConnections
// on MariaDB through go-sql-driver/mysql: every connection of six
// consumers stalls mid-run (nothing forwarded, nothing closed). The store
// deadline frees the claims (the driver closes a connection whose context
// ends), the DSN's readTimeout frees a stalled COMMIT (which the driver
// does not cancel by context), claims behind a stalled session's record
// give up at their lock timeout (SET STATEMENT innodb_lock_wait_timeout),
// and the server ends the stalled sessions at idle_transaction_timeout.
// Every message has its effect exactly once, counted in the database.
func TestStalledConnectionsMariaDB(t *testing.T) {
	t.Parallel()
	const (
		messages     = 300
		workers      = 6
		storeTimeout = 2 * time.Second
		ioTimeout    = 3 * time.Second
		idleInTx     = 4 // seconds: MariaDB's idle_transaction_timeout
		stmtTimeout  = 2 * time.Second
	)
	e := newEnv(t, idemsql.MySQL, envOptions{})
	cfg, err := mysql.ParseDSN(serverURL(t, envMySQL))
	if err != nil {
		t.Fatal(err)
	}
	proxy := faultproxy.New(t, cfg.Addr)
	cfg.Addr = proxy.Addr()
	cfg.ReadTimeout, cfg.WriteTimeout = ioTimeout, ioTimeout
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["idle_transaction_timeout"] = strconv.Itoa(idleInTx)
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(workers + 2)
	t.Cleanup(func() {
		proxy.Close()
		db.Close()
	})
	store, err := idemsql.New(db, idemsql.MySQL, &idemsql.Config{Table: e.table})
	if err != nil {
		t.Fatal(err)
	}
	c, err := idem.NewConsumer(store, idem.Config{Name: "stall", StoreTimeout: storeTimeout, PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	rep := faultproxy.Deliver(ctx, t, faultproxy.Delivery[*sql.Tx]{
		Consumer: c, Messages: messages, Workers: workers, FaultAt: messages / 3,
		Fault: func() { t.Logf("stalled %d connections", proxy.Stall()) },
		Effect: func(ctx context.Context, tx *sql.Tx, id string) error {
			ctx, cancel := context.WithTimeout(ctx, stmtTimeout)
			defer cancel()
			return e.writeEffect(ctx, tx, id)
		},
	})
	t.Logf("MariaDB via go-sql-driver/mysql, StoreTimeout %v, readTimeout %v, idle_transaction_timeout %ds: %v", storeTimeout, ioTimeout, idleInTx, rep)

	var rows, distinct int
	if err := e.db.QueryRowContext(context.Background(), "SELECT count(*), count(DISTINCT `key`) FROM "+e.effects).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	records, err := e.countRecords(context.Background(), "stall")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("effects: %d rows, %d distinct (double %d, lost %d); records %d", rows, distinct, rows-distinct, messages-distinct, records)
	if rows != messages || distinct != messages || records != messages {
		t.Errorf("effects: %d rows, %d distinct, records %d; want %d of each (0 double, 0 lost)", rows, distinct, records, messages)
	}
	if rep.Hit == 0 {
		t.Errorf("the stall hit no delivery: %v", rep)
	}
	if bound := ioTimeout + idleInTx*time.Second + 5*time.Second; rep.Recovery > bound {
		t.Errorf("recovered %v after the stall, want at most %v (read timeout + idle_transaction_timeout + margin)", rep.Recovery, bound)
	}
}
