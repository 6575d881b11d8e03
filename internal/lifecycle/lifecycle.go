// Package lifecycle is the run-once, stop-gracefully state that idem's
// broker consumers share (broker/idemamqp, broker/idemredisstream).
//
// A consumer runs once. Run's context is the parent of every handler's
// context, so cancelling it stops the consumer at once; Stop instead asks
// the consumer to finish what it has in flight, waits for Run to return,
// and cancels Run's context only when its own context ends first. Stop
// before Run makes the consumer's Run return nil as soon as it sees
// Stopping, and Stop is idempotent.
package lifecycle

import (
	"context"
	"sync"
	"time"
)

// Lifecycle is one consumer's run state; New makes one.
type Lifecycle struct {
	stop chan struct{} // closed by Stop
	done chan struct{} // closed when Run's body returns

	mu      sync.Mutex
	started bool
	stopped bool
	cancel  context.CancelFunc // cancels the body's context
}

// New returns a Lifecycle that has neither run nor been stopped.
func New() *Lifecycle {
	return &Lifecycle{stop: make(chan struct{}), done: make(chan struct{})}
}

// Run calls body once, with a child of ctx that Stop cancels when it
// gives up waiting. It returns already, without calling body, when Run was
// called before. Otherwise it returns body's error, except that a nil
// from a body that ended because ctx ended (and not because of Stop)
// becomes ctx's error.
func (l *Lifecycle) Run(ctx context.Context, already error, body func(context.Context) error) error {
	l.mu.Lock()
	if l.started {
		l.mu.Unlock()
		return already
	}
	l.started = true
	runCtx, cancel := context.WithCancel(ctx)
	l.cancel = cancel
	l.mu.Unlock()
	defer close(l.done)
	defer cancel()
	err := body(runCtx)
	if err == nil && ctx.Err() != nil && !l.Stopping() {
		return ctx.Err()
	}
	return err
}

// Stopped returns a channel that Stop closes.
func (l *Lifecycle) Stopped() <-chan struct{} { return l.stop }

// Stopping reports whether Stop was called.
func (l *Lifecycle) Stopping() bool {
	select {
	case <-l.stop:
		return true
	default:
		return false
	}
}

// Sleep waits d unless ctx ends or Stop is called first; it reports
// whether the caller should go on (d passed).
func (l *Lifecycle) Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-l.stop:
		return false
	}
}

// Stop marks the consumer stopping (Stopped is closed) and, when Run was
// called, waits for it to return: nil once it has, or ctx's error when
// ctx ends first, after cancelling the context Run gave its body. Without
// a Run it returns nil at once.
func (l *Lifecycle) Stop(ctx context.Context) error {
	l.mu.Lock()
	if !l.stopped {
		l.stopped = true
		close(l.stop)
	}
	started, cancel := l.started, l.cancel
	l.mu.Unlock()
	if !started {
		return nil
	}
	select {
	case <-l.done:
		return nil
	case <-ctx.Done():
		cancel()
		return ctx.Err()
	}
}
