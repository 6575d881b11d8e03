package idemcli

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/cmd/idem/internal/connect"
)

// The store connections the command opens carry the settings that bound a
// stalled connection: on PostgreSQL the session's
// idle_in_transaction_session_timeout and the server side's keepalive and
// user timeout (a URL parameter overrides one), on MariaDB the driver's
// read and write timeouts (URL parameters too; a bad one is refused) and,
// for a mariadb:// URL, the session's idle_transaction_timeout.
func TestStoreConnectionSettings(t *testing.T) {
	t.Parallel()
	urls := storeURLs(t)
	if u, ok := urls["postgres"]; ok {
		t.Run("postgres", func(t *testing.T) {
			t.Parallel()
			sep := "?"
			if strings.Contains(u, "?") {
				sep = "&"
			}
			for _, tc := range []struct{ url, param, want string }{
				{u, "idle_in_transaction_session_timeout", "30s"},
				{u, "tcp_user_timeout", "30000"}, // milliseconds
				{u, "tcp_keepalives_idle", "15"}, // seconds
				{u + sep + "idle_in_transaction_session_timeout=5s", "idle_in_transaction_session_timeout", "5s"},
			} {
				st, err := openSQLStore(t.Context(), tc.url, "")
				if err != nil {
					t.Fatal(err)
				}
				var got string
				err = st.db.QueryRowContext(t.Context(), "SELECT current_setting($1)", tc.param).Scan(&got)
				st.db.Close()
				if err != nil {
					t.Fatal(err)
				}
				if got != tc.want {
					t.Errorf("%s = %q, want %q", tc.param, got, tc.want)
				}
			}
		})
	}
	if u, ok := urls["mariadb"]; ok {
		t.Run("mariadb", func(t *testing.T) {
			t.Parallel()
			cfg, _, err := connect.MySQLConfig(u)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.ReadTimeout != 30*time.Second || cfg.WriteTimeout != 30*time.Second || cfg.Timeout != 10*time.Second || cfg.DialFunc == nil {
				t.Errorf("default timeouts: read %v, write %v, dial %v (dialer set: %v)", cfg.ReadTimeout, cfg.WriteTimeout, cfg.Timeout, cfg.DialFunc != nil)
			}
			cfg, _, err = connect.MySQLConfig(u + "?readTimeout=5s&writeTimeout=0&innodb_lock_wait_timeout=7")
			if err != nil {
				t.Fatal(err)
			}
			if cfg.ReadTimeout != 5*time.Second || cfg.WriteTimeout != 0 || cfg.Params["innodb_lock_wait_timeout"] != "7" || cfg.Params["readTimeout"] != "" {
				t.Errorf("URL parameters: read %v, write %v, params %v", cfg.ReadTimeout, cfg.WriteTimeout, cfg.Params)
			}
			if _, _, err := connect.MySQLConfig(u + "?readTimeout=soon"); !errors.Is(err, connect.ErrBadURL) {
				t.Errorf("readTimeout=soon: err %v, want errBadURL", err)
			}
			maria := "mariadb" + strings.TrimPrefix(u, "mysql")
			if cfg, _, err = connect.MySQLConfig(maria); err != nil || cfg.Params["idle_transaction_timeout"] != "30" {
				t.Errorf("mariadb:// URL: params %v, err %v; want idle_transaction_timeout 30", cfg.Params, err)
			}
			st, err := openSQLStore(t.Context(), maria, "")
			if err != nil {
				t.Fatal(err)
			}
			defer st.db.Close()
			var got string
			if err := st.db.QueryRowContext(t.Context(), "SELECT @@idle_transaction_timeout").Scan(&got); err != nil || got != "30" {
				t.Errorf("idle_transaction_timeout = %q (err %v), want 30", got, err)
			}
		})
	}
}
