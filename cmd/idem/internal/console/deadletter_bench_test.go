package console_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemnats"
	"github.com/idem-go/idem/broker/idemredisstream"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/cmd/idem/internal/deadletter"
	"github.com/idem-go/idem/internal/testenv"
)

// benchLetters is how many dead letters the destination holds.
const benchLetters = 5000

// deadHeaders are the headers of dead letter i, as an adapter writes them.
func deadHeaders(i int) map[string]string {
	return map[string]string{
		idem.HeaderDeadLetterReason:  idem.ReasonPoison,
		idem.HeaderDeadLetterStatus:  "Failed",
		idem.HeaderDeadLetterError:   "idem: poison message: message \"m-" + strconv.Itoa(i) + "\", after attempt 3 (MaxAttempts 3): ledger unavailable",
		idem.HeaderOriginalMessageID: "m-" + strconv.Itoa(i),
	}
}

// BenchmarkDeadLettersPage reads the dead-letters page (its causes over
// the newest 1,000, a page of 50) of a destination holding 5,000 dead
// letters.
func BenchmarkDeadLettersPage(b *testing.B) {
	ctx := context.Background()
	page := func(b *testing.B, dls console.DeadLetters, dest string) {
		for b.Loop() {
			v, err := console.ReadDeadLetters(ctx, dls, dest, "c", "", 50, 0, false)
			if err != nil || v.Scanned != 1000 || len(v.Letters) != 50 || len(v.Groups) != 1 {
				b.Fatalf("%+v %v", v.Groups, err)
			}
		}
	}
	b.Run("jetstream", func(b *testing.B) {
		nc, err := nats.Connect(testenv.URL(b, "IDEM_TEST_NATS_URL", "nats://127.0.0.1:4222"))
		if err != nil {
			b.Fatal(err)
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		sfx := suffix()
		dest := "bench." + sfx + ".dead"
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH_" + sfx, Subjects: []string{dest}, Storage: jetstream.MemoryStorage}); err != nil {
			b.Fatal(err)
		}
		defer js.DeleteStream(ctx, "BENCH_"+sfx)
		for i := range benchLetters {
			m := nats.NewMsg(dest)
			m.Data = []byte("payload")
			for k, v := range deadHeaders(i) {
				m.Header.Set(k, v)
			}
			m.Header.Set(idemnats.HeaderOriginalSubject, "bench.src")
			if _, err := js.PublishMsgAsync(m); err != nil {
				b.Fatal(err)
			}
		}
		<-js.PublishAsyncComplete()
		page(b, deadletter.NewJetStream(js, "NATS", nil), dest)
	})
	b.Run("redis", func(b *testing.B) {
		opts, err := redis.ParseURL(testenv.URL(b, "IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"))
		if err != nil {
			b.Fatal(err)
		}
		rdb := redis.NewClient(opts)
		defer rdb.Close()
		dest := "bench:" + suffix() + ":dead"
		defer rdb.Del(ctx, dest)
		pipe := rdb.Pipeline()
		for i := range benchLetters {
			vals := []any{idemredisstream.DefaultPayloadField, "payload", idemredisstream.FieldOriginalStream, "bench:src"}
			for k, v := range deadHeaders(i) {
				vals = append(vals, k, v)
			}
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: dest, Values: vals})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			b.Fatal(err)
		}
		page(b, deadletter.NewRedisStreams(rdb, "Redis"), dest)
	})
}
