//go:build !nodemo

package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

func TestDemoChargesEveryPaymentOnce(t *testing.T) {
	t.Parallel()
	code, out, errOut := run(t, "demo", "--messages", "600", "--duplicates", "0.2", "--crash-rate", "0.04",
		"--consumers", "3", "--ack-wait", "300ms", "--json", "--progress", "none")
	if code != 0 {
		t.Fatalf("exit %d, stderr: %s\nstdout: %s", code, errOut, out)
	}
	var rep report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("report is not JSON: %v\n%s", err, out)
	}
	if rep.Messages != 600 || rep.LedgerCharges != 600 || rep.ProviderCharges != 600 {
		t.Errorf("charges: messages %d, ledger %d, provider %d; want 600 each", rep.Messages, rep.LedgerCharges, rep.ProviderCharges)
	}
	if rep.DoubleCharges != 0 || rep.Lost != 0 || rep.DeadLettered != 0 {
		t.Errorf("double charges %d, lost %d, dead letters %d; want 0, 0, 0", rep.DoubleCharges, rep.Lost, rep.DeadLettered)
	}
	// Every duplicate that JetStream let through (its dedupe window is
	// 100ms in the demo) reached idem and was absorbed.
	if reached := rep.DuplicatesPublished - rep.BrokerDroppedDups; rep.DuplicatesPublished == 0 || rep.DuplicatesAbsorbed < reached {
		t.Errorf("duplicates published %d, dropped by the broker %d, absorbed %d", rep.DuplicatesPublished, rep.BrokerDroppedDups, rep.DuplicatesAbsorbed)
	}
	// Consumers died after the provider's charge and before their commit:
	// the redeliveries sent the same derived key and the provider replayed
	// the first charge instead of charging again.
	if rep.ProviderReplays == 0 {
		t.Errorf("provider replays 0: no crash between the provider call and the commit was exercised (crashes %d)", rep.ConsumerCrashes)
	}
	wantReceiptedOnce(t, rep, 600)
	// Every message and every duplicate the broker let through was
	// delivered at least once (a copy its dedupe window dropped was not).
	if want := int64(rep.Messages) + rep.DuplicatesPublished - rep.BrokerDroppedDups; rep.Deliveries < want {
		t.Errorf("deliveries %d < messages + duplicates not dropped by the broker %d", rep.Deliveries, want)
	}
	// The JSON keys are an interface: check the names the issue fixes.
	var keys map[string]any
	_ = json.Unmarshal([]byte(out), &keys)
	for _, k := range []string{"messages", "deliveries", "duplicates_absorbed", "ledger_charges", "provider_charges",
		"double_charges", "lost", "dead_lettered", "elapsed_s", "messages_per_s",
		"events_emitted", "receipts_sent", "double_receipts", "lost_receipts"} {
		if _, ok := keys[k]; !ok {
			t.Errorf("JSON report lacks %q", k)
		}
	}
}

func TestDemoResumesOnTheSameDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	args := []string{"demo", "--dir", dir, "--messages", "300", "--json", "--progress", "none", "--ack-wait", "300ms"}
	if code, out, errOut := run(t, args...); code != 0 {
		t.Fatalf("first run: exit %d: %s %s", code, errOut, out)
	}
	for _, f := range []string{"consumer.db", "provider.db", "producer.next", "nats"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("--dir lacks %s: %v", f, err)
		}
	}
	// A second run finds everything published and charged: it publishes
	// nothing new and charges nothing twice.
	code, out, errOut := run(t, args...)
	if code != 0 {
		t.Fatalf("second run: exit %d: %s %s", code, errOut, out)
	}
	var rep report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.LedgerCharges != 300 || rep.ProviderCharges != 300 || rep.DoubleCharges != 0 || rep.Lost != 0 {
		t.Errorf("second run report %+v", rep)
	}
	wantReceiptedOnce(t, rep, 300)
}

// demoJSON runs `idem demo --json --progress none` with args, requires
// exit status 0 and returns the report.
func demoJSON(t *testing.T, args ...string) (report, string) {
	t.Helper()
	code, out, errOut := run(t, append([]string{"demo", "--json", "--progress", "none"}, args...)...)
	if code != 0 {
		t.Fatalf("exit %d: %s\n%s", code, errOut, out)
	}
	var rep report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("report is not JSON: %v\n%s", err, out)
	}
	return rep, out
}

// wantChargedOnce checks that every one of n payments was charged exactly
// once, by the ledger and by the provider, and that consumers crashed.
func wantChargedOnce(t *testing.T, rep report, n int64) {
	t.Helper()
	if rep.LedgerCharges != n || rep.ProviderCharges != n || rep.DoubleCharges != 0 || rep.Lost != 0 || rep.DeadLettered != 0 {
		t.Errorf("report %+v: want %d charges, none double, none lost, no dead letters", rep, n)
	}
	if rep.ConsumerCrashes == 0 {
		t.Errorf("consumer crashes 0: the crashes were not exercised")
	}
	wantReceiptedOnce(t, rep, n)
}

// TestDemoKafkaRebalanceOnPostgres runs the seed's rebalance story: payments
// on an in-process three-broker Kafka cluster, consumers in one consumer
// group that die without committing offsets (a rebalance replays their
// records to the other members), and PostgreSQL as the store.
func TestDemoKafkaRebalanceOnPostgres(t *testing.T) {
	t.Parallel()
	pg := serviceURL(t, "IDEM_TEST_POSTGRES_URL")
	rep, _ := demoJSON(t, "--broker", "kafka:embedded", "--store", pg, "--messages", "800",
		"--crash-rate", "0.02", "--consumers", "3")
	wantChargedOnce(t, rep, 800)
	if rep.DuplicatesAbsorbed <= rep.DuplicatesPublished {
		t.Errorf("duplicates absorbed %d, published %d: want replays after crashes absorbed",
			rep.DuplicatesAbsorbed, rep.DuplicatesPublished)
	}
}

// TestDemoRedisLeaseMode runs the story in lease mode on Redis: the charge
// is a recovery point, the ledger row carries a key of its own, and
// consumers die between the provider call and the completion.
func TestDemoRedisLeaseMode(t *testing.T) {
	t.Parallel()
	rep, _ := demoJSON(t, "--store", serviceURL(t, "IDEM_TEST_REDIS_URL"), "--messages", "600", "--crash-rate", "0.04",
		"--consumers", "3", "--ack-wait", "300ms")
	wantChargedOnce(t, rep, 600)
	if !strings.HasPrefix(rep.Store, "redis at ") {
		t.Errorf("store %q: want redis", rep.Store)
	}
}

// TestDemoRabbitMQ runs the story on RabbitMQ: consumers that die close
// their channel and RabbitMQ requeues what they had not acked.
func TestDemoRabbitMQ(t *testing.T) {
	t.Parallel()
	rep, out := demoJSON(t, "--broker", serviceURL(t, "IDEM_TEST_AMQP_URL"), "--messages", "500", "--crash-rate", "0.04",
		"--consumers", "3")
	wantChargedOnce(t, rep, 500)
	if strings.Contains(out, "guest:guest") {
		t.Errorf("the report shows the broker password: %s", out)
	}
}

// TestDemoRedisStreams runs the story on a Redis stream with a consumer
// group: a consumer that dies leaves its entries pending, and XAUTOCLAIM
// hands them to another after the ack wait. The store is SQLite, so that
// this test and TestDemoRedisLeaseMode do not share the demo's Redis keys.
func TestDemoRedisStreams(t *testing.T) {
	t.Parallel()
	rep, _ := demoJSON(t, "--broker", serviceURL(t, "IDEM_TEST_REDIS_URL"), "--messages", "500", "--crash-rate", "0.04",
		"--consumers", "3", "--ack-wait", "300ms")
	wantChargedOnce(t, rep, 500)
}

// TestDemoExternalNATSOnMariaDB runs the story on the NATS server started by
// scripts/services (not the in-process one) with MariaDB as the store.
func TestDemoExternalNATSOnMariaDB(t *testing.T) {
	t.Parallel()
	natsURL := serviceURL(t, "IDEM_TEST_NATS_URL")
	mariadb := storeURLs(t)["mariadb"]
	if mariadb == "" {
		t.Skip("IDEM_TEST_MYSQL_URL is not set")
	}
	rep, _ := demoJSON(t, "--broker", natsURL, "--store", mariadb, "--messages", "500",
		"--crash-rate", "0.04", "--consumers", "3", "--ack-wait", "300ms")
	wantChargedOnce(t, rep, 500)
	if !strings.HasPrefix(rep.Store, "mysql at ") || !strings.HasPrefix(rep.Broker, "nats://") {
		t.Errorf("ran on store %q, broker %q", rep.Store, rep.Broker)
	}
}

// TestDemoBrokersDeadLetter runs each of the demo's brokers with a member
// whose every outcome is Rejected: the adapter moves the payment to the
// broker's dead letter and settles the original, and the report's count
// finds it there. It is not parallel: it shares the demo's queue and
// stream names on RabbitMQ and Redis with the parallel demo tests.
func TestDemoBrokersDeadLetter(t *testing.T) {
	ctx := t.Context()
	open := map[string]func() (demoBroker, error){
		"nats:embedded":  func() (demoBroker, error) { return openNATS(ctx, "nats:embedded", t.TempDir(), time.Second, true) },
		"kafka:embedded": func() (demoBroker, error) { return openKafka(ctx, "kafka:embedded") },
	}
	if u := optionalURL(t, "IDEM_TEST_AMQP_URL"); u != "" {
		open["amqp"] = func() (demoBroker, error) { return openAMQP(ctx, u, true) }
	}
	if u := optionalURL(t, "IDEM_TEST_REDIS_URL"); u != "" {
		open["redis streams"] = func() (demoBroker, error) { return openRedisStreams(ctx, u, time.Second, true) }
	}
	errNotAPayment := fmt.Errorf("%w: not a payment", idem.ErrInvalidPayload)
	reject := idem.ProcessorFunc(func(_ context.Context, msg idem.Message) (idem.Outcome, error) {
		return idem.Outcome{Status: idem.Rejected, MessageID: msg.ID, Err: errNotAPayment}, errNotAPayment
	})
	for name, openBroker := range open {
		t.Run(name, func(t *testing.T) {
			b, err := openBroker()
			if err != nil {
				t.Fatal(err)
			}
			defer b.close()
			m, err := b.member(ctx, reject, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			runCtx, cancel := context.WithCancel(ctx)
			ran := make(chan struct{})
			go func() { defer close(ran); _ = m.run(runCtx) }()
			defer func() { cancel(); <-ran; m.close() }()
			if _, err := b.publish(ctx, "pay-bad", []byte(`{"amount_cents":"x"}`)); err != nil {
				t.Fatal(err)
			}
			var dead int64
			var left int
			for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
				dead, _ = b.deadLettered(ctx)
				left, err = b.unfinished(ctx)
				if dead == 1 && left == 0 && err == nil {
					return
				}
			}
			t.Errorf("dead letters %d, unfinished %d (%v); want 1 and 0", dead, left, err)
		})
	}
}
