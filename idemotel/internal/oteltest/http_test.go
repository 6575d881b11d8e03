package oteltest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemotel"
)

const apiConsumer = "idemhttp:api"

// coreRequest is what the core's lease engine reports for a request that
// reached the store; nil for one answered before (no core events).
type coreRequest struct {
	out     idem.Outcome
	reason  idem.DuplicateReason
	claimed bool
	storeOp string // an idem.HookStoreError call, when set
}

// httpRequest feeds the Observer the events idemhttp's middleware reports
// for one request, under a server span as an HTTP server's tracing would
// start: the core's start, claim, store error, outcome and end when the
// key reached the store (core != nil), then the ResponseEvent with the
// request's context. It returns the server span.
func httpRequest(b *testBundle, id string, core *coreRequest, resp idemhttp.ResponseEvent) trace.Span {
	ctx, server := b.tp.Tracer("server").Start(context.Background(), "POST /charges", trace.WithSpanKind(trace.SpanKindServer))
	defer server.End()
	if core != nil {
		pctx := b.obs.OnProcessStart(ctx, idem.ProcessStartEvent{Consumer: apiConsumer, Mode: idem.ModeLease, MessageID: id})
		if core.claimed {
			b.obs.OnClaim(pctx, idem.ClaimEvent{Consumer: apiConsumer, MessageID: id, Mode: idem.ModeLease, Attempt: 1, Token: 7, Latency: time.Millisecond})
		}
		if core.storeOp != "" {
			b.obs.OnStoreError(pctx, idem.StoreErrorEvent{Consumer: apiConsumer, Mode: idem.ModeLease, Op: core.storeOp, Err: idem.ErrStore})
		}
		out := core.out
		out.MessageID = id
		b.obs.OnOutcome(pctx, idem.OutcomeEvent{Outcome: out, Consumer: apiConsumer, Mode: idem.ModeLease, Reason: core.reason,
			Claimed: core.claimed, Released: core.claimed && out.Status == idem.Failed, Latency: 2 * time.Millisecond})
		var err error
		if !out.Ack() {
			err = out.Err
		}
		b.obs.OnProcessEnd(pctx, idem.ProcessEndEvent{Consumer: apiConsumer, Mode: idem.ModeLease, MessageID: id, Latency: 3 * time.Millisecond, Err: err})
		resp.Outcome = core.out.Status
	}
	resp.Consumer, resp.RecordID, resp.Latency = apiConsumer, id, 4*time.Millisecond
	b.obs.OnResponse(ctx, resp)
	return server
}

func apiAttrs(kv ...string) map[string]string {
	m := map[string]string{"idem.consumer": apiConsumer, "messaging.system": ""}
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// An idemhttp middleware's requests (consumer "idemhttp:...") are counted
// by idem.messages from the core's events when they reach the store, and
// by idem.http.responses with their HTTP status from the ResponseEvent,
// which also times them (idem.http.request.duration), those rejected
// before the store included; they carry no messaging.system even when the
// Observer has one, their idempotency spans are of kind internal with the
// record ID, and the status lands on the server span; a message consumer
// on the same Observer keeps its messaging attributes.
func TestHTTPRequests(t *testing.T) {
	t.Parallel()
	b := setup(t) // WithMessagingSystem("kafka")
	servers := map[string]trace.Span{}
	servers["processed"] = httpRequest(b, "scope:k1", &coreRequest{out: idem.Outcome{Status: idem.Processed, Attempt: 1}, claimed: true},
		idemhttp.ResponseEvent{Status: 201, Executed: true, Attempt: 1})
	servers["replay"] = httpRequest(b, "scope:k1", &coreRequest{out: idem.Outcome{Status: idem.Duplicate, Attempt: 1}, reason: idem.DuplicateCompleted},
		idemhttp.ResponseEvent{Status: 201, Replayed: true})
	servers["reused"] = httpRequest(b, "scope:k1", &coreRequest{out: idem.Outcome{Status: idem.FingerprintMismatch,
		Err: fmt.Errorf("%w: %w", idem.ErrFingerprintMismatch, idemhttp.ErrKeyReused)}, reason: idem.DuplicateFingerprintMismatch},
		idemhttp.ResponseEvent{Status: 422, Problem: idemhttp.ProblemKeyReused})
	servers["no scope"] = httpRequest(b, "", nil, idemhttp.ResponseEvent{Status: 401, Problem: idemhttp.ProblemScopeMissing})
	servers["invalid key"] = httpRequest(b, "", nil, idemhttp.ResponseEvent{Status: 400, Problem: idemhttp.ProblemKeyInvalid})
	servers["aborted"] = httpRequest(b, "scope:k2", &coreRequest{out: idem.Outcome{Status: idem.Failed, Err: errors.New("connection aborted")}, claimed: true},
		idemhttp.ResponseEvent{Executed: true, Attempt: 1})
	servers["store down"] = httpRequest(b, "scope:k3", &coreRequest{out: idem.Outcome{Status: idem.Failed, Err: fmt.Errorf("%w: down", idem.ErrStore)}, storeOp: "acquire"},
		idemhttp.ResponseEvent{Status: 503, Problem: idemhttp.ProblemUnavailable})

	c, err := idem.NewLeaseConsumer(b.store, b.config(idem.Config{Name: "payments"}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ok := func(context.Context, *idem.Attempt) (idem.Result, error) { return idem.Result{}, nil }
	if _, err := c.Process(t.Context(), idem.Message{ID: "m1", Payload: []byte("x")}, ok); err != nil {
		t.Fatal(err)
	}

	ms := b.collect(t)
	// The core's counters: the requests that reached the store, without
	// the HTTP status.
	expect(t, "messages", sum(t, ms, "idem.messages", apiAttrs("idem.mode", "lease")), 5)
	expect(t, "messages without a status code", sum(t, ms, "idem.messages", apiAttrs("http.response.status_code", "")), 5)
	expect(t, "processed", sum(t, ms, "idem.messages", apiAttrs("idem.status", "processed")), 1)
	expect(t, "duplicate", sum(t, ms, "idem.messages", apiAttrs("idem.status", "duplicate", "idem.duplicate.reason", "completed")), 1)
	expect(t, "mismatch", sum(t, ms, "idem.messages", apiAttrs("idem.status", "fingerprint_mismatch")), 1)
	expect(t, "failed", sum(t, ms, "idem.messages", apiAttrs("idem.status", "failed")), 2)
	expect(t, "rejected (never reached the store)", sum(t, ms, "idem.messages", apiAttrs("idem.status", "rejected")), 0)
	expect(t, "claims", sum(t, ms, "idem.claims", apiAttrs()), 2)
	expect(t, "claims active", sum(t, ms, "idem.claims.active", apiAttrs()), 0)
	expect(t, "claims released", sum(t, ms, "idem.claims.released", apiAttrs()), 1)
	expect(t, "store errors", sum(t, ms, "idem.store.errors", apiAttrs("idem.store.operation", "acquire")), 1)

	// The responses: every request, by status code.
	resp := func(code, status, replayed string) int64 {
		return sum(t, ms, "idem.http.responses", apiAttrs("http.response.status_code", code, "idem.status", status, "idem.http.replayed", replayed))
	}
	expect(t, "responses", sum(t, ms, "idem.http.responses", apiAttrs()), 7)
	expect(t, "201 processed", resp("201", "processed", "false"), 1)
	expect(t, "201 replayed", resp("201", "duplicate", "true"), 1)
	expect(t, "422 mismatch", resp("422", "fingerprint_mismatch", "false"), 1)
	expect(t, "401 rejected", resp("401", "rejected", "false"), 1)
	expect(t, "400 rejected", resp("400", "rejected", "false"), 1)
	expect(t, "failed without a response", resp("", "failed", "false"), 1)
	expect(t, "503 failed", resp("503", "failed", "false"), 1)

	dur := func(kv ...string) uint64 { return histCount(t, ms, "idem.http.request.duration", apiAttrs(kv...)) }
	expect(t, "HTTP durations", dur(), 7)
	expect(t, "HTTP durations carry no idem.mode", dur("idem.mode", "lease"), 0)
	expect(t, "HTTP duration of a success", dur("idem.status", "processed", "http.response.status_code", "201", "error.type", ""), 1)
	expect(t, "HTTP duration of a replay", dur("idem.status", "duplicate", "http.response.status_code", "201", "error.type", ""), 1)
	expect(t, "HTTP duration of a mismatch", dur("idem.status", "fingerprint_mismatch", "http.response.status_code", "422", "error.type", "fingerprint_mismatch"), 1)
	expect(t, "HTTP duration of a rejection: error.type is the status", dur("idem.status", "rejected", "http.response.status_code", "401", "error.type", "401"), 1)
	expect(t, "HTTP duration of an invalid key", dur("idem.status", "rejected", "http.response.status_code", "400", "error.type", "400"), 1)
	expect(t, "HTTP duration without a response", dur("idem.status", "failed", "http.response.status_code", "", "error.type", "handler"), 1)
	expect(t, "HTTP duration of a store failure", dur("idem.status", "failed", "http.response.status_code", "503", "error.type", "store"), 1)
	expect(t, "HTTP requests as message processing", histCount(t, ms, "messaging.process.duration", map[string]string{"idem.consumer": apiConsumer}), 0)
	expect(t, "the message consumer keeps messaging.system", sum(t, ms, "idem.messages",
		map[string]string{"idem.consumer": "payments", "messaging.system": "kafka", "idem.status": "processed"}), 1)
	expect(t, "the message consumer's duration", histCount(t, ms, "messaging.process.duration",
		map[string]string{"idem.consumer": "payments", "messaging.system": "kafka"}), 1)

	spans := b.spans.GetSpans()
	serverCodes := map[trace.SpanID]string{}
	var httpSpans int
	for _, s := range spans {
		switch {
		case s.Name == "process":
			continue
		case s.SpanKind == trace.SpanKindServer:
			serverCodes[s.SpanContext.SpanID()] = spanAttr(s, "http.response.status_code")
			continue
		}
		httpSpans++
		if s.Name != "idempotency idemhttp:api" || s.SpanKind != trace.SpanKindInternal {
			t.Errorf("span %q kind %v, want idempotency idemhttp:api, internal", s.Name, s.SpanKind)
		}
		for _, k := range []string{"messaging.system", "messaging.message.id", "messaging.operation.name", "messaging.operation.type", "http.response.status_code"} {
			if v := spanAttr(s, k); v != "" {
				t.Errorf("span %q has %s=%q", s.Name, k, v)
			}
		}
		status, id := spanAttr(s, "idem.status"), spanAttr(s, "idem.record.id")
		switch status {
		case "processed", "duplicate", "fingerprint_mismatch":
			expect(t, status+" span record ID", id, "scope:k1")
		}
		switch status {
		case "processed", "duplicate":
			expect(t, status+" span status", s.Status.Code, codes.Unset)
		case "fingerprint_mismatch":
			expect(t, "mismatch span status", s.Status.Code, codes.Error)
			expect(t, "mismatch error.type", spanAttr(s, "error.type"), "fingerprint_mismatch")
		case "failed":
			expect(t, "failed span status", s.Status.Code, codes.Error)
		default:
			t.Errorf("span with idem.status %q", status)
		}
		if status == "processed" {
			var claimed bool
			for _, ev := range s.Events {
				if ev.Name == "idem.claim" {
					for _, kv := range ev.Attributes {
						claimed = claimed || (kv.Key == idemotel.RecordIDKey && kv.Value.AsString() == "scope:k1")
					}
				}
			}
			if !claimed {
				t.Errorf("processed span events %+v lack idem.claim with idem.record.id", s.Events)
			}
		}
	}
	expect(t, "idempotency spans (requests that reached the store)", httpSpans, 5)
	for name, want := range map[string]string{"processed": "201", "replay": "201", "reused": "422", "no scope": "401",
		"invalid key": "400", "aborted": "", "store down": "503"} {
		expect(t, name+": server span status code", serverCodes[servers[name].SpanContext().SpanID()], want)
	}
}

// A real idemhttp middleware over the memory store, with the Observer in
// Options.Hooks, behind an HTTP server: a new key (201), its replay, the
// key reused with another body (422) and an invalid key (400, answered
// before the store) are all counted and timed with their status; the
// core's counters see the three that reached the store.
func TestHTTPMiddleware(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mw, err := idemhttp.New(idem.NewMemoryStore(nil), idemhttp.Options{
		Namespace:     "api",
		Scope:         func(r *http.Request) (string, error) { return r.Header.Get("Authorization"), nil },
		PurgeInterval: -1,
		Hooks:         []idem.Hook{b.obs},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	if mw.Consumer() != apiConsumer {
		t.Fatalf("consumer %q, want %q", mw.Consumer(), apiConsumer)
	}
	var ran int
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran++
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"ch_1"}`)
	}))
	// A server span around the middleware, as an HTTP server's tracing
	// would start.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, span := b.tp.Tracer("server").Start(r.Context(), r.Method+" "+r.URL.Path, trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		h.ServeHTTP(w, r.WithContext(ctx))
	}))
	defer srv.Close()

	send := func(key, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/charges", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer alice")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idemhttp.HeaderIdempotencyKey, key)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Header.Get("Idempotent-Replayed")
	}
	for _, c := range []struct {
		what, key, body string
		code            int
		replayed        string
	}{
		{"new key", `"charge-1"`, `{"cents":100}`, 201, ""},
		{"replay", `"charge-1"`, `{"cents":100}`, 201, "true"},
		{"key reused", `"charge-1"`, `{"cents":999}`, 422, ""},
		{"invalid key", `bad,key`, `{"cents":100}`, 400, ""},
	} {
		code, replayed := send(c.key, c.body)
		expect(t, c.what+" status", code, c.code)
		expect(t, c.what+" Idempotent-Replayed", replayed, c.replayed)
	}
	expect(t, "handler runs", ran, 1)

	ms := b.collect(t)
	resp := func(code, status, replayed string) int64 {
		return sum(t, ms, "idem.http.responses", apiAttrs("http.response.status_code", code, "idem.status", status, "idem.http.replayed", replayed))
	}
	expect(t, "responses", sum(t, ms, "idem.http.responses", apiAttrs()), 4)
	expect(t, "201 processed", resp("201", "processed", "false"), 1)
	expect(t, "201 replayed", resp("201", "duplicate", "true"), 1)
	expect(t, "422 key reused", resp("422", "fingerprint_mismatch", "false"), 1)
	expect(t, "400 invalid key", resp("400", "rejected", "false"), 1)

	dur := func(kv ...string) uint64 { return histCount(t, ms, "idem.http.request.duration", apiAttrs(kv...)) }
	expect(t, "HTTP durations", dur(), 4)
	expect(t, "201 durations, no error", dur("http.response.status_code", "201", "error.type", ""), 2)
	expect(t, "422 duration", dur("http.response.status_code", "422", "idem.status", "fingerprint_mismatch", "error.type", "fingerprint_mismatch"), 1)
	expect(t, "400 duration", dur("http.response.status_code", "400", "idem.status", "rejected", "error.type", "400"), 1)
	if h, ok := ms["idem.http.request.duration"].Data.(metricdata.Histogram[float64]); ok {
		for _, p := range h.DataPoints {
			if p.Sum <= 0 {
				t.Errorf("duration %v of %v not positive", p.Sum, p.Attributes.Encoded(nil))
			}
		}
	}

	expect(t, "messages (requests that reached the store)", sum(t, ms, "idem.messages", apiAttrs("idem.mode", "lease")), 3)
	expect(t, "processed", sum(t, ms, "idem.messages", apiAttrs("idem.status", "processed")), 1)
	expect(t, "duplicate", sum(t, ms, "idem.messages", apiAttrs("idem.status", "duplicate", "idem.duplicate.reason", "completed")), 1)
	expect(t, "mismatch", sum(t, ms, "idem.messages", apiAttrs("idem.status", "fingerprint_mismatch", "idem.duplicate.reason", "fingerprint_mismatch")), 1)
	expect(t, "claims", sum(t, ms, "idem.claims", apiAttrs()), 1)
	expect(t, "claims active", sum(t, ms, "idem.claims.active", apiAttrs()), 0)
	if _, ok := ms["messaging.process.duration"]; ok {
		t.Error("the middleware's requests recorded messaging.process.duration")
	}

	var idemSpans int
	var codes []string
	for _, s := range b.spans.GetSpans() {
		switch s.SpanKind {
		case trace.SpanKindServer:
			codes = append(codes, spanAttr(s, "http.response.status_code"))
		case trace.SpanKindInternal:
			idemSpans++
			expect(t, "idempotency span name", s.Name, "idempotency "+apiConsumer)
		}
	}
	expect(t, "idempotency spans", idemSpans, 3)
	expect(t, "server span status codes", strings.Join(codes, ","), "201,201,422,400")
}
