//go:build !nodemo

package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/cmd/idem/internal/console"
)

// TestDemoConsole runs the demo with --console: after the report (every
// payment charged once, the verdict unchanged), the console is up on the
// demo's store with the staged work, which every page's JSON endpoint
// shows: the consumers, the refused refunds failed for good with their
// cause, the held lease in progress, the failed outbox rows grouped by
// their error, one refund's record; and the run's own records beside them.
// Cancelling the context stops the console and Run returns nil.
func TestDemoConsole(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	up := make(chan string, 1)
	o := &Options{
		Messages: 200, Duplicates: 0.1, CrashRate: 0.02, Consumers: 2,
		Store: "sqlite:", Broker: "nats:embedded", AckWait: 300 * time.Millisecond, Timeout: 3 * time.Minute,
		Seed: 1, JSON: true, Progress: "none", Console: true, ConsoleAddr: "127.0.0.1:0",
		consoleUp: func(url string) { up <- url },
	}
	// stderr is read once the console is up (written before consoleUp) or
	// once Run returned.
	var out, errOut bytes.Buffer
	done := make(chan error, 1)
	go func() { done <- Run(ctx, o, &out, &errOut) }()
	var base string
	select {
	case base = <-up:
	case err := <-done:
		t.Fatalf("the demo ended without a console: %v\nstderr: %s", err, errOut.String())
	}
	if !strings.Contains(errOut.String(), "idem demo: console on "+base) {
		t.Errorf("stderr does not say where the console is: %q", errOut.String())
	}

	var consumers console.ConsumersView
	get(t, base, "api/consumers", nil, &consumers)
	var names []string
	for _, c := range consumers.Consumers {
		names = append(names, c.Consumer)
	}
	for _, want := range []string{demoConsumer, refundsConsumer} {
		if !slices.Contains(names, want) {
			t.Errorf("consumers %v lack %s", names, want)
		}
	}
	if consumers.Outbox == nil || consumers.Outbox.Failed != int64(len(refundsEvents)) || consumers.Outbox.Pending != 0 {
		t.Errorf("outbox backlog %+v, want %d failed and none pending", consumers.Outbox, len(refundsEvents))
	}

	var failed console.RecordPageView
	get(t, base, "api/failed", url.Values{"consumer": {refundsConsumer}}, &failed)
	var ids []string
	for _, r := range failed.Records {
		ids = append(ids, r.MessageID)
		if r.State != "failed" || !strings.Contains(r.Error, errCardExpired.Error()) {
			t.Errorf("failed record %+v: want state failed and the cause %q", r, errCardExpired)
		}
	}
	slices.Sort(ids)
	if !slices.Equal(ids, refundsRefused) {
		t.Errorf("failed records %v, want %v", ids, refundsRefused)
	}

	var leases console.RecordPageView
	get(t, base, "api/failed", url.Values{"consumer": {refundsConsumer}, "state": {"in_progress"}}, &leases)
	if len(leases.Records) != 1 || leases.Records[0].MessageID != refundHeld || !leases.Records[0].LeaseLive || leases.Records[0].Token == 0 {
		t.Errorf("leases in progress %+v, want %s's live lease with its token", leases.Records, refundHeld)
	}

	var outbox console.OutboxView
	get(t, base, "api/outbox", nil, &outbox)
	if len(outbox.Groups) != 1 || outbox.Groups[0].Count != int64(len(refundsEvents)) || !strings.Contains(outbox.Groups[0].Error, errNoRoute.Error()) {
		t.Errorf("outbox groups %+v, want one of %d rows with the error %q", outbox.Groups, len(refundsEvents), errNoRoute)
	}
	if len(outbox.Rows) != len(refundsEvents) || outbox.Rows[0].Destination != refundsDestination {
		t.Errorf("outbox rows %+v, want %d to %s", outbox.Rows, len(refundsEvents), refundsDestination)
	}

	var msg console.MessageView
	get(t, base, "api/message", url.Values{"consumer": {refundsConsumer}, "id": {refundsRefused[0]}}, &msg)
	if msg.MessageID != refundsRefused[0] || msg.State != "failed" || msg.Attempt != 1 {
		t.Errorf("message %+v, want %s failed at its first attempt", msg.RecordView, refundsRefused[0])
	}
	var paid console.MessageView
	get(t, base, "api/message", url.Values{"consumer": {demoConsumer}, "id": {"pay-0000000"}}, &paid)
	if paid.State != "completed" {
		t.Errorf("the run's payment pay-0000000: %+v, want completed", paid.RecordView)
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("demo: %v\nstderr: %s", err, errOut.String())
	}
	var rep report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("report: %v\n%s", err, out.String())
	}
	wantChargedOnce(t, rep, 200)
	wantReceiptedOnce(t, rep, 200)
	if !rep.OK {
		t.Errorf("verdict %q, want ok", rep.Verdict)
	}
}

// TestDemoConsoleRefusals: --console refuses an address beyond loopback
// (the demo's console has no token, and the refusal does not ask for a
// --token the demo lacks) and a Redis store, and --console-addr without
// --console is refused rather than ignored, all before the run.
func TestDemoConsoleRefusals(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--console", "--console-addr", "0.0.0.0:0"},
		{"--console", "--store", "redis://127.0.0.1:1/0"},
		{"--console-addr", "127.0.0.1:0"},
	} {
		code, out, errOut := run(t, append([]string{"demo", "--messages", "1", "--progress", "none"}, args...)...)
		if code != 2 || !strings.Contains(errOut, "--console") || out != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want 2, no report, and why", args, code, out, errOut)
		}
		if strings.Contains(errOut, "set --token") {
			t.Errorf("%v: stderr %q asks for --token, which idem demo does not have", args, errOut)
		}
	}
}

// get GETs base+path?q and decodes its JSON into v.
func get(t *testing.T, base, path string, q url.Values, v any) {
	t.Helper()
	u := base + path
	if q != nil {
		u += "?" + q.Encode()
	}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, u, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		t.Fatalf("GET %s: %s, Content-Type %q", u, resp.Status, resp.Header.Get("Content-Type"))
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
}
