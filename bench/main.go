// Command bench is idem's benchmark harness: in one process and one run it
// puts the same workload (N messages, a fraction of them published twice,
// one side-effect row per message) through five kinds of consumer (six on
// PostgreSQL) on the same broker and the same store, measures the outbox
// relay's sending rate to that broker, and reports throughput
// and per-message latency as ratios against a naive consumer, throughput
// also against the best a person can hand-write (PostgreSQL), beside a
// correctness column per fault.
//
// Run it from the repository root (the go.work workspace):
//
//	go run ./bench --out results            # full mode, a few minutes
//	go run ./bench --quick --out /tmp/r      # under a minute; what the tests run
//
// Contenders:
//   - naive: the handler writes its row in a transaction of its own; no
//     deduplication.
//   - best (PostgreSQL only): the best a person can hand-write for the
//     same guarantee: BEGIN pipelined with a plain INSERT ... ON CONFLICT
//     DO NOTHING into a processed table of one text primary key and a
//     processed_at column, claimed when a row was inserted; the row written
//     in the same transaction; COMMIT (a duplicate: ROLLBACK, and acked).
//     The "× best" column is each contender's throughput against it.
//   - best_checked (every store): the hand-written consumer with idem's
//     guarantee: a processed table of the message ID, the payload's
//     SHA-256 fingerprint and the time of processing, with an index on
//     that time for a purge by age; BEGIN, a plain INSERT ... ON CONFLICT
//     DO NOTHING (INSERT IGNORE on MariaDB),
//     the row, COMMIT; on a conflict the stored fingerprint is read and
//     compared, then ROLLBACK. best_checked_batchN does the same for N
//     messages with one claim statement. The "× best_checked" column is
//     each contender's throughput against it (idem-batchN against
//     best_checked_batchN).
//   - idem: idem.Consumer in transactional mode through idem.Bind; the row
//     is written in the claim's transaction.
//   - idem-outbox: idem with one outgoing message per new message: the
//     handler writes the row and emits a message (idem.Emit) to a stream
//     or topic of the run's own, in the claim's transaction; an
//     idem.Relay (its defaults: 2 rounds in flight, claims of up to 1,000
//     rows) sends it to the broker through the
//     adapter's publisher (idemnats, idemkafka), woken by the consumer
//     after each commit. The "× idem" column is the outbox's cost; the
//     run also waits until the broker holds every outgoing message
//     ("outgoing held / emitted").
//   - idem-batchN: idem.BindBatch, N messages claimed with one statement
//     and their rows written with one statement, in one transaction.
//   - watermill-dedup: Watermill v1.5.1's message.Router with its
//     middleware.Deduplicator (keyed on the producer's message ID, over the
//     in-memory expiring key repository, the only one Watermill ships)
//     in front of the naive handler.
//   - relay: the relay alone. The outbox is filled with 4 × N pending
//     messages (at least 20,000; N with --quick) by batches of idem
//     consumer processing, with no relay running; then a relay (its
//     defaults, as above) sends them to the broker. msgs/s counts
//     messages sent, from the relay's start to the round that sent the
//     last one; it has no ratios and no fault runs.
//
// Every contender consumes through the same broker clients: a JetStream pull
// consumer of nats.go on an in-process nats-server (memory storage), and a
// franz-go consumer-group client on an in-process kfake cluster (one broker,
// four partitions), with offsets committed after every delivery of a poll
// was handled. Watermill reads them through a minimal message.Subscriber
// written here (watermill-nats and watermill-kafka use other clients, Sarama
// for Kafka, which would measure the client library instead of the
// deduplication). Stores: SQLite through store/idemsql (modernc.org/sqlite,
// WAL, synchronous FULL), PostgreSQL through store/idempgxv5 when
// IDEM_TEST_POSTGRES_DURABLE_URL (preferred: durable settings) or
// IDEM_TEST_POSTGRES_URL is set, and MariaDB through store/idemsql with
// --stores mysql (IDEM_TEST_MYSQL_URL, a go-sql-driver DSN).
//
// Each contender gets --rounds throughput runs (3 by default, after a
// warm-up run that is discarded), taken round-robin over the contenders,
// and the medians are reported. In a throughput run the workload is
// published, then consumed by --workers concurrent handlers; throughput is deliveries
// acknowledged per second from the first delivery handled to the last ack,
// and latency is per delivery from the moment a handler takes it (or the
// batch holding it) to its ack. Its side-effect table gives the "duplicates
// published" column. Then two fault runs per contender, run side by side
// since they are not timed: the handler fails on its first attempt at one
// message in twenty, after writing its row; and the consumer dies right
// after committing a message and before acknowledging it (and whatever else
// it held), and a new consumer starts. Each correctness cell is "double /
// lost": message IDs with more than one side-effect row, and IDs with none.
//
// Output: a Markdown table on stdout, and results.csv and throughput.png
// (gonum/plot) in the folder given by --out.
//
// With --round-trips N the harness prints only lease mode's store calls
// per message (a new message, a duplicate, a release after a known
// failure), as the at-most-once front ends (idemhttp, idemgrpc, idem
// consume) make them, counted by idemtest.CallCounter over N messages per
// case, for memory, SQLite, PostgreSQL through pgx and through
// database/sql, MariaDB and Redis (those whose URL is set): with the
// stores' idemdriver.StepRecorder capability, and with it hidden (the
// calls before it existed), and the time of a new message of each:
//
//	go run ./bench --round-trips 200
//
// With --process D it measures only the store, no broker: the cases of
// store/idempgxv5's BenchmarkProcess (best_checked, idem,
// best_checked_duplicate, duplicate, best_checked_batch100,
// idem_batch100) for D each, --rounds interleaved rounds (5 by default),
// --workers at a time, on --stores: postgres (pgx), postgres-sql
// (database/sql on the same server), mysql, sqlite. Each result line, in
// go test -bench's format, carries throughput, client and server CPU, log
// bytes and allocations per message and the per-round ratios (process.go):
//
//	go run ./bench --process 2s --stores postgres,postgres-sql,mysql,sqlite
//
// With --sidecar N it measures only `idem consume` (built from ./cmd/idem)
// against a bare Go relay that fetches from JetStream (nats.go's Fetch),
// POSTs and acks, both at --workers messages at a time, with a
// do-nothing HTTP service, N messages per run, --rounds interleaved rounds
// (5 by default, after a discarded warm-up), on SQLite, PostgreSQL and
// Redis (those whose URL is set), with idem consume's store batches and
// without (--store-batch 64 and 1), and beside a direct Go consumer on the
// same store (SQLite and PostgreSQL); it reports idem consume's CPU,
// allocations and peak RSS per message (the IDEM_BENCH_* variables of
// sidecar.go choose contenders, a prebuilt binary, a baseline binary and
// profiles). It needs a NATS server with JetStream (IDEM_TEST_NATS_URL):
//
//	go run ./bench --sidecar 3000
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := cli(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		if errors.Is(err, errUsage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// cli parses args, runs the harness, prints the table to stdout and writes
// the files. Progress goes to stderr.
func cli(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	var brokers, stores, batches string
	fs.StringVar(&o.out, "out", "results", "folder for results.csv and throughput.png")
	fs.BoolVar(&o.quick, "quick", false, "a short run (under a minute): small N, one batch size, one crash")
	fs.IntVar(&o.n, "n", 0, "distinct messages per throughput run (default 5000; 200 with --quick)")
	fs.Float64Var(&o.dupFraction, "dup-fraction", 0.1, "fraction of the messages published a second time")
	fs.IntVar(&o.faultN, "fault-n", 0, "distinct messages per fault run (default 500; 40 with --quick)")
	fs.IntVar(&o.workers, "workers", 8, "deliveries (or batches) handled at once by each consumer")
	fs.IntVar(&o.rounds, "rounds", 0, "throughput runs per contender, round-robin; medians reported (default 3; 1 with --quick)")
	fs.StringVar(&batches, "batch-sizes", "", "batch sizes of the idem-batch contenders (default 10,100; 10 with --quick)")
	fs.StringVar(&brokers, "brokers", "nats,kafka", "brokers: nats (in-process JetStream), kafka (kfake)")
	fs.StringVar(&stores, "stores", "", "stores: sqlite, postgres, mysql (default sqlite, and postgres when "+envPostgresDurable+" (preferred) or "+envPostgres+" is set)")
	fs.StringVar(&stores, "store", "", "the same as --stores")
	fs.BoolVar(&o.verbose, "v", true, "progress on stderr")
	var roundTrips int
	fs.IntVar(&roundTrips, "round-trips", 0, "only print lease mode's store calls per message (new, duplicate, release; now and before the acquire recorded the run point), over this many messages per case, for memory, sqlite, postgres (pgx and database/sql, when "+envPostgresDurable+" or "+envPostgres+" is set), mariadb ("+envMySQL+") and redis ("+envRedis+"), and exit")
	var sidecar int
	fs.IntVar(&sidecar, "sidecar", 0, "only measure `idem consume` (built from ./cmd/idem) against a bare relay (JetStream Fetch, POST, ack) over this many messages per run, --rounds rounds (default 5), --workers at a time, on sqlite, postgres and redis (those whose URL is set), with and without store batches; needs "+envNATS+" (or "+envSidecarBroker+"=kafka: kfake in this process; or "+envSidecarBroker+"=redis: Redis Streams on "+envRedis+"); "+envCPUPIDs+"=name=PID,... adds the CPU of those servers; and exit")
	var process time.Duration
	fs.DurationVar(&process, "process", 0, "only measure the store alone, no broker: best_checked, idem, best_checked_duplicate, duplicate, best_checked_batch100, idem_batch100, best_outbox1 and idem_outbox1 (the outbox: processing that emits one message, the relay sending and deleting it in the timed section) for this long each, --rounds rounds (default 5), --workers at a time, on --stores (postgres, postgres-sql (database/sql), mysql, sqlite; default sqlite and postgres when its URL is set), with CPU, log bytes and allocations per message, and exit")
	var only string
	fs.StringVar(&only, "contenders", "", "run only these contenders (default all: naive, best (PostgreSQL only), best_checked, best_checked_batchN, idem, idem-outbox, idem-batchN, watermill-dedup, relay)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil // -h, --help: the usage was printed; exit 0
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	if roundTrips < 0 {
		return fmt.Errorf("%w: --round-trips %d", errUsage, roundTrips)
	}
	if sidecar < 0 {
		return fmt.Errorf("%w: --sidecar %d", errUsage, sidecar)
	}
	if sidecar > 0 {
		var log io.Writer
		if o.verbose {
			log = stderr
		}
		rounds := o.rounds
		if rounds == 0 {
			rounds = 5
		}
		load0 := loadAvg()
		if err := runSidecar(ctx, stdout, log, sidecar, rounds, o.workers); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "\nload average %s at the start, %s at the end\n", load0, loadAvg())
		return nil
	}
	if process > 0 {
		var log io.Writer
		if o.verbose {
			log = stderr
		}
		po := processOptions{caseTime: process, rounds: o.rounds, workers: o.workers, stores: splitList(stores), cases: splitList(only)}
		if po.rounds == 0 {
			po.rounds = 5
		}
		if len(po.stores) == 0 {
			po.stores = []string{"sqlite"}
			if postgresURL() != "" {
				po.stores = append(po.stores, "postgres")
			}
		}
		return runProcess(ctx, stdout, log, po)
	}
	if roundTrips > 0 {
		var log io.Writer
		if o.verbose {
			log = stderr
		}
		if err := runRoundTrips(ctx, stdout, log, roundTrips); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "\nload average %s\n", loadAvg())
		return nil
	}
	o.brokers = splitList(brokers)
	o.stores = splitList(stores)
	o.contenders = splitList(only)
	for _, b := range splitList(batches) {
		n, err := strconv.Atoi(b)
		if err != nil {
			return fmt.Errorf("%w: --batch-sizes: %v", errUsage, err)
		}
		o.batchSizes = append(o.batchSizes, n)
	}
	if o.verbose {
		o.log = stderr
	}
	start := time.Now()
	rs, h, err := run(ctx, o)
	if err != nil {
		return err
	}
	if err := writeMarkdown(stdout, rs); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\n%s\n", h.describe(time.Since(start)))
	if err := writeOutputs(h.o.out, rs); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "wrote %s/%s and %s/%s\n", h.o.out, csvFile, h.o.out, chartFile)
	return nil
}
