package secret

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"strings"
	"testing"
)

// testPasswords are passwords with every character that URLs treat
// specially, written raw and percent-encoded.
var testPasswords = []struct {
	name    string
	written string // as it appears in the URL
	meant   string // the password the operator meant
}{
	{"slash", "Pw/slash7", "Pw/slash7"},
	{"at", "Pw@at7", "Pw@at7"},
	{"colon", "Pw:colon7", "Pw:colon7"},
	{"percent", "Pw%percent7", "Pw%percent7"},
	{"all raw", "P/w@x:y%z#q?7", "P/w@x:y%z#q?7"},
	{"encoded", "Pw%2Fenc%40%3A%257", "Pw/enc@:%7"},
	{"encoded lower", "Pw%2fenc%40%3a7", "Pw/enc@:7"},
}

// allForms is what must never appear: the password as written, as meant,
// and as a URL encoder would write what was meant.
func allForms(written, meant string) []string {
	out := []string{written, meant, url.QueryEscape(meant), url.PathEscape(meant),
		strings.TrimPrefix(url.UserPassword("", meant).String(), ":")}
	for _, f := range out {
		out = append(out, lowerHex(f))
	}
	return out
}

func TestScrubEveryForm(t *testing.T) {
	for _, pw := range testPasswords {
		for _, scheme := range []string{"postgres", "postgresql", "mysql", "redis", "rediss", "amqp", "amqps", "nats", "kafka", "http"} {
			raw := scheme + "://user:" + pw.written + "@127.0.0.1:1/db?x=1"
			var s Set
			s.AddText("--store=" + raw)
			for _, f := range allForms(pw.written, pw.meant) {
				// Texts a library might print: the URL, the URL quoted by
				// url.Parse, the password alone, encoded, in a DSN.
				for _, text := range []string{
					raw,
					fmt.Sprintf("parse %q: invalid port", raw),
					"authentication failed for password " + f + " (ok)",
					"dial " + Normalize(raw) + ": refused",
					"user:" + f + "@tcp(127.0.0.1:3306)/db",
				} {
					if got := s.Scrub(text); strings.Contains(got, f) {
						t.Errorf("%s %s: Scrub(%q) = %q keeps %q", pw.name, scheme, text, got, f)
					}
				}
			}
			if got := URL(raw); strings.Contains(got, pw.meant) || strings.Contains(got, pw.written) || !strings.Contains(got, "user:"+Mask+"@127.0.0.1:1") {
				t.Errorf("%s: URL(%q) = %q", pw.name, raw, got)
			}
		}
	}
}

func TestNormalizeGivesTheMeantPassword(t *testing.T) {
	for _, pw := range testPasswords {
		raw := "postgres://user:" + pw.written + "@db.example:5432/app?sslmode=disable"
		u, err := url.Parse(Normalize(raw))
		if err != nil {
			t.Errorf("%s: Normalize(%q) does not parse: %v", pw.name, raw, err)
			continue
		}
		p, _ := u.User.Password()
		if p != pw.meant || u.User.Username() != "user" || u.Host != "db.example:5432" || u.Path != "/app" || u.Query().Get("sslmode") != "disable" {
			t.Errorf("%s: Normalize(%q) = %q: user %q password %q host %q path %q", pw.name, raw, Normalize(raw), u.User.Username(), p, u.Host, u.Path)
		}
	}
	for _, raw := range []string{"nats:embedded", "sqlite:/tmp/x.db", "kafka://a:9092,b:9092", "redis://127.0.0.1:6379/0", "postgres://u:p@h/db?x=a@b", "http://h/p"} {
		if got := Normalize(raw); got != raw {
			t.Errorf("Normalize(%q) = %q, want it unchanged", raw, got)
		}
	}
}

func TestShortSecretsOnlyAsPasswords(t *testing.T) {
	var s Set
	s.AddText("mysql://idem:idem@127.0.0.1:3306/idem_test")
	got := s.Scrub("idem proxy: stopped; dial mysql://idem:idem@127.0.0.1:3306/idem_test; password=idem; user:idem@tcp(h:1)/x")
	want := "idem proxy: stopped; dial mysql://idem:xxxxx@127.0.0.1:3306/idem_test; password=xxxxx; user:xxxxx@tcp(h:1)/x"
	if got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}

func TestUnknownURLsAreMasked(t *testing.T) {
	var s Set // knows nothing
	for text, want := range map[string]string{
		`connect "amqp://guest:Pw/x@y@rabbit:5672/vh": refused`: `connect "amqp://guest:xxxxx@rabbit:5672/vh": refused`,
		"app:Pw@x@tcp(10.0.0.1:3306)/db":                        "app:xxxxx@tcp(10.0.0.1:3306)/db",
		"nats://127.0.0.1:4222 ok":                              "nats://127.0.0.1:4222 ok",
	} {
		if got := s.Scrub(text); got != want {
			t.Errorf("Scrub(%q) = %q, want %q", text, got, want)
		}
	}
}

func TestErrAndWriter(t *testing.T) {
	var s Set
	s.AddSecret("scope-secret-0123456789")
	base := fmt.Errorf("open: %w: key scope-secret-0123456789", fs.ErrNotExist)
	err := s.Err(base)
	if strings.Contains(err.Error(), "scope-secret") || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Err = %q, Is ErrNotExist %v", err, errors.Is(err, fs.ErrNotExist))
	}
	if plain := errors.New("nothing to hide"); s.Err(plain) != plain || s.Err(nil) != nil {
		t.Error("Err wraps an error with nothing to mask")
	}
	var buf bytes.Buffer
	w := s.Writer(&buf)
	msg := "secret is scope-secret-0123456789 and url redis://:Pw%2Fq@h:6379/0\n"
	if n, err := fmt.Fprint(w, msg); n != len(msg) || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
	if got := buf.String(); got != "secret is xxxxx and url redis://:xxxxx@h:6379/0\n" {
		t.Errorf("written %q", got)
	}
	if err := Error(errors.New(`parse "amqp://u:Pw/z@h/": invalid port`), "amqp://u:Pw/z@h/"); strings.Contains(err.Error(), "Pw/z") {
		t.Errorf("Error = %q", err)
	}
}

// TestKeywordPasswords: a password given as a keyword (a libpq
// keyword/value string, quoted or not; a URL's query parameter) is found
// by AddText and masked by Scrub, known or not.
func TestKeywordPasswords(t *testing.T) {
	for _, tc := range []struct{ given, pw, text string }{
		{"host=127.0.0.1 user=idem password=KvPassw0rd31 dbname=idem_test", "KvPassw0rd31",
			`bad URL: store "host=127.0.0.1 user=idem password=KvPassw0rd31 dbname=idem_test"`},
		{"host=h password='Kv Pass\\'w0rd' dbname=d", "Kv Pass'w0rd", "failed: password 'Kv Pass'w0rd' rejected"},
		{"postgres://127.0.0.1:5432/idem_test?sslmode=bogus&password=QueryPassw0rd77&user=idem", "QueryPassw0rd77",
			`cannot parse "postgres://127.0.0.1:5432/idem_test?sslmode=bogus&password=QueryPassw0rd77&user=idem"`},
		{"postgres://h/db?sslpassword=KeyPassw0rd5", "KeyPassw0rd5", "sslpassword=KeyPassw0rd5: bad key"},
	} {
		var s Set
		s.AddText(tc.given)
		if got := s.Scrub(tc.text); strings.Contains(got, tc.pw) {
			t.Errorf("AddText(%q); Scrub(%q) = %q keeps the password", tc.given, tc.text, got)
		}
		var unknown Set
		if got := unknown.Scrub(tc.given); strings.Contains(got, strings.Fields(tc.pw)[0]) {
			t.Errorf("Scrub(%q) knowing nothing = %q keeps the password", tc.given, got)
		}
	}
}

// TestNormalizeEncodesAt: a password holding '@' is percent-encoded, so
// that a driver that cuts the userinfo at the first '@' reads the same
// host and password as Go's parser (one did, and dialed "ssword9@host").
func TestNormalizeEncodesAt(t *testing.T) {
	for raw, want := range map[string]string{
		"postgres://idem:Pa@ssword9@127.0.0.1:5432/idem_test?sslmode=disable": "postgres://idem:Pa%40ssword9@127.0.0.1:5432/idem_test?sslmode=disable",
		"redis://:a@b@h:6379/0":              "redis://:a%40b@h:6379/0",
		"postgres://u:p@h/db?x=a@b":          "postgres://u:p@h/db?x=a@b",
		"mysql://u:p@q@tcp-h:3306/db#frag@x": "mysql://u:p%40q@tcp-h:3306/db#frag@x",
	} {
		got := Normalize(raw)
		if got != want {
			t.Errorf("Normalize(%q) = %q, want %q", raw, got, want)
		}
		if first, _, _ := strings.Cut(strings.SplitN(got, "://", 2)[1], "@"); strings.Count(got[:strings.Index(got, first)+len(first)], "@") != 0 {
			t.Errorf("Normalize(%q) = %q: the userinfo still holds '@'", raw, got)
		}
	}
}

// TestNATSTokenAndPlaceholders: a NATS URL's one-part userinfo is a token,
// masked; the usage texts' placeholder passwords stay readable, unless
// they are a secret the Set was given.
func TestNATSTokenAndPlaceholders(t *testing.T) {
	var s Set
	s.AddText("--broker=nats://S3cr3tZZq@127.0.0.1:1")
	for _, text := range []string{"cannot reach NATS at nats://S3cr3tZZq@127.0.0.1:1", "token S3cr3tZZq refused"} {
		if got := s.Scrub(text); strings.Contains(got, "S3cr3tZZq") {
			t.Errorf("Scrub(%q) = %q keeps the token", text, got)
		}
	}
	var unknown Set
	if got := unknown.Scrub("dial nats://S3cr3tZZq@h:4222: refused"); got != "dial nats://xxxxx@h:4222: refused" {
		t.Errorf("unknown token: %q", got)
	}
	if got := unknown.Scrub("dial postgres://app@h:5432/db"); got != "dial postgres://app@h:5432/db" {
		t.Errorf("a user name is not a secret: %q", got)
	}
	usage := "want amqp://USER:PASS@HOST:PORT/ or postgres://USER:PASSWORD@HOST:PORT/DATABASE"
	if got := unknown.Scrub(usage); got != usage {
		t.Errorf("usage text scrubbed: %q", got)
	}
	var given Set
	given.AddText("amqp://guest:PASS@rabbit:5672/")
	if got := given.Scrub("dial amqp://guest:PASS@rabbit:5672/"); strings.Contains(got, "PASS@") {
		t.Errorf("a given password that looks like a placeholder is kept: %q", got)
	}
}
