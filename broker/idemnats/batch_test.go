package idemnats

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// seqMsg is a message known by its number.
type seqMsg struct {
	jetstream.Msg
	n int
}

// TestNextBatch: a batch handler joins the batches waiting up to the
// limit, leaves what is past it for the next batch taken (its own or
// another handler's), and gets nil once the channel is closed and nothing
// is left.
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
	rests := make(chan []jetstream.Msg, 8)
	var got [][]int
	for {
		b := nextBatch(batches, rests, 4)
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

// TestNextBatchRestToAnotherHandler: what is past a handler's limit goes
// to the next handler that asks, not only to the same handler's next
// batch: a fetch of eight messages, with a limit of four, runs as two
// batches at once (one handler each), not as one batch while the other
// four wait for it to end.
func TestNextBatchRestToAnotherHandler(t *testing.T) {
	t.Parallel()
	batches := make(chan []jetstream.Msg, 8)
	rests := make(chan []jetstream.Msg, 8)
	var fetched []jetstream.Msg
	for i := range 8 {
		fetched = append(fetched, seqMsg{n: i})
	}
	batches <- fetched
	first := nextBatch(batches, rests, 4) // handler A, which then works on it
	got := make(chan []jetstream.Msg, 1)
	go func() { got <- nextBatch(batches, rests, 4) }() // handler B, while A works
	var second []jetstream.Msg
	select {
	case second = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the second handler got no batch while four messages waited for the first handler's next one")
	}
	if len(first) != 4 || len(second) != 4 {
		t.Fatalf("batches of %d and %d messages; want 4 and 4", len(first), len(second))
	}
	close(batches)
	if b := nextBatch(batches, rests, 4); b != nil {
		t.Fatalf("after the channel closed: a batch of %d, want nil", len(b))
	}
}
