package idempgxv5_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
)

// frontendMessages counts the messages of PostgreSQL's protocol that the
// client sends, by their type byte ('P' Parse, 'B' Bind, 'D' Describe,
// 'E' Execute, 'S' Sync, 'Q' a simple query, ...), on every connection
// of a pool (poolOpts.messages). Counting is off until start.
type frontendMessages struct {
	mu     sync.Mutex
	on     bool
	counts map[byte]int
}

// start resets the counts and counts from now on.
func (f *frontendMessages) start() {
	f.mu.Lock()
	f.on, f.counts = true, map[byte]int{}
	f.mu.Unlock()
}

// stop stops counting and returns the counts since start.
func (f *frontendMessages) stop() map[byte]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.on = false
	return f.counts
}

// messageConn is a network connection whose writes are parsed into
// frontend messages for frontendMessages: the startup message (a length
// and no type byte), then messages of a type byte and a length that
// counts itself. The connection is plain TCP (sslmode=disable).
type messageConn struct {
	net.Conn
	m       *frontendMessages
	pending []byte
	started bool
}

func (c *messageConn) Write(b []byte) (int, error) {
	c.m.mu.Lock()
	c.pending = append(c.pending, b...)
	for {
		if !c.started {
			if len(c.pending) < 4 || len(c.pending) < int(binary.BigEndian.Uint32(c.pending)) {
				break
			}
			c.pending = c.pending[binary.BigEndian.Uint32(c.pending):]
			c.started = true
			continue
		}
		if len(c.pending) < 5 {
			break
		}
		n := 1 + int(binary.BigEndian.Uint32(c.pending[1:]))
		if len(c.pending) < n {
			break
		}
		if c.m.on {
			c.m.counts[c.pending[0]]++
		}
		c.pending = c.pending[n:]
	}
	c.m.mu.Unlock()
	return c.Conn.Write(b)
}

// messagesPer formats counts per message (counts divided by n), by type.
func messagesPer(counts map[byte]int, n int) string {
	types := make([]int, 0, len(counts))
	for t := range counts {
		types = append(types, int(t))
	}
	sort.Ints(types)
	var b strings.Builder
	for _, t := range types {
		fmt.Fprintf(&b, "%c=%g ", t, float64(counts[byte(t)])/float64(n))
	}
	return strings.TrimSpace(b.String())
}

// TestClaimProtocolMessagesAgainstHandWritten checks, message by message
// of PostgreSQL's protocol, that a duplicate (BeginClaim of a recorded
// message) and a batch of new messages (BeginClaimBatch, the handler's
// insert, Commit) send no more messages of any type than the
// hand-written consumer with the same guarantee (the benchmarks'
// checkedProcess and bestBatch on checkedSetup's table), with their
// statements prepared once per connection: no Parse once warm, no
// statement described again, the same Syncs (round trips). The CPU that
// idem's duplicate and batch cost beyond the hand-written ones is then the
// server's execution of its statements, not the protocol (see
// docs/benchmarks.md).
func TestClaimProtocolMessagesAgainstHandWritten(t *testing.T) {
	ctx := context.Background()
	m := &frontendMessages{}
	b := setup(t, poolOpts{maxConns: 1, messages: m, noPing: true})
	b.checked = b.effects + "_checked"
	if err := createChecked(ctx, b.pool, b.checked); err != nil {
		t.Fatal(err)
	}
	payload := []byte(`{"order":"o-1"}`)
	sum := sha256.Sum256(payload)
	const seeded = 4
	recordDuplicates(t, b, "c", seeded, sum[:])
	claim := func(id string) *idemdriver.ClaimParams { return claimLikeConsumer("c", id, sum[:]) }

	// Each side runs every sequence once before counting, which prepares
	// its statements on the pool's one connection.
	const rounds = 3
	count := func(name string, op func(i int) error) map[byte]int {
		t.Helper()
		for i := range rounds + 1 {
			if i == 1 {
				m.start()
			}
			if err := op(i); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
		got := m.stop()
		t.Logf("%s, per operation: %s", name, messagesPer(got, rounds))
		return got
	}
	compare := func(what string, idem, hand map[byte]int, syncs int) {
		t.Helper()
		for typ, n := range idem {
			if n > hand[typ] {
				t.Errorf("%s: idem sent %d messages of type %q in %d operations, the hand-written consumer %d", what, n, typ, rounds, hand[typ])
			}
		}
		if idem['P'] != 0 {
			t.Errorf("%s: %d Parse messages once the statements were prepared, want 0", what, idem['P'])
		}
		if idem['S'] != syncs*rounds {
			t.Errorf("%s: %d Syncs in %d operations, want %d each", what, idem['S'], rounds, syncs)
		}
	}

	handDup := count("hand-written duplicate", func(i int) error {
		claimed, err := b.checkedProcess(ctx, "dup-"+strconv.Itoa(i%seeded), payload)
		if err == nil && claimed {
			err = fmt.Errorf("duplicate %d claimed", i)
		}
		return err
	})
	idemDup := count("idem duplicate", func(i int) error {
		tx, res, err := b.store.BeginClaim(ctx, claim("dup-"+strconv.Itoa(i%seeded)))
		if err == nil && (res.Claimed || !res.Ended || tx != nil) {
			err = fmt.Errorf("duplicate %d: %+v, tx %v", i, res, tx)
		}
		return err
	})
	compare("duplicate", idemDup, handDup, 2)

	const size = 10
	ids := func(side string, i int) []string {
		ids := make([]string, size)
		for k := range ids {
			ids[k] = side + "-" + strconv.Itoa(i*size+k)
		}
		slices.Sort(ids)
		return ids
	}
	checkedClaim := `INSERT INTO ` + b.checked + ` (message_id, fingerprint) SELECT * FROM unnest($1::text[], $2::bytea[]) ON CONFLICT DO NOTHING RETURNING message_id`
	effects := `INSERT INTO ` + b.effects + ` (key) SELECT unnest($1::text[])`
	handBatch := count("hand-written batch", func(i int) error {
		fps := make([][]byte, size)
		for k := range fps {
			fps[k] = sum[:]
		}
		return b.bestBatch(ctx, checkedClaim, ids("hand", i), fps)
	})
	idemBatch := count("idem batch", func(i int) error {
		p := &idemdriver.ClaimBatchParams{Consumer: "c", LockTimeout: 5 * time.Second}
		keys := ids("idem", i)
		for _, id := range keys {
			p.Messages = append(p.Messages, idemdriver.ClaimMessage{MessageID: id, Fingerprint: sum[:]})
		}
		tx, res, err := b.store.BeginClaimBatch(ctx, p)
		if err != nil {
			return err
		}
		for _, r := range res {
			if !r.Claimed {
				_ = b.store.Rollback(ctx, tx)
				return fmt.Errorf("batch %d: a message not claimed", i)
			}
		}
		if _, err := tx.Exec(ctx, effects, keys); err != nil {
			_ = b.store.Rollback(ctx, tx)
			return err
		}
		return b.store.Commit(ctx, tx)
	})
	compare("batch", idemBatch, handBatch, 2)
	if n := b.countEffects(t, "idem-0"); n != 1 {
		t.Errorf("batch's effect of idem-0 written %d times, want 1", n)
	}
	checkPool(t, b.pool)
}

// claimLikeConsumer is the claim of message id with fingerprint fp by
// consumer with a lock timeout and a call timeout, as a Consumer sends
// it (the call timeout long enough for a server run under valgrind).
func claimLikeConsumer(consumer, id string, fp []byte) *idemdriver.ClaimParams {
	return &idemdriver.ClaimParams{Consumer: consumer, MessageID: id, Fingerprint: fp, LockTimeout: 5 * time.Second, CallTimeout: time.Minute}
}

// recordDuplicates records the messages dup-0 to dup-<n-1>, with
// fingerprint fp, in b's hand-written table (checkedSetup's, which must
// exist) and, claimed by consumer, in b's Store, for a test that delivers
// them again.
func recordDuplicates(tb testing.TB, b *bundle, consumer string, n int, fp []byte) {
	tb.Helper()
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, `INSERT INTO `+b.checked+` (message_id, fingerprint)
		SELECT 'dup-' || g, $2::bytea FROM generate_series(0, $1::int - 1) g`, n, fp); err != nil {
		tb.Fatal(err)
	}
	for i := range n {
		tx, res, err := b.store.BeginClaim(ctx, claimLikeConsumer(consumer, "dup-"+strconv.Itoa(i), fp))
		if err == nil && !res.Claimed {
			err = fmt.Errorf("dup-%d not claimed: %+v", i, res)
		}
		if err == nil {
			err = b.store.Commit(ctx, tx)
		}
		if err != nil {
			tb.Fatal(err)
		}
	}
}
