package idempgxv5_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/idempgxv5"
)

// dyingStore is a relay's store in a process that dies at its kill-th
// MarkSentClaim: from that call on, every store call fails without
// reaching PostgreSQL (the process is gone), and the IDs it was asked to
// end are recorded: those rows were confirmed by the broker and never
// deleted.
type dyingStore struct {
	*idempgxv5.Store
	kill  int
	dead  atomic.Bool
	died  chan struct{}
	mu    sync.Mutex
	calls int
	lost  map[string]bool // confirmed IDs whose end never reached the database
}

var errDead = errors.New("the relay's process is dead")

func (d *dyingStore) lose(ids []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, id := range ids {
		d.lost[id] = true
	}
}

func (d *dyingStore) MarkSentClaim(ctx context.Context, sent *idemdriver.MarkSentParams, claim *idemdriver.ClaimOutgoingParams) ([]idemdriver.OutgoingRecord, error) {
	d.mu.Lock()
	d.calls++
	die := d.calls == d.kill
	d.mu.Unlock()
	if die && d.dead.CompareAndSwap(false, true) {
		close(d.died)
	}
	if d.dead.Load() {
		d.lose(sent.IDs)
		return nil, errDead
	}
	return d.Store.MarkSentClaim(ctx, sent, claim)
}

func (d *dyingStore) MarkSent(ctx context.Context, p *idemdriver.MarkSentParams) error {
	if d.dead.Load() {
		d.lose(p.IDs)
		return errDead
	}
	return d.Store.MarkSent(ctx, p)
}

func (d *dyingStore) MarkFailed(ctx context.Context, p *idemdriver.MarkFailedParams) error {
	if d.dead.Load() {
		return errDead
	}
	return d.Store.MarkFailed(ctx, p)
}

func (d *dyingStore) ClaimOutgoing(ctx context.Context, p *idemdriver.ClaimOutgoingParams) ([]idemdriver.OutgoingRecord, error) {
	if d.dead.Load() {
		return nil, errDead
	}
	return d.Store.ClaimOutgoing(ctx, p)
}

// broker is what the relays published, in the order the broker confirmed
// it: one log shared by every relay, as one broker's.
type broker struct {
	mu   sync.Mutex
	log  []idem.Outgoing
	by   map[string][]string // ID -> the relays that published it
	seen map[string]bool
	all  chan struct{} // closed once every one of want IDs was published
	want int
}

func (b *broker) publisher(name string, dead *atomic.Bool) idem.Publisher {
	return idem.PublisherFunc(func(_ context.Context, msgs []idem.Outgoing) []error {
		errs := make([]error, len(msgs))
		if dead != nil && dead.Load() {
			for i := range errs {
				errs[i] = errDead
			}
			return errs
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, m := range msgs {
			b.log = append(b.log, m)
			b.by[m.ID] = append(b.by[m.ID], name)
			if !b.seen[m.ID] {
				b.seen[m.ID] = true
				if len(b.seen) == b.want {
					close(b.all)
				}
			}
		}
		return errs
	})
}

// TestBreakRelayDiesHoldingRows: a relay on PostgreSQL holds each round's
// confirmed rows until its next claim deletes them
// (idemdriver.OutboxSentClaimer). It dies (every store call fails from
// then on) just as a round's rows were to be deleted with the next claim.
// Two other relays, on pools of their own as other processes' would be,
// then send the rest. Every row is published; a row is published twice
// only when the dead relay's broker had confirmed it and its delete never
// reached the database (sent again after its lease, with its ID); no row
// is published by the two live relays both; per key, first publications
// are in seq order; the outbox ends empty.
func TestBreakRelayDiesHoldingRows(t *testing.T) {
	ctx := context.Background()
	b := setup(t, poolOpts{maxConns: 4})
	const keys, perKey = 8, 25
	rows := emitKeyed(t, b, keys, perKey)

	br := &broker{by: map[string][]string{}, seen: map[string]bool{}, all: make(chan struct{}), want: len(rows)}
	const lease = 2 * time.Second
	relay := func(name string, s idemdriver.OutboxStore, dead *atomic.Bool) *idem.Relay {
		// Leased rounds: the hole tested is the held rows of
		// idemdriver.OutboxSentClaimer, which locked rounds do not use.
		r, err := idem.NewRelay(idem.RelayConfig{Store: s, Publisher: br.publisher(name, dead), BatchSize: 5, Workers: 2,
			Lease: lease, MinPoll: 10 * time.Millisecond, MaxPoll: 50 * time.Millisecond, Retention: -1})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	dying := &dyingStore{Store: b.store, kill: 4, died: make(chan struct{}), lost: map[string]bool{}}
	actx, stopA := context.WithCancel(ctx)
	aDone := make(chan struct{})
	go func() { defer close(aDone); _ = relay("A", dying, &dying.dead).Run(actx) }()
	select {
	case <-dying.died:
	case <-br.all:
		t.Fatal("relay A published everything before its 4th MarkSentClaim")
	}
	stopA()
	<-aDone

	var lives []chan struct{}
	lctx, stopLive := context.WithCancel(ctx)
	for _, name := range []string{"B", "C"} {
		s, err := idempgxv5.New(newPool(t, poolOpts{maxConns: 3}), &idempgxv5.Config{Table: b.table})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		lives = append(lives, done)
		go func() { defer close(done); _ = relay(name, s, nil).Run(lctx) }()
	}
	select {
	case <-br.all:
	case <-time.After(30 * time.Second):
		t.Error("not every row published after 30 s")
	}
	testenv.Eventually(t, 10*time.Second, "an empty outbox", func() bool {
		st, err := b.store.OutboxStats(ctx)
		return err == nil && st.Pending == 0
	}, func() string { st, err := b.store.OutboxStats(ctx); return fmt.Sprintf("%+v, %v", st, err) })
	stopLive()
	for _, d := range lives {
		<-d
	}

	br.mu.Lock()
	defer br.mu.Unlock()
	dying.mu.Lock()
	defer dying.mu.Unlock()
	if len(dying.lost) == 0 {
		t.Error("relay A died holding no confirmed row; the test did not test the hole")
	}
	for id, by := range br.by {
		if len(by) == 1 {
			continue
		}
		if len(by) > 2 || by[0] != "A" || !dying.lost[id] {
			t.Errorf("%s published by %v; a second publication is allowed only for a row A confirmed and never deleted", id, by)
		}
	}
	for id := range dying.lost {
		if by := br.by[id]; len(by) != 2 {
			t.Errorf("%s, confirmed and never deleted by A, published by %v; want once by A and once again after its lease", id, by)
		}
	}
	firstsInKeyOrder(t, br.log)
	t.Logf("%d publications of %d rows; %d rows confirmed and not deleted when A died", len(br.log), len(rows), len(dying.lost))
}

// TestBreakRelayStopsHoldingRows: a relay on PostgreSQL stopped (its
// context cancelled) while it holds a round's confirmed rows deletes them
// before Run returns, as docs/outbox.md says: nothing is sent again.
func TestBreakRelayStopsHoldingRows(t *testing.T) {
	ctx := context.Background()
	b := setup(t, poolOpts{maxConns: 2})
	tx, err := b.store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.store.EmitTx(ctx, tx, &idemdriver.EmitParams{Consumer: "c", Messages: []idemdriver.OutgoingRecord{
		{ID: "a", Destination: "d", Key: "k", Payload: []byte("a")}, {ID: "b", Destination: "d", Key: "j", Payload: []byte("b")}}}); err != nil {
		t.Fatal(err)
	}
	if err := b.store.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	var published atomic.Int64
	r, err := idem.NewRelay(idem.RelayConfig{Store: b.store, Workers: 1, Retention: -1,
		Publisher: idem.PublisherFunc(func(_ context.Context, msgs []idem.Outgoing) []error {
			published.Add(int64(len(msgs)))
			stop() // the relay stops while this round's rows are confirmed and held
			return make([]error, len(msgs))
		})})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(rctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.table+`_outbox`).Scan(&n); err != nil || n != 0 || published.Load() != 2 {
		t.Errorf("after Run stopped holding its round: %d outbox rows (%v), %d published; want 0 rows, 2 published", n, err, published.Load())
	}
}
