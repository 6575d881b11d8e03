package idemredisstream_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemredisstream"
)

// An entry's keep-alive lasts exactly as long as its handler may run:
// until its handler context's deadline (HandlerTimeout after the entry
// was read), in single and in batch mode, so that its claim on the
// stream does not lapse (and XAUTOCLAIM give it to another member) while
// its handler may still be running within HandlerTimeout.
func TestKeepAliveUntilHandlerDeadline(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch-%v", batch), func(t *testing.T) {
			t.Parallel()
			stream, dead := keys(t)
			type seen struct {
				deadline time.Time
				ok       bool
				until    []time.Time
			}
			got := make(chan seen, 1)
			var cons atomic.Pointer[idemredisstream.Consumer]
			look := func(ctx context.Context) {
				dl, ok := ctx.Deadline()
				select {
				case got <- seen{dl, ok, cons.Load().InFlightUntil()}:
				default:
				}
			}
			cfg := idemredisstream.Config{Stream: stream, Group: "g", Consumer: "c1", DeadLetter: dead, HandlerTimeout: time.Minute}
			if batch {
				cfg.BatchProcessor = batchProcessor(func(ctx context.Context, msgs []idem.Message) ([]idem.Outcome, error) {
					look(ctx)
					outs := make([]idem.Outcome, len(msgs))
					for i, m := range msgs {
						outs[i] = idem.Outcome{Status: idem.Processed, MessageID: m.ID}
					}
					return outs, nil
				})
			} else {
				cfg.Processor = idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
					look(ctx)
					return idem.Outcome{Status: idem.Processed, MessageID: msg.ID}, nil
				})
			}
			c, rdb, _ := start(t, cfg)
			cons.Store(c)
			prod := idemredisstream.NewProducer(rdb, idemredisstream.ProducerConfig{})
			if _, err := prod.Publish(context.Background(), stream, []byte("x"), idemredisstream.WithMessageID("m-1")); err != nil {
				t.Fatal(err)
			}
			var s seen
			select {
			case s = <-got:
			case <-time.After(60 * time.Second):
				t.Fatal("the entry was not handled within 60s")
			}
			if !s.ok || len(s.until) != 1 {
				t.Fatalf("handler context deadline %v (set: %v), keep-alives %v; want a deadline and one entry kept alive", s.deadline, s.ok, s.until)
			}
			if !s.until[0].Equal(s.deadline) {
				t.Errorf("keep-alive until %v, handler deadline %v (%v later): the claim may lapse while the handler may run",
					s.until[0], s.deadline, s.deadline.Sub(s.until[0]))
			}
		})
	}
}
