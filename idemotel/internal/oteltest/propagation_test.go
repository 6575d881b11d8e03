package oteltest

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemotel"
)

// TestProxyContinuesTrace: a request with a traceparent, through an
// untraced idem proxy, gets an idempotency span in the caller's trace
// (a child of the caller's span), and the upstream receives a traceparent
// whose parent is that span; the metrics carry http.request.method.
func TestProxyContinuesTrace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	got := make(chan string, 1)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("traceparent")
		w.WriteHeader(http.StatusCreated)
	}))
	defer upstream.Close()
	u, _ := url.Parse(upstream.URL)
	p, err := idemhttp.NewProxy(u, idem.NewMemoryStore(nil), &idemhttp.ProxyOptions{
		Options:       idemhttp.Options{Namespace: "api", PurgeInterval: -1, Hooks: []idem.Hook{b.obs}},
		InjectHeaders: idemotel.NewHeaderInjector(propagation.TraceContext{}),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	srv := httptest.NewServer(p)
	defer srv.Close()

	const caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/charges", strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer alice")
	req.Header.Set(idemhttp.HeaderIdempotencyKey, `"k1"`)
	req.Header.Set("traceparent", caller)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("status %d, want 201", resp.StatusCode)
	}
	upstreamParent := <-got

	var span *tracetest.SpanStub
	for _, s := range b.spans.GetSpans() {
		if strings.HasPrefix(s.Name, "idempotency ") {
			span = &s
		}
	}
	if span == nil {
		t.Fatal("no idempotency span")
	}
	if tid := span.SpanContext.TraceID().String(); tid != "0af7651916cd43dd8448eb211c80319c" {
		t.Errorf("idempotency span in trace %s, want the caller's", tid)
	}
	if pid := span.Parent.SpanID().String(); pid != "b7ad6b7169203331" {
		t.Errorf("idempotency span's parent %s, want the caller's span", pid)
	}
	want := "00-0af7651916cd43dd8448eb211c80319c-" + span.SpanContext.SpanID().String() + "-01"
	if upstreamParent != want {
		t.Errorf("upstream traceparent %q, want %q (the idempotency span)", upstreamParent, want)
	}
	ms := b.collect(t)
	if n := histCount(t, ms, "idem.http.request.duration", map[string]string{"http.request.method": "POST", "idem.consumer": p.Middleware().Consumer()}); n != 1 {
		t.Errorf("idem.http.request.duration{http.request.method=POST} = %d, want 1", n)
	}
}

// TestInjectTraceContext: the default injector writes the W3C headers of
// the span in ctx, and nothing without one.
func TestInjectTraceContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := map[string]string{}
	idemotel.InjectTraceContext(context.Background(), func(k, v string) { h[k] = v })
	if len(h) != 0 {
		t.Fatalf("without a span: %v, want nothing", h)
	}
	ctx, span := b.tp.Tracer("t").Start(context.Background(), "publish")
	defer span.End()
	idemotel.InjectTraceContext(ctx, func(k, v string) { h[k] = v })
	want := "00-" + span.SpanContext().TraceID().String() + "-" + span.SpanContext().SpanID().String() + "-01"
	if h["traceparent"] != want {
		t.Errorf("traceparent %q, want %q", h["traceparent"], want)
	}
}
