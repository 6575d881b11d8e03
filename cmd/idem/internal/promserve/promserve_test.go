package promserve_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/promserve"
	"github.com/idem-go/idem/cmd/idem/internal/promserve/promservetest"
)

// The server scrapes as Prometheus would: the idemotel metrics of a
// consumer hooked to it, with Prometheus names and labels, beside the Go
// runtime collector; after close the port is no longer served.
func TestServeMetrics(t *testing.T) {
	t.Parallel()
	m, err := promserve.Serve("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c, err := idem.NewConsumer[*idem.MemoryTx](idem.NewMemoryStore(nil), idem.Config{Name: "orders", PurgeInterval: -1, Hooks: m.Hooks()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ok := func(context.Context, *idem.MemoryTx, idem.Message) error { return nil }
	for _, id := range []string{"o-1", "o-2", "o-1", "o-1"} {
		if _, err := c.Process(t.Context(), idem.Message{ID: id, Payload: []byte("x")}, ok); err != nil {
			t.Fatal(err)
		}
	}
	mfs := promservetest.Scrape(t, m.URL())
	orders := map[string]string{"idem_consumer": "orders", "idem_mode": "transactional"}
	with := func(k, v string) map[string]string {
		l := map[string]string{k: v}
		for a, b := range orders {
			l[a] = b
		}
		return l
	}
	promservetest.ExpectValue(t, mfs, "idem_messages_total", with("idem_status", "processed"), 2)
	promservetest.ExpectValue(t, mfs, "idem_messages_total", map[string]string{"idem_status": "duplicate", "idem_duplicate_reason": "completed"}, 2)
	promservetest.ExpectValue(t, mfs, "idem_claims_total", orders, 2)
	promservetest.ExpectValue(t, mfs, "idem_claims_active", orders, 0)
	promservetest.ExpectValue(t, mfs, "messaging_process_duration_seconds", with("messaging_operation_name", "process"), 4)
	if _, ok := promservetest.Value(mfs, "go_goroutines", nil); !ok {
		t.Error("/metrics lacks the Go runtime collector's go_goroutines")
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if resp, err := http.Get(m.URL()); err == nil {
		resp.Body.Close()
		t.Errorf("GET after close: %s, want a refused connection", resp.Status)
	}
	if err := (*promserve.Server)(nil).Close(); err != nil || (*promserve.Server)(nil).Hooks() != nil {
		t.Error("a nil metrics server is not a no-op")
	}
}
