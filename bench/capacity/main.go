// Command capacity turns a consumer's message rate and retention window
// into what idem's processed-messages table costs on PostgreSQL: records
// kept, table size (heap, indexes and TOAST), WAL per day, purge work per
// day, and CPU per 1,000 messages per second, for the default and the
// partitioned layout. It computes from measured figures only: the output
// of `go run ./bench --process` (CPU and WAL per message, in go test
// -bench's format; `go test -bench BenchmarkProcess`'s reads the same) and the
// recorded inputs in inputs.json (bytes per record, measured with
// `capacity measure`, and the at-scale figures of docs/benchmarks.md).
// docs/capacity.md's tables are its output (TestDocMatches checks them),
// so the page cannot drift from the measurements.
//
// Run it from the repository root:
//
//	go run ./bench/capacity --rate 2000 --retention 168h   # one rate
//	go run ./bench/capacity --doc                          # docs/capacity.md's tables
//	go run ./bench/capacity summary FILE                   # medians of a go test -bench output
//	go run ./bench/capacity measure                        # bytes per record on IDEM_TEST_POSTGRES_URL
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "capacity:", err)
		os.Exit(1)
	}
}

// dir is where inputs.json and testdata/ are, relative to the repository
// root (go run ./bench/capacity) or to this package (go test).
func dir() string {
	if _, err := os.Stat("inputs.json"); err == nil {
		return "."
	}
	return filepath.Join("bench", "capacity")
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "summary":
			if len(args) != 2 {
				return errors.New("usage: capacity summary FILE")
			}
			f, err := os.Open(args[1])
			if err != nil {
				return err
			}
			defer f.Close()
			bf, err := parseBench(f)
			if err != nil {
				return err
			}
			bf.summary(stdout)
			return nil
		case "measure":
			return measure(ctx, args[1:], stdout)
		}
	}
	fs := flag.NewFlagSet("capacity", flag.ContinueOnError)
	fs.SetOutput(stderr)
	rate := fs.Float64("rate", 1000, "messages per second, new ones (duplicates cost less)")
	retention := fs.Duration("retention", 7*24*time.Hour, "retention window (idem.Config.RetentionWindow)")
	doc := fs.Bool("doc", false, "print docs/capacity.md's generated block instead")
	inputs := fs.String("inputs", filepath.Join(dir(), "inputs.json"), "recorded inputs")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	in, err := loadInputs(*inputs)
	if err != nil {
		return err
	}
	if *doc {
		return in.writeDoc(stdout)
	}
	if *rate <= 0 || *retention <= 0 {
		return fmt.Errorf("--rate %v and --retention %v must be positive", *rate, *retention)
	}
	writeEstimates(stdout, in, []scenario{{Rate: *rate, Retention: duration{*retention}}})
	return nil
}

// inputs are the recorded measurements the estimates come from.
type inputs struct {
	// Bench is benchmark output in go test -bench's format, relative to
	// inputs.json: that of `go run ./bench --process` (8 workers; durable
	// PostgreSQL, MariaDB and SQLite), whose case names are
	// BenchmarkProcess/<store>/<case>.
	Bench string `json:"bench"`
	// BenchCommand is how Bench was produced, for the page.
	BenchCommand string `json:"bench_command"`
	// Layouts are the processed table's layouts.
	Layouts []layoutInputs `json:"layouts"`
	// Scenarios are the rates and windows docs/capacity.md tabulates.
	Scenarios []scenario `json:"scenarios"`
	// Stores are the other stores whose CPU and log bytes per message
	// Bench also holds (MariaDB, SQLite): their table sizes are not
	// measured, so they get a table of their own.
	Stores []storeInputs `json:"stores,omitempty"`

	bench *benchFile
}

// layoutInputs are one layout's per-record figures.
type layoutInputs struct {
	Name string `json:"name"`
	// BytesPerRecord is pg_total_relation_size over the records of a
	// seeded table (capacity measure).
	BytesPerRecord float64 `json:"bytes_per_record"`
	// KeptExtra is how much longer than the retention window a record
	// stays: the purge interval (default layout), or one bucket
	// (partitioned: a partition is dropped once all its records expired).
	KeptExtra duration `json:"kept_extra"`
	// WALPerMsg is the WAL per new message, one effect row included, on
	// a table that fits in memory: from Bench (case WALCase) when set,
	// else this recorded value.
	WALCase   string  `json:"wal_case,omitempty"`
	WALPerMsg float64 `json:"wal_per_msg,omitempty"`
	// WALPerMsgLarge is the WAL per new message on a table of 10M
	// records of random IDs (full-page images after checkpoints): the
	// median wal-B/msg of WALLarge when set, else this recorded value.
	WALPerMsgLarge float64  `json:"wal_per_msg_large,omitempty"`
	WALLarge       *caseRef `json:"wal_large,omitempty"`
	// CPUCase and CPUBatchCase are the cases of Bench whose cpu-us/msg
	// (server and client) give the CPU per message; "" when not measured.
	CPUCase      string `json:"cpu_case,omitempty"`
	CPUBatchCase string `json:"cpu_batch_case,omitempty"`
	// PurgePerSec is records purged per second while processing runs
	// (BenchmarkPurgeCost): from Purge when set (the median purge-rec/s,
	// or, in output that has none, the median deleted over the median
	// purge-s), else this recorded value.
	PurgePerSec float64  `json:"purge_per_sec,omitempty"`
	Purge       *caseRef `json:"purge,omitempty"`
	// PurgeUnit says what a purge does: DELETE batches, or DROP of
	// partitions.
	PurgeUnit string `json:"purge_unit"`
	// Source says where the recorded values come from.
	Source string `json:"source"`
}

// caseRef names a benchmark case in a file of benchmark output (relative
// to inputs.json).
type caseRef struct {
	File string `json:"file"`
	Case string `json:"case"`
}

// resolve reads the figures that l takes from recorded benchmark output
// (WALLarge, Purge) into WALPerMsgLarge and PurgePerSec; open returns the
// parsed output of a file named relative to inputs.json.
func (l *layoutInputs) resolve(open func(name string) (*benchFile, error)) error {
	if r := l.WALLarge; r != nil {
		bf, err := open(r.File)
		if err != nil {
			return err
		}
		if l.WALPerMsgLarge, err = bf.must(r.Case, "wal-B/msg"); err != nil {
			return fmt.Errorf("%s: %w", r.File, err)
		}
	}
	if r := l.Purge; r != nil {
		bf, err := open(r.File)
		if err != nil {
			return err
		}
		if st, ok := bf.get(r.Case, "purge-rec/s"); ok {
			l.PurgePerSec = st.Median
			return nil
		}
		n, err := bf.must(r.Case, "deleted")
		if err != nil {
			return fmt.Errorf("%s: %w", r.File, err)
		}
		sec, err := bf.must(r.Case, "purge-s")
		if err != nil {
			return fmt.Errorf("%s: %w", r.File, err)
		}
		l.PurgePerSec = n / sec
	}
	return nil
}

// storeInputs are the cases of Bench that give another store's cost per
// message.
type storeInputs struct {
	Name string `json:"name"`
	// CPUCase and CPUBatchCase are the cases whose cpu-us/msg (and
	// server-us/msg where the server was measured) give the CPU per
	// message, one at a time and in batches of 100.
	CPUCase      string `json:"cpu_case"`
	CPUBatchCase string `json:"cpu_batch_case"`
	// LogUnit is the metric of CPUCase that counts the bytes the store
	// writes per new message (redo-B/msg, write-B/msg), and LogName what
	// it counts, for the page.
	LogUnit string `json:"log_unit"`
	LogName string `json:"log_name"`
}

// storeCost is a store's measured cost per new message.
type storeCost struct {
	cpu, server, cpuBatch, log float64
	serverMeasured             bool
}

func (in *inputs) storeCost(s storeInputs) (storeCost, error) {
	var c storeCost
	var err error
	if c.cpu, err = in.bench.must(s.CPUCase, "cpu-us/msg"); err != nil {
		return c, err
	}
	if c.cpuBatch, err = in.bench.must(s.CPUBatchCase, "cpu-us/msg"); err != nil {
		return c, err
	}
	if c.log, err = in.bench.must(s.CPUCase, s.LogUnit); err != nil {
		return c, err
	}
	if st, ok := in.bench.get(s.CPUCase, "server-us/msg"); ok {
		c.server, c.serverMeasured = st.Median, true
	}
	return c, nil
}

// scenario is a rate and a retention window.
type scenario struct {
	Rate      float64  `json:"rate"`
	Retention duration `json:"retention"`
}

// duration is a time.Duration written as "168h" in JSON.
type duration struct{ time.Duration }

func (d *duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	d.Duration = v
	return err
}

func (d duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

func loadInputs(path string) (*inputs, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	in := &inputs{}
	if err := json.Unmarshal(b, in); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	files := map[string]*benchFile{}
	open := func(name string) (*benchFile, error) {
		if bf, ok := files[name]; ok {
			return bf, nil
		}
		f, err := os.Open(filepath.Join(filepath.Dir(path), name))
		if err != nil {
			return nil, err
		}
		defer f.Close()
		bf, err := parseBench(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		files[name] = bf
		return bf, nil
	}
	if in.bench, err = open(in.Bench); err != nil {
		return nil, err
	}
	for i := range in.Layouts {
		if err := in.Layouts[i].resolve(open); err != nil {
			return nil, err
		}
	}
	return in, nil
}

// estimate is one layout's cost at one scenario.
type estimate struct {
	records       float64 // records kept at steady state
	bytes         float64 // table size
	walDay        float64 // bytes of WAL per day, small table
	walDayLarge   float64 // bytes of WAL per day, 10M-record table
	purgedDay     float64 // records purged per day
	purgeSecDay   float64 // seconds of purge per day
	coresPer1k    float64 // server + client CPU cores per 1,000 msgs/s, per message
	coresPer1kB   float64 // the same with batches of 100
	serverPer1k   float64 // server share of coresPer1k
	cpuMeasured   bool
	batchMeasured bool
}

func (in *inputs) estimate(l layoutInputs, s scenario) (estimate, error) {
	var e estimate
	day := 86400.0
	e.records = s.Rate * (s.Retention.Seconds() + l.KeptExtra.Seconds())
	e.bytes = e.records * l.BytesPerRecord
	wal := l.WALPerMsg
	if l.WALCase != "" {
		v, err := in.bench.must(l.WALCase, "wal-B/msg")
		if err != nil {
			return e, err
		}
		wal = v
	}
	e.walDay = s.Rate * day * wal
	e.walDayLarge = s.Rate * day * l.WALPerMsgLarge
	e.purgedDay = s.Rate * day
	e.purgeSecDay = e.purgedDay / l.PurgePerSec
	if l.CPUCase != "" {
		cpu, err := in.bench.must(l.CPUCase, "cpu-us/msg")
		if err != nil {
			return e, err
		}
		srv, err := in.bench.must(l.CPUCase, "server-us/msg")
		if err != nil {
			return e, err
		}
		e.coresPer1k, e.serverPer1k, e.cpuMeasured = cpu*1000/1e6, srv*1000/1e6, true
	}
	if l.CPUBatchCase != "" {
		cpu, err := in.bench.must(l.CPUBatchCase, "cpu-us/msg")
		if err != nil {
			return e, err
		}
		e.coresPer1kB, e.batchMeasured = cpu*1000/1e6, true
	}
	return e, nil
}

// Markers around the generated block of docs/capacity.md.
const (
	docBegin = "<!-- generated by `go run ./bench/capacity --doc`: do not edit by hand -->"
	docEnd   = "<!-- end of generated block -->"
)

// writeDoc writes docs/capacity.md's generated block: the inputs, then
// the estimates of every scenario.
func (in *inputs) writeDoc(w io.Writer) error {
	fmt.Fprintln(w, docBegin)
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Inputs (per record; the CPU and WAL of the default layout are medians of the benchmark output recorded in `bench/capacity/"+in.Bench+"`, from `"+in.BenchCommand+"`):")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| layout | bytes per record | WAL B/msg, small table | WAL B/msg, 10M records | CPU µs/msg (server + client) | CPU µs/msg, batches of 100 | purge | source |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---|---|")
	for _, l := range in.Layouts {
		e, err := in.estimate(l, scenario{Rate: 1, Retention: duration{time.Second}})
		if err != nil {
			return err
		}
		cpu, cpuB := "not measured", "not measured"
		if e.cpuMeasured {
			cpu = fmt.Sprintf("%.0f (server %.0f)", e.coresPer1k*1e3, e.serverPer1k*1e3)
		}
		if e.batchMeasured {
			cpuB = fmt.Sprintf("%.1f", e.coresPer1kB*1e3)
		}
		fmt.Fprintf(w, "| %s | %.0f | %.0f | %s | %s | %s | %s, %s records/s | %s |\n",
			l.Name, l.BytesPerRecord, e.walDay/86400, thousands(l.WALPerMsgLarge), cpu, cpuB, l.PurgeUnit, thousands(l.PurgePerSec), l.Source)
	}
	fmt.Fprintln(w)
	writeEstimates(w, in, in.Scenarios)
	if len(in.Stores) > 0 {
		fmt.Fprintln(w)
		if err := in.writeStores(w); err != nil {
			return err
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, docEnd)
	return nil
}

// writeStores writes the other stores' cost per new message and, for
// each distinct rate of the scenarios, their log bytes per day and CPU.
func (in *inputs) writeStores(w io.Writer) error {
	var rates []float64
	for _, s := range in.Scenarios {
		if !slices.Contains(rates, s.Rate) {
			rates = append(rates, s.Rate)
		}
	}
	fmt.Fprintln(w, "Other stores (same benchmark output; table size not measured): per new message, and at each rate the bytes written per day and the CPU cores, one message at a time / batches of 100:")
	fmt.Fprintln(w)
	var head, rule strings.Builder
	head.WriteString("| store | CPU µs/msg (server) | CPU µs/msg, batches of 100 | bytes written per message |")
	rule.WriteString("|---|---:|---:|---:|")
	for _, r := range rates {
		fmt.Fprintf(&head, " %s msgs/s |", thousands(r))
		rule.WriteString("---:|")
	}
	fmt.Fprintln(w, head.String())
	fmt.Fprintln(w, rule.String())
	for _, st := range in.Stores {
		c, err := in.storeCost(st)
		if err != nil {
			return err
		}
		cpu := fmt.Sprintf("%.0f", c.cpu)
		if c.serverMeasured {
			cpu += fmt.Sprintf(" (%.0f)", c.server)
		}
		fmt.Fprintf(w, "| %s | %s | %.1f | %s (%s) |", st.Name, cpu, c.cpuBatch, thousands(c.log), st.LogName)
		for _, r := range rates {
			fmt.Fprintf(w, " %s/day; %.2f / %.3f cores |", size(r*86400*c.log), c.cpu*r/1e6, c.cpuBatch*r/1e6)
		}
		fmt.Fprintln(w)
	}
	return nil
}

// writeEstimates writes one table row per scenario and layout.
func writeEstimates(w io.Writer, in *inputs, ss []scenario) {
	fmt.Fprintln(w, "| msgs/s | retention | layout | records kept | table size | WAL per day, small table → 10M records | records purged per day (purge time) | CPU cores per 1,000 msgs/s: per message (server) / batches of 100 |")
	fmt.Fprintln(w, "|---:|---:|---|---:|---:|---:|---:|---:|")
	for _, s := range ss {
		for _, l := range in.Layouts {
			e, err := in.estimate(l, s)
			if err != nil {
				fmt.Fprintf(w, "| %s | %s | %s | error: %v |\n", thousands(s.Rate), days(s.Retention.Duration), l.Name, err)
				continue
			}
			cpu := "not measured"
			if e.cpuMeasured {
				cpu = fmt.Sprintf("%.2f (%.2f)", e.coresPer1k, e.serverPer1k)
				if e.batchMeasured {
					cpu += fmt.Sprintf(" / %.3f", e.coresPer1kB)
				}
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s → %s | %s (%s) | %s |\n",
				thousands(s.Rate), days(s.Retention.Duration), l.Name, count(e.records), size(e.bytes),
				size(e.walDay), size(e.walDayLarge), count(e.purgedDay), dur(e.purgeSecDay), cpu)
		}
	}
}

func thousands(v float64) string {
	s := fmt.Sprintf("%.0f", v)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// count writes a number of records with a unit: 1.2M, 3.4G.
func count(v float64) string {
	switch {
	case v >= 1e9:
		return fmt.Sprintf("%.1fG", v/1e9)
	case v >= 1e6:
		return fmt.Sprintf("%.1fM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.0fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

// size writes bytes in binary units.
func size(v float64) string {
	switch {
	case v >= 1<<40:
		return fmt.Sprintf("%.1f TiB", v/(1<<40))
	case v >= 1<<30:
		return fmt.Sprintf("%.1f GiB", v/(1<<30))
	case v >= 1<<20:
		return fmt.Sprintf("%.0f MiB", v/(1<<20))
	}
	return fmt.Sprintf("%.0f KiB", v/(1<<10))
}

func days(d time.Duration) string {
	if d%(24*time.Hour) == 0 {
		return fmt.Sprintf("%d d", d/(24*time.Hour))
	}
	return d.String()
}

func dur(sec float64) string {
	if sec >= 3600 {
		return fmt.Sprintf("%.1f h", sec/3600)
	}
	if sec >= 60 {
		return fmt.Sprintf("%.0f min", sec/60)
	}
	return fmt.Sprintf("%.0f s", sec)
}
