package connect

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestPingFailure: a server that answered with a refusal (a wrong password,
// a database that does not exist) is named as refusing, with what to check;
// anything else is "cannot reach".
func TestPingFailure(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
		want string
	}{
		{"postgres password", fmt.Errorf("failed to connect: %w", &pgconn.PgError{Code: "28P01", Message: "password authentication failed"}),
			"postgres at h:1 refused the connection (check the user, password and database in the URL): failed to connect: "},
		{"postgres database", errors.Join(errors.New("tls refused"), &pgconn.PgError{Code: "3D000", Message: `database "x" does not exist`}),
			"postgres at h:1 refused the connection (check the user, password and database in the URL): "},
		{"mysql password", &mysql.MySQLError{Number: 1045, Message: "Access denied"},
			"postgres at h:1 refused the connection (check the user, password and database in the URL): Error 1045"},
		{"mysql database", &mysql.MySQLError{Number: 1049, Message: "Unknown database"},
			"postgres at h:1 refused the connection"},
		{"too many connections", &pgconn.PgError{Code: "53300", Message: "too many clients"}, "cannot reach postgres at h:1: "},
		{"dial", errors.New("dial tcp h:1: connect: connection refused"), "cannot reach postgres at h:1: dial tcp"},
	} {
		got := pingFailure("postgres at h:1", tt.err).Error()
		if !strings.HasPrefix(got, tt.want) {
			t.Errorf("%s: %q, want it to start with %q", tt.name, got, tt.want)
		}
	}
}
