package idempgxv5_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// checkedOutbox is the hand-written outbox with the guarantees of idem's
// (docs/outbox.md), the reference BenchmarkOutbox's best_checked_outbox1
// measures idem's outbox against: the least a person would write on
// PostgreSQL for
//   - a unique outgoing ID: the table's primary key, and an emit of an ID
//     that exists does nothing (INSERT ... ON CONFLICT (id) DO NOTHING);
//   - order per destination and non-empty key under relays side by side:
//     every row of the table is pending (a confirmed row is deleted, one
//     failed for good moves to the dead-letter table), and a claim takes
//     a row only when no earlier row of its destination and key is in the
//     table, through an index on a hash of the key and seq (the check
//     idem's claim makes, spelled as docs/outbox.md tells relays in other
//     languages to): one claim holds at most one row of a key, and a key's
//     next row is claimable once the delete of the previous one committed;
//   - leases, not a transaction held through the publish: the claim is one
//     UPDATE ... RETURNING of lease_until and attempts whose row selection
//     is FOR UPDATE SKIP LOCKED, committed before the publish; a row whose
//     lease ran out is claimable again (at least once), and the publish
//     gets half the lease;
//   - retries and fenced marks: a retryable publish error sets the row's
//     lease_until to the end of its backoff (minRetry, doubling per
//     attempt to maxRetry), where the row holds back its key's later rows;
//     an error matching idem.ErrPermanent moves the row to the dead-letter
//     table; both only while attempts is the count the claim returned;
//   - completions: a confirmed row is deleted by ID and seq (a row written
//     again with the same ID since is not touched), sent together with the
//     relay's next claim, in one round trip and one transaction.
//
// The table holds what the relay reads and nothing else: id, seq,
// destination, order_key, payload, attempts and lease_until, with fill
// factor 50 so that the claim's update stays on the row's page (heap-only,
// no new index entries), as idem's does (migration 008).
type checkedOutbox struct {
	table              string
	limit              int           // the most rows a claim takes
	lease              time.Duration // how long a claim holds its rows
	minRetry, maxRetry time.Duration // the backoff after a retryable error
	claimSQL, emitSQL  string
	deleteSQL          string
	retrySQL, deadSQL  string
	// locked makes each relay round one transaction that holds its rows'
	// locks through the publish instead of leasing them (lockedRound).
	locked                              bool
	lockSQL, lockedRetrySQL, lockedDead string
}

// newCheckedOutbox returns the hand-written outbox on table (and
// table_dead), with idem's relay defaults: claims of up to 1,000 rows, a
// 30 s lease, retries after 1 s doubling to 5 min.
func newCheckedOutbox(table string) *checkedOutbox {
	t := table
	// The rows a claim may take: under no lease (or retry wait), and the
	// first of their destination and key.
	claimable := `(o.lease_until IS NULL OR o.lease_until <= now())
	AND (o.order_key = '' OR NOT EXISTS (SELECT FROM ` + t + ` p
		WHERE hashtextextended(p.order_key, 0) = hashtextextended(o.order_key, 0) AND p.order_key <> ''
		AND p.destination = o.destination AND p.order_key = o.order_key AND p.seq < o.seq))
	ORDER BY o.seq LIMIT $1::bigint FOR UPDATE SKIP LOCKED`
	dead := func(fence string) string {
		return `WITH d AS (DELETE FROM ` + t + ` AS o USING unnest($1::text[], $2::bigint[], $3::int[], $4::text[]) AS v(id, seq, attempt, err)
	WHERE o.id = v.id AND o.seq = v.seq AND ` + fence + `
	RETURNING o.id, o.seq, o.destination, o.order_key, o.payload, v.attempt, v.err)
INSERT INTO ` + t + `_dead (id, seq, destination, order_key, payload, attempts, last_error) SELECT * FROM d`
	}
	return &checkedOutbox{
		lockSQL: `SELECT o.id, o.seq, o.destination, o.order_key, o.payload, o.attempts + 1 FROM ` + t + ` o
WHERE (SELECT set_config('idle_in_transaction_session_timeout', $2::text, true)) IS NOT NULL AND ` + claimable,
		lockedRetrySQL: `UPDATE ` + t + ` AS o SET lease_until = clock_timestamp() + v.delay * interval '1 microsecond', attempts = v.attempt
FROM unnest($1::text[], $2::bigint[], $3::int[], $4::bigint[]) AS v(id, seq, attempt, delay)
WHERE o.id = v.id AND o.seq = v.seq`,
		lockedDead: dead(`o.attempts = v.attempt - 1`),
		table:      t, limit: idem.DefaultRelayBatchSize, lease: idem.DefaultRelayLease,
		minRetry: idem.DefaultRelayMinRetry, maxRetry: idem.DefaultRelayMaxRetry,
		emitSQL: `INSERT INTO ` + t + ` (id, destination, order_key, payload) VALUES ($1, $2, $3, $4) ON CONFLICT (id) DO NOTHING`,
		claimSQL: `UPDATE ` + t + ` SET lease_until = clock_timestamp() + $2::bigint * interval '1 microsecond', attempts = attempts + 1
WHERE id IN (SELECT o.id FROM ` + t + ` o WHERE ` + claimable + `)
RETURNING id, seq, destination, order_key, payload, attempts`,
		deleteSQL: `DELETE FROM ` + t + ` WHERE (id, seq) IN (SELECT * FROM unnest($1::text[], $2::bigint[]))`,
		retrySQL: `UPDATE ` + t + ` AS o SET lease_until = now() + v.delay * interval '1 microsecond'
FROM unnest($1::text[], $2::bigint[], $3::int[], $4::bigint[]) AS v(id, seq, attempt, delay)
WHERE o.id = v.id AND o.seq = v.seq AND o.attempts = v.attempt`,
		deadSQL: dead(`o.attempts = v.attempt`),
	}
}

// create creates the outbox table, its two indexes beside the primary key
// (seq, for the claim's order of rows; the hash of the key and seq, of
// the rows with a key, for the order check) and the dead-letter table.
func (o *checkedOutbox) create(ctx context.Context, pool *pgxpool.Pool) error {
	for _, q := range []string{
		`CREATE TABLE ` + o.table + ` (id text COLLATE "C" PRIMARY KEY, seq bigint GENERATED ALWAYS AS IDENTITY,
			destination text COLLATE "C" NOT NULL, order_key text COLLATE "C" NOT NULL, payload bytea NOT NULL,
			attempts integer NOT NULL DEFAULT 0, lease_until timestamptz) WITH (fillfactor = 50)`,
		`CREATE INDEX ON ` + o.table + ` (seq)`,
		`CREATE INDEX ON ` + o.table + ` (hashtextextended(order_key, 0), seq) WHERE order_key <> ''`,
		`CREATE TABLE ` + o.table + `_dead (id text COLLATE "C" NOT NULL, seq bigint NOT NULL, destination text NOT NULL,
			order_key text NOT NULL, payload bytea NOT NULL, attempts integer NOT NULL, last_error text NOT NULL,
			failed_at timestamptz NOT NULL DEFAULT now())`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

// emit queues the INSERT of one outgoing message on batch, for the
// emitting transaction to send with its other statements.
func (o *checkedOutbox) emit(batch *pgx.Batch, id, destination, key string, payload []byte) {
	batch.Queue(o.emitSQL, id, destination, key, payload)
}

// checkedOutcomes is what a relay round learned from its publish, to be
// written with its next claim: rows confirmed (deleted), rows to retry
// (their backoff in microseconds) and rows failed for good (dead), each
// named by ID and seq, the last two with the attempt their claim returned.
type checkedOutcomes struct {
	sentIDs  []string
	sentSeqs []int64
	retry    checkedFailures
	dead     checkedFailures
}

// checkedFailures are failed rows as the arrays of retrySQL (detail: the
// delay in microseconds) or deadSQL (the error text).
type checkedFailures struct {
	ids      []string
	seqs     []int64
	attempts []int32
	delays   []int64
	errs     []string
}

func (f *checkedFailures) add(r idem.Outgoing, attempt int32) {
	f.ids = append(f.ids, r.ID)
	f.seqs = append(f.seqs, r.Seq)
	f.attempts = append(f.attempts, attempt)
}

// round writes out's outcomes and, with claim, claims the next rows, all
// in one pgx batch (one round trip, one implicit transaction: the claim
// sees the deleted rows gone). It returns the claimed rows and the attempt
// each claim counted.
func (o *checkedOutbox) round(ctx context.Context, pool *pgxpool.Pool, out *checkedOutcomes, claim bool) ([]idem.Outgoing, []int32, error) {
	batch := &pgx.Batch{}
	o.queueOutcomes(batch, out, false)
	if claim {
		batch.Queue(o.claimSQL, int64(o.limit), o.lease.Microseconds())
	}
	if batch.Len() == 0 {
		return nil, nil, nil
	}
	return sendClaim(pool.SendBatch(ctx, batch), batch.Len(), claim)
}

// queueOutcomes queues the statements that write out on batch: the
// deletes, retries and dead letters, each one statement for all its rows;
// with locked, those of a round that holds the rows' locks (the claim
// wrote no attempt: the retry sets it, the dead letter fences on the one
// before).
func (o *checkedOutbox) queueOutcomes(batch *pgx.Batch, out *checkedOutcomes, locked bool) {
	retry, dead := o.retrySQL, o.deadSQL
	if locked {
		retry, dead = o.lockedRetrySQL, o.lockedDead
	}
	if len(out.sentIDs) > 0 {
		batch.Queue(o.deleteSQL, out.sentIDs, out.sentSeqs)
	}
	if r := &out.retry; len(r.ids) > 0 {
		batch.Queue(retry, r.ids, r.seqs, r.attempts, r.delays)
	}
	if d := &out.dead; len(d.ids) > 0 {
		batch.Queue(dead, d.ids, d.seqs, d.attempts, d.errs)
	}
}

// sendClaim reads the n results of a batch whose last statement is a
// claim when claim is set (the claimed rows and their attempts), closes it,
// and returns the first error.
func sendClaim(br pgx.BatchResults, n int, claim bool) ([]idem.Outgoing, []int32, error) {
	var err error
	for range n - 1 {
		if _, err = br.Exec(); err != nil {
			break
		}
	}
	var recs []idem.Outgoing
	var attempts []int32
	if err == nil && claim {
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			for rows.Next() {
				var r idem.Outgoing
				var attempt int32
				if err = rows.Scan(&r.ID, &r.Seq, &r.Destination, &r.Key, &r.Payload, &attempt); err != nil {
					break
				}
				recs = append(recs, r)
				attempts = append(attempts, attempt)
			}
			rows.Close()
			if err == nil {
				err = rows.Err()
			}
		}
	} else if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, nil, err
	}
	return recs, attempts, nil
}

// lockedRound is one relay round that holds its rows by their row locks
// through the publish, in one transaction on one connection: BEGIN and
// the claim (a SELECT ... FOR UPDATE SKIP LOCKED of the same rows as the
// leasing claim's, writing nothing, which bounds the transaction's idle
// time on the server by the lease) in one round trip, the publish, then
// the outcomes and COMMIT in one more. A row whose lock another round
// holds is still in the table, so the order check holds as with leases.
// It returns the number of rows claimed.
func (o *checkedOutbox) lockedRound(ctx context.Context, pool *pgxpool.Pool, pub idem.Publisher) (n int, err error) {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer func() {
		if err != nil {
			_ = c.Conn().Close(ctx) // in an unknown transaction state: the pool drops it
		}
		c.Release()
	}()
	batch := &pgx.Batch{}
	batch.Queue(`BEGIN`)
	batch.Queue(o.lockSQL, int64(o.limit), strconv.FormatInt(o.lease.Milliseconds(), 10))
	recs, attempts, err := sendClaim(c.SendBatch(ctx, batch), 2, true)
	if err != nil {
		return 0, err
	}
	var out checkedOutcomes
	if len(recs) > 0 {
		out = o.publish(ctx, pub, recs, attempts)
	}
	// The outcomes of what was published are written even when ctx ended
	// meanwhile (a relay that stops ends the rows it holds).
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	batch = &pgx.Batch{}
	o.queueOutcomes(batch, &out, true)
	batch.Queue(`COMMIT`)
	_, _, err = sendClaim(c.SendBatch(ectx, batch), batch.Len(), false)
	return len(recs), err
}

// publish publishes recs (claimed at attempts) through pub within half
// the lease, and returns the outcomes to write.
func (o *checkedOutbox) publish(ctx context.Context, pub idem.Publisher, recs []idem.Outgoing, attempts []int32) checkedOutcomes {
	pctx, cancel := context.WithTimeout(ctx, o.lease/2)
	errs := pub.Publish(pctx, recs)
	cancel()
	var out checkedOutcomes
	for i, r := range recs {
		err := errors.New("no outcome from the publisher")
		if i < len(errs) {
			err = errs[i]
		}
		switch {
		case err == nil:
			out.sentIDs = append(out.sentIDs, r.ID)
			out.sentSeqs = append(out.sentSeqs, r.Seq)
		case errors.Is(err, idem.ErrPermanent):
			out.dead.add(r, attempts[i])
			out.dead.errs = append(out.dead.errs, err.Error())
		default:
			out.retry.add(r, attempts[i])
			out.retry.delays = append(out.retry.delays, o.backoff(attempts[i]).Microseconds())
		}
	}
	return out
}

// backoff is the wait before the next try of a row whose attempt-th
// publish failed: minRetry, doubling per attempt, at most maxRetry.
func (o *checkedOutbox) backoff(attempt int32) time.Duration {
	d := o.minRetry
	for i := int32(1); i < attempt && d < o.maxRetry; i++ {
		d *= 2
	}
	return min(d, o.maxRetry)
}

// run is one relay loop on pool until ctx ends: claim, publish, and write
// the outcomes with the next claim (with locked, lockedRound after
// lockedRound); a claim of no row waits for wake, or
// for 50 ms. When ctx ends it writes the outcomes of its last publish on
// a context of its own and returns. It returns the first error of the
// database otherwise.
func (o *checkedOutbox) run(ctx context.Context, pool *pgxpool.Pool, pub idem.Publisher, wake <-chan struct{}) error {
	var out checkedOutcomes
	for ctx.Err() == nil {
		var n int
		var err error
		if o.locked {
			n, err = o.lockedRound(ctx, pool, pub)
		} else {
			var recs []idem.Outgoing
			var attempts []int32
			recs, attempts, err = o.round(ctx, pool, &out, true)
			if err == nil {
				out, n = checkedOutcomes{}, len(recs)
				if n > 0 {
					out = o.publish(ctx, pub, recs, attempts)
				}
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			return err
		}
		if n == 0 {
			idleWait(ctx, wake)
		}
	}
	// The outcomes of the last publish (written again if the round that
	// ctx's end interrupted wrote them: each statement is idempotent).
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_, _, err := o.round(sctx, pool, &out, false)
	return err
}

// idleWait is a relay loop's pause after a round that found nothing: it
// returns on wake, after 50 ms, or at ctx's end, whichever comes first.
func idleWait(ctx context.Context, wake <-chan struct{}) {
	t := time.NewTimer(50 * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-wake:
	case <-t.C:
	}
}

// checkedID is the hand-written outgoing ID of the message the consumer
// named consumer emits while processing incoming message id: stable
// across redeliveries, unique per consumer and incoming message; with
// hashed, idem's derived ID (idem.OutgoingID) instead.
func checkedID(consumer, id string, hashed bool) string {
	if hashed {
		return idem.OutgoingID(consumer, id, "", 1)
	}
	return consumer + "/" + id + "/charged"
}

// checkedFixture creates a hand-written outbox on the test database,
// dropped at cleanup, and returns it with its pool.
func checkedFixture(t *testing.T) (*checkedOutbox, *pgxpool.Pool) {
	t.Helper()
	pool := newPool(t, poolOpts{})
	ob := newCheckedOutbox(randName("idem_cob_"))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := dropTables(ctx, pool, ob.table); err != nil {
			t.Errorf("drop the outbox: %v", err)
		}
	})
	if err := ob.create(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	return ob, pool
}

// emitChecked commits one transaction that emits msgs (ID, destination,
// key) into ob, with the payload "{}".
func emitChecked(t *testing.T, ob *checkedOutbox, pool *pgxpool.Pool, msgs ...[3]string) {
	t.Helper()
	batch := &pgx.Batch{}
	batch.Queue(`BEGIN`)
	for _, m := range msgs {
		ob.emit(batch, m[0], m[1], m[2], []byte(`{}`))
	}
	batch.Queue(`COMMIT`)
	if err := pool.SendBatch(context.Background(), batch).Close(); err != nil {
		t.Fatal(err)
	}
}

// runChecked runs loops relay loops of ob on pool, publishing through
// pub, until done is closed (failing t if that takes over a minute), then
// stops them and fails t on their errors.
func runChecked(t *testing.T, ob *checkedOutbox, pool *pgxpool.Pool, loops int, pub idem.Publisher, done <-chan struct{}) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, loops)
	for range loops {
		go func() { errs <- ob.run(ctx, pool, pub, nil) }()
	}
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Error("the relay loops did not finish in a minute")
	}
	cancel()
	for range loops {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// tableCount returns the number of rows of table.
func tableCount(t *testing.T, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM `+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// recorder is a publisher that confirms every message, records the IDs
// it published, and closes done once it published want messages. With
// overlap set, its first call returns only once a second call has begun
// (or after a minute, an error), so that two relay rounds are in flight at
// once at least once.
type recorder struct {
	mu      sync.Mutex
	ids     []string
	want    int
	done    chan struct{}
	check   func(ctx context.Context, m idem.Outgoing) error // nil: none
	errs    []error
	overlap bool
	calls   atomic.Int64
	second  chan struct{}
}

func newRecorder(want int) *recorder {
	return &recorder{want: want, done: make(chan struct{}), second: make(chan struct{})}
}

func (r *recorder) Publish(ctx context.Context, msgs []idem.Outgoing) []error {
	if r.overlap {
		switch r.calls.Add(1) {
		case 1:
			select {
			case <-r.second:
			case <-time.After(time.Minute):
				r.mu.Lock()
				r.errs = append(r.errs, errors.New("no second round in flight within a minute of the first"))
				r.mu.Unlock()
			}
		case 2:
			close(r.second)
		}
	}
	var bad []error
	if r.check != nil {
		for _, m := range msgs {
			if err := r.check(ctx, m); err != nil {
				bad = append(bad, err)
			}
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, bad...)
	for _, m := range msgs {
		r.ids = append(r.ids, m.ID)
	}
	if len(r.ids) >= r.want && r.want > 0 {
		close(r.done)
		r.want = 0
	}
	return make([]error, len(msgs))
}

// TestCheckedOutboxUniqueID: an outgoing ID emitted twice, in two
// transactions and twice in one, is one row and one send.
func TestCheckedOutboxUniqueID(t *testing.T) {
	ob, pool := checkedFixture(t)
	emitChecked(t, ob, pool, [3]string{"a", "d", "k"}, [3]string{"b", "d", "k"})
	emitChecked(t, ob, pool, [3]string{"a", "d", "k"}, [3]string{"a", "d", "other"})
	if n := tableCount(t, pool, ob.table); n != 2 {
		t.Fatalf("%d rows after emitting a three times and b once, want 2", n)
	}
	r := newRecorder(2)
	runChecked(t, ob, pool, 2, r, r.done)
	if !slices.Equal(r.ids, []string{"a", "b"}) {
		t.Errorf("published %v, want [a b]", r.ids)
	}
	if n := tableCount(t, pool, ob.table); n != 0 {
		t.Errorf("%d rows left after their publish, want 0", n)
	}
}

// TestCheckedOutboxOrderPerKey: two relay loops, each claim of at most 4
// rows, the first publish held until a second round publishes too, send
// every row once and each key's rows in the order they were
// emitted, each only once the previous row of its destination and key was
// deleted (checked in the database as it is published); rows without a
// key go out too.
func TestCheckedOutboxOrderPerKey(t *testing.T) {
	forCheckedModes(t, testCheckedOrderPerKey)
}

// forCheckedModes runs test on a fresh hand-written outbox with leased
// rounds, then with locked ones.
func forCheckedModes(t *testing.T, test func(t *testing.T, ob *checkedOutbox, pool *pgxpool.Pool)) {
	for _, locked := range []bool{false, true} {
		t.Run(map[bool]string{false: "leased", true: "locked"}[locked], func(t *testing.T) {
			ob, pool := checkedFixture(t)
			ob.locked = locked
			test(t, ob, pool)
		})
	}
}

func testCheckedOrderPerKey(t *testing.T, ob *checkedOutbox, pool *pgxpool.Pool) {
	ob.limit = 4
	var want []string
	emitted := map[string][]string{} // destination/key: IDs in emission order
	for i := range 25 {
		var msgs [][3]string
		for _, d := range []string{"d1", "d2"} {
			for _, k := range []string{"k1", "k2", "k3"} {
				id := d + "-" + k + "-" + strconv.Itoa(i)
				msgs = append(msgs, [3]string{id, d, k})
				emitted[d+"/"+k] = append(emitted[d+"/"+k], id)
			}
		}
		msgs = append(msgs, [3]string{"nokey-" + strconv.Itoa(i), "d1", ""})
		for _, m := range msgs {
			want = append(want, m[0])
		}
		emitChecked(t, ob, pool, msgs...)
	}
	r := newRecorder(len(want))
	r.overlap = true
	r.check = func(ctx context.Context, m idem.Outgoing) error {
		if m.Key == "" {
			return nil
		}
		var earlier int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+ob.table+` WHERE destination = $1 AND order_key = $2 AND seq < $3`,
			m.Destination, m.Key, m.Seq).Scan(&earlier); err != nil {
			return err
		}
		if earlier != 0 {
			return fmt.Errorf("%s published while %d earlier rows of its key were in the outbox", m.ID, earlier)
		}
		return nil
	}
	runChecked(t, ob, pool, 2, r, r.done)
	for _, err := range r.errs {
		t.Error(err)
	}
	if got := slices.Sorted(slices.Values(r.ids)); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Errorf("published %d messages, want each of %d once", len(r.ids), len(want))
	}
	for dk, ids := range emitted {
		var got []string
		for _, id := range r.ids {
			if slices.Contains(ids, id) {
				got = append(got, id)
			}
		}
		if !slices.Equal(got, ids) {
			t.Errorf("%s published in the order %v, want %v", dk, got, ids)
		}
	}
	if n := tableCount(t, pool, ob.table); n != 0 {
		t.Errorf("%d rows left after their publish, want 0", n)
	}
}

// TestCheckedOutboxFailures: a retryable failure holds back its key's
// later rows until the row is sent; a permanent one moves the row to the
// dead-letter table and lets its key's next row go.
func TestCheckedOutboxFailures(t *testing.T) {
	forCheckedModes(t, testCheckedFailures)
}

func testCheckedFailures(t *testing.T, ob *checkedOutbox, pool *pgxpool.Pool) {
	ob.minRetry, ob.maxRetry = 0, 0 // retried at the next claim
	emitChecked(t, ob, pool, [3]string{"a1", "d", "a"}, [3]string{"b1", "d", "b"}, [3]string{"c1", "d", "c"})
	emitChecked(t, ob, pool, [3]string{"a2", "d", "a"}, [3]string{"c2", "d", "c"})
	var (
		mu    sync.Mutex
		order []string
		tries = map[string]int{}
	)
	done := make(chan struct{})
	pub := idem.PublisherFunc(func(_ context.Context, msgs []idem.Outgoing) []error {
		mu.Lock()
		defer mu.Unlock()
		errs := make([]error, len(msgs))
		for i, m := range msgs {
			tries[m.ID]++
			switch {
			case m.ID == "a1" && tries[m.ID] == 1:
				errs[i] = errors.New("broker down")
			case m.ID == "c1":
				errs[i] = fmt.Errorf("%w: rejected", idem.ErrPermanent)
			default:
				order = append(order, m.ID)
				if len(order) == 4 {
					close(done)
				}
			}
		}
		return errs
	})
	runChecked(t, ob, pool, 1, pub, done)
	if i, j := slices.Index(order, "a1"), slices.Index(order, "a2"); i < 0 || j < i {
		t.Errorf("sent %v: a1 must go before a2", order)
	}
	if tries["a1"] != 2 || tries["a2"] != 1 || tries["c1"] != 1 || !slices.Contains(order, "c2") {
		t.Errorf("tries %v, sent %v: want a1 twice, a2 and c1 once, c2 sent", tries, order)
	}
	var id string
	var attempts int
	if err := pool.QueryRow(context.Background(), `SELECT id, attempts FROM `+ob.table+`_dead`).Scan(&id, &attempts); err != nil || id != "c1" || attempts != 1 {
		t.Errorf("dead letter %q at attempt %d (%v), want c1 at 1", id, attempts, err)
	}
	if n := tableCount(t, pool, ob.table); n != 0 {
		t.Errorf("%d rows left, want 0", n)
	}
}

// TestCheckedOutboxFence: a relay whose lease ran out and whose row
// another relay claimed since changes nothing with its failure marks, and
// its late delete does not touch a row written again with the same ID.
func TestCheckedOutboxFence(t *testing.T) {
	ctx := context.Background()
	ob, pool := checkedFixture(t)
	emitChecked(t, ob, pool, [3]string{"x", "d", "k"})
	first, att1, err := ob.round(ctx, pool, &checkedOutcomes{}, true)
	if err != nil || len(first) != 1 || att1[0] != 1 {
		t.Fatalf("first claim %v at %v, %v; want x at attempt 1", first, att1, err)
	}
	if again, _, err := ob.round(ctx, pool, &checkedOutcomes{}, true); err != nil || len(again) != 0 {
		t.Fatalf("claim under a live lease = %v, %v; want none", again, err)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+ob.table+` SET lease_until = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	second, att2, err := ob.round(ctx, pool, &checkedOutcomes{}, true)
	if err != nil || len(second) != 1 || att2[0] != 2 {
		t.Fatalf("claim after the lease = %v at %v, %v; want x at attempt 2", second, att2, err)
	}
	var lease time.Time
	if err := pool.QueryRow(ctx, `SELECT lease_until FROM `+ob.table).Scan(&lease); err != nil {
		t.Fatal(err)
	}
	late := checkedOutcomes{}
	late.retry.add(first[0], att1[0])
	late.retry.delays = append(late.retry.delays, 0)
	late.dead.add(first[0], att1[0])
	late.dead.errs = append(late.dead.errs, "late")
	if _, _, err := ob.round(ctx, pool, &late, false); err != nil {
		t.Fatal(err)
	}
	var attempts int
	var after time.Time
	if err := pool.QueryRow(ctx, `SELECT attempts, lease_until FROM `+ob.table).Scan(&attempts, &after); err != nil {
		t.Fatalf("the row after the late marks: %v", err)
	}
	if attempts != 2 || !after.Equal(lease) || tableCount(t, pool, ob.table+"_dead") != 0 {
		t.Errorf("after the late marks: attempts %d, lease %v (was %v), %d dead; want 2, unchanged, 0", attempts, after, lease, tableCount(t, pool, ob.table+"_dead"))
	}
	sent := checkedOutcomes{sentIDs: []string{"x"}, sentSeqs: []int64{second[0].Seq}}
	if _, _, err := ob.round(ctx, pool, &sent, false); err != nil || tableCount(t, pool, ob.table) != 0 {
		t.Fatalf("the confirmed row's delete: %v, %d rows left", err, tableCount(t, pool, ob.table))
	}
	emitChecked(t, ob, pool, [3]string{"x", "d", "k"})
	if _, _, err := ob.round(ctx, pool, &sent, false); err != nil || tableCount(t, pool, ob.table) != 1 {
		t.Errorf("a late delete of x's earlier row: %v, %d rows left; want the new x kept", err, tableCount(t, pool, ob.table))
	}
}
