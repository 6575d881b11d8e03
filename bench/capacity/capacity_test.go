package main

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDocMatches is the anti-drift check: docs/capacity.md's generated
// block must be exactly what the calculator prints from the recorded
// inputs (inputs.json and the benchmark output it names). After a new
// measurement, update the inputs and paste `go run ./bench/capacity --doc`.
func TestDocMatches(t *testing.T) {
	in, err := loadInputs("inputs.json")
	if err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	if err := in.writeDoc(&want); err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(filepath.Join("..", "..", "docs", "capacity.md"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(page)
	i, j := strings.Index(s, docBegin), strings.Index(s, docEnd)
	if i < 0 || j < i {
		t.Fatalf("docs/capacity.md has no generated block (%q ... %q)", docBegin, docEnd)
	}
	if got := s[i : j+len(docEnd)+1]; got != want.String() {
		t.Errorf("docs/capacity.md's generated block differs from `go run ./bench/capacity --doc`:\n--- page\n%s\n--- calculator\n%s", got, want.String())
	}
}

const sample = `goos: linux
BenchmarkProcess/idem-2         	    2000	    100 ns/op	        100.0 client-us/msg	       300.0 cpu-us/msg	      2000 msgs/s	       200.0 server-us/msg	       500.0 wal-B/msg	    3000 B/op	      78 allocs/op
BenchmarkProcess/idem#01-2      	    2000	    100 ns/op	        100.0 client-us/msg	       500.0 cpu-us/msg	      1000 msgs/s	       400.0 server-us/msg	       520.0 wal-B/msg	    3000 B/op	      78 allocs/op
BenchmarkProcess/idem#02-2      	    2000	    100 ns/op	        100.0 client-us/msg	       400.0 cpu-us/msg	      3000 msgs/s	       300.0 server-us/msg	       510.0 wal-B/msg	    3000 B/op	      78 allocs/op
BenchmarkProcess/idem_batch100-2	    2000	    100 ns/op	         5.0 client-us/msg	        20.0 cpu-us/msg	     60000 msgs/s	        15.0 server-us/msg	       500.0 wal-B/msg	   90000 B/op	     722 allocs/op
PASS
`

func TestParseBench(t *testing.T) {
	bf, err := parseBench(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	s, ok := bf.get("BenchmarkProcess/idem", "msgs/s")
	if !ok || s != (stat{Median: 2000, Min: 1000, Max: 3000, Runs: 3}) {
		t.Errorf("idem msgs/s = %+v, %v; want median 2000 (1000–3000), 3 runs", s, ok)
	}
	if s, _ := bf.get("BenchmarkProcess/idem_batch100", "allocs/op"); s.Median != 722 || s.Runs != 1 {
		t.Errorf("idem_batch100 allocs/op = %+v", s)
	}
	if _, ok := bf.get("BenchmarkProcess/best", "msgs/s"); ok {
		t.Error("a case the output does not have was found")
	}
}

func TestEstimate(t *testing.T) {
	bf, err := parseBench(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	in := &inputs{bench: bf}
	l := layoutInputs{Name: "default", BytesPerRecord: 200, KeptExtra: duration{time.Hour}, WALCase: "BenchmarkProcess/idem",
		WALPerMsgLarge: 7000, CPUCase: "BenchmarkProcess/idem", CPUBatchCase: "BenchmarkProcess/idem_batch100", PurgePerSec: 8640}
	e, err := in.estimate(l, scenario{Rate: 1000, Retention: duration{23 * time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	near := func(name string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-9*math.Max(1, math.Abs(want)) {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	near("records", e.records, 1000*86400)        // 23 h + the 1 h purge interval
	near("bytes", e.bytes, 1000*86400*200)        // × bytes per record
	near("WAL per day", e.walDay, 1000*86400*510) // median WAL of idem
	near("WAL per day at 10M", e.walDayLarge, 1000*86400*7000)
	near("purged per day", e.purgedDay, 1000*86400)
	near("purge seconds", e.purgeSecDay, 1000*86400/8640.0)
	near("cores per 1k msgs/s", e.coresPer1k, 0.4) // 400 µs/msg × 1,000/s
	near("server share", e.serverPer1k, 0.3)
	near("cores per 1k, batches", e.coresPer1kB, 0.02)
	l.CPUCase = "BenchmarkProcess/missing"
	if _, err := in.estimate(l, scenario{Rate: 1, Retention: duration{time.Hour}}); err == nil {
		t.Error("a case missing from the benchmark output gave no error")
	}
}

// TestStoreCost checks the other stores' figures: medians of the
// benchmark output's rounds, the server's CPU only where it was measured,
// and an error for a case the output does not have.
func TestStoreCost(t *testing.T) {
	const out = `BenchmarkProcess/mysql/idem#00	100	1 ns/op	400 client-us/msg	300 server-us/msg	700 cpu-us/msg	450 redo-B/msg
BenchmarkProcess/mysql/idem#01	100	1 ns/op	400 client-us/msg	500 server-us/msg	900 cpu-us/msg	470 redo-B/msg
BenchmarkProcess/mysql/idem#02	100	1 ns/op	400 client-us/msg	100 server-us/msg	500 cpu-us/msg	460 redo-B/msg
BenchmarkProcess/mysql/idem_batch100#00	100	1 ns/op	20 cpu-us/msg
BenchmarkProcess/sqlite/idem#00	100	1 ns/op	500 cpu-us/msg	9000 write-B/msg
BenchmarkProcess/sqlite/idem_batch100#00	100	1 ns/op	15 cpu-us/msg
`
	bf, err := parseBench(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	in := &inputs{bench: bf, Scenarios: []scenario{{Rate: 1000, Retention: duration{time.Hour}}}}
	my := storeInputs{Name: "MariaDB", CPUCase: "BenchmarkProcess/mysql/idem", CPUBatchCase: "BenchmarkProcess/mysql/idem_batch100", LogUnit: "redo-B/msg", LogName: "redo"}
	c, err := in.storeCost(my)
	if err != nil {
		t.Fatal(err)
	}
	if c != (storeCost{cpu: 700, server: 300, cpuBatch: 20, log: 460, serverMeasured: true}) {
		t.Errorf("MariaDB cost = %+v", c)
	}
	lite := storeInputs{Name: "SQLite", CPUCase: "BenchmarkProcess/sqlite/idem", CPUBatchCase: "BenchmarkProcess/sqlite/idem_batch100", LogUnit: "write-B/msg", LogName: "written"}
	if c, err = in.storeCost(lite); err != nil || c.serverMeasured || c.cpu != 500 || c.log != 9000 {
		t.Errorf("SQLite cost = %+v, %v", c, err)
	}
	in.Stores = []storeInputs{my, lite}
	var b bytes.Buffer
	if err := in.writeStores(&b); err != nil {
		t.Fatal(err)
	}
	// 460 B × 86,400 s × 1,000 msgs/s = 37 GiB a day; 700 µs × 1,000/s = 0.70 cores.
	if !strings.Contains(b.String(), "| MariaDB | 700 (300) | 20.0 | 460 (redo) | 37.0 GiB/day; 0.70 / 0.020 cores |") {
		t.Errorf("stores table:\n%s", b.String())
	}
	lite.CPUCase = "BenchmarkProcess/sqlite/missing"
	if _, err := in.storeCost(lite); err == nil {
		t.Error("a case missing from the benchmark output gave no error")
	}
}
