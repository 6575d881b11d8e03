package idemhttp

import (
	"net/http"
	"net/url"
	"testing"
	"testing/synctest"

	"github.com/idem-go/idem"
)

// TestDeliverTargetUserInfo: a target with user information sends it as
// basic authentication, as http.Client did before the Deliverer called
// its transport directly.
func TestDeliverTargetUserInfo(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		target, _ := url.Parse("http://alice:s3cret@service.test/messages")
		b := setupDeliver(t, idem.Config{}, DelivererOptions{Target: target}, func(int, *http.Request) (*http.Response, error) {
			return response(200, nil, ""), nil
		})
		if s := b.settle(idem.Message{ID: "m", Payload: []byte("p")}); s.Action != idem.Ack {
			t.Fatalf("settle: %+v", s)
		}
		user, pass, ok := b.svc.last.BasicAuth()
		if !ok || user != "alice" || pass != "s3cret" {
			t.Fatalf("basic auth = %q %q %v; want alice s3cret", user, pass, ok)
		}
	})
}
