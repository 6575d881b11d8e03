package console_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/idemdriver"
)

// Purge now deletes the records outrun by the window, once: posted twice
// it acts once, and a second confirmation deletes nothing and says so,
// as does a purge of an unknown consumer.
func TestPurgeNowOnce(t *testing.T) {
	clk := &clock{t: time.Date(2026, 12, 6, 1, 0, 0, 0, time.UTC)}
	store := idem.NewMemoryStore(clk.now)
	ctx := t.Context()
	if err := store.MarkRunning(ctx, &idemdriver.MarkRunningParams{Consumer: "payments"}); err != nil {
		t.Fatal(err)
	}
	c, err := idem.NewConsumer[*idem.MemoryTx](store, idem.Config{Name: "payments", PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, id := range []string{"pay-1", "pay-2", "pay-3"} {
		if _, err := c.Process(ctx, idem.Message{ID: id, Payload: []byte(id)}, func(context.Context, *idem.MemoryTx, idem.Message) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	clk.add(2 * time.Hour)
	if err := store.MarkRunning(ctx, &idemdriver.MarkRunningParams{Consumer: "payments", MaxGap: 3 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, store, console.Config{Now: clk.now})
	if _, body, _ := f.get("/consumers"); !strings.Contains(body, `name="older_than"`) {
		t.Errorf("the consumers page offers no purge: %s", body)
	}
	form := f.confirmForm("action=purge&consumer=payments&older_than=1h")
	var v console.ActionView
	for i := range 2 {
		req, _ := http.NewRequest("POST", f.srv.URL+"/action", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Accept", "application/json")
		resp, err := f.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		err = json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || !v.Changed || v.Deleted == nil || *v.Deleted != 3 {
			t.Fatalf("post %d: %d %+v %v", i+1, resp.StatusCode, v, err)
		}
	}
	st, _ := store.Stats(ctx)
	if len(st) != 0 {
		t.Errorf("records left: %+v", st)
	}
	if code, body := f.post("/action", f.confirmForm("action=purge&consumer=payments&older_than=1h")); code != 200 || !strings.Contains(body, "nothing changed") {
		t.Errorf("second purge: %d %s", code, body)
	}
	if code, body := f.post("/action", f.confirmForm("action=purge&consumer=paymnets&older_than=1h")); code != 200 || !strings.Contains(body, "unknown consumer") {
		t.Errorf("purge of an unknown consumer: %d %s", code, body)
	}
	if code, _, _ := f.get("/confirm?action=purge&consumer=payments&older_than=soon"); code != http.StatusBadRequest {
		t.Errorf("a bad window: %d, want 400", code)
	}
	ro := newFixture(t, store, console.Config{ReadOnly: true})
	if _, body, _ := ro.get("/consumers"); strings.Contains(body, "older_than") || strings.Contains(body, "/confirm") {
		t.Errorf("read-only consumers page offers a purge: %s", body)
	}
	if code, _, _ := ro.get("/confirm?action=purge&consumer=payments&older_than=1h"); code != http.StatusNotFound {
		t.Errorf("read-only purge confirm: %d, want 404", code)
	}
	for result, want := range map[string]float64{"changed": 1, "repeated": 1, "unchanged": 2} {
		if got := testutil.ToFloat64(mustCounter(t, f.reg, "purge", result)); got != want {
			t.Errorf("purge %s counted %v, want %v", result, got, want)
		}
	}
}
