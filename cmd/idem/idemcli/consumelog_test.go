package idemcli

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem/internal/testenv"
)

// TestConsumeLogsOneLinePerMessage: `idem consume --log-format json` logs
// one line per delivery at info with what the adapter does with it (ack, a
// redelivery after a 503 with its delay, a dead letter after a 422 with the
// service's status), on an in-process NATS server with a password, and
// never the password, the payload or a header value (nor, in its lines,
// the answer's body).
func TestConsumeLogsOneLinePerMessage(t *testing.T) {
	t.Parallel()
	const password, payloadSecret, headerSecret, bodySecret = "pw-s3cret-77", "4242-payload-secret", "hdr-secret-9", "body-secret-answer"
	brokerURL := "nats://idem:" + password + "@" + startNATS(t, "idem", password)

	// The messages wait in the stream before the sidecar starts.
	js := newStream(t, brokerURL, "ORDERS", "orders.>")
	ctx := context.Background()
	for _, id := range []string{"ord-ok", "ord-refused", "ord-busy"} {
		m := nats.NewMsg("orders.created")
		m.Header.Set(jetstream.MsgIDHeader, id)
		m.Header.Set("Authorization", "Bearer "+headerSecret)
		m.Data = []byte(`{"card":"` + payloadSecret + `"}`)
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}

	var busy atomic.Int32
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Header.Get("Idempotency-Key") {
		case "ord-refused":
			w.WriteHeader(http.StatusUnprocessableEntity)
			_, _ = w.Write([]byte(bodySecret))
		case "ord-busy":
			if busy.Add(1) == 1 {
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write([]byte(bodySecret))
				return
			}
			w.WriteHeader(http.StatusCreated)
		default:
			w.WriteHeader(http.StatusCreated)
		}
	}))
	defer svc.Close()

	var out, errOut strings.Builder
	ow, ew := &lockedWriter{w: &out}, &lockedWriter{w: &errOut}
	stderr := func() string { ew.mu.Lock(); defer ew.mu.Unlock(); return errOut.String() }
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan int, 1)
	go func() {
		done <- mainContext(rctx, []string{"consume", "--broker", brokerURL, "--from", "orders.created", "--to", svc.URL + "/orders",
			"--store", "sqlite:" + filepath.Join(t.TempDir(), "c.db"), "--log-format", "json",
			"--retry-base", "10ms", "--retry-max", "50ms", "--concurrency", "1"}, ow, ew)
	}()
	lines := func() []map[string]any {
		var ls []map[string]any
		for _, l := range strings.Split(stderr(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "message" {
				ls = append(ls, m)
			}
		}
		return ls
	}
	testenv.Eventually(t, 60*time.Second, "four message lines (ok, refused, busy twice)", func() bool { return len(lines()) >= 4 }, stderr)
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("consume exit %d:\n%s", code, stderr())
	}

	byID := map[string][]map[string]any{}
	for _, l := range lines() {
		if l["level"] != "INFO" || l["system"] != "nats" || l["destination"] != "orders.created" {
			t.Errorf("line %v: want level INFO, system nats, destination orders.created", l)
		}
		id, _ := l["message_id"].(string)
		byID[id] = append(byID[id], l)
	}
	want := func(id string, i int, fields map[string]any) {
		t.Helper()
		if len(byID[id]) <= i {
			t.Errorf("%s: %d lines, want line %d", id, len(byID[id]), i+1)
			return
		}
		for k, v := range fields {
			if got := byID[id][i][k]; got != v {
				t.Errorf("%s line %d: %s = %v, want %v (%v)", id, i+1, k, got, v, byID[id][i])
			}
		}
	}
	want("ord-ok", 0, map[string]any{"outcome": "Processed", "action": "Ack", "reason": "processed", "attempt": float64(1)})
	want("ord-refused", 0, map[string]any{"action": "DeadLetter", "reason": "permanent", "service_status": float64(422)})
	want("ord-busy", 0, map[string]any{"outcome": "Failed", "action": "Redeliver", "service_status": float64(503)})
	want("ord-busy", 1, map[string]any{"outcome": "Processed", "action": "Ack", "attempt": float64(2)})
	if l := byID["ord-busy"]; len(l) > 0 && l[0]["delay_ms"] == nil {
		t.Errorf("a redelivery line without delay_ms: %v", l[0])
	}
	if len(byID) != 3 || len(byID["ord-ok"]) != 1 || len(byID["ord-refused"]) != 1 || len(byID["ord-busy"]) != 2 {
		t.Errorf("lines by message %v: want one per delivery", byID)
	}
	for _, secret := range []string{password, payloadSecret, headerSecret} {
		if strings.Contains(stderr(), secret) || strings.Contains(out.String(), secret) {
			t.Errorf("the output holds %q:\n%s\n%s", secret, out.String(), stderr())
		}
	}
	// The adapter's own warning carries the answer (as the dead letter
	// does); the message lines give its status only.
	for _, l := range lines() {
		if b, _ := json.Marshal(l); strings.Contains(string(b), bodySecret) {
			t.Errorf("a message line holds the answer's body: %s", b)
		}
	}
}

// startNATS starts an in-process JetStream server on a loopback port with
// the account user, password, stopped when the test ends, and returns its
// host:port.
func startNATS(t *testing.T, user, password string) string {
	t.Helper()
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, Username: user, Password: password,
		JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(30 * time.Second) {
		t.Fatal("NATS server did not start")
	}
	return srv.Addr().String()
}

// newStream connects to the NATS server at brokerURL (closed at cleanup)
// and creates the stream name capturing subjects.
func newStream(t *testing.T, brokerURL, name string, subjects ...string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: name, Subjects: subjects}); err != nil {
		t.Fatal(err)
	}
	return js
}
