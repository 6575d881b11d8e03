package idemcli

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem/broker/idemkafka"
	"github.com/idem-go/idem/internal/testenv"
)

// partitionLog is a service's log of the calls it received, by the Kafka
// partition of each message (known from the produce): the offsets called,
// in the order the calls started.
type partitionLog struct {
	mu      sync.Mutex
	where   map[string][2]int64 // message ID -> partition, offset
	offsets map[int64][]int64   // partition -> offsets called, in order
	ok      map[string]bool     // answered 2xx
}

func (l *partitionLog) call(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.where[id]
	l.offsets[w[0]] = append(l.offsets[w[0]], w[1])
}

func (l *partitionLog) answered(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ok[id] = true
}

func (l *partitionLog) done() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ok)
}

// kafkaNumbered starts a kfake cluster with topic (of partitions
// partitions) and its dead letter topic, and produces n records to topic,
// message IDs m-00, m-01, ..., record i keyed key(i); it returns the
// cluster and the records as produced (partitions and offsets set).
func kafkaNumbered(t *testing.T, partitions int32, topic string, n int, key func(i int) []byte) (*kfake.Cluster, []*kgo.Record) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic, topic+"-dead"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	prod, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	rs := make([]*kgo.Record, n)
	for i := range rs {
		rs[i] = &kgo.Record{Topic: topic, Key: key(i), Value: []byte("p"),
			Headers: []kgo.RecordHeader{{Key: idemkafka.DefaultIDHeader, Value: fmt.Appendf(nil, "m-%02d", i)}}}
	}
	if err := prod.ProduceSync(context.Background(), rs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	return c, rs
}

// TestConsumeBatchClaimKafka: `idem consume --batch-claim --concurrency 2
// --hold 16` on Kafka (kfake, 3 partitions) calls the records of each
// partition in offset order, one at a time: a record answered 503 twice
// is retried before the next record of its partition is called, a record
// refused (422) is dead-lettered and the next one called. No record is
// lost or answered 2xx twice, every message has its record in the
// store, and the refused one is in the dead letter topic.
func TestConsumeBatchClaimKafka(t *testing.T) {
	t.Parallel()
	const n, concurrency, hold = 90, 2, 16
	topic := "batch-in"
	// Nine keys: the records of a key go to one partition, in order.
	c, rs := kafkaNumbered(t, 3, topic, n, func(i int) []byte { return fmt.Appendf(nil, "k%d", i%9) })
	ctx := context.Background()
	log := &partitionLog{where: map[string][2]int64{}, offsets: map[int64][]int64{}, ok: map[string]bool{}}
	for _, r := range rs {
		log.where[string(r.Headers[0].Value)] = [2]int64{int64(r.Partition), r.Offset}
	}

	calls := &callLog{}
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer calls.call(r)()
		id := r.Header.Get("Idempotency-Key")
		log.call(id)
		calls.mu.Lock()
		k := calls.calls[id]
		calls.mu.Unlock()
		switch {
		case id == "m-07":
			w.WriteHeader(http.StatusUnprocessableEntity)
			return
		case id == "m-40" && k <= 2:
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		log.answered(id)
		w.WriteHeader(http.StatusOK)
	}))
	defer svc.Close()

	storePath := filepath.Join(t.TempDir(), "c.db")
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stderr, done := startConsume(rctx, "--broker", "kafka://"+strings.Join(c.ListenAddrs(), ","), "--from", topic,
		"--to", svc.URL+"/in", "--store", "sqlite:"+storePath, "--log-level", "warn", "--batch-claim",
		"--retry-base", "20ms", "--concurrency", fmt.Sprint(concurrency), "--hold", fmt.Sprint(hold))
	testenv.Eventually(t, 60*time.Second, "every record answered 2xx but the refused one",
		func() bool { return log.done() == n-1 },
		func() string { return fmt.Sprintf("%d answered\n%s", log.done(), stderr()) })
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("consume exit %d:\n%s", code, stderr())
	}

	for _, id := range []string{"m-07", "m-40"} {
		if w := log.where[id]; len(log.offsets[w[0]]) == 0 {
			t.Fatalf("%s's partition got no call", id)
		}
	}
	log.mu.Lock()
	for p, offs := range log.offsets {
		for i := 1; i < len(offs); i++ {
			if offs[i] < offs[i-1] {
				t.Errorf("partition %d: offsets called %v; want offset order (a retry before the next)", p, offs)
				break
			}
		}
	}
	log.mu.Unlock()
	for i := range n {
		id := fmt.Sprintf("m-%02d", i)
		want := 1
		if id == "m-40" {
			want = 3
		}
		if got := calls.calls[id]; got != want {
			t.Errorf("%s called %d times, want %d", id, got, want)
		}
	}
	if most := calls.peak(); most > concurrency {
		t.Errorf("%d calls ran at once; want at most --concurrency %d", most, concurrency)
	}

	wantRecords(t, storePath, n)

	dl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic+"-dead"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer dl.Close()
	pctx, pcancel := context.WithTimeout(ctx, 20*time.Second)
	defer pcancel()
	var dead []string
	for len(dead) == 0 && pctx.Err() == nil {
		dl.PollFetches(pctx).EachRecord(func(r *kgo.Record) {
			for _, h := range r.Headers {
				if h.Key == idemkafka.DefaultIDHeader {
					dead = append(dead, string(h.Value))
				}
			}
		})
	}
	if len(dead) != 1 || dead[0] != "m-07" {
		t.Errorf("dead letters %v, want [m-07]", dead)
	}
}

// TestConsumeBatchClaimKafkaStop: a graceful stop of `idem consume
// --batch-claim` on Kafka while a record is being retried in place (its
// service answers 503 each time) ends at once, with exit status 0, not
// after --shutdown-timeout with an error: the retry and the records after
// it are left to the next run, never called, and the records before it
// were called once each.
func TestConsumeBatchClaimKafkaStop(t *testing.T) {
	t.Parallel()
	const n = 10
	topic := "batch-stop"
	c, _ := kafkaNumbered(t, 1, topic, n, func(int) []byte { return nil })
	ctx := context.Background()
	calls := &callLog{}
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer calls.call(r)()
		if r.Header.Get("Idempotency-Key") == "m-03" {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer svc.Close()
	count := func(id string) int {
		calls.mu.Lock()
		defer calls.mu.Unlock()
		return calls.calls[id]
	}

	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stderr, done := startConsume(rctx, "--broker", "kafka://"+strings.Join(c.ListenAddrs(), ","), "--from", topic,
		"--to", svc.URL+"/in", "--store", "sqlite:"+filepath.Join(t.TempDir(), "c.db"), "--log-level", "warn",
		"--batch-claim", "--retry-base", "20ms", "--retry-max", "100ms", "--max-attempts", "1000",
		"--concurrency", "1", "--hold", "10", "--shutdown-timeout", "60s")
	testenv.Eventually(t, 60*time.Second, "m-03 retried in place", func() bool { return count("m-03") >= 3 },
		func() string { return stderr() })
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("consume exit %d:\n%s", code, stderr())
	}
	for i := range n {
		id := fmt.Sprintf("m-%02d", i)
		switch got := count(id); {
		case i < 3 && got != 1:
			t.Errorf("%s called %d times, want 1", id, got)
		case i > 3 && got != 0:
			t.Errorf("%s called %d times, want 0 (after the record retried)", id, got)
		}
	}
}
