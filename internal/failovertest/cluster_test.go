package failovertest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"

	"github.com/idem-go/idem/internal/ownservice"
	"github.com/idem-go/idem/internal/testenv"
)

// primaryPIDFile returns the pid file of s's primary: on postgres-ha the
// node without standby.signal whose postmaster.pid exists, on redis-ha
// the node on masterPort (the master the Sentinel names).
func primaryPIDFile(s *ownservice.Service, masterPort int) (string, error) {
	for i, n := range []string{"node1", "node2"} {
		switch s.Name {
		case "postgres-ha":
			data := filepath.Join(s.Dir, "postgres-ha", n, "data")
			if _, err := os.Stat(filepath.Join(data, "standby.signal")); err == nil {
				continue
			}
			if _, err := os.Stat(filepath.Join(data, "postmaster.pid")); err == nil {
				return filepath.Join(data, "postmaster.pid"), nil
			}
		case "redis-ha":
			if s.Port([]string{"IDEM_REDIS_HA_PORT", "IDEM_REDIS_HA_PORT2"}[i]) == masterPort {
				return filepath.Join(s.Dir, "redis-ha", n, "redis.pid"), nil
			}
		}
	}
	return "", fmt.Errorf("%s: no primary found under %s", s.Name, s.Dir)
}

// riskLog is a slog.Handler that keeps the consumer's failover-risk
// warnings.
type riskLog struct {
	mu    sync.Mutex
	risks []string
}

func (l *riskLog) Enabled(_ context.Context, lvl slog.Level) bool { return lvl >= slog.LevelWarn }

func (l *riskLog) Handle(_ context.Context, r slog.Record) error {
	if !strings.HasPrefix(r.Message, "idem: a crash or failover") {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "risk" {
			l.mu.Lock()
			l.risks = append(l.risks, a.Value.String())
			l.mu.Unlock()
		}
		return true
	})
	return nil
}

func (l *riskLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *riskLog) WithGroup(string) slog.Handler      { return l }

func (l *riskLog) logged() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.risks)
}

// checkRiskWarning checks the consumer's start-up warning: with a risk
// (want non-empty, a substring of it) exactly one, once it came; without,
// none (the store's own answer is checked first, so the consumer has
// nothing to say).
func checkRiskWarning(t *testing.T, logs *riskLog, reporter idemdriver.FailoverRiskReporter, want string) {
	t.Helper()
	risk, err := reporter.FailoverRisk(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if want == "" {
		if risk != "" || len(logs.logged()) != 0 {
			t.Errorf("want no failover risk; store says %q, consumer warned %q", risk, logs.logged())
		}
		return
	}
	if !strings.Contains(risk, want) {
		t.Errorf("store's failover risk %q, want it to say %q", risk, want)
	}
	testenv.Eventually(t, time.Minute, "the consumer's failover-risk warning", func() bool { return len(logs.logged()) > 0 }, nil)
	if got := logs.logged(); len(got) != 1 || !strings.Contains(got[0], want) {
		t.Errorf("consumer warned %q, want one warning saying %q", got, want)
	}
}
