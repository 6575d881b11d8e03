// Package testenv holds the test helpers every module of this repository
// shares: finding a required service's URL and waiting for a condition.
// It is internal: not part of idem's API.
//
// A service's URL comes from an environment variable (IDEM_TEST_POSTGRES_URL,
// IDEM_TEST_POSTGRES_DURABLE_URL, IDEM_TEST_PGBOUNCER_URL,
// IDEM_TEST_MYSQL_URL, IDEM_TEST_REDIS_URL, IDEM_TEST_AMQP_URL,
// IDEM_TEST_NATS_URL). When it is missing the test skips, unless
// IDEM_TEST_REQUIRE_ALL=1 (set by ./scripts/test), which makes it fail: a
// test that needs a service never passes by skipping under the suite.
package testenv

import (
	"io"
	"os"
	"testing"
	"time"
)

// RequireAllEnv is the variable that turns a missing service into a failure.
const RequireAllEnv = "IDEM_TEST_REQUIRE_ALL"

// The service variables.
const (
	// PostgresEnv is the fast test PostgreSQL (fsync, synchronous_commit
	// and full_page_writes off).
	PostgresEnv = "IDEM_TEST_POSTGRES_URL"
	// PostgresDurableEnv is a PostgreSQL with Debian's durable defaults
	// (fsync, synchronous_commit and full_page_writes on), for benchmarks
	// and crash tests.
	PostgresDurableEnv = "IDEM_TEST_POSTGRES_DURABLE_URL"
	// PgBouncerEnv is PgBouncer in transaction pooling mode in front of
	// the fast test PostgreSQL: a server connection serves a client for
	// one transaction only, and named prepared statements do not survive
	// it (pgx clients need a query exec mode that does not prepare them).
	PgBouncerEnv = "IDEM_TEST_PGBOUNCER_URL"
	MySQLEnv     = "IDEM_TEST_MYSQL_URL"
	RedisEnv     = "IDEM_TEST_REDIS_URL"
	AMQPEnv      = "IDEM_TEST_AMQP_URL"
	NATSEnv      = "IDEM_TEST_NATS_URL"
)

// Required reports whether missing services fail tests (IDEM_TEST_REQUIRE_ALL=1).
func Required() bool { return os.Getenv(RequireAllEnv) == "1" }

// URL returns the value of the environment variable env. When it is empty
// the test is skipped with a message naming the variable and an example
// value, or fails under IDEM_TEST_REQUIRE_ALL=1.
func URL(tb testing.TB, env, example string) string {
	tb.Helper()
	u := os.Getenv(env)
	if u == "" {
		if Required() {
			tb.Fatalf("missing environment variable %s (required: %s=1); ./scripts/services starts the services and prints it", env, RequireAllEnv)
		}
		tb.Skipf("missing environment variable %s; set it to e.g. %s, or run ./scripts/test", env, example)
	}
	return u
}

// Poll is how often Eventually checks its condition.
const Poll = 10 * time.Millisecond

// Eventually checks cond every Poll until it holds, and fails the test
// after timeout with what, and describe's account of the state reached
// when describe is not nil. It is for conditions on real services and
// processes (a broker redelivering, a server restarting), whose timing no
// test controls; code under the test's own control uses synctest or an
// injected clock instead.
func Eventually(tb testing.TB, timeout time.Duration, what string, cond func() bool, describe func() string) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			if describe != nil {
				tb.Fatalf("after %v: %s not reached: %s", timeout, what, describe())
			}
			tb.Fatalf("after %v: %s not reached", timeout, what)
		}
		time.Sleep(Poll)
	}
}

// ExampleOutput runs an Example function that needs a server (and so has
// no "// Output:" comment: go test compiles it without running it) and
// returns what it printed on os.Stdout. The test calling it must not be
// parallel: os.Stdout is redirected while f runs.
func ExampleOutput(tb testing.TB, f func()) string {
	tb.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	out := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		out <- string(b)
	}()
	func() {
		defer func() { os.Stdout = stdout; w.Close() }()
		f()
	}()
	return <-out
}

// ServerExample is an Example function that needs a server, and what it
// prints.
type ServerExample struct {
	Name string
	Run  func()
	Want string
}

// RunServerExamples runs examples (which have no "// Output:" comment, so
// go test only compiles them) against the server of env, failing or
// skipping as URL does when env is unset, and checks what each printed.
// The calling test must not be parallel: see ExampleOutput.
func RunServerExamples(t *testing.T, env string, examples ...ServerExample) {
	t.Helper()
	URL(t, env, "the server the examples use")
	for _, ex := range examples {
		if got := ExampleOutput(t, ex.Run); got != ex.Want {
			t.Errorf("%s printed:\n%s\nwant:\n%s", ex.Name, got, ex.Want)
		}
	}
}
