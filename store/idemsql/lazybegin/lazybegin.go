// Package lazybegin opens a database/sql handle over pgx's stdlib driver
// whose transactions send BEGIN together with their first statement, in
// one network round trip, instead of a round trip of its own at
// DB.BeginTx. It is for store/idemsql on PostgreSQL, whose claim is a
// transaction's first statement: with it a new message costs the round
// trips of pgx's own store (store/idempgxv5) for BEGIN and the claim.
//
// The transactions are still *sql.Tx values: handlers run their
// statements in them as in any other. What changes, for every
// transaction on the handle (the application's too):
//
//   - BeginTx with the default options (isolation level default, not read
//     only) sends nothing: BEGIN goes with the transaction's first
//     ExecContext with arguments, pipelined as one pgx batch, or, when the
//     first statement is a query (QueryContext, QueryRowContext), a prepare
//     or an ExecContext without arguments (which stdlib sends as a simple
//     query, several statements allowed), just before it, as BeginTx would
//     have. Other options begin at once, as pgx's stdlib does.
//   - An error of BEGIN is returned by that first statement, not by
//     BeginTx; now() in the transaction is the time of its first
//     statement.
//   - Commit and Rollback of a transaction that ran no statement send
//     nothing (there is nothing to end).
//   - The driver connection that (*sql.Conn).Raw hands over is this
//     package's, not a *stdlib.Conn: get pgx's connection with
//     interface{ Conn() *pgx.Conn }, as stdlib's has the same method.
//
// Checked against pgx v5.13.0's stdlib, whose connection it wraps
// (stdlib.Conn.Conn gives the *pgx.Conn that sends the batch).
package lazybegin

import (
	"context"
	"database/sql"
	"database/sql/driver"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// OpenDB returns a *sql.DB over pgx's stdlib driver with config and opts
// (as stdlib.OpenDB), whose transactions begin with their first
// statement.
func OpenDB(config pgx.ConnConfig, opts ...stdlib.OptionOpenDB) *sql.DB {
	return sql.OpenDB(Connector(stdlib.GetConnector(config, opts...)))
}

// Connector wraps c, a connector of pgx's stdlib driver (such as
// stdlib.GetConnector returns), so that the transactions of the *sql.DB
// that sql.OpenDB makes of it begin with their first statement. A
// connection of c that is not pgx's (*stdlib.Conn) is used as it is.
func Connector(c driver.Connector) driver.Connector { return connector{c} }

type connector struct{ inner driver.Connector }

func (c connector) Connect(ctx context.Context) (driver.Conn, error) {
	dc, err := c.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	sc, ok := dc.(*stdlib.Conn)
	if !ok {
		return dc, nil
	}
	return &conn{sc: sc}, nil
}

func (c connector) Driver() driver.Driver { return c.inner.Driver() }

// conn is pgx's stdlib connection with a BEGIN held back (pending) until
// the transaction's first statement. database/sql uses a connection from
// one goroutine at a time.
type conn struct {
	sc      *stdlib.Conn
	pending bool
	// The batch of BEGIN and a first statement, kept for the next
	// transaction, so that it allocates only pgx's results.
	batch  pgx.Batch
	queued [2]*pgx.QueuedQuery
	qq     [2]pgx.QueuedQuery
	vals   []any
	// tx is the transaction BeginTx returns, one at a time.
	tx tx
}

// Conn returns the pgx connection underneath, as stdlib.Conn.Conn does,
// for (*sql.Conn).Raw: the driver connection is this wrapper, not a
// *stdlib.Conn, so assert interface{ Conn() *pgx.Conn } rather than the
// type. Do not begin or end transactions on it.
func (c *conn) Conn() *pgx.Conn { return c.sc.Conn() }

func (c *conn) Close() error { return c.sc.Close() }

func (c *conn) Ping(ctx context.Context) error { return c.sc.Ping(ctx) }

func (c *conn) CheckNamedValue(v *driver.NamedValue) error { return c.sc.CheckNamedValue(v) }

// Interface checks: what database/sql looks for on stdlib's connection.
var (
	_ driver.ConnBeginTx        = (*conn)(nil)
	_ driver.ExecerContext      = (*conn)(nil)
	_ driver.QueryerContext     = (*conn)(nil)
	_ driver.ConnPrepareContext = (*conn)(nil)
	_ driver.NamedValueChecker  = (*conn)(nil)
	_ driver.SessionResetter    = (*conn)(nil)
	_ driver.Pinger             = (*conn)(nil)
)

// ResetSession forgets a BEGIN still held back (its transaction ended
// without a statement) and resets stdlib's connection.
func (c *conn) ResetSession(ctx context.Context) error {
	c.pending = false
	return c.sc.ResetSession(ctx)
}

func (c *conn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if opts.Isolation != driver.IsolationLevel(sql.LevelDefault) || opts.ReadOnly {
		return c.sc.BeginTx(ctx, opts)
	}
	if c.sc.Conn().IsClosed() {
		return nil, driver.ErrBadConn
	}
	c.pending = true
	c.tx = tx{c: c, ctx: ctx}
	return &c.tx, nil
}

// flush sends the pending BEGIN on its own.
func (c *conn) flush(ctx context.Context) error {
	if !c.pending {
		return nil
	}
	c.pending = false
	_, err := c.sc.Conn().Exec(ctx, "begin")
	return err
}

func (c *conn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if !c.pending || len(args) == 0 {
		// Without arguments stdlib sends the text as a simple query,
		// which may hold several statements; a batch could not.
		if err := c.flush(ctx); err != nil {
			return nil, err
		}
		return c.sc.ExecContext(ctx, query, args)
	}
	c.pending = false
	c.vals = c.vals[:0]
	for _, a := range args {
		c.vals = append(c.vals, a.Value)
	}
	defer clear(c.vals) // keep no argument past the call
	c.qq = [2]pgx.QueuedQuery{{SQL: "begin"}, {SQL: query, Arguments: c.vals}}
	c.queued = [2]*pgx.QueuedQuery{&c.qq[0], &c.qq[1]}
	c.batch = pgx.Batch{QueuedQueries: c.queued[:]}
	br := c.sc.Conn().SendBatch(ctx, &c.batch)
	_, err := br.Exec()
	var tag interface{ RowsAffected() int64 }
	if err == nil {
		tag, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	return driver.RowsAffected(tag.RowsAffected()), nil
}

func (c *conn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if err := c.flush(ctx); err != nil {
		return nil, err
	}
	return c.sc.QueryContext(ctx, query, args)
}

func (c *conn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	if err := c.flush(ctx); err != nil {
		return nil, err
	}
	return c.sc.PrepareContext(ctx, query)
}

func (c *conn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

// tx ends a transaction begun lazily: with COMMIT or ROLLBACK once BEGIN
// was sent, with nothing before.
type tx struct {
	c   *conn
	ctx context.Context
}

func (t *tx) Commit() error { return t.end("commit") }

func (t *tx) Rollback() error { return t.end("rollback") }

func (t *tx) end(command string) error {
	if t.c.pending {
		t.c.pending = false
		return nil
	}
	pc := t.c.sc.Conn()
	tag, err := pc.Exec(t.ctx, command)
	if err != nil {
		if pc.PgConn().TxStatus() != 'I' {
			_ = pc.Close(context.Background()) // the transaction's state is unknown
		}
		return err
	}
	if command == "commit" && tag.String() == "ROLLBACK" {
		return pgx.ErrTxCommitRollback // the server rolled a failed transaction back
	}
	return nil
}
