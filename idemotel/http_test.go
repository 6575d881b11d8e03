package idemotel_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemotel"
)

// httpRequest feeds the Observer the events idemhttp's middleware reports
// for one request: start, claim when claimed, outcome, end.
func httpRequest(obs *idemotel.Observer, id string, out idem.Outcome, reason idem.DuplicateReason, code int, claimed bool) {
	const consumer = "idemhttp:api"
	ctx := obs.OnProcessStart(context.Background(), idem.ProcessStartEvent{Consumer: consumer, Mode: idem.ModeLease, MessageID: id})
	if claimed {
		obs.OnClaim(ctx, idem.ClaimEvent{Consumer: consumer, MessageID: id, Mode: idem.ModeLease, Attempt: 1, Token: 7, Latency: time.Millisecond})
	}
	out.MessageID = id
	obs.OnOutcome(ctx, idem.OutcomeEvent{Outcome: out, Consumer: consumer, Mode: idem.ModeLease, Reason: reason,
		Claimed: claimed, Latency: 2 * time.Millisecond})
	_ = code // the HTTP status is idemhttp's own event now (idemhttp.ResponseEvent), not the core's
	var err error
	if !out.Ack() {
		err = out.Err
	}
	obs.OnProcessEnd(ctx, idem.ProcessEndEvent{Consumer: consumer, Mode: idem.ModeLease, MessageID: id, Latency: 3 * time.Millisecond, Err: err})
}

// An idemhttp middleware's requests (consumer "idemhttp:...") are counted
// with their HTTP status, timed by idem.http.request.duration, carry no
// messaging.system even when the Observer has one, and are spans of kind
// internal named after the consumer, with the record ID; a message
// consumer on the same Observer keeps its messaging attributes.
func TestHTTPRequests(t *testing.T) {
	t.Parallel()
	b := setup(t) // WithMessagingSystem("kafka")
	httpRequest(b.obs, "scope:k1", idem.Outcome{Status: idem.Processed, Attempt: 1}, idem.NotDuplicate, 201, true)
	httpRequest(b.obs, "scope:k1", idem.Outcome{Status: idem.Duplicate, Attempt: 1}, idem.DuplicateCompleted, 201, false)
	httpRequest(b.obs, "scope:k1", idem.Outcome{Status: idem.FingerprintMismatch, Err: fmt.Errorf("%w: 422", idem.ErrFingerprintMismatch)},
		idem.DuplicateFingerprintMismatch, 422, false)
	httpRequest(b.obs, "", idem.Outcome{Status: idem.Rejected, Err: errors.New("no principal")}, idem.NotDuplicate, 401, false)
	httpRequest(b.obs, "scope:k2", idem.Outcome{Status: idem.Failed, Err: errors.New("released")}, idem.NotDuplicate, 0, true)

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
	api := func(kv ...string) map[string]string {
		m := map[string]string{"messaging.consumer.group.name": "idemhttp:api", "messaging.system": "", "idem.mode": "lease"}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	expect(t, "processed 201", sum(t, ms, "idem.messages", api("idem.status", "processed", "http.response.status_code", "201")), 1)
	expect(t, "duplicate 201", sum(t, ms, "idem.messages", api("idem.status", "duplicate", "idem.duplicate.reason", "completed", "http.response.status_code", "201")), 1)
	expect(t, "mismatch 422", sum(t, ms, "idem.messages", api("idem.status", "fingerprint_mismatch", "http.response.status_code", "422")), 1)
	expect(t, "rejected 401", sum(t, ms, "idem.messages", api("idem.status", "rejected", "http.response.status_code", "401")), 1)
	expect(t, "failed without a response", sum(t, ms, "idem.messages", api("idem.status", "failed", "http.response.status_code", "")), 1)
	expect(t, "all HTTP", sum(t, ms, "idem.messages", api()), 5)
	expect(t, "claims", sum(t, ms, "idem.claims", api()), 2)
	expect(t, "claims active", sum(t, ms, "idem.claims.active", api()), 0)
	expect(t, "HTTP durations", histCount(t, ms, "idem.http.request.duration", api()), 5)
	expect(t, "HTTP duration of a mismatch", histCount(t, ms, "idem.http.request.duration",
		api("idem.status", "fingerprint_mismatch", "http.response.status_code", "422", "error.type", "fingerprint_mismatch")), 1)
	expect(t, "HTTP duration of a rejection: error.type is the status", histCount(t, ms, "idem.http.request.duration",
		api("idem.status", "rejected", "error.type", "401")), 1)
	expect(t, "HTTP duration without a response", histCount(t, ms, "idem.http.request.duration",
		api("idem.status", "failed", "error.type", "handler")), 1)
	expect(t, "HTTP requests as message processing", histCount(t, ms, "messaging.process.duration", map[string]string{"messaging.consumer.group.name": "idemhttp:api"}), 0)
	expect(t, "the message consumer keeps messaging.system", sum(t, ms, "idem.messages",
		map[string]string{"messaging.consumer.group.name": "payments", "messaging.system": "kafka", "idem.status": "processed"}), 1)
	expect(t, "the message consumer's duration", histCount(t, ms, "messaging.process.duration",
		map[string]string{"messaging.consumer.group.name": "payments", "messaging.system": "kafka"}), 1)

	spans := b.spans.GetSpans()
	var httpSpans int
	for _, s := range spans {
		if s.Name == "process payments" {
			continue
		}
		httpSpans++
		if s.Name != "idempotency idemhttp:api" || s.SpanKind != trace.SpanKindInternal {
			t.Errorf("span %q kind %v, want idempotency idemhttp:api, internal", s.Name, s.SpanKind)
		}
		for _, k := range []string{"messaging.system", "messaging.message.id", "messaging.operation.name", "messaging.operation.type"} {
			if v := spanAttr(s, k); v != "" {
				t.Errorf("span %q has %s=%q", s.Name, k, v)
			}
		}
		status, code, id := spanAttr(s, "idem.status"), spanAttr(s, "http.response.status_code"), spanAttr(s, "idem.record.id")
		switch status {
		case "processed", "duplicate":
			expect(t, status+" span record ID", id, "scope:k1")
			expect(t, status+" span HTTP status", code, "201")
			expect(t, status+" span status", s.Status.Code, codes.Unset)
		case "fingerprint_mismatch":
			expect(t, "mismatch span HTTP status", code, "422")
			expect(t, "mismatch span status", s.Status.Code, codes.Error)
			expect(t, "mismatch error.type", spanAttr(s, "error.type"), "fingerprint_mismatch")
		case "rejected":
			expect(t, "rejected span record ID", id, "")
			expect(t, "rejected error.type", spanAttr(s, "error.type"), "401")
		case "failed":
			expect(t, "failed span HTTP status", code, "")
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
	expect(t, "HTTP spans", httpSpans, 5)
}
