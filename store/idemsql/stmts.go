package idemsql

import (
	"context"
	"database/sql"
	"sync"
)

// stmtCache holds SQLite's lease statements prepared once on the
// database: database/sql keeps a statement prepared on each connection
// that ran it, and a transaction runs it there (Tx.StmtContext) without
// the driver parsing the SQL text again, which on SQLite costs more than
// running it. A statement that could not be prepared is run from its
// text, as before, and prepared again on a later call.
type stmtCache struct {
	mu sync.Mutex
	m  map[string]*sql.Stmt
}

// prepare prepares those of queries not prepared yet. It must run outside
// any transaction of db: a pool of one connection would wait for itself.
func (c *stmtCache) prepare(ctx context.Context, db *sql.DB, queries ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, q := range queries {
		if _, ok := c.m[q]; ok {
			continue
		}
		st, err := db.PrepareContext(ctx, q)
		if err != nil {
			return // run from the text this time
		}
		if c.m == nil {
			c.m = map[string]*sql.Stmt{}
		}
		c.m[q] = st
	}
}

func (c *stmtCache) get(query string) *sql.Stmt {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[query]
}

// preparedTx runs a transaction's statements through the cache's
// prepared statements when it has them (an sqlQuerier).
type preparedTx struct {
	tx *sql.Tx
	c  *stmtCache
}

func (p preparedTx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if st := p.c.get(query); st != nil {
		return p.tx.StmtContext(ctx, st).ExecContext(ctx, args...)
	}
	return p.tx.ExecContext(ctx, query, args...)
}

func (p preparedTx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if st := p.c.get(query); st != nil {
		return p.tx.StmtContext(ctx, st).QueryContext(ctx, args...)
	}
	return p.tx.QueryContext(ctx, query, args...)
}

func (p preparedTx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if st := p.c.get(query); st != nil {
		return p.tx.StmtContext(ctx, st).QueryRowContext(ctx, args...)
	}
	return p.tx.QueryRowContext(ctx, query, args...)
}

// prepareSQLiteLease prepares SQLite's lease statements (the claim, its
// recovery point, the record read of a refused claim, the steps read of a
// takeover, complete) that are not prepared yet. Call it before the
// transaction that runs them (through prepared) begins.
func (s *Store) prepareSQLiteLease(ctx context.Context) {
	s.stmts.prepare(ctx, s.db, s.lq.acquire, s.lq.point, s.lq.record, s.lq.steps, s.lq.complete)
}

// prepared is tx running the prepared statements of s.
func (s *Store) prepared(tx *sql.Tx) preparedTx { return preparedTx{tx: tx, c: &s.stmts} }
