package idemcli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
)

func TestConsumeUsageErrors(t *testing.T) {
	t.Parallel()
	base := []string{"consume", "--broker", "nats://127.0.0.1:1", "--from", "x", "--to", "http://127.0.0.1:1/in", "--store", "sqlite:" + t.TempDir() + "/x.db"}
	for _, tt := range []struct {
		name, flag, value, want string
	}{
		{"no target", "--to", "", "--to is required"},
		{"not http", "--to", "ftp://host/x", "--to"},
		{"relative", "--to", "/in", "--to"},
		{"no concurrency", "--concurrency", "0", "--concurrency"},
		{"hold below concurrency", "--hold", "4", "--hold"},
		{"hold too large", "--hold", "5000", "--hold"},
		{"no attempts", "--max-attempts", "0", "--max-attempts"},
		{"short ack wait", "--ack-wait", "10ms", "--ack-wait"},
		{"Kafka instance ID on NATS", "--kafka-instance-id", "sidecar-1", "--kafka-instance-id"},
		{"Kafka order on NATS", "--kafka-order", "key", "--kafka-order is for a kafka"},
		{"bad Kafka order", "--kafka-order", "offset", "want partition or key"},
		{"point at call at least once", "--point-at-call=true", "--at-least-once=true", "--point-at-call"},
		{"bad health address", "--health-addr", "nohost", "--health-addr"},
		{"bad log format", "--log-format", "xml", "--log-format"},
		{"bad log level", "--log-level", "loud", "--log-level"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			args := slices.Clone(base)
			if i := slices.Index(args, tt.flag); i >= 0 {
				args[i+1] = tt.value
			} else {
				args = append(args, tt.flag, tt.value)
			}
			code, _, errOut := run(t, args...)
			if code != 2 || !strings.Contains(errOut, tt.want) {
				t.Fatalf("exit %d, stderr %q; want 2 naming %s", code, errOut, tt.want)
			}
		})
	}
}

func TestPublishPlan(t *testing.T) {
	t.Parallel()
	f := &publishFlags{broker: "nats://x", to: "s", count: 50, duplicates: 0.2, prefix: "m-", seed: 7, concurrency: 1}
	ids, err := f.plan()
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 60 {
		t.Fatalf("%d IDs, want 50 + 10 duplicates", len(ids))
	}
	seen := map[string]bool{}
	for i, id := range ids {
		if !seen[id] && id != fmt.Sprintf("m-%06d", len(seen)) {
			t.Fatalf("ID %d is %s: a first copy out of order, or a duplicate before its first copy", i, id)
		}
		seen[id] = true
	}
	again, _ := f.plan()
	if !slices.Equal(ids, again) {
		t.Error("the same flags planned other messages")
	}
	if string(f.payloadOf("m-000003", 3)) != `{"id":"m-000003","n":3}` {
		t.Errorf("payload %s", f.payloadOf("m-000003", 3))
	}
	for _, bad := range []*publishFlags{
		{broker: "nats://x", to: "s", concurrency: 1},
		{broker: "nats://x", to: "s", id: "a", count: 3, concurrency: 1},
		{broker: "nats://x", to: "s", id: "a", duplicates: 0.5, concurrency: 1},
		{broker: "nats://x", to: "s", count: -1, concurrency: 1},
		{to: "s", id: "a", concurrency: 1},
		{broker: "nats://x", to: "s", id: "a"},
	} {
		if _, err := bad.plan(); err == nil {
			t.Errorf("plan(%+v): no error", bad)
		}
	}
}

func TestConsumeHealthHasNoErrorText(t *testing.T) {
	t.Parallel()
	var healthy atomic.Bool
	h, err := serveHealth("127.0.0.1:0", func(context.Context) bool { return healthy.Load() })
	if err != nil {
		t.Fatal(err)
	}
	defer h.close()
	get := func() (int, string) {
		resp, err := http.Get("http://" + h.addr + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	if code, body := get(); code != http.StatusServiceUnavailable || body != `{"status":"unavailable"}` {
		t.Errorf("unhealthy: %d %s", code, body)
	}
	healthy.Store(true)
	if code, body := get(); code != http.StatusOK || body != `{"status":"ok"}` {
		t.Errorf("healthy: %d %s", code, body)
	}
}
