package lifecycle

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

var errAlready = errors.New("already running")

// TestRunOnce: a second Run returns the given error without calling its
// body; Stop waits for the first Run's body, which sees Stopping, and
// Run then returns the body's nil.
func TestRunOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := New()
		entered := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- l.Run(t.Context(), errAlready, func(ctx context.Context) error {
				close(entered)
				<-l.Stopped()
				return nil
			})
		}()
		<-entered
		if err := l.Run(t.Context(), errAlready, func(context.Context) error { t.Error("second body ran"); return nil }); err != errAlready {
			t.Fatalf("second Run = %v, want %v", err, errAlready)
		}
		if l.Stopping() {
			t.Fatal("Stopping before Stop")
		}
		if err := l.Stop(t.Context()); err != nil {
			t.Fatalf("Stop = %v", err)
		}
		if err := <-done; err != nil {
			t.Fatalf("Run = %v, want nil after Stop", err)
		}
		if err := l.Stop(t.Context()); err != nil {
			t.Fatalf("second Stop = %v", err)
		}
	})
}

// TestStopGivesUp: when Stop's context ends before the body returns,
// Stop cancels the body's context and returns its context's error; Run
// returns nil (the body's), since it was stopped.
func TestStopGivesUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := New()
		entered := make(chan struct{})
		done := make(chan error, 1)
		var cause error
		go func() {
			done <- l.Run(t.Context(), errAlready, func(ctx context.Context) error {
				close(entered)
				<-ctx.Done() // a handler that ignores Stop
				cause = ctx.Err()
				return nil
			})
		}()
		<-entered
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		if err := l.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Stop = %v, want DeadlineExceeded", err)
		}
		if err := <-done; err != nil || !errors.Is(cause, context.Canceled) {
			t.Fatalf("Run = %v, body's context %v; want nil and Canceled", err, cause)
		}
	})
}

// TestRunContextEnds: a body that returns nil because Run's context ended
// makes Run return that context's error; a body's own error is returned
// as it is.
func TestRunContextEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if err := New().Run(ctx, errAlready, func(ctx context.Context) error { <-ctx.Done(); return nil }); !errors.Is(err, context.Canceled) {
			t.Fatalf("Run = %v, want Canceled", err)
		}
		boom := errors.New("boom")
		if err := New().Run(t.Context(), errAlready, func(context.Context) error { return boom }); err != boom {
			t.Fatalf("Run = %v, want %v", err, boom)
		}
	})
}

// TestRunContextEndsWhileStopping: a body that returns nil after Stop is
// a stopped Run, nil, even when Run's context ended meanwhile.
func TestRunContextEndsWhileStopping(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := New()
		ctx, cancel := context.WithCancel(t.Context())
		entered := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- l.Run(ctx, errAlready, func(context.Context) error {
				close(entered)
				<-l.Stopped()
				cancel()
				return nil
			})
		}()
		<-entered
		if err := l.Stop(t.Context()); err != nil {
			t.Fatalf("Stop = %v", err)
		}
		if err := <-done; err != nil {
			t.Fatalf("Run = %v, want nil: it was stopped", err)
		}
	})
}

// TestStopBeforeRun: Stop without a Run returns at once; the body of a
// later Run sees Stopping, and Sleep returns false at once.
func TestStopBeforeRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := New()
		if err := l.Stop(t.Context()); err != nil {
			t.Fatalf("Stop = %v", err)
		}
		start := time.Now()
		err := l.Run(t.Context(), errAlready, func(ctx context.Context) error {
			if !l.Stopping() {
				t.Error("Stopping false after Stop")
			}
			if l.Sleep(ctx, time.Hour) {
				t.Error("Sleep went on after Stop")
			}
			return nil
		})
		if err != nil || time.Since(start) != 0 {
			t.Fatalf("Run = %v after %v, want nil at once", err, time.Since(start))
		}
	})
}

// TestSleep: Sleep reports true after d, and false when its context ends
// first.
func TestSleep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := New()
		start := time.Now()
		if !l.Sleep(t.Context(), time.Minute) || time.Since(start) != time.Minute {
			t.Fatalf("Sleep returned false or after %v, want true after 1m", time.Since(start))
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		if l.Sleep(ctx, time.Minute) {
			t.Fatal("Sleep went on after its context ended")
		}
	})
}
