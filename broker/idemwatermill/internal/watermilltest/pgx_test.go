package watermilltest

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemwatermill"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/idempgxv5"
)

// Transactional over store/idempgxv5: the handler reads a pgx.Tx with
// Tx[pgx.Tx], on an in-process Pub/Sub (gochannel) that redelivers nacked
// messages; duplicates and a failed handler are charged once.
func TestTransactionalPgx(t *testing.T) {
	t.Parallel()
	url := testenv.URL(t, testenv.PostgresEnv, pgExample)
	id := suffix()
	charges := "wm_charges_" + id
	db, _ := openPG(t, url, charges) // the charges table, and the counts
	pool, err := pgxpool.New(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store, err := idempgxv5.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	idempotent := transactional[pgx.Tx](t)(idem.NewConsumer(store, idem.Config{Name: "wm-pgx-" + id}))
	fails := newFailOnce("m-2", "m-7")
	handler := func(msg *message.Message) error {
		tx, ok := idemwatermill.Tx[pgx.Tx](msg.Context())
		if !ok {
			return errors.New("no pgx.Tx in the message's context")
		}
		payload, fail := string(msg.Payload), fails.fail(msg.UUID)
		if fail {
			payload = failedPayload
		}
		if _, err := tx.Exec(msg.Context(), `INSERT INTO `+charges+` (message_id, payload) VALUES ($1, $2)`, msg.UUID, payload); err != nil {
			return err
		}
		if fail {
			return errors.New("injected failure after the row")
		}
		return nil
	}
	ps := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	defer ps.Close()
	var acks atomic.Int64
	runRouter(t, ps, "payments", handler, countAcks(&acks), idempotent)
	const n, dupEvery = 20, 3
	publishAll(t, ps, "payments", n, dupEvery)
	testenv.Eventually(t, time.Minute, "every delivery acked", func() bool { return acks.Load() >= n+(n+dupEvery-1)/dupEvery }, nil)
	checkCharges(t, db, charges, n)
}
