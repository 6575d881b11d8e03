package idemhttp

import (
	"context"
	"errors"
	"net/http"
	"net/textproto"
	"net/url"
	"slices"
	"strings"
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
		// A transport error names the target without its password.
		b.d.rt = roundTripFunc(func(*http.Request) (*http.Response, error) { return nil, errors.New("refused") })
		_, _, err := b.d.call(context.Background(), &idem.Attempt{Message: idem.Message{ID: "n"}}, &callSlot{})
		var ue *url.Error
		if !errors.As(err, &ue) || ue.Op != "Post" || strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), "alice:***@") {
			t.Fatalf("call error = %v; want a *url.Error naming alice:***@", err)
		}
	})
}

// TestDeliverHeaderValues: every valid value of the broker's headers is
// sent, under the prefixed canonical name, several values of one name
// and names that differ only in case together, the others in their own
// field.
func TestDeliverHeaderValues(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setupDeliver(t, idem.Config{}, DelivererOptions{}, func(int, *http.Request) (*http.Response, error) {
			return response(200, nil, ""), nil
		})
		msg := idem.Message{ID: "m", Payload: []byte("p"), Headers: map[string][]string{
			"trace-id": {"a", "b"}, "Trace-Id": {"c"}, "x-one": {"1"}, "bad": {"x\ny"},
		}}
		if s := b.settle(msg); s.Action != idem.Ack {
			t.Fatalf("settle: %+v", s)
		}
		h := b.svc.last.Header
		got := slices.Sorted(slices.Values(h[textproto.CanonicalMIMEHeaderKey(HeaderBrokerPrefix+"trace-id")]))
		if !slices.Equal(got, []string{"a", "b", "c"}) {
			t.Errorf("trace-id values = %q; want a b c", got)
		}
		if v := h.Values(HeaderBrokerPrefix + "x-one"); !slices.Equal(v, []string{"1"}) {
			t.Errorf("x-one = %q; want 1", v)
		}
		if v := h.Values(HeaderBrokerPrefix + "bad"); len(v) != 0 {
			t.Errorf("bad = %q; want none", v)
		}
		// The Idempotency-Key goes in lower case (noInternalRetry).
		if !slices.Equal(h["idempotency-key"], []string{"m"}) || h.Get(HeaderMessageID) != "m" || h.Get(HeaderAttempt) != "1" {
			t.Errorf("headers = %v", h)
		}
	})
}
