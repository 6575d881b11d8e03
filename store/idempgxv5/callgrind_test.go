package idempgxv5_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestClaimServerInstructions counts a PostgreSQL backend's user-space
// instructions per duplicate and per message of a batch of 100 new
// messages: idem's (BeginClaim; BeginClaimBatch, the handler's insert and
// Commit), the hand-written consumer's with the same guarantee (the
// benchmarks' checkedProcess and bestBatch on checkedSetup's table), and
// idem's duplicate sent by hand with parts of its statements taken away,
// which says what each part costs. Every case sends the same protocol
// messages (TestClaimProtocolMessagesAgainstHandWritten). It needs a
// PostgreSQL of its own run under valgrind's callgrind, which follows its
// backends and writes each one's counts when it exits, and skips without
// one:
//
//	valgrind --tool=callgrind --trace-children=yes --callgrind-out-file=$DIR/cg.%p \
//	  postgres -D $DATA -p 21434 -c fsync=off -c autovacuum=off &
//	IDEM_CALLGRIND_POSTGRES=postgres://...:21434/... IDEM_CALLGRIND_DIR=$DIR \
//	  go test -run TestClaimServerInstructions -v
//
// The tables hold 10,000 records of another consumer (and as many
// hand-written ones), analyzed, then 1,000 recorded messages. Each case
// runs twice, each time on a new connection: 21 and 221 duplicates, or 8
// and 18 batches of 100; the difference of the two backends' totals over
// the messages in between is the cost of one (the statements prepared,
// and the generic plans taken after five executions, in both).
func TestClaimServerInstructions(t *testing.T) {
	url, dir := os.Getenv("IDEM_CALLGRIND_POSTGRES"), os.Getenv("IDEM_CALLGRIND_DIR")
	if url == "" || dir == "" {
		t.Skip("set IDEM_CALLGRIND_POSTGRES and IDEM_CALLGRIND_DIR (see the doc comment)")
	}
	ctx := context.Background()
	b := setup(t, poolOpts{maxConns: 2, url: url})
	b.checked = b.effects + "_checked"
	if err := createChecked(ctx, b.pool, b.checked); err != nil {
		t.Fatal(err)
	}
	payload := []byte(`{"order":"o-1","amount":200}`)
	sum := sha256.Sum256(payload)
	const seeded = 1000
	for _, q := range []string{
		recordsInsert(b.table, true, "'history'", "message_id, fingerprint") + `'h-' || g, sha256(g::text::bytea) FROM generate_series(1, 10000) g`,
		`INSERT INTO ` + b.checked + ` (message_id, fingerprint) SELECT 'h-' || g, sha256(g::text::bytea) FROM generate_series(1, 10000) g`,
		`ANALYZE ` + b.table + `, ` + b.checked,
	} {
		if _, err := b.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	recordDuplicates(t, b, "bench", seeded, sum[:])
	claim := func(id string) *idemdriver.ClaimParams { return claimLikeConsumer("bench", id, sum[:]) }
	var key int16
	if err := b.pool.QueryRow(ctx, `SELECT key FROM `+b.table+`_consumers WHERE name = 'bench'`).Scan(&key); err != nil {
		t.Fatal(err)
	}

	// idem's duplicate by hand: its claim and record read as the store
	// sends them (the lock timeout saved, set and put back; the consumer's
	// key hidden from the planner), then without each part in turn.
	lt := `set_config('idem.lock_timeout', current_setting('lock_timeout') || left(set_config('lock_timeout', COALESCE($4::text, current_setting('lock_timeout')), true), 0), true) IS NOT NULL`
	insert := `INSERT INTO ` + b.table + ` (consumer_key, message_id, fingerprint) `
	conflict := ` ON CONFLICT (consumer_key, message_id) DO NOTHING`
	withLT := insert + `SELECT $1::smallint, $2::text, $3::bytea WHERE ` + lt + conflict +
		` RETURNING set_config('lock_timeout', current_setting('idem.lock_timeout'), true) IS NOT NULL`
	returning := insert + `VALUES ($1::smallint, $2::text, $3::bytea)` + conflict + ` RETURNING true`
	plain := insert + `VALUES ($1::smallint, $2::text, $3::bytea)` + conflict
	record := `SELECT fingerprint, state FROM ` + b.table + ` WHERE consumer_key = (SELECT $1::smallint) AND message_id = $2::text`
	byHand := func(claim, record string, lockTimeout bool) func(context.Context, *pgxpool.Pool, *idempgxv5.Store, int) error {
		return func(ctx context.Context, pool *pgxpool.Pool, st *idempgxv5.Store, i int) error {
			args := []any{key, "dup-" + strconv.Itoa(i%seeded), sum[:], "5000"}
			if !lockTimeout {
				args = args[:3]
			}
			return handDuplicate(ctx, pool, claim, args, record, sum[:])
		}
	}
	type kase struct {
		name string
		msgs int // messages per operation
		op   func(ctx context.Context, pool *pgxpool.Pool, st *idempgxv5.Store, i int) error
	}
	batch := func(side string, i int) []string {
		ids := make([]string, 100)
		for k := range ids {
			ids[k] = side + "-" + strconv.Itoa(i*100+k)
		}
		slices.Sort(ids)
		return ids
	}
	checkedClaim := `INSERT INTO ` + b.checked + ` (message_id, fingerprint) SELECT * FROM unnest($1::text[], $2::bytea[]) ON CONFLICT DO NOTHING RETURNING message_id`
	effects := `INSERT INTO ` + b.effects + ` (key) SELECT unnest($1::text[])`
	cases := []kase{
		{"hand-written duplicate", 1, func(ctx context.Context, pool *pgxpool.Pool, st *idempgxv5.Store, i int) error {
			own := *b
			own.pool = pool
			claimed, err := own.checkedProcess(ctx, "dup-"+strconv.Itoa(i%seeded), payload)
			if err == nil && claimed {
				err = fmt.Errorf("duplicate %d claimed", i)
			}
			return err
		}},
		{"idem duplicate (BeginClaim)", 1, func(ctx context.Context, pool *pgxpool.Pool, st *idempgxv5.Store, i int) error {
			_, res, err := st.BeginClaim(ctx, claim("dup-"+strconv.Itoa(i%seeded)))
			if err == nil && (res.Claimed || !res.Ended) {
				err = fmt.Errorf("duplicate %d: %+v", i, res)
			}
			return err
		}},
		{"by hand: idem's statements", 1, byHand(withLT, record, true)},
		{"by hand: no lock timeout", 1, byHand(returning, record, false)},
		{"by hand: nor RETURNING", 1, byHand(plain, record, false)},
		{"hand-written batch of 100", 100, func(ctx context.Context, pool *pgxpool.Pool, st *idempgxv5.Store, i int) error {
			own := *b
			own.pool = pool
			fps := make([][]byte, 100)
			for k := range fps {
				fps[k] = sum[:]
			}
			return own.bestBatch(ctx, checkedClaim, batch(fmt.Sprintf("hand%p", pool), i), fps)
		}},
		{"idem batch of 100 (BeginClaimBatch)", 100, func(ctx context.Context, pool *pgxpool.Pool, st *idempgxv5.Store, i int) error {
			ids := batch(fmt.Sprintf("idem%p", pool), i)
			p := &idemdriver.ClaimBatchParams{Consumer: "bench", LockTimeout: 5 * time.Second}
			for _, id := range ids {
				p.Messages = append(p.Messages, idemdriver.ClaimMessage{MessageID: id, Fingerprint: sum[:]})
			}
			tx, res, err := st.BeginClaimBatch(ctx, p)
			if err != nil {
				return err
			}
			if !res[len(res)-1].Claimed {
				err = fmt.Errorf("batch %d: not claimed", i)
			} else {
				_, err = tx.Exec(ctx, effects, ids)
			}
			if err != nil {
				_ = st.Rollback(ctx, tx)
				return err
			}
			return st.Commit(ctx, tx)
		}},
	}
	// Each case runs twice, each time on a connection of its own: the
	// difference between the two backends' totals (written when they
	// exit) is the cost of the operations the second ran in addition.
	run := func(c kase, n int) (pid string) {
		return callgrindBackend(t, url, b.table, n, func(pool *pgxpool.Pool, st *idempgxv5.Store, i int) error {
			if err := c.op(ctx, pool, st, i); err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			return nil
		})
	}
	for _, c := range cases {
		few, many := 21, 221
		if c.msgs > 1 {
			few, many = 8, 18
		}
		short, long := run(c, few), run(c, many)
		per := (exitInstructions(t, dir, long) - exitInstructions(t, dir, short)) / float64((many-few)*c.msgs)
		t.Logf("%-34s %6.1fk instructions per message", c.name, per/1000)
	}
}

// handDuplicate is a duplicate as the hand-written consumer sends it (BEGIN
// and claim, then the record's read and ROLLBACK, each pair pipelined)
// with the statements claim (args) and record (the first two of args),
// which returns the fingerprint and state: an error unless it is fp.
func handDuplicate(ctx context.Context, pool *pgxpool.Pool, claim string, args []any, record string, fp []byte) error {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	batch := &pgx.Batch{}
	batch.Queue(`BEGIN`)
	batch.Queue(claim, args...)
	if err := c.SendBatch(ctx, batch).Close(); err != nil {
		return err
	}
	var (
		got   []byte
		state *int16
	)
	batch = &pgx.Batch{}
	batch.Queue(record, args[:2]...).QueryRow(func(r pgx.Row) error { return r.Scan(&got, &state) })
	batch.Queue(`ROLLBACK`)
	if err := c.SendBatch(ctx, batch).Close(); err != nil {
		return err
	}
	if string(got) != string(fp) {
		return fmt.Errorf("read fingerprint %x, want %x", got, fp)
	}
	return nil
}

// callgrindBackend runs op n times (i from 0) on a store on table of a
// pool of one connection of its own to url, closed after, and returns
// that connection's backend PID, whose instruction total callgrind writes
// when it exits (exitInstructions).
func callgrindBackend(t *testing.T, url, table string, n int, op func(pool *pgxpool.Pool, st *idempgxv5.Store, i int) error) (pid string) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	st, err := idempgxv5.New(pool, &idempgxv5.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	pid = backendPID(t, pool)
	for i := range n {
		if err := op(pool, st, i); err != nil {
			t.Fatal(err)
		}
	}
	return pid
}

// backendPID is the process ID of the backend of pool's one connection.
func backendPID(tb testing.TB, pool *pgxpool.Pool) string {
	tb.Helper()
	c, err := pool.Acquire(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Release()
	return strconv.Itoa(int(c.Conn().PgConn().PID()))
}

// exitInstructions reads the instruction total that callgrind writes to
// dir/cg.<pid> when backend pid exits, waiting for it.
func exitInstructions(tb testing.TB, dir, pid string) float64 {
	tb.Helper()
	total := regexp.MustCompile(`(?m)^(?:summary|totals): (\d+)`)
	var m [][]byte
	testenv.Eventually(tb, time.Minute, "callgrind's output of backend "+pid, func() bool {
		data, err := os.ReadFile(filepath.Join(dir, "cg."+pid))
		m = total.FindSubmatch(data)
		return err == nil && m != nil
	}, func() string { return "no total in " + filepath.Join(dir, "cg."+pid) })
	n, _ := strconv.ParseFloat(string(m[1]), 64)
	return n
}
