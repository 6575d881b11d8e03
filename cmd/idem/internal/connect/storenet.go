package connect

import (
	"context"
	"errors"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Network settings of the store connections the command opens, so that a
// connection that stops answering (a half-open TCP connection, a
// black-holed network) fails within about a minute instead of holding
// its session, and its locks, for the operating system's defaults (two
// hours of keepalive idle on Linux, retransmissions for about 15 minutes).
// The core's StoreTimeout bounds each store call on top of this.
const (
	// storeDialTimeout bounds a TCP connect.
	storeDialTimeout = 10 * time.Second
	// storeKeepAlive: probes after 15s idle, every 5s, 3 unanswered end it.
	storeKeepAliveIdle, storeKeepAliveInterval, storeKeepAliveCount = 15 * time.Second, 5 * time.Second, 3
	// storeUserTimeout (Linux TCP_USER_TIMEOUT) ends a connection whose
	// sent data stays unacknowledged that long.
	storeUserTimeout = 30 * time.Second
	// storeIdleInTx ends, on the server, a session left idle in a
	// transaction that long (a client that died or stalled mid-handler),
	// releasing its claim's locks; idem's own transactions never pause.
	storeIdleInTx = 30 * time.Second
	// storeIOTimeout bounds each read and write on a MySQL connection
	// (go-sql-driver/mysql's readTimeout and writeTimeout).
	storeIOTimeout = 30 * time.Second
)

// storeDialer dials store connections with the keepalive and user
// timeout above.
func storeDialer() *net.Dialer {
	return &net.Dialer{
		Timeout: storeDialTimeout,
		KeepAliveConfig: net.KeepAliveConfig{
			Enable: true, Idle: storeKeepAliveIdle, Interval: storeKeepAliveInterval, Count: storeKeepAliveCount,
		},
		Control: tcpUserTimeout(storeUserTimeout),
	}
}

// PGStoreSettings sets, where the URL did not, the PostgreSQL session's
// idle_in_transaction_session_timeout and the server side's TCP
// keepalive and tcp_user_timeout (so the server, too, notices a client
// that is gone), and dials with storeDialer.
func PGStoreSettings(cfg *pgx.ConnConfig) {
	pgStoreDialer(cfg)
	for k, v := range map[string]string{
		"idle_in_transaction_session_timeout": storeIdleInTx.String(),
		"tcp_keepalives_idle":                 storeKeepAliveIdle.String(),
		"tcp_keepalives_interval":             storeKeepAliveInterval.String(),
		"tcp_keepalives_count":                "3",
		"tcp_user_timeout":                    storeUserTimeout.String(),
	} {
		if _, set := cfg.RuntimeParams[k]; !set {
			cfg.RuntimeParams[k] = v
		}
	}
}

// pgStoreDialer makes cfg dial with storeDialer.
func pgStoreDialer(cfg *pgx.ConnConfig) {
	d := storeDialer()
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		return d.DialContext(ctx, network, addr)
	}
}

// pgBouncerSettings adapts cfg, as parsed from rawURL, to a pooler that
// refused the session settings of PGStoreSettings as startup parameters
// (PgBouncer accepts only a few): the client side keeps storeDialer's
// keepalive and user timeout, the server's own settings apply, and,
// unless the URL chose one (default_query_exec_mode), statements run in
// pgx's QueryExecModeCacheDescribe, which prepares no named statement:
// PgBouncer before 1.21 does not carry named statements from one server
// connection to the next in transaction pooling.
func pgBouncerSettings(cfg *pgx.ConnConfig, rawURL string) {
	pgStoreDialer(cfg)
	if !strings.Contains(rawURL, "default_query_exec_mode") {
		cfg.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	}
}

// refusedStartupParameter reports whether err is a pooler's refusal of a
// startup parameter: PgBouncer's FATAL "unsupported startup parameter"
// (SQLSTATE 08P01; PgBouncer's messages are not translated).
func refusedStartupParameter(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "08P01" && strings.HasPrefix(pe.Message, "unsupported startup parameter")
}
