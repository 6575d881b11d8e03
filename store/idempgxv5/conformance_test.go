package idempgxv5_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/idem-go/idem/idemtest"
	"github.com/jackc/pgx/v5"
)

// TestConformance runs idem's store conformance suite, each case on its own
// pool and tables, with pgx's default query mode (extended protocol,
// cached prepared statements) and with the simple protocol that
// PgBouncer-style poolers need. After each case the pool must have no
// connection still acquired: no path of the suite leaks one.
func TestConformance(t *testing.T) {
	testURL(t) // skip (or fail) before the suite starts its subtests
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		t.Run(modeName(mode), func(t *testing.T) {
			t.Parallel()
			idemtest.Run(t, harness(mode))
		})
	}
}

func harness(mode pgx.QueryExecMode) idemtest.Harness[pgx.Tx] {
	return idemtest.Harness[pgx.Tx]{New: func(t *testing.T) *idemtest.Setup[pgx.Tx] {
		b := setup(t, poolOpts{maxConns: 40, mode: mode})
		t.Cleanup(func() { noneAcquired(t, b.pool) })
		return b.setup()
	}}
}

// setup returns the bundle as an idemtest.Setup.
func (b *bundle) setup() *idemtest.Setup[pgx.Tx] {
	return &idemtest.Setup[pgx.Tx]{
		Store:        b.store,
		WriteEffect:  b.writeEffect,
		CountEffects: b.queryEffects,
		CountRecords: b.queryRecords,
		Shift:        b.shift,
	}
}

// leaseSetup returns the bundle as an idemtest.LeaseSetup.
func (b *bundle) leaseSetup() *idemtest.LeaseSetup {
	return &idemtest.LeaseSetup{Store: b.store, ExpireLease: b.expireLease, CountRecords: b.queryRecords, Shift: b.shift, LockRecord: b.lockRecord}
}

// lockRecord locks consumer's record id in a transaction of its own
// (SELECT ... FOR UPDATE) until unlock rolls it back.
func (b *bundle) lockRecord(ctx context.Context, consumer, id string) (unlock func() error, err error) {
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	tag, err := tx.Exec(ctx, `SELECT 1 FROM `+b.table+` WHERE `+b.consumerIs()+` AND message_id = $2 FOR UPDATE`, consumer, id)
	if err == nil && tag.RowsAffected() != 1 {
		err = fmt.Errorf("no record %q of consumer %q", id, consumer)
	}
	if err != nil {
		_ = tx.Rollback(ctx)
		return nil, err
	}
	return func() error { return tx.Rollback(context.Background()) }, nil
}

func (b *bundle) queryEffects(ctx context.Context, key string) (n int, err error) {
	err = b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.effects+` WHERE key = $1`, key).Scan(&n)
	return n, err
}

func (b *bundle) queryRecords(ctx context.Context, consumer string) (n int, err error) {
	err = b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.table+` WHERE `+b.consumerIs(), consumer).Scan(&n)
	return n, err
}

// modeName names a query exec mode for a subtest: "CacheStatement".
func modeName(m pgx.QueryExecMode) string {
	return map[pgx.QueryExecMode]string{
		pgx.QueryExecModeCacheStatement: "CacheStatement",
		pgx.QueryExecModeCacheDescribe:  "CacheDescribe",
		pgx.QueryExecModeDescribeExec:   "DescribeExec",
		pgx.QueryExecModeExec:           "Exec",
		pgx.QueryExecModeSimpleProtocol: "SimpleProtocol",
	}[m]
}

// TestLeaseConformance runs idem's lease-mode conformance suite, each case
// on its own pool and tables, in pgx's default query mode and in simple
// protocol mode, with the same check that no connection leaks.
func TestLeaseConformance(t *testing.T) {
	testURL(t)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		t.Run(modeName(mode), func(t *testing.T) {
			t.Parallel()
			idemtest.RunLease(t, leaseHarness(mode))
		})
	}
}

func leaseHarness(mode pgx.QueryExecMode) idemtest.LeaseHarness {
	return idemtest.LeaseHarness{New: func(t *testing.T) *idemtest.LeaseSetup {
		b := setup(t, poolOpts{maxConns: 40, mode: mode})
		t.Cleanup(func() { noneAcquired(t, b.pool) })
		return b.leaseSetup()
	}}
}
