//go:build !nodemo

package demo

// Tests of the demo that sit beside other commands' tests: its metrics
// and its handling of a broker password.

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/cmd/idem/internal/promserve"
	dto "github.com/prometheus/client_model/go"
)

// `idem demo --metrics-addr` serves the consumer's metrics; scraped at the
// end of the run they agree with the demo's report: every payment
// processed once, every duplicate the report counts absorbed, no claim
// left active, and one process duration per delivery.
func TestDemoServesMetrics(t *testing.T) {
	t.Parallel()
	var mfs map[string]*dto.MetricFamily
	o := &Options{
		Messages: 300, Duplicates: 0.2, CrashRate: 0.02, Consumers: 2,
		Store: "sqlite:", Broker: "nats:embedded", AckWait: 300 * time.Millisecond, Timeout: 3 * time.Minute,
		Seed: 1, JSON: true, Progress: "none", MetricsAddr: "127.0.0.1:0",
		afterRun: func(url string) { mfs = scrape(t, url) },
	}
	var out, errOut bytes.Buffer
	if err := Run(t.Context(), o, &out, &errOut); err != nil {
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
	m, err := promserve.Serve("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	code, _, errOut := run(t, "demo", "--metrics-addr", m.Addr, "--messages", "1", "--progress", "none")
	if code != 1 || !strings.Contains(errOut, "--metrics-addr") || !strings.Contains(errOut, "address already in use") {
		t.Errorf("exit %d, stderr %q; want 1 and the address in use", code, errOut)
	}
}
