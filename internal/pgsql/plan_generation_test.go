package pgsql

import (
	"strings"
	"testing"
)

// TestPlanGeneration: a batch statement's text is unchanged until its
// Queries' batches acquired 1,024 records, then names a new plan
// generation at each doubling, up to maxPlanGeneration; copies of the
// Queries (a consumer's own, see Table.Queries) share the count.
func TestPlanGeneration(t *testing.T) {
	q := NewV2("t")
	base := q.completeBatchTexts.get(q)
	if base != q.completeBatchTexts.plain {
		t.Fatalf("generation 0 changed the text")
	}
	one := *q
	for _, c := range []struct {
		writes uint64
		gen    int
	}{{1023, 0}, {1, 1}, {1024, 2}, {2048, 3}, {1 << 30, maxPlanGeneration}} {
		one.batchWrites.Add(c.writes)
		if g := q.planGeneration(); g != c.gen {
			t.Fatalf("after %d more writes: generation %d, want %d", c.writes, g, c.gen)
		}
		text := q.completeBatchTexts.get(q)
		if c.gen == 0 {
			if text != base {
				t.Errorf("generation 0: text changed")
			}
			continue
		}
		if !strings.HasPrefix(text, base) || !strings.HasSuffix(text, planComment(c.gen)) {
			t.Errorf("generation %d: text ends %q", c.gen, text[len(text)-40:])
		}
		if again := q.completeBatchTexts.get(q); again != text {
			t.Errorf("generation %d: a second get gave another text", c.gen)
		}
	}
}

// TestPlanGenerationCountsTableRows: the records a table's statistics
// counted when its shape was found (batchBase) count towards the plan
// generation like those acquired since: a table of 3,000 records is in
// generation 2 from the start, and moves to 3 when the two reach 4,096.
func TestPlanGenerationCountsTableRows(t *testing.T) {
	q := NewV2("t")
	q.batchBase.Store(3000)
	for _, c := range []struct {
		writes uint64
		gen    int
	}{{0, 2}, {1095, 2}, {1, 3}, {4096, 4}} {
		q.batchWrites.Add(c.writes)
		if g := q.planGeneration(); g != c.gen {
			t.Fatalf("table of 3,000 records, %d writes: generation %d, want %d", q.batchWrites.Load(), g, c.gen)
		}
	}
}
