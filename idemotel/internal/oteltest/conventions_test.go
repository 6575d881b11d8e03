package oteltest

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// conventionRow is one row of the table in the package doc's "Semantic
// conventions" section.
type conventionRow struct{ kind, convention string }

// conventionTable parses that table from idemotel's doc.go, by kind and
// name ("metric idem.messages", "attribute idem.mode").
func conventionTable(t *testing.T) map[string]conventionRow {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("..", "..", "doc.go"))
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(src), "// # Semantic conventions\n")
	if !ok {
		t.Fatal("doc.go has no Semantic conventions section")
	}
	sec, _, _ = strings.Cut(sec, "\n// # ")
	rows := map[string]conventionRow{}
	for _, line := range strings.Split(sec, "\n") {
		line, ok := strings.CutPrefix(line, "//\t")
		if !ok {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 3 || f[0] == "name" {
			continue
		}
		rows[f[1]+" "+f[0]] = conventionRow{kind: f[1], convention: strings.Join(f[2:], " ")}
	}
	if len(rows) < 20 {
		t.Fatalf("parsed %d rows from the conventions table", len(rows))
	}
	return rows
}

// semconvKeys are the semantic-convention names idem may use, from the
// semconv package whose version the table names: a row claiming a
// convention must be one of them.
var semconvKeys = map[string]bool{
	string(semconv.MessagingSystemKey): true, string(semconv.MessagingOperationNameKey): true,
	string(semconv.MessagingOperationTypeKey): true, string(semconv.MessagingDestinationNameKey): true,
	string(semconv.MessagingDestinationTemplateKey): true, string(semconv.MessagingConsumerGroupNameKey): true,
	string(semconv.MessagingMessageIDKey): true, string(semconv.MessagingBatchMessageCountKey): true,
	string(semconv.HTTPRequestMethodKey): true, string(semconv.HTTPRouteKey): true,
	string(semconv.HTTPResponseStatusCodeKey): true, string(semconv.ErrorTypeKey): true,
	string(semconv.ExceptionMessageKey): true,
	"messaging.process.duration":        true, // the metric (messagingconv.ProcessDuration)
}

// TestConventionTable: each row names a real convention of the version
// the Observer's schema URL declares, or is in the idem namespace.
func TestConventionTable(t *testing.T) {
	t.Parallel()
	version := strings.TrimPrefix(semconv.SchemaURL, "https://opentelemetry.io/schemas/")
	for key, r := range conventionTable(t) {
		_, name, _ := strings.Cut(key, " ")
		switch {
		case r.convention == "idem":
			if !strings.HasPrefix(name, "idem.") {
				t.Errorf("%s: idem's own name outside the idem namespace", name)
			}
			if semconvKeys[name] {
				t.Errorf("%s: has a convention, yet the table says idem", name)
			}
		case !strings.HasSuffix(r.convention, " v"+version):
			t.Errorf("%s: convention %q, want one of v%s (the schema URL)", name, r.convention, version)
		case !semconvKeys[name]:
			t.Errorf("%s: not a name of the semantic conventions v%s", name, version)
		}
		if r.kind != "metric" && r.kind != "attribute" {
			t.Errorf("%s: kind %q", name, r.kind)
		}
	}
}

// checkConventions checks every metric, metric attribute, span attribute
// and span event attribute b's Observer emitted against the table. Every
// test's setup runs it at the end.
func checkConventions(t *testing.T, b *testBundle) {
	t.Helper()
	rows := conventionTable(t)
	var rm metricdata.ResourceMetrics
	if err := b.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	attrs := func(where string, set attribute.Set) {
		for _, kv := range set.ToSlice() {
			if _, ok := rows["attribute "+string(kv.Key)]; !ok {
				t.Errorf("%s: attribute %s is not in the conventions table", where, kv.Key)
			}
		}
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if _, ok := rows["metric "+m.Name]; !ok {
				t.Errorf("metric %s is not in the conventions table", m.Name)
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					attrs(m.Name, p.Attributes)
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					attrs(m.Name, p.Attributes)
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					attrs(m.Name, p.Attributes)
				}
			default:
				t.Errorf("metric %s: unexpected data %T", m.Name, m.Data)
			}
		}
	}
	for _, s := range b.spans.GetSpans() {
		if s.InstrumentationScope.Name != "github.com/idem-go/idem/idemotel" {
			continue
		}
		attrs("span "+s.Name, attribute.NewSet(s.Attributes...))
		for _, e := range s.Events {
			if e.Name == "exception" { // RecordError's event, the exception conventions'
				continue
			}
			attrs("span "+s.Name+" event "+e.Name, attribute.NewSet(e.Attributes...))
		}
	}
}

// TestConventionsOfADelivery: a broker delivery and a routed HTTP request
// carry the conventions' attributes with the broker's values: the span is
// "process <destination>", the consumer group is the broker's (not the
// idem consumer name), and idem.http.request.duration has
// http.request.method and http.route.
func TestConventionsOfADelivery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, err := idem.NewConsumer(b.store, b.config(idem.Config{Name: "payments"}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := idem.WithDelivery(t.Context(), idem.Delivery{System: "kafka", Destination: "orders", ConsumerGroup: "ledger"})
	ok := func(context.Context, *idem.MemoryTx, idem.Message) error { return nil }
	if _, err := c.Process(ctx, idem.Message{ID: "m1", Payload: []byte("a")}, ok); err != nil {
		t.Fatal(err)
	}
	_, _ = c.Process(ctx, idem.Message{ID: "m2", Payload: []byte("a")}, func(context.Context, *idem.MemoryTx, idem.Message) error { return errors.New("boom") })

	mw, err := idemhttp.New(idem.NewMemoryStore(nil), idemhttp.Options{Namespace: "api", PurgeInterval: -1, Hooks: []idem.Hook{b.obs},
		Scope: func(r *http.Request) (string, error) { return r.Header.Get("Authorization"), nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	mux := http.NewServeMux()
	mux.Handle("POST /charges/{id}", mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(201) })))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/charges/42", strings.NewReader("{}"))
	req.Header.Set("Authorization", "Bearer a")
	req.Header.Set(idemhttp.HeaderIdempotencyKey, `"k"`)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	ms := b.collect(t)
	delivery := map[string]string{"idem.consumer": "payments", "messaging.system": "kafka",
		"messaging.destination.name": "orders", "messaging.consumer.group.name": "ledger"}
	expect(t, "process calls with the delivery's attributes", histCount(t, ms, "messaging.process.duration", delivery), 2)
	expect(t, "messages with the delivery's attributes", sum(t, ms, "idem.messages", delivery), 2)
	expect(t, "HTTP request with method and route", histCount(t, ms, "idem.http.request.duration",
		map[string]string{"http.request.method": "POST", "http.route": "/charges/{id}", "http.response.status_code": "201"}), 1)
	var names []string
	for _, s := range b.spans.GetSpans() {
		names = append(names, s.Name)
	}
	if n := strings.Count(strings.Join(names, ";")+";", "process orders;"); n != 2 {
		t.Errorf("spans %v: want two named \"process orders\"", names)
	}
}
