package idemcli

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/idem-go/idem"
)

// scrape GETs url and parses the Prometheus text format.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("GET %s: %s, Content-Type %q", url, resp.Status, resp.Header.Get("Content-Type"))
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return mfs
}

// value sums the samples of family name whose labels include want: the
// counter, gauge or untyped value, or the sample count of a histogram. It
// reports whether the family exists.
func value(mfs map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	mf, ok := mfs[name]
	if !ok {
		return 0, false
	}
	var v float64
next:
	for _, m := range mf.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for k, w := range want {
			if labels[k] != w {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			v += m.GetCounter().GetValue()
		case m.Gauge != nil:
			v += m.GetGauge().GetValue()
		case m.Histogram != nil:
			v += float64(m.GetHistogram().GetSampleCount())
		case m.Untyped != nil:
			v += m.GetUntyped().GetValue()
		}
	}
	return v, true
}

func expectValue(t *testing.T, mfs map[string]*dto.MetricFamily, name string, labels map[string]string, want float64) {
	t.Helper()
	got, ok := value(mfs, name, labels)
	if !ok {
		t.Errorf("/metrics has no %s", name)
		return
	}
	if got != want {
		t.Errorf("%s%v = %v, want %v", name, labels, got, want)
	}
}

// The server scrapes as Prometheus would: the idemotel metrics of a
// consumer hooked to it, with Prometheus names and labels, beside the Go
// runtime collector; after close the port is no longer served.
func TestServeMetrics(t *testing.T) {
	t.Parallel()
	m, err := serveMetrics("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c, err := idem.NewConsumer[*idem.MemoryTx](idem.NewMemoryStore(nil), idem.Config{Name: "orders", PurgeInterval: -1, Hooks: m.hooks()})
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
	mfs := scrape(t, m.url())
	orders := map[string]string{"idem_consumer": "orders", "idem_mode": "transactional"}
	with := func(k, v string) map[string]string {
		l := map[string]string{k: v}
		for a, b := range orders {
			l[a] = b
		}
		return l
	}
	expectValue(t, mfs, "idem_messages_total", with("idem_status", "processed"), 2)
	expectValue(t, mfs, "idem_messages_total", map[string]string{"idem_status": "duplicate", "idem_duplicate_reason": "completed"}, 2)
	expectValue(t, mfs, "idem_claims_total", orders, 2)
	expectValue(t, mfs, "idem_claims_active", orders, 0)
	expectValue(t, mfs, "messaging_process_duration_seconds", with("messaging_operation_name", "process"), 4)
	if _, ok := value(mfs, "go_goroutines", nil); !ok {
		t.Error("/metrics lacks the Go runtime collector's go_goroutines")
	}
	if err := m.close(); err != nil {
		t.Fatal(err)
	}
	if resp, err := http.Get(m.url()); err == nil {
		resp.Body.Close()
		t.Errorf("GET after close: %s, want a refused connection", resp.Status)
	}
	if err := (*metricsServer)(nil).close(); err != nil || (*metricsServer)(nil).hooks() != nil {
		t.Error("a nil metrics server is not a no-op")
	}
}
