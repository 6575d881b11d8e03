package idemcli

import (
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	colmetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	common "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/protobuf/proto"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testenv"
)

func TestVersion(t *testing.T) {
	t.Parallel()
	code, out, errOut := run(t, "version", "--json")
	var bi buildInfo
	if code != 0 || json.Unmarshal([]byte(out), &bi) != nil {
		t.Fatalf("version --json: exit %d, %q %q", code, out, errOut)
	}
	if bi.Module != "github.com/idem-go/idem/cmd/idem" || bi.Version == "" || !strings.HasPrefix(bi.GoVersion, "go") {
		t.Errorf("version --json = %+v", bi)
	}
	if code, out, _ := run(t, "version"); code != 0 || !strings.HasPrefix(out, "github.com/idem-go/idem/cmd/idem ") {
		t.Errorf("version: exit %d, %q", code, out)
	}
}

// TestVersionSaysWhyNoRevision: a binary without a VCS revision (go run,
// -buildvcs=false, a git worktree) says where to look; one with a
// revision prints it with its time and dirty flag.
func TestVersionSaysWhyNoRevision(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	printVersion(&b, buildInfo{Module: "m", Version: "(devel)", GoVersion: "go1.26"})
	if got := b.String(); got != "m (devel) (no VCS revision: see idem version --help) go1.26\n" {
		t.Errorf("without a revision: %q", got)
	}
	b.Reset()
	printVersion(&b, buildInfo{Module: "m", Version: "v1.2.3", Revision: "abc123", Time: "2026-12-02T05:46:58Z", Modified: true, GoVersion: "go1.26"})
	if got := b.String(); got != "m v1.2.3 revision abc123 (modified) of 2026-12-02T05:46:58Z go1.26\n" {
		t.Errorf("with a revision: %q", got)
	}
}

// TestHelpExitsZero: --help of every command prints its usage and exits 0.
func TestHelpExitsZero(t *testing.T) {
	t.Parallel()
	for _, c := range newRoot(io.Discard, io.Discard).Commands() {
		if c.Name() == "help" || c.Name() == "completion" {
			continue
		}
		if code, out, errOut := run(t, c.Name(), "--help"); code != 0 || !strings.Contains(out, "Usage:") {
			t.Errorf("%s --help: exit %d, stdout %q, stderr %q", c.Name(), code, out, errOut)
		}
	}
	if code, _, _ := run(t, "--help"); code != 0 {
		t.Errorf("--help: exit %d", code)
	}
}

// TestInspectAndStatsJSON: --json prints the record and the counts as
// JSON with the text output's fields.
func TestInspectAndStatsJSON(t *testing.T) {
	t.Parallel()
	url := "sqlite:" + filepath.Join(t.TempDir(), "ops.db")
	if code, _, errOut := run(t, "migrate", "--store", url); code != 0 {
		t.Fatalf("migrate: %d %s", code, errOut)
	}
	st, err := openSQLStore(t.Context(), url, "")
	if err != nil {
		t.Fatal(err)
	}
	c, err := idem.NewConsumer(st.store, idem.Config{Name: "orders", PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"m-1", "m-2"} {
		if _, err := c.Process(t.Context(), idem.Message{ID: id, Payload: []byte("x")}, func(context.Context, *sql.Tx, idem.Message) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	st.db.Close()

	code, out, errOut := run(t, "inspect", "--json", "--store", url, "--consumer", "orders", "--id", "m-1")
	var rec map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &rec) != nil {
		t.Fatalf("inspect --json: exit %d, %q %q", code, out, errOut)
	}
	if rec["consumer"] != "orders" || rec["message_id"] != "m-1" || rec["state"] != "completed" || rec["processed_at"] == nil ||
		len(rec["fingerprint"].(string)) != 64 {
		t.Errorf("inspect --json = %v", rec)
	}
	code, out, errOut = run(t, "stats", "--json", "--store", url)
	var sj storeStatsJSON
	if code != 0 || json.Unmarshal([]byte(out), &sj) != nil {
		t.Fatalf("stats --json: exit %d, %q %q", code, out, errOut)
	}
	stats := sj.Consumers
	if len(stats) != 1 || stats[0].Consumer != "orders" || stats[0].Records != 2 || stats[0].Oldest == nil || stats[0].Newest == nil {
		t.Errorf("stats --json = %+v", stats)
	}
	// The outbox backlog, as the text output shows it: the migrated
	// store has an empty outbox.
	if sj.Outbox == nil || sj.Outbox.Pending != 0 || sj.Outbox.Failed != 0 || !strings.Contains(out, `"oldest_pending_s": 0`) {
		t.Errorf("stats --json outbox = %+v in %s", sj.Outbox, out)
	}
}

// otlpReceiver is an in-process OTLP/HTTP receiver: it decodes the
// protobuf export requests of traces and metrics.
type otlpReceiver struct {
	mu      sync.Mutex
	spans   []string          // span names
	metrics []string          // metric names
	service map[string]string // signal -> service.name of the resource
}

func (rc *otlpReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var resp proto.Message
	switch r.URL.Path {
	case "/v1/traces":
		var req coltrace.ExportTraceServiceRequest
		if err = proto.Unmarshal(body, &req); err == nil {
			for _, rs := range req.ResourceSpans {
				rc.noteService("traces", rs.GetResource().GetAttributes())
				for _, ss := range rs.ScopeSpans {
					for _, s := range ss.Spans {
						rc.spans = append(rc.spans, s.Name)
					}
				}
			}
		}
		resp = &coltrace.ExportTraceServiceResponse{}
	case "/v1/metrics":
		var req colmetrics.ExportMetricsServiceRequest
		if err = proto.Unmarshal(body, &req); err == nil {
			for _, rm := range req.ResourceMetrics {
				rc.noteService("metrics", rm.GetResource().GetAttributes())
				for _, sm := range rm.ScopeMetrics {
					for _, m := range sm.Metrics {
						rc.metrics = append(rc.metrics, m.Name)
					}
				}
			}
		}
		resp = &colmetrics.ExportMetricsServiceResponse{}
	default:
		http.NotFound(w, r)
		return
	}
	if err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	out, _ := proto.Marshal(resp)
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// noteService records the service.name of a signal's resource.
func (rc *otlpReceiver) noteService(signal string, attrs []*common.KeyValue) {
	for _, kv := range attrs {
		if kv.Key == "service.name" {
			rc.service[signal] = kv.GetValue().GetStringValue()
		}
	}
}

// TestProxyExportsOTLPAndLogsRequests: with OTEL_EXPORTER_OTLP_ENDPOINT the
// proxy exports the idempotency span (in the caller's trace) and the
// metrics over OTLP/HTTP, under the service name of OTEL_SERVICE_NAME (or
// idem-proxy, never unknown_service), the upstream gets the span's
// traceparent, and each request is one JSON log line without the key or
// the Authorization header.
func TestProxyExportsOTLPAndLogsRequests(t *testing.T) {
	rc := &otlpReceiver{service: map[string]string{}}
	collector := httptest.NewServer(rc)
	defer collector.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	t.Setenv("OTEL_SERVICE_NAME", "")
	t.Setenv("OTEL_METRIC_EXPORT_INTERVAL", "100")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")

	got := make(chan string, 4)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("traceparent")
		w.WriteHeader(http.StatusCreated)
	}))
	defer upstream.Close()
	p := startProxy(t, "--upstream", upstream.URL, "--store", "sqlite:"+filepath.Join(t.TempDir(), "p.db"), "--log-format", "json")
	const caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, p.addr+"/charges?token=secret-query", strings.NewReader(`{}`))
		req.Header.Set("Authorization", "Bearer sk_live_secret")
		req.Header.Set("Idempotency-Key", `"order-secret-42"`)
		req.Header.Set("traceparent", caller)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	if tp := <-got; !strings.HasPrefix(tp, "00-0af7651916cd43dd8448eb211c80319c-") || strings.Contains(tp, "b7ad6b7169203331") {
		t.Errorf("upstream traceparent %q: want the caller's trace with the proxy's span as parent", tp)
	}
	testenv.Eventually(t, 30*time.Second, "spans and metrics reach the OTLP receiver", func() bool {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		return len(rc.spans) > 0 && strings.Contains(strings.Join(rc.metrics, " "), "idem.http.request.duration")
	}, func() string {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		return "spans " + strings.Join(rc.spans, ",") + "; metrics " + strings.Join(rc.metrics, ",")
	})
	rc.mu.Lock()
	if rc.service["traces"] != "idem-proxy" || rc.service["metrics"] != "idem-proxy" {
		t.Errorf("service.name %v, want idem-proxy", rc.service)
	}
	rc.mu.Unlock()

	logs := p.stderr()
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(logs), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "request" {
			lines = append(lines, m)
		}
	}
	if len(lines) != 2 {
		t.Fatalf("%d request lines, want 2; stderr:\n%s", len(lines), logs)
	}
	if lines[0]["outcome"] != "Processed" || lines[1]["outcome"] != "Duplicate" || lines[1]["replayed"] != true ||
		lines[0]["key_hash"] == nil || lines[0]["key_hash"] != lines[1]["key_hash"] || lines[0]["path"] != "/charges" || lines[0]["status"] != float64(201) {
		t.Errorf("request lines %v", lines)
	}
	for _, secret := range []string{"order-secret-42", "sk_live_secret", "secret-query"} {
		if strings.Contains(logs, secret) {
			t.Errorf("the log holds %q:\n%s", secret, logs)
		}
	}
}
