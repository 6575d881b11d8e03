package idemnats

import (
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// seqMsg is a message known by its number.
type seqMsg struct {
	jetstream.Msg
	n int
}

// TestNextBatch: a batch handler joins the batches waiting up to the
// limit, keeps what is past it for its next batch, and gets nil once the
// channel is closed and nothing is left.
func TestNextBatch(t *testing.T) {
	t.Parallel()
	msgs := func(from, to int) []jetstream.Msg {
		var ms []jetstream.Msg
		for i := from; i < to; i++ {
			ms = append(ms, seqMsg{n: i})
		}
		return ms
	}
	nums := func(ms []jetstream.Msg) []int {
		var out []int
		for _, m := range ms {
			out = append(out, m.(seqMsg).n)
		}
		return out
	}
	batches := make(chan []jetstream.Msg, 8)
	batches <- msgs(0, 2)
	batches <- msgs(2, 5)
	batches <- msgs(5, 6)
	close(batches)
	var carry []jetstream.Msg
	var got [][]int
	for {
		b := nextBatch(batches, &carry, 4)
		if b == nil {
			break
		}
		if len(b) > 4 {
			t.Fatalf("batch of %d, over the limit of 4", len(b))
		}
		got = append(got, nums(b))
	}
	if g, w := fmt.Sprint(got), "[[0 1 2 3] [4 5]]"; g != w {
		t.Fatalf("batches %s, want %s", g, w)
	}
}
