package main

import (
	"encoding/csv"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// The files written to --out.
const (
	csvFile   = "results.csv"
	chartFile = "throughput.png"
)

// baseline returns the naive contender's result of r's setup, if any.
func baseline(rs []result, r result) (result, bool) { return contenderResult(rs, r, "naive") }

// bestOf returns the hand-written best contender's result of r's setup,
// if any (PostgreSQL only).
func bestOf(rs []result, r result) (result, bool) { return contenderResult(rs, r, "best") }

// contenderResult returns contender name's result of r's setup, if it ran
// without error.
func contenderResult(rs []result, r result, name string) (result, bool) {
	for _, b := range rs {
		if b.Broker == r.Broker && b.Store == r.Store && b.Contender == name && b.Err == "" {
			return b, true
		}
	}
	return result{}, false
}

func ratio(a, b float64) string {
	if b == 0 || a == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", a/b)
}

func ms(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", float64(d)/float64(time.Millisecond))
}

// writeMarkdown writes the results as one Markdown table: throughput and
// latency with their ratios against the naive consumer of the same broker
// and store, throughput also against the hand-written best consumer ("-"
// where the store has none), and per fault the message IDs with a double effect and the
// IDs lost ("double / lost").
func writeMarkdown(w io.Writer, rs []result) error {
	var b strings.Builder
	b.WriteString("| broker | store | contender | msgs/s | × naive | × best | × best_checked | × idem | p50 ms | p99 ms | p50 × naive | p99 × naive | outgoing held / emitted | duplicates published: double / lost | handler error once: double / lost | crash after commit: double / lost |\n")
	b.WriteString("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|\n")
	for _, r := range rs {
		if r.Err != "" {
			fmt.Fprintf(&b, "| %s | %s | %s | failed: %s | | | | | | | | | | %s | %s | %s |\n",
				r.Broker, r.Store, r.Contender, strings.ReplaceAll(r.Err, "|", "/"), r.Dup, r.Fail, r.Crash)
			continue
		}
		base, best, id := references(rs, r)
		chk, _ := contenderResult(rs, r, checkedRef(r))
		fmt.Fprintf(&b, "| %s | %s | %s | %.0f | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			r.Broker, r.Store, r.Contender, r.Throughput, ratio(r.Throughput, base.Throughput), ratio(r.Throughput, best.Throughput),
			ratio(r.Throughput, chk.Throughput), ratio(r.Throughput, id.Throughput),
			ms(r.P50), ms(r.P99), ratio(float64(r.P50), float64(base.P50)), ratio(float64(r.P99), float64(base.P99)),
			held(r), r.Dup, r.Fail, r.Crash)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// references returns the results r's throughput is compared with: the
// naive, best and idem contenders of r's setup. The relay contender sends
// rather than consumes, so it has none; idem is not compared with itself.
func references(rs []result, r result) (naive, best, id result) {
	if r.Contender == "relay" {
		return
	}
	naive, _ = baseline(rs, r)
	best, _ = bestOf(rs, r)
	if r.Contender != "idem" {
		id, _ = contenderResult(rs, r, "idem")
	}
	return
}

// held is the "outgoing held / emitted" cell: "-" for contenders that
// emit nothing.
func held(r result) string {
	if r.Contender != "idem-outbox" && r.Contender != "relay" {
		return "-"
	}
	return fmt.Sprintf("%d / %d", r.Relayed, r.Messages)
}

// writeCSV writes one row per result, with raw numbers.
func writeCSV(path string, rs []result) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	_ = w.Write([]string{"broker", "store", "contender", "batch_size", "workers", "messages", "deliveries",
		"elapsed_s", "msgs_per_s", "throughput_vs_naive", "throughput_vs_best", "throughput_vs_best_checked", "throughput_vs_idem", "outgoing_held", "p50_ms", "p99_ms", "p50_vs_naive", "p99_vs_naive",
		"dup_double", "dup_lost", "error_double", "error_lost", "crash_double", "crash_lost", "fault_timeout", "error"})
	itoa := strconv.Itoa
	ftoa := func(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }
	for _, r := range rs {
		base, best, id := references(rs, r)
		chk, _ := contenderResult(rs, r, checkedRef(r))
		rt := func(a, b float64) string {
			if a == 0 || b == 0 {
				return ""
			}
			return ftoa(a / b)
		}
		_ = w.Write([]string{r.Broker, r.Store, r.Contender, itoa(r.Batch), itoa(r.Workers), itoa(r.Messages), itoa(r.Deliveries),
			ftoa(r.Elapsed.Seconds()), ftoa(r.Throughput), rt(r.Throughput, base.Throughput), rt(r.Throughput, best.Throughput),
			rt(r.Throughput, chk.Throughput), rt(r.Throughput, id.Throughput), itoa(r.Relayed),
			ftoa(float64(r.P50) / 1e6), ftoa(float64(r.P99) / 1e6),
			rt(float64(r.P50), float64(base.P50)), rt(float64(r.P99), float64(base.P99)),
			itoa(r.Dup.Double), itoa(r.Dup.Lost), itoa(r.Fail.Double), itoa(r.Fail.Lost), itoa(r.Crash.Double), itoa(r.Crash.Lost),
			strconv.FormatBool(r.Dup.Timeout || r.Fail.Timeout || r.Crash.Timeout), r.Err})
	}
	w.Flush()
	if err := w.Error(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// writeChart draws throughput (deliveries per second) as grouped bars:
// one group per broker and store, one bar per contender (the batch
// contenders carry their batch size in their name).
func writeChart(path string, rs []result) error {
	var setups, contenders []string
	seen := map[string]bool{}
	for _, r := range rs {
		s := r.Broker + " / " + r.Store
		if !seen["s:"+s] {
			seen["s:"+s] = true
			setups = append(setups, s)
		}
		if !seen["c:"+r.Contender] {
			seen["c:"+r.Contender] = true
			contenders = append(contenders, r.Contender)
		}
	}
	p := plot.New()
	p.Title.Text = "idem bench: throughput by contender and batch size"
	p.Y.Label.Text = "messages per second"
	p.Y.Min = 0
	width := vg.Points(14)
	top := 0.0
	for _, r := range rs {
		top = max(top, r.Throughput)
	}
	p.Y.Max = top * 1.5 // room for the legend above the bars
	for i, c := range contenders {
		vals := make(plotter.Values, len(setups))
		for j, s := range setups {
			for _, r := range rs {
				if r.Broker+" / "+r.Store == s && r.Contender == c {
					vals[j] = r.Throughput
				}
			}
		}
		bars, err := plotter.NewBarChart(vals, width)
		if err != nil {
			return err
		}
		bars.LineStyle.Width = 0
		bars.Color = plotutil.Color(i)
		bars.Offset = vg.Length(float64(i)-float64(len(contenders)-1)/2) * width
		p.Add(bars)
		p.Legend.Add(c, bars)
	}
	p.Legend.Top = true
	p.NominalX(setups...)
	p.X.Padding = width * vg.Length(len(contenders)) / 2
	w := vg.Length(max(6, 2.2*float64(len(setups)))) * vg.Inch
	return p.Save(w, 4.5*vg.Inch, path)
}

// writeOutputs writes results.csv and throughput.png to dir.
func writeOutputs(dir string, rs []result) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := writeCSV(filepath.Join(dir, csvFile), rs); err != nil {
		return fmt.Errorf("write %s: %w", csvFile, err)
	}
	if err := writeChart(filepath.Join(dir, chartFile), rs); err != nil {
		return fmt.Errorf("write %s: %w", chartFile, err)
	}
	return nil
}
