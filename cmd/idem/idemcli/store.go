package idemcli

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
	_ "modernc.org/sqlite"             // registers the "sqlite" database/sql driver

	"github.com/idem-go/idem/cmd/idem/internal/secret"
	"github.com/idem-go/idem/store/idemsql"
)

// errBadURL marks a store or broker URL that cannot be parsed or used.
var errBadURL = errors.New("bad URL")

// sqlStore is an opened SQL store: the database, its dialect and the idem store over it.
type sqlStore struct {
	db      *sql.DB
	dialect idemsql.Dialect
	store   *idemsql.Store
	// where names the database for messages, without credentials.
	where string
}

// openSQLStore opens the store named by rawURL:
//
//	sqlite:PATH                     a SQLite file (WAL, BEGIN IMMEDIATE, busy timeout)
//	postgres://user:pass@host:port/db?sslmode=disable
//	mysql://user:pass@host:port/db  MariaDB or MySQL
//
// It checks that the server answers within 10 seconds. The errors it
// returns never hold the password, the drivers' included.
func openSQLStore(ctx context.Context, rawURL, table string) (st *sqlStore, err error) {
	defer func() { err = secret.Error(err, rawURL) }()
	scheme, rest, ok := strings.Cut(rawURL, ":")
	if !ok || rawURL == "" {
		return nil, fmt.Errorf("%w: store %q: want sqlite:PATH, postgres://... or mysql://...", errBadURL, redact(rawURL))
	}
	s := &sqlStore{}
	switch strings.ToLower(scheme) {
	case "sqlite", "sqlite3":
		path := strings.TrimPrefix(rest, "//")
		if path == "" {
			return nil, fmt.Errorf("%w: store %q: sqlite needs a file path, as in sqlite:/var/lib/app/idem.db", errBadURL, rawURL)
		}
		s.dialect, s.where = idemsql.SQLite, "sqlite file "+path
		s.db, err = sql.Open("sqlite", idemsql.SQLiteDSN(path))
		if err == nil {
			// SQLite has one writer at a time. Queueing writers in the
			// pool hands the connection over at once, where contending
			// connections would sleep in SQLite's busy handler.
			s.db.SetMaxOpenConns(1)
		}
	case "postgres", "postgresql":
		u, perr := url.Parse(rawURL)
		if perr != nil || u.Host == "" {
			return nil, fmt.Errorf("%w: store %q: want postgres://user:password@host:port/database", errBadURL, redact(rawURL))
		}
		s.dialect, s.where = idemsql.Postgres, "postgres at "+u.Host
		s.db, err = sql.Open("pgx", rawURL)
	case "mysql", "mariadb":
		dsn, where, derr := mysqlDSN(rawURL)
		if derr != nil {
			return nil, derr
		}
		s.dialect, s.where = idemsql.MySQL, where
		s.db, err = sql.Open("mysql", dsn)
	case "redis":
		return nil, fmt.Errorf("%w: store %q: this command works on the SQL stores (sqlite:, postgres://, mysql://); the Redis store (lease mode) is for demo and proxy", errBadURL, redact(rawURL))
	default:
		return nil, fmt.Errorf("%w: store %q: unknown scheme %q (want sqlite:, postgres:// or mysql://; demo and proxy also take redis://)", errBadURL, redact(rawURL), scheme)
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", s.where, err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := s.db.PingContext(pingCtx); err != nil {
		s.db.Close()
		return nil, fmt.Errorf("cannot reach %s: %w", s.where, err)
	}
	s.store, err = idemsql.New(s.db, s.dialect, &idemsql.Config{Table: table})
	if err != nil {
		s.db.Close()
		return nil, err
	}
	return s, nil
}

// mysqlDSN turns mysql://user:pass@host:port/db?param=v into a
// go-sql-driver/mysql DSN.
func mysqlDSN(rawURL string) (dsn, where string, err error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" || strings.Trim(u.Path, "/") == "" {
		return "", "", fmt.Errorf("%w: store %q: want mysql://user:password@host:port/database", errBadURL, redact(rawURL))
	}
	cfg := mysql.NewConfig()
	cfg.Net, cfg.Addr, cfg.DBName = "tcp", u.Host, strings.Trim(u.Path, "/")
	if !strings.Contains(u.Host, ":") {
		cfg.Addr += ":3306"
	}
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	cfg.ParseTime = true
	cfg.Params = map[string]string{}
	for k, v := range u.Query() {
		cfg.Params[k] = v[0]
	}
	return cfg.FormatDSN(), "mysql at " + cfg.Addr, nil
}

// redact hides the password of a URL for messages, even of one that does
// not parse (secret.URL).
func redact(raw string) string { return secret.URL(raw) }

// rebind rewrites ?-placeholders for the dialect ($1, $2 ... on PostgreSQL).
func rebind(d idemsql.Dialect, q string) string {
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
