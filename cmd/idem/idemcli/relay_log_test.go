package idemcli

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/idem-go/idem"
)

// failingPublisher fails the messages whose destination it names, with
// that error.
type failingPublisher map[string]error

func (p failingPublisher) Publish(_ context.Context, msgs []idem.Outgoing) []error {
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		errs[i] = p[m.Destination]
	}
	return errs
}

// TestRelayLogsUnsentMessages: `idem relay` says which messages it could
// not send and why, one line per destination of a batch, and whether they
// are retried or failed for good; it returns the publisher's errors as
// they were, and says nothing of a batch that went out.
func TestRelayLogsUnsentMessages(t *testing.T) {
	var out strings.Builder
	pub := loggedPublisher{failingPublisher{
		"orders.created": errors.New("nats: no response from stream"),
		"orders.bad":     idem.Permanent(errors.New("invalid subject")),
	}, slog.New(slog.NewTextHandler(&out, nil))}
	msgs := []idem.Outgoing{
		{ID: "a", Destination: "orders.created"},
		{ID: "b", Destination: "orders.sent"},
		{ID: "c", Destination: "orders.created"},
		{ID: "d", Destination: "orders.bad"},
	}
	errs := pub.Publish(context.Background(), msgs)
	if len(errs) != 4 || errs[0] == nil || errs[1] != nil || errs[2] == nil || !idem.IsPermanent(errs[3]) {
		t.Fatalf("errors %v", errs)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []string{
		`level=WARN msg="idem relay: messages not sent" destination=orders.created messages=2 then="retried with backoff" error="nats: no response from stream"`,
		`level=WARN msg="idem relay: messages not sent" destination=orders.bad messages=1 then="failed for good: idem failed --outbox lists them, idem retry --outbox-id sends one again" error="invalid subject"`,
	}
	if len(lines) != len(want) {
		t.Fatalf("log:\n%s", out.String())
	}
	for i := range want {
		if _, rest, _ := strings.Cut(lines[i], " "); rest != want[i] {
			t.Errorf("line %d: %q, want %q", i, rest, want[i])
		}
	}
	out.Reset()
	if pub.Publish(context.Background(), msgs[1:2]); out.Len() != 0 {
		t.Errorf("a batch sent in full logged %q", out.String())
	}
}
