//go:build !nodemo

package idemcli

// Tests of the demo that sit beside other commands' tests: its metrics
// and its handling of a broker password.

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

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

// TestDemoWithPasswordOnNATS runs the demo to its report on a NATS server
// that requires a user and a password with '/', '@', ':', '%', '#' and
// '?', written raw in the URL: the command connects with the password the
// operator meant and prints it nowhere.
func TestDemoWithPasswordOnNATS(t *testing.T) {
	t.Parallel()
	for _, pw := range []struct{ name, written, meant string }{secretPasswords[4], secretPasswords[5]} {
		t.Run(pw.name, func(t *testing.T) {
			t.Parallel()
			addr := startNATS(t, "demo", pw.meant)
			code, output := runMain(context.Background(), "demo", "--broker", "nats://demo:"+pw.written+"@"+addr,
				"--messages", "40", "--consumers", "2", "--crash-rate", "0", "--progress", "none", "--timeout", "2m")
			if code != 0 || !strings.Contains(output, "nats://demo:xxxxx@"+addr) || !strings.Contains(output, "lost messages") {
				t.Fatalf("exit %d, want 0 and a report naming the broker without its password:\n%s", code, output)
			}
			wantNoPassword(t, output, pw.written, pw.meant)
			// The wrong password is refused, and not printed either.
			code, output = runMain(context.Background(), "demo", "--broker", "nats://demo:Wrong/pw%40"+"@"+addr,
				"--messages", "1", "--progress", "none", "--timeout", "1m")
			if code != 1 || !strings.Contains(output, "cannot reach NATS at nats://demo:xxxxx@"+addr) {
				t.Fatalf("wrong password: exit %d:\n%s", code, output)
			}
			wantNoPassword(t, output, "Wrong/pw%40", "Wrong/pw@")
		})
	}
}
