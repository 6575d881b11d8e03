package watermilltest

import (
	"context"
	"database/sql"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testenv"
)

// BenchmarkMiddleware measures what idemwatermill costs a Watermill
// handler against Watermill's own middleware.Deduplicator (its in-memory
// expiring key repository, keyed on the UUID), in one run: each iteration
// is one new message through the wrapped handler, called as the Router
// calls it.
//
//   - postgres/dedup: the Deduplicator, and a handler inserting the charge
//     row on its own (autocommit);
//   - postgres/idem: Transactional over idemsql, the handler inserting the
//     row in the claim's transaction (BEGIN, claim, row, COMMIT);
//   - memory/dedup and memory/idem: the same without a database (an empty
//     handler; idem's MemoryStore), the middleware's own cost.
//
// PostgreSQL is IDEM_TEST_POSTGRES_DURABLE_URL (fsync on: each commit is a
// disk flush, as in production). Reported per message: ns/op, B/op and
// allocs/op (the client's), client-cpu-ns (this process's user+system CPU)
// and wal-B (pg_current_wal_lsn difference, PostgreSQL only).
func BenchmarkMiddleware(b *testing.B) {
	b.Run("memory/dedup", func(b *testing.B) {
		runBench(b, nil, "", dedup(), func(*message.Message) ([]*message.Message, error) { return nil, nil })
	})
	b.Run("memory/idem", func(b *testing.B) {
		mw := transactional[*idem.MemoryTx](b)(idem.NewConsumer(idem.NewMemoryStore(nil), idem.Config{Name: "bench", PurgeInterval: -1}))
		runBench(b, nil, "", mw, func(*message.Message) ([]*message.Message, error) { return nil, nil })
	})
	url := testenv.URL(b, testenv.PostgresDurableEnv, "postgres://idem:idem@127.0.0.1:5433/idem_test?sslmode=disable")
	b.Run("postgres/dedup", func(b *testing.B) {
		charges := "wm_bench_" + suffix()
		db, _ := openPG(b, url, charges)
		insert := `INSERT INTO ` + charges + ` (message_id, payload) VALUES ($1, $2)`
		runBench(b, db, charges, dedup(), func(msg *message.Message) ([]*message.Message, error) {
			_, err := db.ExecContext(msg.Context(), insert, msg.UUID, string(msg.Payload))
			return nil, err
		})
	})
	b.Run("postgres/idem", func(b *testing.B) {
		charges := "wm_bench_" + suffix()
		db, store := openPG(b, url, charges)
		mw := transactional[*sql.Tx](b)(idem.NewConsumer(store, idem.Config{Name: "wm-bench-" + suffix(), PurgeInterval: -1}))
		h := charge(charges, nil)
		runBench(b, db, charges, mw, func(msg *message.Message) ([]*message.Message, error) { return nil, h(msg) })
	})
}

// dedup is Watermill's Deduplicator as its documentation sets it up, keyed
// on the message UUID (the same identity idem uses).
func dedup() message.HandlerMiddleware {
	repo, err := middleware.NewMapExpiringKeyRepository(time.Hour)
	if err != nil {
		panic(err)
	}
	d := &middleware.Deduplicator{
		KeyFactory: func(m *message.Message) (string, error) { return m.UUID, nil },
		Repository: repo,
		Timeout:    time.Minute,
	}
	return d.Middleware
}

// runBench sends b.N new messages through mw(h) and reports the steady
// counters per message.
func runBench(b *testing.B, db *sql.DB, charges string, mw message.HandlerMiddleware, h message.HandlerFunc) {
	wrapped := mw(h)
	ctx := context.Background()
	ids := make([]string, b.N)
	for i := range ids {
		ids[i] = watermill.NewUUID()
	}
	payload := []byte(`{"amount":100}`)
	walStart := walLSN(b, db)
	cpuStart := cpuTime()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		msg := message.NewMessageWithContext(ctx, ids[i], payload)
		if _, err := wrapped(msg); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(cpuTime()-cpuStart)/float64(b.N), "client-cpu-ns/op")
	if db != nil {
		b.ReportMetric(float64(walLSN(b, db)-walStart)/float64(b.N), "wal-B/op")
		if rows, _ := chargeCounts(b, db, charges); rows != b.N {
			b.Fatalf("%d charge rows for %d messages", rows, b.N)
		}
	}
}

// walLSN returns PostgreSQL's current WAL position in bytes (0 without db).
func walLSN(tb testing.TB, db *sql.DB) int64 {
	if db == nil {
		return 0
	}
	var lsn int64
	if err := db.QueryRow(`SELECT pg_current_wal_lsn() - '0/0'::pg_lsn`).Scan(&lsn); err != nil {
		tb.Fatal(err)
	}
	return lsn
}

// cpuTime returns this process's user and system CPU time, in ns.
func cpuTime() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
