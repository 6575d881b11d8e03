package idemsql

import (
	"context"
	"database/sql"
	"sync"
	"sync/atomic"
)

// maxCachedStatements bounds the statements a Store keeps prepared: the
// texts it runs are few (the claims, their reads, the lease statements),
// but a MySQL claim's text carries its lock timeout, which callers may
// vary.
const maxCachedStatements = 64

// stmtCache holds the hot statements of the MySQL and SQLite dialects
// (the transactional claim and its read, the lease statements) prepared
// once on the database: database/sql keeps a statement prepared on each
// connection that ran it, and a transaction runs it there
// (Tx.StmtContext). SQLite then does not parse the SQL text again, which
// costs more than running it; go-sql-driver/mysql, which otherwise
// prepares every statement with arguments, runs it, and closes it
// (unless the DSN sets interpolateParams=true), sends one command instead
// of three. A statement that could not be prepared is run from its text,
// as before, and prepared again on a later call.
//
// Statements prepared stay prepared, on each connection that ran them,
// for the life of the *sql.DB: the Store has no Close, and at most
// maxCachedStatements are kept (MySQL counts them per connection against
// max_prepared_stmt_count, 16,382 by default, for the whole server). When
// the server refuses to prepare one more (MySQL error 1461), one of the
// cache's or one the driver prepares for a statement run from its text
// (the MySQL Acquire's among them), the cache stops for good: it closes the statements it holds, giving the server's
// budget back to the application's own statements, and every statement
// runs from its text from then on; the statement refused is run again
// from its text, once (a refused prepare ran nothing).
type stmtCache struct {
	// mu serialises the writers; readers load m without it.
	mu sync.Mutex
	m  atomic.Pointer[map[string]*sql.Stmt]
	// wanted are the texts run from text inside a transaction (where the
	// pool may have no connection to prepare them on), to prepare at the
	// next Begin; wants counts them, to keep Begin's check lock-free.
	wanted map[string]struct{}
	wants  atomic.Int32
	// off is set once the server refused a prepare (refused).
	off atomic.Bool
}

// mysqlTooManyPrepared is MySQL's and MariaDB's error number for a
// prepare refused because the server holds max_prepared_stmt_count
// statements (ER_MAX_PREPARED_STMT_COUNT_REACHED).
const mysqlTooManyPrepared = 1461

// refused reports whether err is the server refusing to prepare one more
// statement (mysqlTooManyPrepared); if so, the cache stops for good and
// closes its statements, so that they count no more against the server's
// limit (on a connection a transaction holds, when the transaction ends).
func (c *stmtCache) refused(err error) bool {
	if n, ok := mysqlErrorNumber(err); !ok || n != mysqlTooManyPrepared {
		return false
	}
	if !c.off.CompareAndSwap(false, true) {
		return true
	}
	c.mu.Lock()
	old := c.m.Swap(nil)
	clear(c.wanted)
	c.wants.Store(0)
	c.mu.Unlock()
	if old != nil {
		for _, st := range *old {
			_ = st.Close()
		}
	}
	return true
}

// noteRefused is refused for the error of a statement run from its text
// (nil: nothing to note). A driver that prepares such a statement itself
// (go-sql-driver/mysql without interpolateParams) is refused too once
// the server holds its limit, which the cache's own statements may fill
// on the connections in use: the cache gives its statements back then as
// well, or a store running on fewer connections than it prepared on
// would keep the budget, and every other statement would be refused.
func (c *stmtCache) noteRefused(err error) {
	if err != nil {
		c.refused(err)
	}
}

// prepare prepares those of queries not prepared yet. It must run outside
// any transaction of db: a pool of one connection would wait for itself.
// It holds no lock while it prepares, so that a transaction's statements
// (get, want) never wait behind a prepare that waits for a connection
// the transaction holds.
func (c *stmtCache) prepare(ctx context.Context, db *sql.DB, queries ...string) {
	if c.off.Load() || c.has(queries) {
		return
	}
	var made map[string]*sql.Stmt
	for _, q := range queries {
		if c.get(q) != nil || made[q] != nil {
			continue
		}
		if c.size()+len(made) >= maxCachedStatements {
			break
		}
		st, err := db.PrepareContext(ctx, q)
		if err != nil {
			c.refused(err)
			break // run from the text this time
		}
		if made == nil {
			made = make(map[string]*sql.Stmt)
		}
		made[q] = st
	}
	if made == nil {
		return
	}
	var extra []*sql.Stmt
	c.mu.Lock()
	if c.off.Load() { // refused meanwhile
		c.mu.Unlock()
		for _, st := range made {
			_ = st.Close()
		}
		return
	}
	next := make(map[string]*sql.Stmt, c.size()+len(made))
	if old := c.m.Load(); old != nil {
		for q, st := range *old {
			next[q] = st
		}
	}
	for q, st := range made {
		if next[q] != nil { // prepared meanwhile by another caller
			extra = append(extra, st)
			continue
		}
		next[q] = st
	}
	c.m.Store(&next)
	c.mu.Unlock()
	for _, st := range extra {
		_ = st.Close()
	}
}

// size is how many statements are prepared.
func (c *stmtCache) size() int {
	if m := c.m.Load(); m != nil {
		return len(*m)
	}
	return 0
}

// has reports whether every one of queries is prepared.
func (c *stmtCache) has(queries []string) bool {
	m := c.m.Load()
	if m == nil {
		return len(queries) == 0
	}
	for _, q := range queries {
		if (*m)[q] == nil {
			return false
		}
	}
	return true
}

// get returns the statement prepared for query, or nil.
func (c *stmtCache) get(query string) *sql.Stmt {
	if m := c.m.Load(); m != nil {
		return (*m)[query]
	}
	return nil
}

// want records query, run from its text inside a transaction, for
// prepareWanted.
func (c *stmtCache) want(query string) {
	if c.off.Load() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.wanted[query]; ok || len(c.wanted) >= maxCachedStatements || c.off.Load() {
		return
	}
	if c.wanted == nil {
		c.wanted = make(map[string]struct{})
	}
	c.wanted[query] = struct{}{}
	c.wants.Add(1)
}

// prepareWanted prepares the statements want recorded. Like prepare, it
// must run outside any transaction of db. A statement that fails to
// prepare is dropped, to be recorded again by its next run.
func (c *stmtCache) prepareWanted(ctx context.Context, db *sql.DB) {
	if c.wants.Load() == 0 {
		return
	}
	c.mu.Lock()
	queries := make([]string, 0, len(c.wanted))
	for q := range c.wanted {
		queries = append(queries, q)
	}
	clear(c.wanted)
	c.wants.Store(0)
	c.mu.Unlock()
	c.prepare(ctx, db, queries...)
}

// preparedTx runs a transaction's statements through the cache's
// prepared statements when it has them (an sqlQuerier); a statement it
// does not have is run from its text and recorded (want), and so is one
// whose prepare on the transaction's connection the server refused
// (stmtCache.refused).
type preparedTx struct {
	tx *sql.Tx
	c  *stmtCache
}

func (p preparedTx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if st := p.c.get(query); st != nil {
		res, err := p.tx.StmtContext(ctx, st).ExecContext(ctx, args...)
		if err == nil || !p.c.refused(err) {
			return res, err
		}
	}
	p.c.want(query)
	res, err := p.tx.ExecContext(ctx, query, args...)
	p.c.noteRefused(err)
	return res, err
}

func (p preparedTx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if st := p.c.get(query); st != nil {
		rows, err := p.tx.StmtContext(ctx, st).QueryContext(ctx, args...)
		if err == nil || !p.c.refused(err) {
			return rows, err
		}
	}
	p.c.want(query)
	rows, err := p.tx.QueryContext(ctx, query, args...)
	p.c.noteRefused(err)
	return rows, err
}

func (p preparedTx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if st := p.c.get(query); st != nil {
		row := p.tx.StmtContext(ctx, st).QueryRowContext(ctx, args...)
		if err := row.Err(); err == nil || !p.c.refused(err) {
			return row
		}
	}
	p.c.want(query)
	row := p.tx.QueryRowContext(ctx, query, args...)
	p.c.noteRefused(row.Err())
	return row
}

// preparedDB runs statements outside any transaction through the cache's
// prepared statements (an sqlQuerier): a statement not prepared yet is
// prepared first, since no connection of db is held.
type preparedDB struct {
	db *sql.DB
	c  *stmtCache
}

func (p preparedDB) stmt(ctx context.Context, query string) *sql.Stmt {
	if st := p.c.get(query); st != nil {
		return st
	}
	p.c.prepare(ctx, p.db, query)
	return p.c.get(query)
}

func (p preparedDB) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if st := p.stmt(ctx, query); st != nil {
		res, err := st.ExecContext(ctx, args...)
		if err == nil || !p.c.refused(err) {
			return res, err
		}
	}
	res, err := p.db.ExecContext(ctx, query, args...)
	p.c.noteRefused(err)
	return res, err
}

func (p preparedDB) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if st := p.stmt(ctx, query); st != nil {
		rows, err := st.QueryContext(ctx, args...)
		if err == nil || !p.c.refused(err) {
			return rows, err
		}
	}
	rows, err := p.db.QueryContext(ctx, query, args...)
	p.c.noteRefused(err)
	return rows, err
}

func (p preparedDB) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if st := p.stmt(ctx, query); st != nil {
		row := st.QueryRowContext(ctx, args...)
		if err := row.Err(); err == nil || !p.c.refused(err) {
			return row
		}
	}
	row := p.db.QueryRowContext(ctx, query, args...)
	p.c.noteRefused(row.Err())
	return row
}

// prepareSQLiteLease prepares SQLite's lease statements (the claim, its
// recovery point, the record read of a refused claim, the steps read of a
// takeover, complete, a batch's claim and recovery points) that are not prepared yet. Call it before the
// transaction that runs them (through prepared) begins.
func (s *Store) prepareSQLiteLease(ctx context.Context) {
	s.stmts.prepare(ctx, s.db, s.lq.acquire, s.lq.point, s.lq.record, s.lq.steps, s.lq.complete, s.lq.acquireMany, s.lq.pointMany)
}

// prepared is tx running the prepared statements of s.
func (s *Store) prepared(tx *sql.Tx) preparedTx { return preparedTx{tx: tx, c: &s.stmts} }

// preparedOnDB is s's database running the prepared statements of s.
func (s *Store) preparedOnDB() preparedDB { return preparedDB{db: s.db, c: &s.stmts} }
