package idemhttp_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemhttp"
)

// refusingStore refuses every claim as a misconfigured store does.
type refusingStore struct{ idemdriver.LeaseStore }

func (refusingStore) Acquire(context.Context, *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
	return idemdriver.AcquireResult{}, fmt.Errorf("%w: the table is not there", idem.ErrInvalidConfig)
}

// TestStoreRefusalIsFinal: a store that refuses the claim as invalid (a
// configuration error) gets 500 with Stripe-Should-Retry: false, so that
// clients (idemhttp's Transport among them) do not retry what only an
// operator can fix.
func TestStoreRefusalIsFinal(t *testing.T) {
	t.Parallel()
	mw, err := idemhttp.New(refusingStore{idem.NewMemoryStore(nil)}, idemhttp.Options{Namespace: "pay",
		Scope: func(*http.Request) (string, error) { return "user", nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	ran := false
	srv := httptest.NewServer(mw.Require(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran = true })))
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{}`))
	req.Header.Set(idemhttp.HeaderIdempotencyKey, `"k"`)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusInternalServerError || resp.Header.Get(idemhttp.HeaderShouldRetry) != "false" || ran {
		t.Errorf("store refusal: %d, %s %q, handler ran %v; want 500, false, not run",
			resp.StatusCode, idemhttp.HeaderShouldRetry, resp.Header.Get(idemhttp.HeaderShouldRetry), ran)
	}
}
