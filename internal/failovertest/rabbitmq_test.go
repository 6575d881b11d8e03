package failovertest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemamqp"
	"github.com/idem-go/idem/internal/ownservice"
	"github.com/idem-go/idem/internal/testenv"
)

// TestRabbitMQQuorumLeaderFailover publishes messages with stable IDs
// (the message_id property, idemamqp.WithMessageID) with publisher
// confirms to a quorum queue on a three-node RabbitMQ cluster (Debian's
// rabbitmq-server, scripts/services start rabbitmq-ha) while idemamqp
// consumes them into a transactional idem consumer whose effect is a
// counter that commits with the record (a MemoryStore, which does not fail
// over). Mid-load the node leading the queue is SIGKILLed; the other two
// elect a new leader, and the killed node is started again on its state.
// Producer and consumer reconnect through Redial, to the next node that
// answers. A publish counts once RabbitMQ confirmed it; lost is a message
// so confirmed whose effect never ran, doubles an effect run twice; the
// time to recover runs from the kill to the first publish confirmed after
// it. A quorum queue confirms a publish once a majority of its members
// wrote it, so one node's death loses nothing: asserted, as are the
// doubles, which idem's record rules out whatever RabbitMQ redelivers. It
// makes reducedRounds failovers.
func TestRabbitMQQuorumLeaderFailover(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	knobs := []string{"IDEM_RABBITMQ_HA_PORT", "IDEM_RABBITMQ_HA_PORT2", "IDEM_RABBITMQ_HA_PORT3",
		"IDEM_RABBITMQ_HA_DIST_PORT", "IDEM_RABBITMQ_HA_DIST_PORT2", "IDEM_RABBITMQ_HA_DIST_PORT3", "IDEM_RABBITMQ_HA_EPMD_PORT"}
	ports, err := ownservice.FreePorts(len(knobs))
	if err != nil {
		t.Fatal(err)
	}
	var env []string
	for i, k := range knobs {
		env = append(env, fmt.Sprintf("%s=%d", k, ports[i]))
	}
	c := ownservice.StartEnv(t, "rabbitmq-ha", env...)
	cl := &rabbitCluster{urls: strings.Split(c.URL, ","), dir: filepath.Join(c.Dir, "rabbitmq-ha"), amqpPorts: ports[:3], epmdPort: ports[6]}

	const queue, dead = "failover", "failover.dead"
	conn, err := cl.dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{queue, dead} {
		if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
			t.Fatal(err)
		}
	}
	_ = ch.Close()

	var effects effectCounter
	var redelivered atomic.Int64 // deliveries idem answered Duplicate
	store := idem.NewMemoryStore(nil)
	consumer, err := idem.NewConsumer(store, idem.Config{Name: "failover", PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	bound := idem.Bind(consumer, func(ctx context.Context, tx *idem.MemoryTx, m idem.Message) error {
		tx.OnCommit(func() { effects.add(m.ID) })
		return nil
	})
	sub, err := idemamqp.NewConsumer(conn, idemamqp.Config{
		Processor: idem.ProcessorFunc(func(ctx context.Context, m idem.Message) (idem.Outcome, error) {
			out, err := bound.Process(ctx, m)
			if err == nil && out.Status == idem.Duplicate {
				redelivered.Add(1)
			}
			return out, err
		}),
		Queue: queue, DeadLetter: dead, Concurrency: workers, Prefetch: 2 * workers,
		RetryDelay: 100 * time.Millisecond, Redial: cl.dial, MaxReconnectInterval: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer background(ctx, sub.Run)()
	pconn, err := cl.dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer pconn.Close()
	producer := idemamqp.NewProducer(pconn, idemamqp.ProducerConfig{Redial: cl.dial, MaxReconnectInterval: time.Second})
	defer producer.Close()

	var m matrix
	n := messages(t)
	for r := range reducedRounds(t) {
		all := ids(r, n)
		redelivered.Store(0)
		rejoined := make(chan error, 1)
		kill := func() {
			leader, err := cl.leader(ctx, queue)
			if err != nil {
				t.Fatal(err)
			}
			if err := ownservice.KillPIDFile(filepath.Join(cl.dir, fmt.Sprintf("node%d", leader), "rabbitmq.pid")); err != nil {
				t.Fatal(err)
			}
			go func() { rejoined <- c.Restart() }()
		}
		// A publish RabbitMQ did not confirm within 5 s is sent again.
		published, recovered := publishThrough(t, all, n/3, kill, 5*time.Second, 3*time.Minute, func(ctx context.Context, id string) error {
			_, err := producer.Publish(ctx, queue, []byte(id), idemamqp.WithMessageID(id))
			return err
		})
		// Every confirmed publish should reach the effect; wait until it
		// does, or until nothing more arrives for 15 seconds.
		awaitEffects(all, effects.snapshot, 15*time.Second)
		if err := <-rejoined; err != nil {
			t.Fatal(err)
		}
		doubles, lost := m.add(roundResult{acked: published, recover: recovered}, all, effects.snapshot())
		t.Logf("round %d: %d doubles, %d lost (confirmed, no effect), %d deliveries idem answered Duplicate, recovered in %v",
			r, doubles, lost, redelivered.Load(), recovered)
		if doubles != 0 || lost != 0 {
			t.Errorf("round %d: %d doubles, %d lost; want none with a quorum queue and one node killed", r, doubles, lost)
		}
		var members []string
		testenv.Eventually(t, 3*time.Minute, "every member of the quorum queue online again", func() bool {
			members, err = cl.online(ctx, queue)
			return err == nil && len(members) == 3
		}, func() string { return fmt.Sprint(members, err) })
	}
	t.Logf("RabbitMQ quorum queue (3 nodes), leader node killed: %v", &m)
}

// rabbitCluster is rabbitmq-ha as the test sees it: the nodes' AMQP URLs
// (node 1 first), its state directory and the ports that name its nodes.
type rabbitCluster struct {
	urls      []string
	dir       string
	amqpPorts []int
	epmdPort  int
	next      atomic.Int64 // the node dial tries first
}

// dial connects to the first node that answers, starting after the one
// dialled last: idemamqp's Redial.
func (c *rabbitCluster) dial(ctx context.Context) (*amqp.Connection, error) {
	var errs []error
	for range c.urls {
		u := c.urls[int(c.next.Add(1))%len(c.urls)]
		conn, err := amqp.DialConfig(u, amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
		if err == nil {
			return conn, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errors.Join(errs...)
}

// node returns the number (1..3) of the node named name.
func (c *rabbitCluster) node(name string) (int, error) {
	for i, p := range c.amqpPorts {
		if name == fmt.Sprintf("rqha%d-%d@localhost", i+1, p) {
			return i + 1, nil
		}
	}
	return 0, fmt.Errorf("no node of rabbitmq-ha is named %q", name)
}

// queueInfo asks the nodes in turn for queue's leader and online members
// (rabbitmqctl list_queues, as scripts/services runs it).
func (c *rabbitCluster) queueInfo(ctx context.Context, queue string) (leader string, online []string, err error) {
	for i, p := range c.amqpPorts {
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		cmd := exec.CommandContext(cctx, "rabbitmqctl", "-n", fmt.Sprintf("rqha%d-%d@localhost", i+1, p),
			"list_queues", "name", "leader", "online", "--formatter", "json", "-q")
		cmd.Env = append(os.Environ(), "ERL_EPMD_ADDRESS=127.0.0.1", fmt.Sprintf("ERL_EPMD_PORT=%d", c.epmdPort))
		var out, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &stderr
		err = cmd.Run()
		cancel()
		if err != nil {
			err = fmt.Errorf("rabbitmqctl list_queues on node%d: %v: %s", i+1, err, stderr.String())
			continue
		}
		var qs []struct {
			Name   string   `json:"name"`
			Leader string   `json:"leader"`
			Online []string `json:"online"`
		}
		if err = json.Unmarshal(out.Bytes(), &qs); err != nil {
			continue
		}
		for _, q := range qs {
			if q.Name == queue {
				return q.Leader, q.Online, nil
			}
		}
		return "", nil, fmt.Errorf("queue %q not listed by node%d", queue, i+1)
	}
	return "", nil, err
}

// leader returns the number (1..3) of the node leading queue.
func (c *rabbitCluster) leader(ctx context.Context, queue string) (int, error) {
	name, _, err := c.queueInfo(ctx, queue)
	if err != nil {
		return 0, err
	}
	return c.node(name)
}

// online returns queue's online members, sorted.
func (c *rabbitCluster) online(ctx context.Context, queue string) ([]string, error) {
	_, online, err := c.queueInfo(ctx, queue)
	slices.Sort(online)
	return online, err
}
