package idempgxv5

import (
	"context"
	"sync"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/pgsql"
	"github.com/idem-go/idem/internal/sqlstore"
	"github.com/jackc/pgx/v5"
)

// Interface checks.
var (
	_ idemdriver.OutboxTx[pgx.Tx] = (*Store)(nil)
	_ idemdriver.OutboxStore      = (*Store)(nil)
	_ idemdriver.OutboxNotifier   = (*Store)(nil)
)

// outboxes caches the outbox statements per table.
var outboxes sync.Map // table -> *sqlstore.Outbox

func (s *Store) outbox() *sqlstore.Outbox {
	if o, ok := outboxes.Load(s.table.Qualified); ok {
		return o.(*sqlstore.Outbox)
	}
	o, _ := outboxes.LoadOrStore(s.table.Qualified, pgsql.Outbox(s.table.Qualified+"_outbox"))
	return o.(*sqlstore.Outbox)
}

// EmitTx implements [idemdriver.OutboxTx]: one multi-row INSERT into the
// outbox table (Table + "_outbox") in tx, ON CONFLICT (id) DO NOTHING. p
// is checked first (idemdriver.ValidateEmitParams), so tx stays usable on
// invalid input (errors match idemdriver.ErrInvalidOutgoing or
// ErrInvalidConsumerName). The table's trigger notifies relays at commit.
func (s *Store) EmitTx(ctx context.Context, tx pgx.Tx, p *idemdriver.EmitParams) error {
	return s.outbox().Emit(ctx, querier{tx}, p)
}

// ClaimOutgoing implements [idemdriver.OutboxStore]: one UPDATE ...
// RETURNING whose selection of pending rows is FOR UPDATE SKIP LOCKED.
// Errors: idemdriver.ErrInvalidConfig for p out of range, else pgx's.
func (s *Store) ClaimOutgoing(ctx context.Context, p *idemdriver.ClaimOutgoingParams) ([]idemdriver.OutgoingRecord, error) {
	return s.outbox().Claim(ctx, querier{s.pool}, nil, p)
}

// MarkSent implements [idemdriver.OutboxStore].
func (s *Store) MarkSent(ctx context.Context, p *idemdriver.MarkSentParams) error {
	return s.outbox().MarkSent(ctx, querier{s.pool}, p)
}

// MarkFailed implements [idemdriver.OutboxStore]. p is checked with
// idemdriver.ValidateMarkFailedParams.
func (s *Store) MarkFailed(ctx context.Context, p *idemdriver.MarkFailedParams) error {
	return s.outbox().MarkFailed(ctx, querier{s.pool}, p)
}

// PendingOutgoing implements [idemdriver.OutboxStore].
func (s *Store) PendingOutgoing(ctx context.Context, p *idemdriver.PendingOutgoingParams) (int, error) {
	return s.outbox().Pending(ctx, querier{s.pool}, p)
}

// PurgeOutbox implements [idemdriver.OutboxStore]. p is checked with
// idemdriver.ValidatePurgeOutboxParams.
func (s *Store) PurgeOutbox(ctx context.Context, p *idemdriver.PurgeOutboxParams) (int64, error) {
	return s.outbox().Purge(ctx, querier{s.pool}, p)
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
