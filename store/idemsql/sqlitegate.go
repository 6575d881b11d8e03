package idemsql

import (
	"context"
	"database/sql"
	"fmt"
	"sync"

	"github.com/idem-go/idem/internal/sqlstore"
)

// sqliteFiles holds what the SQLite Stores of this process share per
// database: scope (checkSQLite's: "file:" and the main database file, or
// "memory:" and the *sql.DB of an in-memory database) -> *sqliteFile. An
// entry lives as long as the process; it is a few words.
var sqliteFiles sync.Map

// sqliteFile is what the SQLite Stores of one database share in this
// process: the write gate and the purge locks.
type sqliteFile struct {
	// gate queues the store's writers (see writeGate).
	gate writeGate
	// mu guards begun and stop: the transaction of Store.Begin that holds
	// the gate (one at most, since the gate has one holder), until it ends
	// (endGated), and the stop function of the context.AfterFunc that
	// gives the gate back when the context of Begin ends.
	mu    sync.Mutex
	begun *sql.Tx
	stop  func() bool
	// purging holds the purge locks: table + "\x00" + consumer ->
	// struct{}.
	purging sync.Map
}

// sqliteFileOf returns the shared state of the database named by scope.
func sqliteFileOf(scope string) *sqliteFile {
	if f, ok := sqliteFiles.Load(scope); ok {
		return f.(*sqliteFile)
	}
	f, _ := sqliteFiles.LoadOrStore(scope, &sqliteFile{})
	return f.(*sqliteFile)
}

// writeGate is the FIFO write gate of one SQLite database in this
// process: every write transaction and write statement a Store runs on
// SQLite holds it, from before its BEGIN (or its statement) until its
// COMMIT or ROLLBACK, and writers take it in the order they asked.
//
// SQLite runs one writer at a time, and a writer that finds the write
// lock taken waits in SQLite's busy handler: it sleeps (1 ms, growing to
// 100 ms) and tries again, until the busy timeout. Between its tries the
// other connections of the process keep taking the lock, so under load a
// writer could lose every try for the whole timeout and fail with
// SQLITE_BUSY, though the database was never stuck. With the gate, the
// writers of this process wait in a queue instead, and the lock passes
// from one to the next as the previous one ends: the busy handler is
// left to writers of other processes (and to transactions the
// application begins itself on the *sql.DB), which still meet the busy
// timeout.
//
// A goroutine holding the gate must not ask for it again (it would wait
// for itself): no Store method calls another while it holds it.
//
// A buffered channel of one would not do: its waiters are not served in
// order. Here each waiter has a channel of its own, in a queue; lock
// hands the gate to the head of the queue, and a waiter whose context
// ends leaves the queue, or, when the gate was handed to it meanwhile,
// passes it on.
type writeGate struct {
	mu      sync.Mutex
	held    bool
	waiters []*gateWaiter // oldest first
}

// gateWaiter is a writer queued for the gate: ready is closed when the
// gate is handed to it, granted set (under the gate's mu).
type gateWaiter struct {
	ready   chan struct{}
	granted bool
}

// lock takes the gate, waiting behind the writers that asked before. It
// returns ctx.Err() (the gate not taken) when ctx ends first.
func (g *writeGate) lock(ctx context.Context) error {
	g.mu.Lock()
	if !g.held {
		g.held = true
		g.mu.Unlock()
		return nil
	}
	if err := ctx.Err(); err != nil {
		g.mu.Unlock()
		return err
	}
	w := &gateWaiter{ready: make(chan struct{})}
	g.waiters = append(g.waiters, w)
	g.mu.Unlock()
	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
	}
	g.mu.Lock()
	if w.granted {
		// Handed over just as ctx ended: pass it on.
		g.mu.Unlock()
		g.unlock()
		return ctx.Err()
	}
	for i, x := range g.waiters {
		if x == w {
			g.waiters = append(g.waiters[:i], g.waiters[i+1:]...)
			break
		}
	}
	g.mu.Unlock()
	return ctx.Err()
}

// unlock gives the gate back: to the oldest waiter if there is one.
func (g *writeGate) unlock() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.waiters) == 0 {
		g.held = false
		return
	}
	w := g.waiters[0]
	g.waiters[0] = nil
	g.waiters = g.waiters[1:]
	w.granted = true
	close(w.ready)
}

// lockWrite takes s's write gate on SQLite (nothing on the other
// dialects, whose s.sqlite is nil). An error wraps ctx.Err().
func (s *Store) lockWrite(ctx context.Context) error {
	if s.sqlite == nil {
		return nil
	}
	if err := s.sqlite.gate.lock(ctx); err != nil {
		return fmt.Errorf("idemsql: waiting for the SQLite write gate: %w", err)
	}
	return nil
}

// unlockWrite gives back what lockWrite took.
func (s *Store) unlockWrite() {
	if s.sqlite != nil {
		s.sqlite.gate.unlock()
	}
}

// gated runs f holding s's write gate on SQLite (see writeGate): f is one
// of the store's writes, its statements and transactions on s.db.
func gated[T any](ctx context.Context, s *Store, f func() (T, error)) (T, error) {
	if err := s.lockWrite(ctx); err != nil {
		var zero T
		return zero, err
	}
	defer s.unlockWrite()
	return f()
}

// gatedErr is gated for a write that returns only an error.
func (s *Store) gatedErr(ctx context.Context, f func() error) error {
	if err := s.lockWrite(ctx); err != nil {
		return err
	}
	defer s.unlockWrite()
	return f()
}

// beginGated begins a transaction for Store.Begin, holding the write gate
// on SQLite until endGated: called by Store.Commit or Store.Rollback, or
// when ctx ends, since database/sql then rolls the transaction back
// itself (a transaction its caller ended with tx.Commit keeps the gate
// until then).
func (s *Store) beginGated(ctx context.Context) (*sql.Tx, error) {
	if s.sqlite == nil {
		return s.db.BeginTx(ctx, nil)
	}
	if err := s.lockWrite(ctx); err != nil {
		return nil, err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		s.unlockWrite()
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { s.endGated(tx) })
	f := s.sqlite
	f.mu.Lock()
	f.begun, f.stop = tx, stop
	f.mu.Unlock()
	if ctx.Err() != nil { // ended before begun was set for the AfterFunc's call
		s.endGated(tx)
	}
	return tx, nil
}

// endGated gives back the write gate tx holds, once tx has ended;
// nothing for a transaction that holds none (not from Store.Begin, or
// given back already).
func (s *Store) endGated(tx *sql.Tx) {
	if s.sqlite == nil {
		return
	}
	f := s.sqlite
	f.mu.Lock()
	if f.begun != tx {
		f.mu.Unlock()
		return
	}
	stop := f.stop
	f.begun, f.stop = nil, nil
	f.mu.Unlock()
	stop()
	f.gate.unlock()
}

// gatedQuerier runs each statement on s.db holding s's write gate, from
// the statement's start until its Row is scanned or its Rows closed: for
// the shared SQL-store logic (internal/sqlstore) writing outside a
// transaction, one statement at a time.
type gatedQuerier struct{ s *Store }

func (g gatedQuerier) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	return gated(ctx, g.s, func() (int64, error) { return querier{g.s.db}.Exec(ctx, query, args...) })
}

func (g gatedQuerier) Query(ctx context.Context, query string, args ...any) (sqlstore.Rows, error) {
	if err := g.s.lockWrite(ctx); err != nil {
		return nil, err
	}
	rows, err := querier{g.s.db}.Query(ctx, query, args...)
	if err != nil {
		g.s.unlockWrite()
		return nil, err
	}
	return &gatedRows{Rows: rows, s: g.s}, nil
}

func (g gatedQuerier) QueryRow(ctx context.Context, query string, args ...any) sqlstore.Row {
	if err := g.s.lockWrite(ctx); err != nil {
		return errRow{err}
	}
	return &gatedRow{Row: querier{g.s.db}.QueryRow(ctx, query, args...), s: g.s}
}

// gatedRows gives back the write gate when closed.
type gatedRows struct {
	sqlstore.Rows
	s    *Store
	once sync.Once
}

func (r *gatedRows) Close() {
	r.Rows.Close()
	r.once.Do(r.s.unlockWrite)
}

// gatedRow gives back the write gate when scanned.
type gatedRow struct {
	sqlstore.Row
	s    *Store
	once sync.Once
}

func (r *gatedRow) Scan(dest ...any) error {
	err := r.Row.Scan(dest...)
	r.once.Do(r.s.unlockWrite)
	return err
}

// errRow is a Row whose Scan returns err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
