package idemhttp

import (
	"errors"
	"net/http"
	"testing"
	"testing/synctest"

	"github.com/idem-go/idem"
)

// DeadLetterAnswer reads a record the Deliverer completed as the
// Deliverer settles it: a refusal (4xx, 3xx) and an unknown outcome are
// dead-letter answers with the reason the delivery was dead-lettered
// with; a success is not, and neither is a result that is no delivery
// answer, even one under the answers' content type.
func TestDeadLetterAnswer(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		answers := map[string]int{"ok": 200, "created": 201, "refused": 422, "moved": 302}
		b := setupDeliver(t, idem.Config{}, DelivererOptions{}, func(_ int, r *http.Request) (*http.Response, error) {
			status, ok := answers[r.Header.Get(HeaderMessageID)]
			if !ok {
				return nil, errors.New("connection reset after the request was sent")
			}
			return response(status, nil, "answer"), nil
		})
		for id, want := range map[string]string{"ok": "", "created": "", "refused": idem.ReasonPermanent, "moved": idem.ReasonPermanent, "broken": idem.ReasonOutcomeUnknown} {
			s := b.settle(idem.Message{ID: id, Payload: []byte("p")})
			rec, err := b.store.Inspect(t.Context(), "deliver-test", id)
			if err != nil {
				t.Fatalf("Inspect(%q): %v", id, err)
			}
			reason, ok := DeadLetterAnswer(rec.ContentType, rec.Result)
			if reason != want || ok != (want != "") {
				t.Errorf("DeadLetterAnswer of %q's record = %q, %v; want %q, %v", id, reason, ok, want, want != "")
			}
			if ok && (s.Action != idem.DeadLetter || s.Reason != reason) || !ok && s.Action != idem.Ack {
				t.Errorf("delivery of %q settled %v %s; DeadLetterAnswer says %q, %v", id, s.Action, s.Reason, reason, ok)
			}
		}
	})
	for _, c := range []struct{ ctype, body string }{
		{answerContentType, `{"body":"eA=="}`},
		{answerContentType, `not json`},
		{"application/json", `{"status":422}`},
		{"", ""},
	} {
		if reason, ok := DeadLetterAnswer(c.ctype, []byte(c.body)); ok || reason != "" {
			t.Errorf("DeadLetterAnswer(%q, %q) = %q, %v; want no dead-letter answer", c.ctype, c.body, reason, ok)
		}
	}
}
