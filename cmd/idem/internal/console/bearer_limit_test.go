package console_test

import (
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/console"
)

// bearer sends GET /api/consumers with an Authorization: Bearer header
// and an X-Forwarded-For header, and returns the status.
func (f *fixture) bearer(token, forwardedFor string) int {
	f.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, f.srv.URL+"/api/consumers", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("X-Forwarded-For", forwardedFor)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// Guessing the token in an Authorization: Bearer header counts against
// the same sign-in limit as the form, whatever X-Forwarded-For claims:
// after SignInFailures wrong tokens a client is refused with 429, even
// with the right token, until the oldest failure leaves the window; and
// the sign-in form refuses it too.
func TestBearerGuessesLimited(t *testing.T) {
	store := idem.NewMemoryStore(nil)
	poisoned(t, store, "payments", "pay-1")
	clk := &clock{t: time.Date(2026, 12, 6, 1, 0, 0, 0, time.UTC)}
	f := newFixture(t, store, console.Config{Token: "s3cret-token", Now: clk.now})
	for i := range console.SignInFailures {
		if code := f.bearer("guess", "203.0.113."+string(rune('1'+i))); code != http.StatusUnauthorized {
			t.Fatalf("guess %d: %d, want 401", i+1, code)
		}
	}
	if code := f.bearer("s3cret-token", "198.51.100.7"); code != http.StatusTooManyRequests {
		t.Fatalf("after %d wrong bearer tokens, the right one: %d; want 429 (the guesses are not limited)", console.SignInFailures, code)
	}
	if code, _ := f.post("/login", url.Values{"token": {"s3cret-token"}}); code != http.StatusTooManyRequests {
		t.Fatalf("after %d wrong bearer tokens, the sign-in form: %d; want 429", console.SignInFailures, code)
	}
	clk.add(console.SignInWindow + time.Second)
	if code := f.bearer("s3cret-token", ""); code != http.StatusOK {
		t.Fatalf("after the window, the right token: %d; want 200", code)
	}
}
