package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
)

// The --process mode's outbox cases, beside store/idempgxv5's
// BenchmarkOutbox, on every store the harness knows:
//
//   - best_outbox1: best_checked whose transaction also inserts one
//     narrow outbox row (ID, destination, key, payload), sent by two
//     hand-written relay loops that, in one transaction each round,
//     select up to 1,000 rows (FOR UPDATE SKIP LOCKED where the server
//     has it), publish them (confirmed at once) and delete them; woken by
//     the consumer after each commit. database/sql stores only.
//   - idem_outbox1: idem whose handler also emits one message (about 100
//     bytes), sent by an idem.Relay (Run, the defaults, a publisher that
//     confirms at once) woken by the Consumer (Config.Relay, so
//     EmitParams.RelayWoken), which ends a round's rows with its next
//     claim where the store can (idemdriver.OutboxSentClaimer).
//
// In both the timed section ends once every message emitted was
// published and its row deleted, so the row's whole life is paid in it,
// and every counter (CPU, log bytes, allocations) covers the relay too.

// outboxRelay is the relay side of an outbox case: started before the
// case's warm-up, drained at the end of its timed section.
type outboxRelay struct {
	sent    atomic.Int64
	emitted atomic.Int64 // messages whose processing committed an emit
	pending func(ctx context.Context) (int64, error)
	stop    func()
}

// drain waits until the relay has published every message emitted and
// pending reports no row left, or until timeout.
func (r *outboxRelay) drain(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if r.sent.Load() >= r.emitted.Load() {
			n, err := r.pending(ctx)
			if err != nil {
				return err
			}
			if n == 0 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("outbox not drained in %v: %d of %d published", timeout, r.sent.Load(), r.emitted.Load())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// counted wraps op so that every operation that succeeded counts one
// emitted message.
func (r *outboxRelay) counted(op func(ctx context.Context, i int64) error) func(ctx context.Context, i int64) error {
	return func(ctx context.Context, i int64) error {
		err := op(ctx, i)
		if err == nil {
			r.emitted.Add(1)
		}
		return err
	}
}

// outboxCase returns case c's operation and relay on s, started; false
// when c is not an outbox case or the store lacks it.
func (s *processStore) outboxCase(ctx context.Context, c, prefix string) (func(ctx context.Context, i int64) error, *outboxRelay, bool, error) {
	fresh := func(i int64) string { return prefix + fmt.Sprint(i) }
	switch c {
	case "idem_outbox1":
		store := s.rdb.outbox()
		if store == nil {
			return nil, nil, false, nil
		}
		rel := &outboxRelay{}
		pub := idem.PublisherFunc(func(_ context.Context, m []idem.Outgoing) []error {
			rel.sent.Add(int64(len(m)))
			return make([]error, len(m))
		})
		r, err := idem.NewRelay(idem.RelayConfig{Store: store, Publisher: pub, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return nil, nil, true, err
		}
		h, err := s.rdb.idemOutbox("bench-outbox", "orders.charged", r)
		if err != nil {
			return nil, nil, true, err
		}
		rctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Go(func() { _ = r.Run(rctx) })
		rel.stop = func() { cancel(); wg.Wait() }
		rel.pending = func(ctx context.Context) (int64, error) {
			st, err := store.OutboxStats(ctx)
			return st.Pending, err
		}
		return rel.counted(oneOp(h, fresh)), rel, true, nil
	case "best_outbox1":
		chk, ok := s.chk.(*sqlChecked)
		if !ok {
			return nil, nil, false, nil
		}
		rel, h, err := chk.startOutbox(ctx)
		if err != nil {
			return nil, nil, true, err
		}
		return rel.counted(oneOp(h, fresh)), rel, true, nil
	}
	return nil, nil, false, nil
}

// startOutbox creates best_outbox1's outbox table (dropped by the
// relay's stop) and starts its two relay loops; the handler is
// best_checked's, inserting one outbox row per new message.
func (c *sqlChecked) startOutbox(ctx context.Context) (*outboxRelay, msgHandler, error) {
	t := c.table + "_outbox"
	var ddl, round string
	switch c.dialect {
	case "mysql":
		ddl = `CREATE TABLE ` + t + ` (seq BIGINT AUTO_INCREMENT PRIMARY KEY, id VARBINARY(255) NOT NULL,
			destination VARBINARY(255) NOT NULL, order_key VARBINARY(255) NOT NULL, payload BLOB NOT NULL) ENGINE=InnoDB`
		round = `SELECT seq, id, destination, order_key, payload FROM ` + t + ` ORDER BY seq LIMIT 1000 FOR UPDATE SKIP LOCKED`
	case "sqlite":
		ddl = `CREATE TABLE ` + t + ` (seq INTEGER PRIMARY KEY, id TEXT NOT NULL, destination TEXT NOT NULL, order_key TEXT NOT NULL, payload BLOB NOT NULL)`
		round = `DELETE FROM ` + t + ` WHERE seq IN (SELECT seq FROM ` + t + ` ORDER BY seq LIMIT 1000) RETURNING seq, id, destination, order_key, payload`
	default: // postgres
		ddl = `CREATE TABLE ` + t + ` (seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, id text NOT NULL,
			destination text NOT NULL, order_key text NOT NULL, payload bytea NOT NULL)`
		round = `DELETE FROM ` + t + ` WHERE seq IN (SELECT seq FROM ` + t + ` ORDER BY seq LIMIT 1000 FOR UPDATE SKIP LOCKED) RETURNING seq, id, destination, order_key, payload`
	}
	if _, err := c.db.ExecContext(ctx, ddl); err != nil {
		return nil, nil, fmt.Errorf("best_outbox1: %w", err)
	}
	rel := &outboxRelay{}
	wake := make(chan struct{}, 1)
	// oneRound is one relay round in one transaction: the rows, their
	// publish (confirmed at once), their deletion, COMMIT.
	oneRound := func(ctx context.Context) (int, error) {
		tx, err := c.db.BeginTx(ctx, nil)
		if err != nil {
			return 0, err
		}
		defer func() { _ = tx.Rollback() }()
		rows, err := tx.QueryContext(ctx, round)
		if err != nil {
			return 0, err
		}
		var out []idem.Outgoing
		var seqs []any
		for rows.Next() {
			var m idem.Outgoing
			var seq int64
			if err := rows.Scan(&seq, &m.ID, &m.Destination, &m.Key, &m.Payload); err != nil {
				rows.Close()
				return 0, err
			}
			out = append(out, m)
			seqs = append(seqs, seq)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return 0, err
		}
		if c.dialect == "mysql" && len(seqs) > 0 {
			del := `DELETE FROM ` + t + ` WHERE seq IN (?` + strings.Repeat(", ?", len(seqs)-1) + `)`
			if _, err := tx.ExecContext(ctx, del, seqs...); err != nil {
				return 0, err
			}
		}
		if err := tx.Commit(); err != nil {
			return 0, err
		}
		rel.sent.Add(int64(len(out))) // the publish, confirmed at once
		return len(out), nil
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for rctx.Err() == nil {
				n, err := oneRound(rctx)
				if err != nil && rctx.Err() == nil && !errors.Is(err, context.Canceled) {
					// A lock wait or a busy database: try again.
					time.Sleep(time.Millisecond)
					continue
				}
				if n == 1000 {
					continue
				}
				t := time.NewTimer(50 * time.Millisecond)
				select {
				case <-rctx.Done():
				case <-wake:
				case <-t.C:
				}
				t.Stop()
			}
		})
	}
	rel.stop = func() {
		cancel()
		wg.Wait()
		dctx, dcancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer dcancel()
		_, _ = c.db.ExecContext(dctx, `DROP TABLE `+t)
	}
	rel.pending = func(ctx context.Context) (n int64, err error) {
		err = c.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+t).Scan(&n)
		return n, err
	}
	insert := `INSERT INTO ` + t + ` (id, destination, order_key, payload) VALUES (` + c.list(4, false) + `)`
	h := c.oneWith(func(ctx context.Context, tx *sql.Tx, id string) error {
		_, err := tx.ExecContext(ctx, insert, id+"/charged", "orders.charged", id, payload(id))
		return err
	}, func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	})
	return rel, h, nil
}
