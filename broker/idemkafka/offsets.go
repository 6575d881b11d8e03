package idemkafka

import (
	"sort"

	"github.com/twmb/franz-go/pkg/kgo"
)

// offsetTracker keeps, for one partition, the records handed to the
// Consumer in offset order and which of them are done (acknowledged or
// dead-lettered), and computes the offset that may be committed: the one
// after the longest done prefix. A record done out of order (a later
// offset before an earlier one) never moves the commit past the earlier,
// unfinished one. Offsets need not be contiguous numbers (compaction and
// transaction markers leave gaps); "contiguous" means contiguous in the
// sequence of records received.
//
// It is not safe for concurrent use; the Consumer guards it with its mutex.
type offsetTracker struct {
	pending []trackedRecord // received, not yet in the done prefix, ascending offsets
	commit  kgo.EpochOffset // offset after the done prefix; Offset -1 if none yet
}

type trackedRecord struct {
	offset int64
	epoch  int32
	done   bool
}

func newOffsetTracker() *offsetTracker {
	return &offsetTracker{commit: kgo.EpochOffset{Epoch: -1, Offset: -1}}
}

// add records a received record. Offsets must ascend; a record at or below
// the last one added is ignored and add reports false.
func (t *offsetTracker) add(offset int64, epoch int32) bool {
	if n := len(t.pending); n > 0 && offset <= t.pending[n-1].offset {
		return false
	}
	if offset < t.commit.Offset {
		return false
	}
	t.pending = append(t.pending, trackedRecord{offset: offset, epoch: epoch})
	return true
}

// done marks the record at offset done and advances the commit point over
// the done prefix. It reports whether the commit point moved. An unknown
// offset is ignored.
func (t *offsetTracker) done(offset int64) bool {
	i := sort.Search(len(t.pending), func(i int) bool { return t.pending[i].offset >= offset })
	if i == len(t.pending) || t.pending[i].offset != offset {
		return false
	}
	t.pending[i].done = true
	n := 0
	for n < len(t.pending) && t.pending[n].done {
		n++
	}
	if n == 0 {
		return false
	}
	last := t.pending[n-1]
	t.commit = kgo.EpochOffset{Epoch: last.epoch, Offset: last.offset + 1}
	t.pending = t.pending[n:]
	if len(t.pending) == 0 {
		t.pending = nil
	}
	return true
}

// committable returns the offset to commit (the next record to read) and
// whether any record is done yet.
func (t *offsetTracker) committable() (kgo.EpochOffset, bool) {
	return t.commit, t.commit.Offset >= 0
}

// outstanding is the number of received records not yet in the done prefix.
func (t *offsetTracker) outstanding() int { return len(t.pending) }
