package console_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/console"
)

// Before any action, /metrics serves every series of
// idem_console_actions_total at zero.
func TestActionsCounterStartsAtZero(t *testing.T) {
	var reg *prometheus.Registry
	metrics := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(w, r)
	})
	f := newFixture(t, idem.NewMemoryStore(nil), console.Config{Metrics: metrics})
	reg = f.reg
	code, body, _ := f.get("/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	n := 0
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, "idem_console_actions_total{") {
			n++
			if !strings.HasSuffix(line, " 0") {
				t.Errorf("series not at zero: %s", line)
			}
		}
	}
	// Five action kinds by five results, and the refused form of no kind.
	if n != 26 {
		t.Errorf("%d series of idem_console_actions_total, want 26:\n%s", n, body)
	}
	for _, want := range []string{
		`idem_console_actions_total{action="retry",result="changed"} 0`,
		`idem_console_actions_total{action="purge",result="repeated"} 0`,
		`idem_console_actions_total{action="unknown",result="refused"} 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
