package failovertest

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/ownservice"
	"github.com/idem-go/idem/store/idempgxv5"
)

// TestPostgresFailover runs the transactional mode on a PostgreSQL primary
// with a streaming standby: each message's idem record and its effect row
// (failover_effects, no unique key, so a second run would be a second row)
// in one transaction, acknowledged only after the commit. Mid-load the
// primary is SIGKILLed and the standby promoted; clients follow through
// the multi-host URL (target_session_attrs=read-write). With a
// synchronous standby no message may be lost and none may run twice;
// with the asynchronous one the counts are recorded, not asserted to be
// zero. Nothing runs twice in any configuration: the record and the
// effect commit, or vanish, together.
func TestPostgresFailover(t *testing.T) {
	t.Parallel()
	for _, cfg := range []struct {
		name, sync string
		zeroLost   bool
		risk       string // the start-up warning's
	}{
		{"async", "async", false, "1 standby(s) replicate asynchronously"},
		{"sync_on", "on", true, ""},
		{"sync_remote_apply", "remote_apply", true, ""},
	} {
		t.Run(cfg.name, func(t *testing.T) { testPostgresFailover(t, cfg.sync, cfg.zeroLost, cfg.risk) })
	}
}

func testPostgresFailover(t *testing.T, sync string, zeroLost bool, risk string) {
	ctx := t.Context()
	c := ownservice.StartEnv(t, "postgres-ha", "IDEM_POSTGRES_HA_SYNC="+sync)
	pcfg, err := pgxpool.ParseConfig(c.URL + "&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = workers + 2
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store, err := idempgxv5.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE failover_effects (id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	logs := &riskLog{}
	consumer, err := idem.NewConsumer(store, idem.Config{
		Name: "failover", PurgeInterval: -1, Logger: slog.New(logs),
		// A synchronous commit waits for the standby's return after a
		// failover: longer than the default would let it.
		StoreTimeout: 2 * time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	checkRiskWarning(t, logs, store, risk)
	process := func(ctx context.Context, id string) error {
		_, err := consumer.Process(ctx, idem.Message{ID: id, Payload: []byte(id)},
			func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
				_, err := tx.Exec(ctx, `INSERT INTO failover_effects (id) VALUES ($1)`, m.ID)
				return err
			})
		return err
	}
	failover := func(killed func()) (func() error, error) {
		pidFile, err := primaryPIDFile(c, 0)
		if err != nil {
			return nil, err
		}
		if err := ownservice.KillPIDFile(pidFile); err != nil {
			return nil, err
		}
		killed()
		if err := c.Command("promote", c.Name); err != nil {
			return nil, err
		}
		return c.Restart, nil
	}
	var m matrix
	n := messages(t)
	for r := range rounds(t) {
		all := ids(r, n)
		res := round{deliveries: all, process: process, killAt: n / 3, failover: failover}.run(ctx, t)
		effects := map[string]int{}
		rows, err := pool.Query(ctx, `SELECT id, count(*) FROM failover_effects WHERE id LIKE $1 GROUP BY id`, all[0][:len(all[0])-5]+"%")
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id string
			var k int
			if err := rows.Scan(&id, &k); err != nil {
				t.Fatal(err)
			}
			effects[id] = k
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		doubles, lost := m.add(res, all, effects)
		t.Logf("round %d: %d doubles, %d lost, recovered in %v", r, doubles, lost, res.recover)
		if doubles != 0 {
			t.Errorf("round %d: %d effects ran twice; the record and the effect commit together", r, doubles)
		}
		if zeroLost && lost != 0 {
			t.Errorf("round %d: %d acknowledged messages lost with a synchronous standby", r, lost)
		}
	}
	t.Logf("PostgreSQL %s: %v", sync, &m)
}
