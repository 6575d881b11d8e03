package idemcli

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/spf13/cobra"

	"github.com/idem-go/idem/cmd/idem/internal/secret"
)

// secretPasswords are passwords with every character URLs treat
// specially, as written in the URL and as the operator means them.
var secretPasswords = []struct {
	name, written, meant string
}{
	{"slash", "Pw/slash7Q", "Pw/slash7Q"},
	{"at", "Pw@at7Q", "Pw@at7Q"},
	{"colon", "Pw:colon7Q", "Pw:colon7Q"},
	{"percent", "Pw%percent7Q", "Pw%percent7Q"},
	{"encoded", "Pw%2Fenc%40%3A%257Q", "Pw/enc@:%7Q"},
	{"everything raw", "P/w@x:y%z#q?7Q", "P/w@x:y%z#q?7Q"},
}

// passwordForms is every form of a password that must never be printed:
// as written, as meant, and as URL encoders write what is meant, in
// upper- and lowercase hex.
func passwordForms(written, meant string) []string {
	forms := []string{written, meant, url.QueryEscape(meant), url.PathEscape(meant),
		strings.TrimPrefix(url.UserPassword("", meant).String(), ":")}
	lower := regexp.MustCompile(`%[0-9A-F]{2}`)
	for _, f := range forms {
		forms = append(forms, lower.ReplaceAllStringFunc(f, strings.ToLower))
	}
	return forms
}

// runMain runs the idem command as Main does, until ctx ends, and returns
// its exit status and everything it printed (stdout, then stderr: the logs
// are on stderr).
func runMain(ctx context.Context, args ...string) (int, string) {
	var out, errOut lockedBuilder
	code := mainContext(ctx, args, &out, &errOut)
	return code, out.String() + errOut.String()
}

type lockedBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuilder) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// wantNoPassword fails when output holds any form of the password.
func wantNoPassword(t *testing.T, output, written, meant string) {
	t.Helper()
	for _, f := range passwordForms(written, meant) {
		if strings.Contains(output, f) {
			t.Errorf("the output shows the password as %q:\n%s", f, output)
			return
		}
	}
}

// credentialedURLs returns, for a password as written, the URLs of every
// scheme the commands take, with the flag that takes each: services that
// are not there (port 1) and, when the shared services run, the real
// servers with a wrong password.
func credentialedURLs(t *testing.T, pw string) map[string][2]string {
	urls := map[string][2]string{
		"postgres":       {"store", "postgres://idem:" + pw + "@127.0.0.1:1/db?connect_timeout=5"},
		"postgresql":     {"store", "postgresql://idem:" + pw + "@127.0.0.1:1/db?connect_timeout=5"},
		"mysql":          {"store", "mysql://idem:" + pw + "@127.0.0.1:1/db"},
		"mariadb":        {"store", "mariadb://idem:" + pw + "@127.0.0.1:1/db"},
		"redis store":    {"store", "redis://:" + pw + "@127.0.0.1:1/0"},
		"rediss store":   {"store", "rediss://user:" + pw + "@127.0.0.1:1/0"},
		"mysql DSN":      {"store", "idem:" + pw + "@tcp(127.0.0.1:1)/db"},
		"nats":           {"broker", "nats://user:" + pw + "@127.0.0.1:1"},
		"amqp":           {"broker", "amqp://user:" + pw + "@127.0.0.1:1/"},
		"amqps":          {"broker", "amqps://user:" + pw + "@127.0.0.1:1/"},
		"redis broker":   {"broker", "redis://:" + pw + "@127.0.0.1:1/0"},
		"rediss broker":  {"broker", "rediss://user:" + pw + "@127.0.0.1:1/0"},
		"kafka":          {"broker", "kafka://user:" + pw + "@127.0.0.1:1"},
		"http upstream":  {"upstream", "http://user:" + pw + "@127.0.0.1:1/"},
		"https upstream": {"upstream", "https://user:" + pw + "@127.0.0.1:1/"},
	}
	hostPort := func(env string) string {
		u, err := url.Parse(optionalURL(t, env))
		if err != nil || u.Host == "" {
			return ""
		}
		return u.Host
	}
	if h := hostPort("IDEM_TEST_POSTGRES_URL"); h != "" {
		urls["real postgres"] = [2]string{"store", "postgres://idem:" + pw + "@" + h + "/idem_test?sslmode=disable"}
	}
	if dsn := optionalURL(t, "IDEM_TEST_MYSQL_URL"); dsn != "" {
		if cfg, err := mysql.ParseDSN(dsn); err == nil {
			urls["real mariadb"] = [2]string{"store", "mysql://" + cfg.User + ":" + pw + "@" + cfg.Addr + "/" + cfg.DBName}
		}
	}
	// Not the shared Redis: it has no password, and accepts any.
	if h := hostPort("IDEM_TEST_AMQP_URL"); h != "" {
		urls["real rabbitmq"] = [2]string{"broker", "amqp://guest:" + pw + "@" + h + "/"}
	}
	return urls
}

// fillerFlags are values for the other flags a command needs to get as
// far as opening its URLs; each is passed only to commands that have it.
var fillerFlags = map[string]string{
	"consumer": "payments", "id": "pay-1", "older-than": "1h", "messages": "5", "timeout": "30s",
	"progress": "none", "upstream": "http://127.0.0.1:1", "listen": "127.0.0.1:0",
	// A store that is not there, so that a command given a good URL
	// elsewhere (--upstream) fails instead of serving.
	"store": "postgres://idem@127.0.0.1:1/db?connect_timeout=5",
}

// TestNoSecretIsPrinted runs every command of idem, with every URL flag
// it has, on URLs of every scheme holding passwords with '/', '@', ':' and
// '%' (raw and percent-encoded), on servers that are not there and on the
// real ones with a wrong password, and greps everything it printed for
// each form of the password.
func TestNoSecretIsPrinted(t *testing.T) {
	t.Parallel()
	root := newRoot(io.Discard, io.Discard)
	var cmds []*cobra.Command
	for _, c := range root.Commands() {
		if c.Name() != "help" && c.Name() != "completion" && c.Runnable() {
			cmds = append(cmds, c)
		}
	}
	ran := map[string]int{}
	var mu sync.Mutex
	for _, pw := range secretPasswords {
		urls := credentialedURLs(t, pw.written)
		t.Run(pw.name, func(t *testing.T) {
			t.Parallel()
			for _, c := range cmds {
				for scheme, fu := range urls {
					flag, u := fu[0], fu[1]
					if c.Flags().Lookup(flag) == nil {
						continue
					}
					args := []string{c.Name(), "--" + flag, u}
					for name, v := range fillerFlags {
						if name != flag && c.Flags().Lookup(name) != nil {
							args = append(args, "--"+name, v)
						}
					}
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
					code, output := runMain(ctx, args...)
					cancel()
					if code == 0 {
						t.Errorf("%s %s: exit 0, want an error:\n%s", c.Name(), scheme, output)
					}
					if !strings.Contains(output, "idem: ") {
						t.Errorf("%s %s: no error message:\n%s", c.Name(), scheme, output)
					}
					wantNoPassword(t, output, pw.written, pw.meant)
					mu.Lock()
					ran[c.Name()]++
					mu.Unlock()
				}
			}
		})
	}
	t.Cleanup(func() {
		for _, c := range cmds {
			if c.Flags().Lookup("store") != nil || c.Flags().Lookup("broker") != nil {
				if ran[c.Name()] == 0 {
					t.Errorf("idem %s was never run with a credentialed URL", c.Name())
				}
			}
		}
	})
}

// TestNoSecretFromEnvironmentOrFlagErrors: URLs given in IDEM_* variables
// are masked too, and so are values repeated by flag parse errors, the
// scope secret's included.
func TestNoSecretFromEnvironmentOrFlagErrors(t *testing.T) {
	const scopeSecret = "scope-Secret/0123456789"
	for _, pw := range secretPasswords {
		t.Setenv("IDEM_STORE", "postgres://idem:"+pw.written+"@127.0.0.1:1/db?connect_timeout=5")
		code, output := runMain(context.Background(), "stats")
		if code != 1 {
			t.Errorf("%s: exit %d:\n%s", pw.name, code, output)
		}
		wantNoPassword(t, output, pw.written, pw.meant)
	}
	// A libpq keyword/value string, a password in the query, a password
	// holding '@' (which a driver cutting at the first '@' would dial as
	// part of the host): no piece of the password is printed.
	for store, pieces := range map[string][]string{
		"host=127.0.0.1 port=1 user=idem password=KvPassw0rd31 dbname=idem_test connect_timeout=5": {"KvPassw0rd31"},
		"postgres://127.0.0.1:1/idem_test?sslmode=bogus&password=QueryPassw0rd77&user=idem":        {"QueryPassw0rd77"},
		"postgres://idem:Pa@ssword9@127.0.0.1:1/idem_test?connect_timeout=5":                       {"Pa@ssword9", "Pa%40ssword9", "ssword9"},
	} {
		t.Setenv("IDEM_STORE", store)
		for _, args := range [][]string{{"stats"}, {"proxy", "--upstream", "http://127.0.0.1:1"}} {
			code, output := runMain(context.Background(), args...)
			for _, p := range pieces {
				if code == 0 || strings.Contains(output, p) {
					t.Errorf("%v with IDEM_STORE %s: exit %d, output shows %q:\n%s", args, secret.URL(store), code, p, output)
				}
			}
		}
	}
	t.Setenv("IDEM_STORE", "")
	for _, args := range [][]string{
		{"proxy", "--scope-secret", scopeSecret, "--max-header-bytes", scopeSecret},
		{"proxy", "--scope-secret=" + scopeSecret, "--lease", scopeSecret},
		{"stats", "--store", "sqlite:/nonexistent/" + scopeSecret + ".db", "--scope-secret", scopeSecret},
	} {
		code, output := runMain(context.Background(), args...)
		if code == 0 || strings.Contains(output, scopeSecret) || strings.Contains(output, url.QueryEscape(scopeSecret)) {
			t.Errorf("%v: exit %d, output shows the scope secret:\n%s", args, code, output)
		}
	}
	t.Setenv("IDEM_SCOPE_SECRET", scopeSecret)
	code, output := runMain(context.Background(), "proxy", "--upstream", "http://127.0.0.1:1", "--store", "sqlite:/x.db", "--lease", scopeSecret)
	if code != 2 || strings.Contains(output, scopeSecret) {
		t.Errorf("IDEM_SCOPE_SECRET: exit %d, output:\n%s", code, output)
	}
}

// TestProxyPrintsNoSecret runs `idem proxy` with a scope secret and an
// upstream URL holding a password, serves requests, /healthz and /metrics,
// and greps its whole output and the answers for the secrets; without a
// scope secret it warns once.
func TestProxyPrintsNoSecret(t *testing.T) {
	t.Parallel()
	const scopeSecret = "proxy-Scope/Secret-0123456789"
	pw := secretPasswords[5]
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	}))
	defer up.Close()
	upURL := strings.Replace(up.URL, "http://", "http://user:"+pw.written+"@", 1)
	for _, withSecret := range []bool{true, false} {
		dbPath := filepath.Join(t.TempDir(), "proxy.db")
		args := []string{"proxy", "--listen", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0", "--upstream", upURL,
			"--store", "sqlite:" + dbPath}
		if withSecret {
			args = append(args, "--scope-secret", scopeSecret)
		}
		ctx, cancel := context.WithCancel(context.Background())
		pr, pwr := io.Pipe()
		var errOut lockedBuilder
		done := make(chan int, 1)
		go func() {
			done <- mainContext(ctx, args, pwr, &errOut)
			pwr.Close()
		}()
		var stdout []string
		sc := bufio.NewScanner(pr)
		if !sc.Scan() {
			cancel()
			t.Fatalf("no listening line; exit %d, stderr %s", <-done, errOut.String())
		}
		stdout = append(stdout, sc.Text())
		m := regexp.MustCompile(`listening on (http://\S+),`).FindStringSubmatch(sc.Text())
		if m == nil || !sc.Scan() {
			cancel()
			t.Fatalf("stdout %q; stderr %s", sc.Text(), errOut.String())
		}
		stdout = append(stdout, sc.Text()) // the metrics line
		metricsURL := strings.TrimPrefix(sc.Text(), "idem proxy: metrics on ")
		var answers []string
		get := func(method, u string) int {
			req, _ := http.NewRequest(method, u, strings.NewReader(`{}`))
			req.Header.Set("Authorization", "Basic "+scopeSecret)
			req.Header.Set("Idempotency-Key", `"k-1"`)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			answers = append(answers, fmt.Sprint(resp.Header), string(b))
			return resp.StatusCode
		}
		if s1, s2, h := get(http.MethodPost, m[1]+"/x"), get(http.MethodPost, m[1]+"/x"), get(http.MethodGet, m[1]+"/healthz"); s1 != 201 || s2 != 201 || h != 200 {
			t.Errorf("POST %d, retry %d, healthz %d", s1, s2, h)
		}
		get(http.MethodGet, metricsURL)
		cancel()
		for sc.Scan() {
			stdout = append(stdout, sc.Text())
		}
		if code := <-done; code != 0 {
			t.Errorf("exit %d: %s", code, errOut.String())
		}
		output := strings.Join(slices.Concat(stdout, answers), "\n") + errOut.String()
		wantNoPassword(t, output, pw.written, pw.meant)
		if strings.Contains(output, scopeSecret) {
			t.Errorf("the output shows the scope secret:\n%s", output)
		}
		// The store holds neither the secret nor the credentials it keys
		// (this test sends the secret as the Authorization value too).
		files, _ := filepath.Glob(dbPath + "*")
		for _, file := range files {
			if b, err := os.ReadFile(file); err != nil || bytes.Contains(b, []byte(scopeSecret)) {
				t.Errorf("store file %s: %v, or it holds the scope secret", file, err)
			}
		}
		warnings := strings.Count(errOut.String(), "scope is not keyed")
		if withSecret && warnings != 0 || !withSecret && warnings != 1 {
			t.Errorf("scope secret %v: %d warnings, want %d:\n%s", withSecret, warnings, map[bool]int{true: 0, false: 1}[withSecret], errOut.String())
		}
	}
}

// TestDriverLogsAreMasked: the lines go-redis and go-sql-driver/mysql log
// through their package-level loggers reach Main's stderr masked.
func TestDriverLogsAreMasked(t *testing.T) {
	const pw = "Pw/driver%40log9Q"
	var sec secret.Set
	sec.AddText("redis://:" + pw + "@127.0.0.1:1/0")
	var out lockedBuilder
	routeLibraryLogs(sec.Writer(&out))
	t.Cleanup(func() {
		libraryLogs.mu.Lock()
		libraryLogs.w = nil
		libraryLogs.mu.Unlock()
	})
	libraryLogger{}.Printf(context.Background(), "redis: dial redis://:%s@127.0.0.1:1/0: refused", pw)
	libraryLogger{}.Print("closing bad idle connection of user:" + pw + "@tcp(127.0.0.1:1)/db")
	got := out.String()
	if strings.Count(got, "\n") != 2 || !strings.Contains(got, "mysql: closing bad idle connection") {
		t.Fatalf("driver logs: %q", got)
	}
	wantNoPassword(t, got, pw, "Pw/driver@log9Q")
}
