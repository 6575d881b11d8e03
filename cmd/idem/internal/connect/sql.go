// Package connect opens the stores and reaches the brokers that the idem
// command's flags name by URL: the SQL stores (SQLite, PostgreSQL directly
// or through a pooler, MySQL and MariaDB) with bounded network waits, and
// the NATS, RabbitMQ, Kafka and Redis connections the demo, idem consume
// and idem relay share. Errors it returns never hold a password.
package connect

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	"github.com/idem-go/idem/cmd/idem/internal/secret"
	"github.com/idem-go/idem/store/idemsql"
)

// ErrBadURL marks a store or broker URL that cannot be parsed or used.
var ErrBadURL = errors.New("bad URL")

// SQLStore is an opened SQL store: the database, its dialect and the idem store over it.
type SQLStore struct {
	DB      *sql.DB
	Dialect idemsql.Dialect
	Store   *idemsql.Store
	// Where names the database for messages, without credentials.
	Where string
	// Pooler is set when PostgreSQL is behind a pooler that refused the
	// session settings (PgBouncer): DB then runs without them.
	Pooler bool
}

// OpenSQL opens the store named by rawURL:
//
//	sqlite:PATH                     a SQLite file (WAL, BEGIN IMMEDIATE, busy timeout)
//	postgres://user:pass@host:port/db?sslmode=disable
//	mysql://user:pass@host:port/db  MariaDB or MySQL
//
// It checks that the server answers within 10 seconds. The errors it
// returns never hold the password, the drivers' included.
func OpenSQL(ctx context.Context, rawURL, table string) (st *SQLStore, err error) {
	defer func() { err = secret.Error(err, rawURL) }()
	scheme, rest, ok := strings.Cut(rawURL, ":")
	if !ok || rawURL == "" {
		return nil, fmt.Errorf("%w: store %q: want sqlite:PATH, postgres://... or mysql://...", ErrBadURL, secret.URL(rawURL))
	}
	s := &SQLStore{}
	var bare *pgx.ConnConfig // postgres: the URL's own settings
	switch strings.ToLower(scheme) {
	case "sqlite", "sqlite3":
		path := strings.TrimPrefix(rest, "//")
		if path == "" {
			return nil, fmt.Errorf("%w: store %q: sqlite needs a file path, as in sqlite:/var/lib/app/idem.db", ErrBadURL, rawURL)
		}
		s.Dialect, s.Where = idemsql.SQLite, "sqlite file "+path
		s.DB, err = sql.Open("sqlite", idemsql.SQLiteDSN(path))
		if err == nil {
			// SQLite has one writer at a time. Queueing writers in the
			// pool hands the connection over at once, where contending
			// connections would sleep in SQLite's busy handler.
			s.DB.SetMaxOpenConns(1)
		}
	case "postgres", "postgresql":
		u, perr := url.Parse(rawURL)
		if perr != nil || u.Host == "" {
			return nil, fmt.Errorf("%w: store %q: want postgres://USER:PASSWORD@HOST:PORT/DATABASE", ErrBadURL, secret.URL(rawURL))
		}
		s.Dialect, s.Where = idemsql.Postgres, "postgres at "+u.Host
		cfg, perr := pgx.ParseConfig(rawURL)
		if perr != nil {
			return nil, fmt.Errorf("%w: store %q: want postgres://USER:PASSWORD@HOST:PORT/DATABASE", ErrBadURL, secret.URL(rawURL))
		}
		bare = cfg.Copy()
		PGStoreSettings(cfg)
		s.DB = stdlib.OpenDB(*cfg)
	case "mysql", "mariadb":
		cfg, where, derr := MySQLConfig(rawURL)
		if derr != nil {
			return nil, derr
		}
		s.Dialect, s.Where = idemsql.MySQL, where
		var conn driver.Connector
		if conn, err = mysql.NewConnector(cfg); err == nil {
			s.DB = sql.OpenDB(conn)
		}
	case "redis":
		return nil, fmt.Errorf("%w: store %q: this command works on the SQL stores (sqlite:, postgres://, mysql://); the Redis store (lease mode) is for demo, proxy, consume, inspect and the operator commands (failed, retry, release, replay, console)", ErrBadURL, secret.URL(rawURL))
	default:
		return nil, fmt.Errorf("%w: store %q: unknown scheme %q (want sqlite:, postgres:// or mysql://; demo and proxy also take redis://)", ErrBadURL, secret.URL(rawURL), scheme)
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", s.Where, err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err = s.DB.PingContext(pingCtx)
	if bare != nil && refusedStartupParameter(err) {
		// A pooler such as PgBouncer in front of PostgreSQL.
		s.DB.Close()
		pgBouncerSettings(bare, rawURL)
		s.DB = stdlib.OpenDB(*bare)
		s.Where += " (through a pooler)"
		s.Pooler = true
		err = s.DB.PingContext(pingCtx)
	}
	if err != nil {
		s.DB.Close()
		return nil, pingFailure(s.Where, err)
	}
	s.Store, err = idemsql.New(s.DB, s.Dialect, &idemsql.Config{Table: table})
	if err != nil {
		s.DB.Close()
		return nil, err
	}
	return s, nil
}

// MySQLConfig turns mysql://user:pass@host:port/db?param=v into a
// go-sql-driver/mysql configuration: the parameters timeout, readTimeout
// and writeTimeout are the driver's, the others session variables; a
// mariadb:// URL also sets MariaDB's idle_transaction_timeout.
func MySQLConfig(rawURL string) (cfg *mysql.Config, where string, err error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" || strings.Trim(u.Path, "/") == "" {
		return nil, "", fmt.Errorf("%w: store %q: want mysql://USER:PASSWORD@HOST:PORT/DATABASE", ErrBadURL, secret.URL(rawURL))
	}
	cfg = mysql.NewConfig()
	cfg.Net, cfg.Addr, cfg.DBName = "tcp", u.Host, strings.Trim(u.Path, "/")
	if !strings.Contains(u.Host, ":") {
		cfg.Addr += ":3306"
	}
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	cfg.ParseTime = true
	cfg.Params = map[string]string{}
	// Bounded network waits (see storenet.go), unless the URL sets them:
	// a read or write on a stalled connection fails after storeIOTimeout,
	// which also bounds a COMMIT (go-sql-driver does not cancel it by
	// context).
	d := storeDialer()
	cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout = storeDialTimeout, storeIOTimeout, storeIOTimeout
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		return d.DialContext(ctx, network, addr)
	}
	for k, v := range u.Query() {
		switch k {
		case "timeout", "readTimeout", "writeTimeout":
			t, perr := time.ParseDuration(v[0])
			if perr != nil || t < 0 {
				return nil, "", fmt.Errorf("%w: store %q: %s=%q is not a duration such as 30s (0 for none)", ErrBadURL, secret.URL(rawURL), k, v[0])
			}
			*map[string]*time.Duration{"timeout": &cfg.Timeout, "readTimeout": &cfg.ReadTimeout, "writeTimeout": &cfg.WriteTimeout}[k] = t
		default:
			cfg.Params[k] = v[0]
		}
	}
	if _, set := cfg.Params["idle_transaction_timeout"]; !set && strings.EqualFold(u.Scheme, "mariadb") {
		// MariaDB's: the server ends a session left idle in a transaction
		// (MySQL has no such variable, so mysql:// URLs go without it).
		cfg.Params["idle_transaction_timeout"] = strconv.Itoa(int(storeIdleInTx / time.Second))
	}
	return cfg, "mysql at " + cfg.Addr, nil
}

// Rebind rewrites ?-placeholders for the dialect ($1, $2 ... on PostgreSQL).
func Rebind(d idemsql.Dialect, q string) string {
	if d != idemsql.Postgres {
		return q
	}
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// pingFailure is the error of a first ping of the database at where that
// failed with err: "refused" when the server answered that it will not
// take the connection as the URL asks for it (PostgreSQL's SQLSTATE class
// 28, a wrong password or user, or 3D000, a database that does not exist;
// MySQL's errors 1044, 1045 and 1049), since the server was reached;
// "cannot reach" for anything else (a refused dial, a timeout, TLS).
func pingFailure(where string, err error) error {
	var pe *pgconn.PgError
	var me *mysql.MySQLError
	if errors.As(err, &pe) && (strings.HasPrefix(pe.Code, "28") || pe.Code == "3D000") ||
		errors.As(err, &me) && (me.Number == 1044 || me.Number == 1045 || me.Number == 1049) {
		return fmt.Errorf("%s refused the connection (check the user, password and database in the URL): %w", where, err)
	}
	return fmt.Errorf("cannot reach %s: %w", where, err)
}
