package idemcli

import (
	"os"
	"testing"
)

// TestMain routes the drivers' logs before any test runs: the first
// command would otherwise install the loggers (mysql.SetLogger,
// redis.SetLogger, package globals) while a parallel test reads them
// (mysql.NewConfig), a data race under -race.
func TestMain(m *testing.M) {
	routeLibraryLogs(nil)
	os.Exit(m.Run())
}
