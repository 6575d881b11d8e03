package dashboardtest

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metricsql"
	dto "github.com/prometheus/client_model/go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/promserve"
	"github.com/idem-go/idem/cmd/idem/internal/promserve/promservetest"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemotel"
)

// dashboardPath is the dashboard, from this package's folder.
var dashboardPath = filepath.Join("..", "..", "..", "..", "..", "docs", "grafana", "idem-dashboard.json")

// TestDashboardNamesExportedMetrics parses every query of the dashboard
// (panel targets and template variables) and checks that each metric it
// selects is on the idem command's /metrics page, and each label it
// filters or groups by is a label of that metric there.
func TestDashboardNamesExportedMetrics(t *testing.T) {
	t.Parallel()
	exported := scrapeEverything(t)
	queries := dashboardQueries(t)
	if len(queries) < 10 {
		t.Fatalf("the dashboard has %d queries; want its panels' (at least 10)", len(queries))
	}
	used := map[string]bool{}
	for _, q := range queries {
		sels, err := selectors(q.expr)
		if err != nil {
			t.Errorf("%s: %q does not parse: %v", q.where, q.expr, err)
			continue
		}
		if len(sels) == 0 {
			t.Errorf("%s: %q selects no metric", q.where, q.expr)
		}
		for _, s := range sels {
			family, labels, ok := exported.lookup(s.metric)
			if !ok {
				t.Errorf("%s: %q names %s, which idem does not export", q.where, q.expr, s.metric)
				continue
			}
			used[family] = true
			for _, l := range s.labels {
				if !labels[l] {
					t.Errorf("%s: %q: %s has no label %s (it has %v)", q.where, q.expr, s.metric, l, keys(labels))
				}
			}
		}
	}
	// What the dashboard is for: each of these shows on some panel.
	for _, want := range []string{"idem_messages_total", "idem_claims_active", "idem_lease_takeovers_total",
		"idem_outbox_pending", "idem_outbox_oldest_pending_seconds", "idem_outbox_failed", "idem_purge_rows_total", "idem_purge_lag_seconds"} {
		if !used[want] {
			t.Errorf("no panel shows %s", want)
		}
	}
}

// exportedMetrics are the families of a /metrics page, with the label
// names of their samples.
type exportedMetrics map[string]map[string]bool

// lookup finds the family of a selected series name: the family itself,
// or a histogram's _bucket, _sum or _count series (with the label le for
// _bucket).
func (e exportedMetrics) lookup(name string) (family string, labels map[string]bool, ok bool) {
	if l, ok := e[name]; ok {
		return name, l, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, found := strings.CutSuffix(name, suffix); found {
			if l, ok := e[base+"#histogram"]; ok {
				if suffix == "_bucket" {
					l = with(l, "le")
				}
				return base, l, true
			}
		}
	}
	return "", nil, false
}

func with(l map[string]bool, k string) map[string]bool {
	m := map[string]bool{k: true}
	for n := range l {
		m[n] = true
	}
	return m
}

// scrapeEverything serves /metrics as the idem command does
// (promserve.Serve, as idem consume, proxy, demo and relay do), has every
// instrument of idem's observers record a value through the hooks the
// commands install (the consumer observer of Hooks, and an outbox observer
// on MeterProvider with a store for the backlog gauges, as idem relay
// does), and returns what the page shows.
func scrapeEverything(t *testing.T) exportedMetrics {
	t.Helper()
	srv, err := promserve.Serve("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx := context.Background()
	boom := errors.New("boom")
	for _, h := range srv.Hooks() {
		for _, consumer := range []string{"payments", idemotel.HTTPConsumerPrefix + "charges"} {
			for _, mode := range []idem.Mode{idem.ModeTransactional, idem.ModeLease} {
				if s, ok := h.(idem.HookProcessStart); ok {
					pctx := s.OnProcessStart(ctx, idem.ProcessStartEvent{Consumer: consumer, Mode: mode, MessageID: "m-1"})
					h.(idem.HookClaim).OnClaim(pctx, idem.ClaimEvent{Consumer: consumer, MessageID: "m-1", Mode: mode, Attempt: 1, Token: 1, Latency: time.Millisecond})
					for _, out := range []idem.OutcomeEvent{
						{Outcome: idem.Outcome{Status: idem.Processed, MessageID: "m-1"}, Consumer: consumer, Mode: mode, Claimed: true},
						{Outcome: idem.Outcome{Status: idem.Duplicate, MessageID: "m-1"}, Consumer: consumer, Mode: mode, Reason: idem.DuplicateCompleted},
						{Outcome: idem.Outcome{Status: idem.Failed, MessageID: "m-2", Err: boom}, Consumer: consumer, Mode: mode, Claimed: true, Released: true},
					} {
						h.(idem.HookOutcome).OnOutcome(pctx, out)
					}
					h.(idem.HookProcessEnd).OnProcessEnd(pctx, idem.ProcessEndEvent{Consumer: consumer, Mode: mode, MessageID: "m-1", Latency: time.Millisecond})
				}
				h.(idem.HookStoreError).OnStoreError(ctx, idem.StoreErrorEvent{Consumer: consumer, Mode: mode, Op: "claim", Err: boom})
			}
			le := idem.LeaseEvent{Consumer: consumer, MessageID: "m-1", Attempt: 2, Token: 2, Op: "complete", Latency: time.Millisecond}
			h.(idem.HookLeaseRenewed).OnLeaseRenewed(ctx, le)
			h.(idem.HookLeaseTakenOver).OnLeaseTakenOver(ctx, le)
			h.(idem.HookLeaseLost).OnLeaseLost(ctx, le)
			for _, err := range []error{nil, idem.ErrPurgeInProgress, boom} {
				h.(idem.HookPurge).OnPurge(ctx, idem.PurgeEvent{Consumer: consumer, Result: idem.PurgeResult{Deleted: 3, Batches: 1, Horizon: time.Now().Add(-time.Hour)},
					RetentionWindow: time.Hour, Lag: time.Minute, Latency: time.Millisecond, Err: err})
			}
		}
		h.(idemhttp.HookResponse).OnResponse(ctx, idemhttp.ResponseEvent{Consumer: idemotel.HTTPConsumerPrefix + "charges", Method: "POST", Route: "/charges",
			Status: 201, Outcome: idem.Processed, Latency: time.Millisecond})
	}
	store := idem.NewMemoryStore(nil)
	ob, err := idemotel.NewOutboxObserver(store, idemotel.WithMeterProvider(srv.MeterProvider), idemotel.WithMessagingSystem("nats"))
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	ob.OnEmit(ctx, idem.EmitEvent{Consumer: "payments", MessageID: "m-1", Count: 2})
	ob.OnRelay(ctx, idem.RelayEvent{Result: idem.RelayResult{Claimed: 3, Sent: 1, Failed: 1, Retried: 1}, Latency: time.Millisecond, OldestAge: time.Second})

	mfs := promservetest.Scrape(t, srv.URL())
	e := exportedMetrics{}
	for name, mf := range mfs {
		labels := map[string]bool{}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = true
			}
		}
		if mf.GetType() == dto.MetricType_HISTOGRAM {
			name += "#histogram"
		}
		e[name] = labels
	}
	return e
}

// query is one PromQL expression of the dashboard and where it is.
type query struct{ where, expr string }

// dashboardQueries returns the expressions of the dashboard's panel
// targets (rows' nested panels included) and of its query variables.
func dashboardQueries(t *testing.T) []query {
	t.Helper()
	b, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	type target struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	}
	type panel struct {
		Title   string   `json:"title"`
		Type    string   `json:"type"`
		Targets []target `json:"targets"`
		Panels  []panel  `json:"panels"`
	}
	var d struct {
		Title      string  `json:"title"`
		UID        string  `json:"uid"`
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	if d.Title == "" || d.UID == "" {
		t.Errorf("the dashboard has no title or uid")
	}
	var qs []query
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				qs = append(qs, query{where: "panel " + p.Title + " " + tg.RefID, expr: tg.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(string)
		if m, ok := v.Query.(map[string]any); ok {
			q, _ = m["query"].(string)
		}
		// label_values(METRIC, LABEL): the metric selector and the label.
		inner, ok := strings.CutPrefix(q, "label_values(")
		inner, ok2 := strings.CutSuffix(inner, ")")
		metric, label, ok3 := strings.Cut(inner, ",")
		if !ok || !ok2 || !ok3 {
			t.Errorf("variable %s: %q is not label_values(METRIC, LABEL)", v.Name, q)
			continue
		}
		qs = append(qs, query{where: "variable " + v.Name, expr: "count by (" + strings.TrimSpace(label) + ") (" + strings.TrimSpace(metric) + ")"})
	}
	return qs
}

// selection is one series selector of a query: the metric name and the
// labels the query filters it by or groups its aggregation by.
type selection struct {
	metric string
	labels []string
}

// grafanaVars are Grafana's interval macros, replaced by a duration before
// parsing.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")

// selectors parses expr as PromQL and returns its series selectors, each
// with its label filters and the by() labels of the aggregations above it.
func selectors(expr string) ([]selection, error) {
	e, err := metricsql.Parse(grafanaVars.Replace(expr))
	if err != nil {
		return nil, err
	}
	var out []selection
	var walk func(e metricsql.Expr, grouping []string)
	walk = func(e metricsql.Expr, grouping []string) {
		switch x := e.(type) {
		case *metricsql.MetricExpr:
			for _, lfs := range x.LabelFilterss {
				s := selection{labels: slices.Clone(grouping)}
				for _, lf := range lfs {
					if lf.Label == "__name__" {
						s.metric = lf.Value
					} else {
						s.labels = append(s.labels, lf.Label)
					}
				}
				out = append(out, s)
			}
		case *metricsql.AggrFuncExpr:
			g := grouping
			if strings.EqualFold(x.Modifier.Op, "by") {
				g = append(slices.Clone(grouping), x.Modifier.Args...)
			}
			for _, a := range x.Args {
				walk(a, g)
			}
		case *metricsql.FuncExpr:
			for _, a := range x.Args {
				walk(a, grouping)
			}
		case *metricsql.RollupExpr:
			walk(x.Expr, grouping)
		case *metricsql.BinaryOpExpr:
			walk(x.Left, grouping)
			walk(x.Right, grouping)
		}
	}
	walk(e, nil)
	return out, nil
}

func keys(m map[string]bool) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
