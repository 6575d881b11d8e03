package idempgxv5

import (
	"context"
	"sync"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/pgsql"
	"github.com/idem-go/idem/internal/sqlstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Interface checks.
var (
	_ idemdriver.OutboxTx[pgx.Tx]        = (*Store)(nil)
	_ idemdriver.OutboxCommitter[pgx.Tx] = (*Store)(nil)
	_ idemdriver.OutboxStore             = (*Store)(nil)
	_ idemdriver.OutboxNotifier          = (*Store)(nil)
	_ idemdriver.OutboxSentClaimer       = (*Store)(nil)
)

// outboxes caches the outbox statements per table.
var outboxes sync.Map // table -> *sqlstore.Outbox

func (s *Store) outbox() *sqlstore.Outbox {
	if o, ok := outboxes.Load(s.table.Qualified); ok {
		return o.(*sqlstore.Outbox)
	}
	o, _ := outboxes.LoadOrStore(s.table.Qualified, pgsql.OutboxNativeArrays(s.table.Qualified+"_outbox"))
	return o.(*sqlstore.Outbox)
}

// EmitTx implements [idemdriver.OutboxTx]: one multi-row INSERT into the
// outbox table (Table + "_outbox") in tx, ON CONFLICT (id) DO NOTHING. p
// is checked first (idemdriver.ValidateEmitParams), so tx stays usable on
// invalid input (errors match idemdriver.ErrInvalidOutgoing or
// ErrInvalidConsumerName). The table's trigger notifies relays at commit,
// except in a transaction this Store began ([Store.Begin],
// [Store.BeginClaim]): there the INSERT also sets idem.outbox_quiet for
// the transaction (an INSERT ... SELECT whose condition calls set_config
// before any row is written), which the trigger heeds, and
// [Store.Commit] notifies after
// the commit instead. A notifying transaction holds a server-wide lock
// through its commit's disk flush, so notifying inside every consumer
// transaction would make their commits run one at a time. With
// p.RelayWoken (the caller wakes a relay of its own process after the
// commit), Store.Commit sends no notification for these rows.
func (s *Store) EmitTx(ctx context.Context, tx pgx.Tx, p *idemdriver.EmitParams) error {
	return timed(ctx, tx, func() error { return s.emitTx(ctx, tx, p) })
}

func (s *Store) emitTx(ctx context.Context, tx pgx.Tx, p *idemdriver.EmitParams) error {
	state, ok := s.ownLoad(tx)
	if ok && state == false {
		q, args, err := s.outbox().EmitStatementQuiet(p)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, q, args...); err != nil {
			return err
		}
		s.ownStore(tx, emitted(p))
		return nil
	}
	if err := s.outbox().Emit(ctx, querier{tx}, p); err != nil {
		return err
	}
	if ok && !p.RelayWoken {
		s.ownStore(tx, true) // an earlier emit's relay is not this one's
	}
	return nil
}

// relayWoken is the value of Store.own for a transaction that emitted
// only rows whose caller wakes a relay itself (EmitParams.RelayWoken):
// quiet, and its commit notifies nobody. A transaction that emitted rows
// that need the notification maps to true, one that emitted none to
// false.
type relayWoken struct{}

// emitted is the value of Store.own for a quiet transaction once p's
// rows are written in it.
func emitted(p *idemdriver.EmitParams) any {
	if p.RelayWoken {
		return relayWoken{}
	}
	return true
}

// EmitCommit implements [idemdriver.OutboxCommitter]: in a transaction
// this Store began ([Store.Begin], [Store.BeginClaim],
// [Store.BeginClaimBatch]) it sends the outbox INSERT that also makes the
// transaction quiet (see EmitTx) and the COMMIT in one round trip, and
// after the commit notifies relays as [Store.Commit]
// does, unless p.RelayWoken (the caller wakes a relay of its own process
// after the commit: relays of other processes find the rows at their next
// poll). In any other transaction it is [Store.EmitTx], then
// [Store.Commit]. p is checked first (idemdriver.ValidateEmitParams), so
// tx stays usable on invalid input. When a statement fails, those after it are not run, nothing
// commits, and the error is the failed statement's; the caller rolls tx
// back.
//
// pgx's Tx learns of the commit through a Commit with a context ended
// beforehand, which pgx refuses before sending anything. A query tracer
// (pgx.ConnConfig.Tracer) would record that call as a failed "commit", so
// on a connection with a tracer EmitCommit is EmitTx, then Commit.
func (s *Store) EmitCommit(ctx context.Context, tx pgx.Tx, p *idemdriver.EmitParams) error {
	return timed(ctx, tx, func() error { return s.emitCommit(ctx, tx, p) })
}

func (s *Store) emitCommit(ctx context.Context, tx pgx.Tx, p *idemdriver.EmitParams) error {
	if _, ok := s.ownLoad(tx); !ok || tx.Conn().Config().Tracer != nil {
		if err := s.EmitTx(ctx, tx, p); err != nil {
			return err
		}
		return s.Commit(ctx, tx)
	}
	q, args, err := s.outbox().EmitStatementQuiet(p)
	if err != nil {
		return err
	}
	b := &pgx.Batch{}
	b.Queue(q, args...)
	b.Queue(`COMMIT`)
	br := tx.SendBatch(ctx, b)
	_, err = br.Exec()
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err == nil && tag.String() != "COMMIT" {
		err = pgx.ErrTxCommitRollback
	}
	if err != nil {
		return err
	}
	// The transaction ended with the COMMIT above: close pgx's Tx (and
	// return the connection to the pool) without sending another.
	s.ownEnd(tx)
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	_ = tx.Commit(ended)
	if !p.RelayWoken {
		s.wakeRelays()
	}
	return nil
}

// wakeRelays has the outbox's channel notified after a commit that
// emitted, outside any transaction and off the committer's path: a
// goroutine sends the notifications one at a time, and wakes asked for
// while one is being sent are folded into the next (a notification sent
// after a commit wakes relays for it, whoever asked). A pg_notify is a
// transaction with a commit of its own, flushed to disk with
// synchronous_commit on, so the consumer does not wait for it. Errors are
// not reported (relays also poll); each send has notifyTimeout.
func (s *Store) wakeRelays() {
	s.wakeWanted.Store(true)
	if s.waking.CompareAndSwap(false, true) {
		go s.sendWakes()
	}
}

// notifyTimeout bounds one notification of wakeRelays.
const notifyTimeout = 10 * time.Second

// sendWakes is the sender of wakeRelays; it holds s.waking.
func (s *Store) sendWakes() {
	for {
		for s.wakeWanted.Swap(false) {
			ctx, cancel := context.WithTimeout(context.Background(), notifyTimeout)
			_, _ = s.pool.Exec(ctx, `SELECT pg_notify($1, '')`, s.table.Name+"_outbox")
			cancel()
		}
		s.waking.Store(false)
		// A wake asked for after the last Swap and before the Store
		// found waking taken: send it, unless another sender started.
		if !s.wakeWanted.Load() || !s.waking.CompareAndSwap(false, true) {
			return
		}
	}
}

// ClaimOutgoing implements [idemdriver.OutboxStore]: one UPDATE ...
// RETURNING whose selection of pending rows is FOR UPDATE SKIP LOCKED.
// Errors: idemdriver.ErrInvalidConfig for p out of range, else pgx's.
func (s *Store) ClaimOutgoing(ctx context.Context, p *idemdriver.ClaimOutgoingParams) ([]idemdriver.OutgoingRecord, error) {
	return s.outbox().Claim(ctx, querier{s.pool}, nil, p)
}

// MarkSent implements [idemdriver.OutboxStore]: one DELETE of the rows
// named by p.IDs, given as an array, whatever their number; with p.Keep,
// one UPDATE that marks them sent instead.
func (s *Store) MarkSent(ctx context.Context, p *idemdriver.MarkSentParams) error {
	return s.outbox().MarkSent(ctx, querier{s.pool}, p)
}

// MarkSentClaim implements [idemdriver.OutboxSentClaimer]: MarkSent's
// statement and ClaimOutgoing's in one pgx batch, which PostgreSQL runs as
// one implicit transaction (the batch ends with a single Sync): one round
// trip and one commit where the two calls take two of each, and the claim
// sees the ended rows gone. With no sent row it is ClaimOutgoing. Errors:
// idemdriver.ErrInvalidConfig (or ErrInvalidOutgoing) for invalid
// parameters, before anything is sent, else pgx's; on an error neither
// statement's work committed, unless the commit's outcome is unknown.
func (s *Store) MarkSentClaim(ctx context.Context, sent *idemdriver.MarkSentParams, claim *idemdriver.ClaimOutgoingParams) ([]idemdriver.OutgoingRecord, error) {
	mq, margs, cq, cargs, _, err := s.outbox().SentClaimStatements(sent, claim)
	if err != nil {
		return nil, err
	}
	if mq == "" {
		return s.ClaimOutgoing(ctx, claim)
	}
	b := &pgx.Batch{}
	b.Queue(mq, margs...)
	b.Queue(cq, cargs...)
	br := s.pool.SendBatch(ctx, b)
	_, err = br.Exec()
	var recs []idemdriver.OutgoingRecord
	if err == nil {
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			recs, err = sqlstore.ScanClaimed(rows)
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	return recs, nil
}

// MarkFailed implements [idemdriver.OutboxStore]: one UPDATE of every row
// of p, given as arrays, whatever their number, planned for each call's
// arrays. Under pgx's default mode, QueryExecModeCacheStatement, it runs
// as QueryExecModeCacheDescribe (an unnamed statement, parsed at each
// call): a statement prepared once gets PostgreSQL's generic plan from
// its sixth run on, which guesses 10 rows per array and may join them by
// reading the arrays again for every outbox row, a cost that grows with
// the square of the rows (seconds for a thousand). p is checked with
// idemdriver.ValidateMarkFailedParams.
func (s *Store) MarkFailed(ctx context.Context, p *idemdriver.MarkFailedParams) error {
	var q pgxQuerier = s.pool
	if s.cachesStatements {
		q = modeQuerier{s.pool, pgx.QueryExecModeCacheDescribe}
	}
	return s.outbox().MarkFailed(ctx, querier{q}, p)
}

// PurgeOutbox implements [idemdriver.OutboxStore]: one DELETE of the
// rows its subquery selects FOR UPDATE SKIP LOCKED, so purges of relays
// side by side take disjoint rows, never waiting for each other's locks
// (nor deadlocking). p is checked with
// idemdriver.ValidatePurgeOutboxParams.
func (s *Store) PurgeOutbox(ctx context.Context, p *idemdriver.PurgeOutboxParams) (int64, error) {
	return s.outbox().Purge(ctx, querier{s.pool}, nil, p)
}

// OutboxStats implements [idemdriver.OutboxStore].
func (s *Store) OutboxStats(ctx context.Context) (idemdriver.OutboxStats, error) {
	return s.outbox().Stats(ctx, querier{s.pool})
}

// WatchOutgoing implements [idemdriver.OutboxNotifier]: it takes a
// connection out of the pool (or opens one with Config.ListenConfig) for
// as long as it runs, LISTENs on the outbox's channel (the table's insert
// trigger notifies it at every commit that inserted rows, whoever wrote
// them), calls notify once when listening and then once per
// notification, and closes the connection when ctx ends or the connection
// fails, returning why.
func (s *Store) WatchOutgoing(ctx context.Context, notify func()) error {
	var conn *pgx.Conn
	if s.listen != nil {
		c, err := pgx.ConnectConfig(ctx, s.listen)
		if err != nil {
			return err
		}
		conn = c
	} else {
		c, err := s.pool.Acquire(ctx)
		if err != nil {
			return err
		}
		conn = c.Hijack() // a listening connection never goes back to the pool
	}
	defer func() {
		cctx, cancel := sqlstore.Detached(ctx)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgsql.OutboxChannel(s.table.Name)); err != nil {
		return err
	}
	notify() // rows may have come while nobody listened
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		notify()
	}
}
