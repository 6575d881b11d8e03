package kafkatest

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem/broker/idemkafka"
)

// TestResetOffsetWarning checks the start-up warning: a client whose
// kgo.ConsumeResetOffset is the end of the partition is warned about
// once; franz-go's default and the start are not.
func TestResetOffsetWarning(t *testing.T) {
	t.Parallel()
	topic := uniqueName("reset")
	seeds := newCluster(t, topic).ListenAddrs()
	for _, tt := range []struct {
		name     string
		opts     []kgo.Opt
		wantWarn int
	}{
		{"end", []kgo.Opt{kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd())}, 1},
		{"start", []kgo.Opt{kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, 0},
		{"rewind", []kgo.Opt{kgo.ConsumeResetOffset(kgo.RewindOffset(time.Minute))}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var logs syncBuffer
			logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
			m := startMember(t, seeds, uniqueName("g"), topic, idemkafka.Config{Processor: noopProcessor, DeadLetter: "dead", Logger: logger}, tt.opts...)
			if err := m.stop(context.Background()); err != nil {
				t.Fatal(err)
			}
			out := logs.String()
			if got := strings.Count(out, "kgo.ConsumeResetOffset is the end of the partition"); got != tt.wantWarn {
				t.Fatalf("%d warnings, want %d; log:\n%s", got, tt.wantWarn, out)
			}
		})
	}
}
