package secret

import (
	"strings"
	"testing"
)

// scrubURLsEvery is scrubURLs with every pattern run on every text.
func scrubURLsEvery(text string) string {
	text = keywordPassword.ReplaceAllString(text, "${1}"+Mask)
	text = urlPassword.ReplaceAllStringFunc(text, func(m string) string {
		sub := urlPassword.FindStringSubmatch(m)
		if placeholders[m[len(sub[1]):len(m)-1]] {
			return m
		}
		return sub[1] + Mask + "@"
	})
	text = urlToken.ReplaceAllString(text, "${1}"+Mask+"@")
	return dsnPassword.ReplaceAllString(text, "${1}"+Mask+"@${2}")
}

// TestScrubURLsSkipsOnlyWhatCannotMatch: the scans that skip a pattern
// never change what is masked.
func TestScrubURLsSkipsOnlyWhatCannotMatch(t *testing.T) {
	for _, text := range []string{
		"",
		`time=2026-12-06T12:00:00Z level=INFO msg=request method=POST path=/payments status=201 bytes=30 duration_ms=1.2 outcome=Processed key_hash=0123456789abcdef`,
		"postgres://user:hunter2@db:5432/idem",
		"REDIS://:s3cret@cache:6379/0 and more",
		"nats://tok3n@nats:4222",
		"user:pw@tcp(db:3306)/idem",
		"user:pw@unix(/run/mysqld.sock)/idem",
		"host=db PASSWORD=hunter2 dbname=x",
		"host=db PaSsWoRd = 'a b' x",
		"host=db paſſword=hunter2", // long s folds to s
		"sslpassword=x&password=y",
		"amqp://USER:PASS@HOST/",
		"word=1 w0rd://x",
		"://:@",
	} {
		if got, want := scrubURLs(text), scrubURLsEvery(text); got != want {
			t.Errorf("scrubURLs(%q) = %q, want %q", text, got, want)
		}
	}
	line := strings.Repeat("a=b ", 40)
	if n := testing.AllocsPerRun(50, func() { scrubURLs(line) }); n != 0 {
		t.Errorf("a log line with nothing to mask: %v allocations, want 0", n)
	}
}
