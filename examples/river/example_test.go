package riverexample_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/idem-go/idem"
	riverexample "github.com/idem-go/idem/examples/river"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
)

// provider stands for a payment provider with idempotency keys: a key it
// has seen gets the first charge back.
type provider struct {
	mu      sync.Mutex
	charges map[string]string // idempotency key -> charge ID
}

func (p *provider) Charge(_ context.Context, key string, _ riverexample.PaymentArgs) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if id, ok := p.charges[key]; ok {
		return id, nil
	}
	id := "ch_" + strconv.Itoa(len(p.charges)+1)
	p.charges[key] = id
	return id, nil
}

// A River client with both workers, and a payment enqueued twice: one
// ledger row and one charge. The example runs against the PostgreSQL named
// by IDEM_TEST_POSTGRES_URL, in a schema of its own (River's tables,
// idem's and the ledger) that it drops at the end.
//
// It needs PostgreSQL, so go test compiles it without running it;
// TestExamplesOnServers runs it and checks what it prints.
func Example() {
	ctx := context.Background()
	url := os.Getenv("IDEM_TEST_POSTGRES_URL")
	if url == "" {
		fmt.Println("IDEM_TEST_POSTGRES_URL is not set: this example needs PostgreSQL")
		return
	}
	schema := "idem_river_example_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		fmt.Println(err)
		return
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema // River, idem and the ledger in one schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")

	// River's tables, idem's and the ledger.
	store, err := idempgxv5.New(pool, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := riverexample.Migrate(ctx, pool, store); err != nil {
		fmt.Println(err)
		return
	}

	// The idem consumers: transactional for the ledger, lease mode for the
	// provider.
	ledger, err := idem.NewConsumer[pgx.Tx](store, idem.Config{Name: "ledger"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ledger.Close()
	charges, err := idem.NewLeaseConsumer(store, idem.Config{Name: "charges"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer charges.Close()
	prov := &provider{charges: map[string]string{}}

	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}},
		Workers: riverexample.NewWorkers(
			&riverexample.LedgerWorker{Pool: pool, Consumer: ledger},
			&riverexample.ChargeWorker{Consumer: charges, Provider: prov},
		),
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	completed, cancel := client.Subscribe(river.EventKindJobCompleted)
	defer cancel()
	if err := client.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer client.Stop(ctx)

	// The producer enqueues the payment, and later enqueues it again (its
	// first insert timed out, say): four jobs for one payment.
	payment := riverexample.PaymentArgs{PaymentID: "p1", AmountCents: 1250}
	done := 0
	for range 2 {
		for _, args := range []river.JobArgs{riverexample.LedgerArgs{PaymentArgs: payment}, riverexample.ChargeArgs{PaymentArgs: payment}} {
			if _, err := client.Insert(ctx, args, nil); err != nil {
				fmt.Println(err)
				return
			}
		}
		for range 2 {
			select {
			case <-completed:
				done++
			case <-time.After(time.Minute):
				fmt.Println("a job did not complete within a minute")
				return
			}
		}
	}

	var rows int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM ledger").Scan(&rows); err != nil {
		fmt.Println(err)
		return
	}
	prov.mu.Lock()
	n := len(prov.charges)
	prov.mu.Unlock()
	fmt.Println("jobs completed:", done)
	fmt.Println("ledger rows:", rows)
	fmt.Println("charges:", n)
}
