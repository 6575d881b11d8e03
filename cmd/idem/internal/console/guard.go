package console

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idem-go/idem/idemdriver"
)

// Defaults of the sign-in guard.
const (
	// DefaultSessionTTL is how long a sign-in lasts: the session cookie's
	// Max-Age, and the expiry the server checks in the cookie itself.
	DefaultSessionTTL = 12 * time.Hour
	// SignInFailures is how many failed sign-ins one client (remote IP
	// address) may make in SignInWindow; the next ones get 429 until the
	// oldest failure leaves the window.
	SignInFailures = 5
	// SignInWindow is the window of SignInFailures.
	SignInWindow = 15 * time.Minute
	// maxClients bounds the clients whose failures are remembered.
	maxClients = 10_000
)

// sessionValue is the session cookie's value for a sign-in that expires
// at exp: the expiry (Unix seconds) and an HMAC of it keyed by the token,
// so that the server needs no session table and a copied cookie stops
// working at exp whatever its Max-Age says.
func (s *Server) sessionValue(exp time.Time) string {
	e := strconv.FormatInt(exp.Unix(), 10)
	m := hmac.New(sha256.New, []byte(s.cfg.Token))
	m.Write([]byte("idem console session " + e))
	return e + "." + hex.EncodeToString(m.Sum(nil))
}

// sessionOK reports whether v is a session value this server made and
// whose expiry has not passed.
func (s *Server) sessionOK(v string) bool {
	e, _, ok := strings.Cut(v, ".")
	if !ok {
		return false
	}
	exp, err := strconv.ParseInt(e, 10, 64)
	if err != nil || !s.cfg.Now().Before(time.Unix(exp, 0)) {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(v), []byte(s.sessionValue(time.Unix(exp, 0)))) == 1
}

// signIns counts the failed sign-ins of each client in the last
// SignInWindow.
type signIns struct {
	mu       sync.Mutex
	failures map[string][]time.Time
}

// clientOf is the client a sign-in is counted against: the remote IP
// address (behind a reverse proxy, every client is the proxy's).
func clientOf(r *http.Request) string {
	if h, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return h
	}
	return r.RemoteAddr
}

// wait returns how long client must wait before its next sign-in, zero
// when it may try now.
func (l *signIns) wait(client string, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.recent(client, now)
	if len(f) < SignInFailures {
		return 0
	}
	return f[len(f)-SignInFailures].Add(SignInWindow).Sub(now)
}

// fail counts a failed sign-in of client at now.
func (l *signIns) fail(client string, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failures == nil {
		l.failures = map[string][]time.Time{}
	}
	if _, ok := l.failures[client]; !ok && len(l.failures) >= maxClients {
		for c := range l.failures { // forget the clients with no recent failure, or, failing that, one client
			if len(l.recent(c, now)) == 0 || len(l.failures) >= maxClients {
				delete(l.failures, c)
			}
		}
	}
	l.failures[client] = append(l.recent(client, now), now)
}

// recent returns client's failures within the window, dropping the older
// ones. l.mu is held.
func (l *signIns) recent(client string, now time.Time) []time.Time {
	f := l.failures[client]
	i := 0
	for i < len(f) && !f[i].After(now.Add(-SignInWindow)) {
		i++
	}
	if i == len(f) {
		delete(l.failures, client)
		return nil
	}
	f = f[i:]
	l.failures[client] = f
	return f
}

// ErrUnknownConsumer means the table holds no record of the consumer
// named: a typo, or another --table.
var ErrUnknownConsumer = errors.New("unknown consumer")

// ErrTable means the store cannot read its records table: the table does
// not exist (a wrong --table, or no idem migrate), or another failure.
var ErrTable = errors.New("cannot read the records table")

// Probe checks that st can read its records table, with one indexed
// lookup of a record that does not exist. Its error matches ErrTable and
// holds PublicError's text (never a row's values).
func Probe(ctx context.Context, st Store) error {
	_, err := st.Inspect(ctx, "idem-console-probe", "probe")
	if err == nil || errors.Is(err, idemdriver.ErrNotFound) {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrTable, PublicError(err, false))
}

// MissingTableHint follows the news of a missing records table, here and
// in the idem command's errors: a wrong --table is the likely cause (the
// demo's store names its table idem_demo_processed), and migrate, not the
// console, creates the table.
const MissingTableHint = "(is --table right? the demo's store has --table idem_demo_processed; idem migrate creates a table)"

// PublicError is what a page or a command says of a store failure err:
// the database's own error code and message, unless that kind of message
// quotes the values of a row (a PostgreSQL data or integrity error, and
// every error's detail) and showPayloads is false; a missing table named
// as such; otherwise the kind of failure. It never holds the DSN.
func PublicError(err error, showPayloads bool) string {
	var pg *pgconn.PgError
	switch {
	case errors.As(err, &pg):
		msg := pg.Message
		if pg.Code == "42P01" {
			return "the table does not exist: " + msg + " " + MissingTableHint
		}
		if !showPayloads && (strings.HasPrefix(pg.Code, "22") || strings.HasPrefix(pg.Code, "23")) {
			msg = "(the message may quote a row's values; --show-payloads shows it)"
		}
		if showPayloads && pg.Detail != "" {
			msg += " (" + pg.Detail + ")"
		}
		return "PostgreSQL error " + pg.Code + ": " + msg
	case errors.Is(err, context.DeadlineExceeded):
		return "the store did not answer in time"
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return "cannot reach the store (a network error)"
	}
	text := err.Error()
	for _, missing := range []string{"no such table", "doesn't exist", "does not exist"} {
		if strings.Contains(text, missing) {
			return "the table does not exist " + MissingTableHint
		}
	}
	if showPayloads {
		return text
	}
	return "the store failed; see the console's log (--show-payloads shows the store's own message)"
}

// KnownConsumer returns nil when the table holds records of consumer,
// and an error matching ErrUnknownConsumer that names the consumers it
// holds otherwise. It lists the consumers with a skip scan of the index
// when the store can (idemdriver.ConsumerLister), with Stats otherwise.
// A store that cannot list its consumers (Stats fails with
// idemdriver.ErrUnsupported, as idemredis's does) cannot tell: nil.
func KnownConsumer(ctx context.Context, st Store, consumer string) error {
	list := st.Stats
	if cl, ok := st.(idemdriver.ConsumerLister); ok {
		list = cl.Consumers
	}
	stats, err := list(ctx)
	if errors.Is(err, idemdriver.ErrUnsupported) {
		return nil
	}
	if err != nil {
		return err
	}
	names := make([]string, 0, len(stats))
	for _, c := range stats {
		if c.Consumer == consumer {
			return nil
		}
		if len(names) < 20 {
			names = append(names, strconv.Quote(c.Consumer))
		}
	}
	if len(names) == 0 {
		return fmt.Errorf("%w %q: this table holds no records at all (is --table right?)", ErrUnknownConsumer, consumer)
	}
	return fmt.Errorf("%w %q: this table holds no records of it; its consumers: %s", ErrUnknownConsumer, consumer, strings.Join(names, ", "))
}
