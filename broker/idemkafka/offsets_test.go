package idemkafka

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestOffsetTracker checks the contiguous-commit rule: the committable offset
// is the one after the longest done prefix of the records received, whatever
// order records finish in and whatever gaps the offsets have.
func TestOffsetTracker(t *testing.T) {
	t.Parallel()
	type step struct {
		done       int64
		wantMoved  bool
		wantCommit int64 // -1: nothing committable yet
	}
	tests := []struct {
		name    string
		offsets []int64
		steps   []step
	}{
		{
			name:    "in order",
			offsets: []int64{0, 1, 2},
			steps:   []step{{0, true, 1}, {1, true, 2}, {2, true, 3}},
		},
		{
			name:    "later done first does not commit past the earlier",
			offsets: []int64{10, 11, 12, 13},
			steps: []step{
				{12, false, -1},
				{13, false, -1},
				{11, false, -1},
				{10, true, 14}, // the whole prefix becomes done at once
			},
		},
		{
			name:    "hole in the middle holds the commit",
			offsets: []int64{0, 1, 2, 3},
			steps:   []step{{0, true, 1}, {2, false, 1}, {3, false, 1}, {1, true, 4}},
		},
		{
			name:    "offset gaps (compaction, transaction markers) are contiguous records",
			offsets: []int64{5, 9, 20},
			steps:   []step{{5, true, 6}, {20, false, 6}, {9, true, 21}},
		},
		{
			name:    "unknown and repeated offsets are ignored",
			offsets: []int64{0, 1},
			steps:   []step{{7, false, -1}, {0, true, 1}, {0, false, 1}, {1, true, 2}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tr := newOffsetTracker()
			for _, o := range tt.offsets {
				if !tr.add(o, 3) {
					t.Fatalf("add(%d) refused", o)
				}
			}
			for i, s := range tt.steps {
				moved := tr.done(s.done)
				eo, ok := tr.committable()
				got := int64(-1)
				if ok {
					got = eo.Offset
				}
				if moved != s.wantMoved || got != s.wantCommit {
					t.Fatalf("step %d done(%d): moved=%v committable=%d, want moved=%v committable=%d",
						i, s.done, moved, got, s.wantMoved, s.wantCommit)
				}
				if ok && eo.Epoch != 3 {
					t.Fatalf("step %d: epoch %d, want the record's leader epoch 3", i, eo.Epoch)
				}
			}
			if tr.outstanding() != 0 {
				t.Fatalf("%d records outstanding after all were done", tr.outstanding())
			}
		})
	}
}

// TestOffsetTrackerAdd checks that records must be added in ascending order
// and that nothing at or below the commit point is taken again.
func TestOffsetTrackerAdd(t *testing.T) {
	t.Parallel()
	tr := newOffsetTracker()
	if !tr.add(4, 0) || !tr.add(5, 0) {
		t.Fatal("ascending adds refused")
	}
	if tr.add(5, 0) || tr.add(3, 0) {
		t.Fatal("a repeated or lower offset was accepted")
	}
	tr.done(4)
	tr.done(5)
	if eo, _ := tr.committable(); eo != (kgo.EpochOffset{Epoch: 0, Offset: 6}) {
		t.Fatalf("committable %+v, want offset 6", eo)
	}
	if tr.add(5, 0) {
		t.Fatal("an offset below the commit point was accepted")
	}
	if !tr.add(6, 1) || tr.outstanding() != 1 {
		t.Fatal("the next offset was refused")
	}
}

// TestOffsetTrackerEpochOfLastDone checks that the commit carries the leader
// epoch of the last record of the done prefix.
func TestOffsetTrackerEpochOfLastDone(t *testing.T) {
	t.Parallel()
	tr := newOffsetTracker()
	tr.add(0, 1)
	tr.add(1, 2)
	tr.done(1)
	tr.done(0)
	if eo, ok := tr.committable(); !ok || eo != (kgo.EpochOffset{Epoch: 2, Offset: 2}) {
		t.Fatalf("committable %+v %v, want epoch 2 offset 2", eo, ok)
	}
}
