// Package clitest holds the helpers the idem command's test packages
// share: the service URLs from the environment.
package clitest

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem/internal/ownservice"
	"github.com/idem-go/idem/internal/testenv"
)

// OptionalURL returns the URL in the environment variable env, or ""; under
// IDEM_TEST_REQUIRE_ALL=1 (the README test command) a missing URL fails
// the test.
func OptionalURL(t testing.TB, env string) string {
	t.Helper()
	u := os.Getenv(env)
	if u == "" && testenv.Required() {
		t.Fatalf("%s is not set and IDEM_TEST_REQUIRE_ALL=1", env)
	}
	return u
}

// StoreURLs returns the SQL store URLs to test on: SQLite (a file in a
// temporary folder of t) always, PostgreSQL and MariaDB from the
// IDEM_TEST_POSTGRES_URL and IDEM_TEST_MYSQL_URL variables (OptionalURL).
func StoreURLs(t testing.TB) map[string]string {
	t.Helper()
	urls := map[string]string{"sqlite": "sqlite:" + filepath.Join(t.TempDir(), "ops.db")}
	if u := OptionalURL(t, "IDEM_TEST_POSTGRES_URL"); u != "" {
		urls["postgres"] = u
	}
	if dsn := OptionalURL(t, "IDEM_TEST_MYSQL_URL"); dsn != "" {
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			t.Fatalf("IDEM_TEST_MYSQL_URL: %v", err)
		}
		urls["mariadb"] = fmt.Sprintf("mysql://%s:%s@%s/%s", cfg.User, cfg.Passwd, cfg.Addr, cfg.DBName)
	}
	return urls
}

// FreePorts returns n distinct loopback ports that were free a moment ago.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	ports, err := ownservice.FreePorts(n)
	if err != nil {
		t.Fatal(err)
	}
	return ports
}
