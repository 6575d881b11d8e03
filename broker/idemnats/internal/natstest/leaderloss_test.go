package natstest

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem/broker/idemnats"
	"github.com/idem-go/idem/internal/testenv"
)

// TestPullRequestLostWithLeader: a pull request that no server answers (it
// was sent while the consumer had no leader, and JetStream dropped it
// without a word, or it waited at a leader that died) is given up after
// two missed heartbeats of the one a second every request asks for (not
// nats.go's 5s for a 30s request: 10s per lost request), and the next one
// goes out and delivers. The Consumer's JetStream API requests go through
// a prefix of the test's own, which forwards them to the in-process
// server's JetStream, except the first pull request, which it drops.
func TestPullRequestLostWithLeader(t *testing.T) {
	t.Parallel()
	conn := inProcess(t)
	_, js := newJS(t, conn)
	s := newStreams(t, js, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := s.stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	relay := conn(t)
	next := "FAKE.API.CONSUMER.MSG.NEXT." + s.name + ".C"
	var mu sync.Mutex
	var pulls []map[string]int64 // the pull requests' bodies, the dropped one first
	if _, err := relay.Subscribe("FAKE.API.>", func(m *nats.Msg) {
		if m.Subject == next {
			var req map[string]int64
			if err := json.Unmarshal(m.Data, &req); err != nil {
				t.Errorf("pull request %q: %v", m.Data, err)
			}
			mu.Lock()
			pulls = append(pulls, req)
			first := len(pulls) == 1
			mu.Unlock()
			if first {
				return // lost with its leader
			}
		}
		fwd := nats.NewMsg("$JS.API." + strings.TrimPrefix(m.Subject, "FAKE.API."))
		fwd.Reply, fwd.Data, fwd.Header = m.Reply, m.Data, m.Header
		if err := relay.PublishMsg(fwd); err != nil {
			t.Errorf("forward %s: %v", m.Subject, err)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := relay.Flush(); err != nil {
		t.Fatal(err)
	}
	pjs, err := jetstream.NewWithAPIPrefix(conn(t), "FAKE.API")
	if err != nil {
		t.Fatal(err)
	}
	cons, err := pjs.Consumer(ctx, s.name, "C")
	if err != nil {
		t.Fatal(err)
	}
	st := newSQLiteTx(t)
	c, err := idemnats.NewConsumer(pjs, cons, idemnats.Config{Processor: st.proc, DeadLetter: s.dlSubject, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	runConsumer(t, c)
	if _, err := idemnats.NewProducer(js).Publish(ctx, s.subject, []byte("p"), idemnats.WithMessageID("m-1")); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the message processed after the first pull request was lost", func() bool {
		r, _ := st.effects(t)
		return r == 1
	}, nil)
	testenv.Eventually(t, 30*time.Second, "the message acknowledged", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.AckFloor.Stream == 1
	}, nil)
	mu.Lock()
	defer mu.Unlock()
	if len(pulls) < 2 {
		t.Fatalf("%d pull requests, want the dropped one and another", len(pulls))
	}
	for i, req := range pulls {
		if hb := time.Duration(req["idle_heartbeat"]); hb != time.Second {
			t.Errorf("pull request %d asks for heartbeats every %v, want 1s (requests %v)", i, hb, pulls)
		}
	}
}
