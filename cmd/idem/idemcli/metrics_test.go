package idemcli

import (
	"bytes"
	"context"
	"encoding/json"
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

// `idem demo --metrics-addr` serves the consumer's metrics; scraped at the
// end of the run they agree with the demo's report: every payment
// processed once, every duplicate the report counts absorbed, no claim
// left active, and one process duration per delivery.
func TestDemoServesMetrics(t *testing.T) {
	t.Parallel()
	var mfs map[string]*dto.MetricFamily
	o := &demoOptions{
		messages: 300, duplicates: 0.2, crashRate: 0.02, consumers: 2,
		store: "sqlite:", broker: "nats:embedded", ackWait: 300 * time.Millisecond, timeout: 3 * time.Minute,
		seed: 1, json: true, progress: "none", metricsAddr: "127.0.0.1:0",
		afterRun: func(url string) { mfs = scrape(t, url) },
	}
	var out, errOut bytes.Buffer
	if err := runDemo(t.Context(), o, &out, &errOut); err != nil {
		t.Fatalf("demo: %v\nstderr: %s\nstdout: %s", err, errOut.String(), out.String())
	}
	if !strings.Contains(errOut.String(), "idem demo: metrics on http://127.0.0.1:") {
		t.Errorf("stderr does not say where the metrics are: %q", errOut.String())
	}
	var rep report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("report: %v\n%s", err, out.String())
	}
	if mfs == nil {
		t.Fatal("the metrics were not scraped")
	}
	demo := map[string]string{"idem_consumer": demoConsumer}
	with := func(k, v string) map[string]string {
		return map[string]string{"idem_consumer": demoConsumer, k: v}
	}
	expectValue(t, mfs, "idem_messages_total", with("idem_status", "processed"), float64(rep.Messages))
	expectValue(t, mfs, "idem_messages_total", with("idem_status", "duplicate"), float64(rep.DuplicatesAbsorbed))
	if rep.DuplicatesAbsorbed == 0 {
		t.Error("the demo absorbed no duplicates: the duplicate counter was not exercised")
	}
	expectValue(t, mfs, "idem_claims_active", demo, 0)
	expectValue(t, mfs, "messaging_process_duration_seconds", demo, float64(rep.Deliveries))
	// The family only appears with a first error (the run is over and
	// cancelled Begins are not store errors).
	if n, _ := value(mfs, "idem_store_errors_total", demo); n != 0 {
		t.Errorf("store errors %v, want 0: %v", n, mfs["idem_store_errors_total"])
	}
	// A provider replay is a handler run again after a rollback (a crash
	// before the commit), and every rollback released its claim.
	if released, _ := value(mfs, "idem_claims_released_total", demo); released < float64(rep.ProviderReplays) {
		t.Errorf("released claims %v < provider replays %d", released, rep.ProviderReplays)
	}
}

func TestDemoMetricsAddrInUse(t *testing.T) {
	t.Parallel()
	m, err := serveMetrics("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer m.close()
	code, _, errOut := run(t, "demo", "--metrics-addr", m.addr, "--messages", "1", "--progress", "none")
	if code != 1 || !strings.Contains(errOut, "--metrics-addr") || !strings.Contains(errOut, "address already in use") {
		t.Errorf("exit %d, stderr %q; want 1 and the address in use", code, errOut)
	}
}
