package idemcli

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// `idem proxy --metrics-addr` serves the middleware's metrics: scraped
// after one request, its retry and a reuse of the key with another body,
// they count one processed request, one duplicate (the replay) and one
// fingerprint mismatch, each with the status the client got, and no store
// error.
func TestProxyServesMetrics(t *testing.T) {
	t.Parallel()
	up, n := countingUpstream(t)
	p := startProxy(t, "--upstream", up.URL, "--store", "sqlite:"+t.TempDir()+"/proxy.db", "--metrics-addr", "127.0.0.1:0")
	var metricsURL string
	select {
	case line := <-p.lines:
		var ok bool
		metricsURL, ok = strings.CutPrefix(line, "idem proxy: metrics on ")
		if !ok || !strings.HasPrefix(metricsURL, "http://127.0.0.1:") || !strings.HasSuffix(metricsURL, "/metrics") {
			t.Fatalf("second line %q, want the metrics URL", line)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("no metrics line in 60 s")
	}

	client := &http.Client{Transport: &http.Transport{}, Timeout: 60 * time.Second}
	defer client.CloseIdleConnections()
	post := func(key, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, p.addr+"/payments", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer alice")
		req.Header.Set("Idempotency-Key", key)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("POST: %v", err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Header.Get("Idempotent-Replayed")
	}
	if s, r := post(`"pay-1"`, `{"amount":100}`); s != 201 || r != "" {
		t.Fatalf("first: %d %q", s, r)
	}
	if s, r := post(`"pay-1"`, `{"amount":100}`); s != 201 || r != "true" {
		t.Fatalf("retry: %d %q, want the replay", s, r)
	}
	if s, _ := post(`"pay-1"`, `{"amount":999}`); s != 422 {
		t.Fatalf("other body: %d, want 422", s)
	}
	// A request without a key passes through and is not counted.
	if resp, err := client.Get(p.addr + "/healthz"); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	if n.Load() != 1 {
		t.Fatalf("upstream ran %d times, want 1", n.Load())
	}

	mfs := scrape(t, metricsURL)
	u, _ := url.Parse(up.URL)
	consumer := "idemhttp:proxy:" + u.Host
	with := func(kv ...string) map[string]string {
		l := map[string]string{"idem_consumer": consumer, "idem_mode": "lease"}
		for i := 0; i < len(kv); i += 2 {
			l[kv[i]] = kv[i+1]
		}
		return l
	}
	web := func(kv ...string) map[string]string {
		l := map[string]string{"idem_consumer": consumer}
		for i := 0; i < len(kv); i += 2 {
			l[kv[i]] = kv[i+1]
		}
		return l
	}
	expectValue(t, mfs, "idem_messages_total", with("idem_status", "processed"), 1)
	expectValue(t, mfs, "idem_messages_total", with("idem_status", "duplicate", "idem_duplicate_reason", "completed"), 1)
	expectValue(t, mfs, "idem_messages_total", with("idem_status", "fingerprint_mismatch", "idem_duplicate_reason", "fingerprint_mismatch"), 1)
	expectValue(t, mfs, "idem_messages_total", with(), 3)
	expectValue(t, mfs, "idem_claims_total", with(), 1)
	expectValue(t, mfs, "idem_claims_active", with(), 0)
	expectValue(t, mfs, "idem_http_responses_total", web("idem_status", "processed", "http_response_status_code", "201"), 1)
	expectValue(t, mfs, "idem_http_responses_total", web("idem_status", "duplicate", "http_response_status_code", "201", "idem_http_replayed", "true"), 1)
	expectValue(t, mfs, "idem_http_responses_total", web("idem_status", "fingerprint_mismatch", "http_response_status_code", "422"), 1)
	expectValue(t, mfs, "idem_http_request_duration_seconds", web(), 3)
	expectValue(t, mfs, "idem_http_request_duration_seconds", web("idem_status", "fingerprint_mismatch", "error_type", "fingerprint_mismatch"), 1)
	if _, ok := mfs["messaging_process_duration_seconds"]; ok {
		t.Error("HTTP requests were recorded as message processing")
	}
	if v, _ := value(mfs, "idem_store_errors_total", nil); v != 0 {
		t.Errorf("store errors %v, want 0", v)
	}
	// Cardinality and privacy: no label carries the key, the scope or the
	// path, and messaging.system is not set on HTTP requests.
	for name, mf := range mfs {
		if !strings.HasPrefix(name, "idem_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				v := l.GetValue()
				if l.GetName() == "messaging_system" || strings.Contains(v, "pay-1") || strings.Contains(v, "alice") || strings.Contains(v, "/payments") {
					t.Errorf("%s has label %s=%q", name, l.GetName(), v)
				}
			}
		}
	}
	if _, ok := value(mfs, "go_goroutines", nil); !ok {
		t.Error("/metrics lacks the Go runtime collector")
	}

	if err := p.stop(t); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if resp, err := http.Get(metricsURL); err == nil {
		resp.Body.Close()
		t.Errorf("GET /metrics after the proxy stopped: %s, want a refused connection", resp.Status)
	}
}

func TestProxyMetricsAddrErrors(t *testing.T) {
	t.Parallel()
	m, err := serveMetrics("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer m.close()
	store := "sqlite:" + t.TempDir() + "/proxy.db"
	code, _, errOut := run(t, "proxy", "--upstream", "http://127.0.0.1:1", "--store", store, "--listen", "127.0.0.1:0", "--metrics-addr", m.srv.Addr)
	if code != 1 || !strings.Contains(errOut, "--metrics-addr") || !strings.Contains(errOut, "address already in use") {
		t.Errorf("address in use: exit %d, stderr %q; want 1 and the address in use", code, errOut)
	}
	code, _, errOut = run(t, "proxy", "--upstream", "http://127.0.0.1:1", "--store", store, "--metrics-addr", "nonsense")
	if code != 2 || !strings.Contains(errOut, "--metrics-addr") {
		t.Errorf("bad address: exit %d, stderr %q; want 2", code, errOut)
	}
}
