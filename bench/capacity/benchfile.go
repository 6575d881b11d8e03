package main

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// A benchFile is the output of `go test -bench` (BenchmarkProcess and the
// like): for each case, its rounds' values of each metric.
type benchFile struct {
	// cases maps a case name (BenchmarkProcess/idem; the round suffix
	// "#01" and the GOMAXPROCS suffix "-2" taken off) to its metrics,
	// each a list with one value per round, in order.
	cases map[string]map[string][]float64
	order []string // case names in order of first appearance
}

// caseName matches a result line's name: the case, an optional round
// suffix (#NN) and the GOMAXPROCS suffix (-N).
var caseName = regexp.MustCompile(`^(Benchmark\S+?)(#\d+)?(-\d+)?$`)

// parseBench reads go test -bench output. Lines that are not results are
// skipped. A result line is the name, the iteration count, then pairs of
// value and unit.
func parseBench(r io.Reader) (*benchFile, error) {
	bf := &benchFile{cases: map[string]map[string][]float64{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") || len(f)%2 != 0 {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue
		}
		m := caseName.FindStringSubmatch(f[0])
		if m == nil {
			continue
		}
		name := m[1]
		metrics, ok := bf.cases[name]
		if !ok {
			metrics = map[string][]float64{}
			bf.cases[name] = metrics
			bf.order = append(bf.order, name)
		}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return nil, fmt.Errorf("%s: value %q of %s: %w", name, f[i], f[i+1], err)
			}
			metrics[f[i+1]] = append(metrics[f[i+1]], v)
		}
	}
	return bf, sc.Err()
}

// stat is the median, minimum and maximum of a metric's rounds.
type stat struct {
	Median, Min, Max float64
	Runs             int
}

// get returns the statistics of metric unit in case name, and whether
// the file has it.
func (bf *benchFile) get(name, unit string) (stat, bool) {
	vs := bf.cases[name][unit]
	if len(vs) == 0 {
		return stat{}, false
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return stat{Median: med, Min: s[0], Max: s[len(s)-1], Runs: len(s)}, true
}

// must is get for a metric the caller needs.
func (bf *benchFile) must(name, unit string) (float64, error) {
	s, ok := bf.get(name, unit)
	if !ok {
		return 0, fmt.Errorf("the benchmark output has no %s for %s", unit, name)
	}
	return s.Median, nil
}

// String formats s as "median (min–max)" with the given precision.
func (s stat) format(prec int) string {
	return fmt.Sprintf("%.*f (%.*f–%.*f)", prec, s.Median, prec, s.Min, prec, s.Max)
}

// summary writes every case's metrics of bf as median (min–max) and the
// number of rounds, one line per case and metric.
func (bf *benchFile) summary(w io.Writer) {
	for _, name := range bf.order {
		units := make([]string, 0, len(bf.cases[name]))
		for u := range bf.cases[name] {
			units = append(units, u)
		}
		slices.Sort(units)
		for _, u := range units {
			s, _ := bf.get(name, u)
			prec := 2
			if s.Median >= 100 {
				prec = 0
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%d runs\n", name, u, s.format(prec), s.Runs)
		}
	}
}
