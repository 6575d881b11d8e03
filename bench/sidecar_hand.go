package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The hand-written sidecar is the reference `idem consume` is measured
// against: what an engineer would write by hand for one store with the
// same guarantees as `idem consume --hold 64` at most once, and nothing
// more. Per fetched batch it makes one store round trip that claims every
// message of the batch (the fencing token and the recovery point "the
// call started" written by the claim itself), the calls of the messages
// it acquired, one round trip that records their outcomes, fenced by the
// token, and the acks.

// A record's states in the hand-written sidecar's table.
const (
	handHeld      = 1 // claimed: token owns it until lease_until
	handCompleted = 2 // the service answered 2xx
	handFailed    = 3 // dead-lettered: an answer for good, or an unknown outcome
	// handConflict is not stored: a claim reports it for a message whose
	// ID has a record of another payload (fingerprint).
	handConflict = 4
)

// handLease is the lease of a hand-written sidecar's claim, and its
// consumer's AckWait: not renewed, so a call that has not answered by
// the end of the lease (less handLeaseMargin) is cancelled.
const (
	handLease       = 30 * time.Second
	handLeaseMargin = time.Second
)

// handRetention is how long the hand-written sidecar keeps a finished
// record (idem's default retention window): on Redis its expiry.
const handRetention = 7 * 24 * time.Hour

// handMsg is one message of a batch as the store sees it.
type handMsg struct {
	id          string
	fingerprint []byte // SHA-256 of the payload
}

// handClaim is a claim's verdict on one message: acquired (the token to
// complete it with, its call may go), or the state of a record the claim
// did not take (handHeld: held by a live lease; handCompleted,
// handFailed, handConflict). A message the claim has no verdict on (a
// record inserted by a transaction its snapshot could not see) is
// missing from the claim's answer, and is left to be redelivered.
type handClaim struct {
	token    int64
	state    int16
	acquired bool
}

// handOutcome is what a call left of an acquired message: handCompleted,
// handFailed (dead-lettered) or handHeld (released: its outcome is known
// to be no effect, so its redelivery may call again).
type handOutcome struct {
	id    string
	token int64
	state int16
}

// handStore is the hand-written sidecar's store: claim and finish are
// one round trip, one durable commit, each.
type handStore interface {
	// claim claims msgs (distinct IDs) for lease: it inserts a record for
	// each new message and takes over each one whose lease ran out, with
	// the same fingerprint, in the same statement that records the
	// recovery point (the token of the call about to start). A record
	// taken over whose recovery point is set (a call that may have been
	// sent) is failed instead of acquired: its outcome is unknown.
	claim(ctx context.Context, msgs []handMsg, lease time.Duration) (map[string]handClaim, error)
	// finish records outs and returns the IDs it recorded: those whose
	// token still owns a held record. Another token's (a stale holder's)
	// outcome changes nothing.
	finish(ctx context.Context, outs []handOutcome) (map[string]bool, error)
	close()
}

// handPG is handStore on PostgreSQL (pgx) in a table of its own: only
// the columns the guarantees need, the message ID the primary key (one
// consumer per table), an index on the time retention counts from (the
// purge of expired records), fill factor 50 (as idem's outbox; its
// processed table keeps the default) so that an outcome's update finds
// room on its row's page.
type handPG struct {
	pool                *pgxpool.Pool
	claimSQL, finishSQL string
}

// newHandPG creates table on the PostgreSQL at url.
func newHandPG(ctx context.Context, url, table string) (*handPG, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	// Generic plans from the first execution: a custom plan sees the
	// arrays' 64 elements and the statistics' few held records, and scans
	// the whole table for the outcomes instead of probing the key.
	cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	t := pgx.Identifier{table}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+t+` (
	message_id text PRIMARY KEY,
	fingerprint bytea NOT NULL,
	state smallint NOT NULL,
	token bigint NOT NULL,
	lease_until timestamptz NOT NULL,
	call_started bigint
) WITH (fillfactor = 50)`); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: %w", err)
	}
	// The retention index: a finished record's lease_until is the time
	// of its outcome, from which the retention window counts, so that a
	// purge (DELETE ... WHERE state <> 1 AND lease_until < the cutoff)
	// reads only the expired records. It keeps an outcome's update from
	// being heap-only, as idem's retention index does.
	if _, err := pool.Exec(ctx, `CREATE INDEX IF NOT EXISTS `+pgx.Identifier{table + "_retention"}.Sanitize()+` ON `+t+` (lease_until)`); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: %w", err)
	}
	// The claim: INSERT ... ON CONFLICT DO UPDATE of the rows whose
	// lease ran out (judged on their latest committed version), in ID
	// order so that two claims lock in the same order; then, unless it
	// took every message, the other records as of its snapshot.
	claim := `WITH u AS (
	SELECT * FROM unnest($1::text[], $2::bytea[]) AS u(id, fp)
), up AS (
	INSERT INTO ` + t + ` AS r (message_id, fingerprint, state, token, lease_until, call_started)
	SELECT id, fp, 1, 1, now() + $3 * interval '1 microsecond', 1 FROM u ORDER BY id
	ON CONFLICT (message_id) DO UPDATE
	SET token = r.token + 1, lease_until = excluded.lease_until,
		state = CASE WHEN r.call_started IS NULL THEN 1 ELSE 3 END,
		call_started = COALESCE(r.call_started, r.token + 1)
	WHERE r.state = 1 AND r.lease_until <= now() AND r.fingerprint = excluded.fingerprint
	RETURNING r.message_id, r.token, r.state
)
SELECT message_id, token, state, state = 1 FROM up
UNION ALL
SELECT r.message_id, r.token, CASE WHEN r.fingerprint <> u.fp THEN 4 ELSE r.state END, false
FROM u JOIN ` + t + ` AS r ON r.message_id = u.id
WHERE (SELECT count(*) FROM up) < cardinality($1::text[]) AND NOT EXISTS (SELECT FROM up WHERE up.message_id = u.id)`
	// The outcomes: fenced by the token, the rows locked in ID order
	// (the caller sorts them; the primary key's index scan of = ANY
	// returns them so); a release clears the recovery point.
	finish := `UPDATE ` + t + ` AS r SET state = u.state, lease_until = now(),
	call_started = CASE WHEN u.state = 1 THEN NULL ELSE r.call_started END
FROM unnest($1::text[], $2::bigint[], $3::smallint[]) AS u(id, token, state)
WHERE r.message_id = ANY($1::text[]) AND r.message_id = u.id AND r.token = u.token AND r.state = 1
RETURNING r.message_id`
	return &handPG{pool: pool, claimSQL: claim, finishSQL: finish}, nil
}

func (s *handPG) claim(ctx context.Context, msgs []handMsg, lease time.Duration) (map[string]handClaim, error) {
	ids := make([]string, len(msgs))
	fps := make([][]byte, len(msgs))
	for i, m := range msgs {
		ids[i], fps[i] = m.id, m.fingerprint
	}
	rows, err := s.pool.Query(ctx, s.claimSQL, ids, fps, lease.Microseconds())
	if err != nil {
		return nil, err
	}
	got := make(map[string]handClaim, len(msgs))
	var id string
	var c handClaim
	_, err = pgx.ForEachRow(rows, []any{&id, &c.token, &c.state, &c.acquired}, func() error {
		got[id] = c
		return nil
	})
	return got, err
}

func (s *handPG) finish(ctx context.Context, outs []handOutcome) (map[string]bool, error) {
	slices.SortFunc(outs, func(a, b handOutcome) int { return strings.Compare(a.id, b.id) })
	ids := make([]string, len(outs))
	tokens := make([]int64, len(outs))
	states := make([]int16, len(outs))
	for i, o := range outs {
		ids[i], tokens[i], states[i] = o.id, o.token, o.state
	}
	rows, err := s.pool.Query(ctx, s.finishSQL, ids, tokens, states)
	if err != nil {
		return nil, err
	}
	done := make(map[string]bool, len(outs))
	var id string
	_, err = pgx.ForEachRow(rows, []any{&id}, func() error {
		done[id] = true
		return nil
	})
	return done, err
}

func (s *handPG) close() { s.pool.Close() }

// handSidecar is the hand-written sidecar on JetStream: loops batch
// loops, each fetching up to 64 messages, claiming them (one round trip),
// POSTing the acquired ones with at most concurrency calls in flight over
// all loops, recording the outcomes (one round trip), then acking.
type handSidecar struct {
	js       jetstream.JetStream
	cons     jetstream.Consumer
	store    handStore
	client   *http.Client
	url      string
	dead     string        // the dead-letter subject
	calls    chan struct{} // a slot per call in flight
	msgs     atomic.Uint64 // store calls: claims and outcomes, one per message
	trips    atomic.Uint64 // store round trips
	lease    time.Duration
	fetchMax int
}

// handContender is the --sidecar contender of the hand-written sidecar on
// the store open returns for a run (given the run's tag): loops batch
// loops of up to fetch messages each (at most loops × fetch held), with
// concurrency calls in flight over all of them.
func handContender(js jetstream.JetStream, open func(ctx context.Context, tag string) (handStore, error), loops, fetch, concurrency int) func(ctx context.Context, stream, subject, target, tag string) (func() usage, error) {
	return func(ctx context.Context, stream, subject, target, tag string) (func() usage, error) {
		st, err := open(ctx, tag)
		if err != nil {
			return nil, err
		}
		cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "hand", AckPolicy: jetstream.AckExplicitPolicy, AckWait: handLease})
		if err != nil {
			st.close()
			return nil, err
		}
		h := newHandSidecar(js, cons, st, target, subject+".dead", concurrency)
		h.fetchMax = fetch
		ctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for range loops {
			wg.Go(func() { h.run(ctx) })
		}
		return func() usage {
			cancel()
			wg.Wait()
			h.client.CloseIdleConnections()
			st.close()
			return usage{storeCalls: h.msgs.Load(), storeTrips: h.trips.Load()}
		}, nil
	}
}

func newHandSidecar(js jetstream.JetStream, cons jetstream.Consumer, st handStore, url, dead string, concurrency int) *handSidecar {
	return &handSidecar{js: js, cons: cons, store: st, url: url, dead: dead,
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: concurrency}},
		calls:  make(chan struct{}, concurrency), lease: handLease, fetchMax: 64}
}

// run handles batches until ctx ends.
func (h *handSidecar) run(ctx context.Context) {
	for ctx.Err() == nil {
		batch := h.fetch(ctx)
		if len(batch) > 0 {
			h.handle(ctx, batch)
		}
	}
}

// fetch returns the messages available now, up to fetchMax, or else
// waits up to a second for one.
func (h *handSidecar) fetch(ctx context.Context) []jetstream.Msg {
	var ms []jetstream.Msg
	if b, err := h.cons.FetchNoWait(h.fetchMax); err == nil {
		for m := range b.Messages() {
			ms = append(ms, m)
		}
	}
	if len(ms) > 0 || ctx.Err() != nil {
		return ms
	}
	if b, err := h.cons.Fetch(1, jetstream.FetchMaxWait(time.Second)); err == nil {
		for m := range b.Messages() {
			ms = append(ms, m)
		}
	}
	return ms
}

// handle claims batch, calls the service for the messages acquired,
// records the outcomes and acks what is done. Nothing is acked that the
// store did not record: a failed round trip leaves the batch to be
// redelivered (a claim's records then wait for their lease).
func (h *handSidecar) handle(ctx context.Context, batch []jetstream.Msg) {
	msgs := make([]handMsg, 0, len(batch))
	seen := make(map[string]bool, len(batch))
	var todo []jetstream.Msg // the messages claimed, in msgs' order
	for _, m := range batch {
		id := m.Headers().Get(nats.MsgIdHdr)
		switch {
		case id == "":
			h.deadLetter(ctx, m, "no message ID", false)
			continue
		case seen[id]: // a second delivery of an ID in the batch waits for the first
			_ = m.NakWithDelay(time.Second)
			continue
		}
		seen[id] = true
		fp := sha256.Sum256(m.Data())
		msgs = append(msgs, handMsg{id: id, fingerprint: fp[:]})
		todo = append(todo, m)
	}
	if len(msgs) == 0 {
		return
	}
	start := time.Now()
	claims, err := h.store.claim(ctx, msgs, h.lease)
	h.trips.Add(1)
	h.msgs.Add(uint64(len(msgs)))
	if err != nil {
		return
	}
	outs := make([]handOutcome, 0, len(msgs))
	var outMsgs []jetstream.Msg
	var mu sync.Mutex
	var wg sync.WaitGroup
	callCtx, cancel := context.WithDeadline(ctx, start.Add(h.lease-handLeaseMargin))
	defer cancel()
	for i, m := range todo {
		c, ok := claims[msgs[i].id]
		switch {
		case !ok || (!c.acquired && c.state == handHeld):
			_ = m.NakWithDelay(time.Second) // held by another, or not visible yet
		case !c.acquired && c.state == handCompleted:
			_ = m.Ack() // a duplicate: answered already
		case !c.acquired && c.state == handFailed:
			// Failed by this claim (a call of an earlier token may
			// have been sent: outcome unknown) or before: dead-lettered
			// again in case the earlier publish was lost.
			h.deadLetter(ctx, m, "failed or outcome-unknown", true)
		case !c.acquired:
			h.deadLetter(ctx, m, "conflict: another payload with this message ID", false)
		default:
			h.calls <- struct{}{}
			wg.Go(func() {
				defer func() { <-h.calls }()
				state, known := h.call(callCtx, msgs[i].id, m.Data())
				if !known {
					_ = m.Nak() // outcome unknown: the lease runs out, a redelivery dead-letters it
					return
				}
				mu.Lock()
				outs = append(outs, handOutcome{id: msgs[i].id, token: c.token, state: state})
				outMsgs = append(outMsgs, m)
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	if len(outs) == 0 {
		return
	}
	byID := make(map[string]jetstream.Msg, len(outs))
	for i, o := range outs {
		byID[o.id] = outMsgs[i]
	}
	// The calls were made: their outcomes are recorded and acked even
	// when the sidecar is stopping.
	ctx, stop := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer stop()
	done, err := h.store.finish(ctx, outs)
	h.trips.Add(1)
	h.msgs.Add(uint64(len(outs)))
	if err != nil {
		return
	}
	for _, o := range outs {
		m := byID[o.id]
		switch {
		case !done[o.id]: // fenced: another token owns the record now; its holder decides
		case o.state == handCompleted:
			_ = m.Ack()
		case o.state == handHeld:
			_ = m.NakWithDelay(time.Second)
		default:
			h.deadLetter(ctx, m, "permanent: the service refused it", true)
		}
	}
}

// call POSTs one message with its ID as Idempotency-Key and returns the
// outcome to record: handCompleted on a 2xx, handHeld (release: retry
// later) on 409, 429 or a 5xx, handFailed on any other answer; known is
// false when the request may have reached the service without an answer.
func (h *handSidecar) call(ctx context.Context, id string, payload []byte) (state int16, known bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, strings.NewReader(string(payload)))
	if err != nil {
		return handFailed, true
	}
	req.Header.Set("Idempotency-Key", id)
	resp, err := h.client.Do(req)
	if err != nil {
		return 0, false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	switch s := resp.StatusCode; {
	case s/100 == 2:
		return handCompleted, true
	case s == http.StatusConflict || s == http.StatusTooManyRequests || s/100 == 5:
		return handHeld, true
	default:
		return handFailed, true
	}
}

// deadLetter publishes m to the dead-letter subject with reason, and acks
// m once the broker stored it (or terminates it when ack is false: a
// conflicting payload is not recorded and must not come back).
func (h *handSidecar) deadLetter(ctx context.Context, m jetstream.Msg, reason string, ack bool) {
	dl := &nats.Msg{Subject: h.dead, Data: m.Data(), Header: nats.Header{"Idem-Dead-Letter-Reason": []string{reason}}}
	if _, err := h.js.PublishMsg(ctx, dl); err != nil {
		return // not acked: it comes back
	}
	if ack {
		_ = m.Ack()
	} else {
		_ = m.Term()
	}
}
