package idemnats

import (
	"log/slog"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// progressMsg counts its in-progress reports.
type progressMsg struct {
	jetstream.Msg
	reports atomic.Int32
}

func (m *progressMsg) InProgress() error { m.reports.Add(1); return nil }

// TestProgressSetReports: a message in the set is reported in progress
// every period until it is removed, and for at most its limit; one
// reporter covers every message, added at any time.
func TestProgressSetReports(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := newProgressSet()
		stuck, taken, running, unlimited := &progressMsg{}, &progressMsg{}, &progressMsg{}, &progressMsg{}
		p.add(stuck, 10*time.Second)
		p.add(taken, 10*time.Second)
		p.add(unlimited, 0)
		done := make(chan struct{})
		stopped := make(chan struct{})
		go func() {
			defer close(stopped)
			p.report(done, time.Second, slog.New(slog.DiscardHandler))
		}()
		time.Sleep(3500 * time.Millisecond)
		synctest.Wait()
		if got := taken.reports.Load(); got != 3 {
			t.Fatalf("after 3.5s: %d reports, want 3 (one a second)", got)
		}
		// A handler took it: it leaves the waiting messages and joins
		// the running ones, with the handler's own limit.
		p.remove(taken)
		p.add(running, 5*time.Second)
		time.Sleep(time.Minute)
		synctest.Wait()
		p.remove(running)
		p.remove(unlimited)
		time.Sleep(time.Minute)
		synctest.Wait()
		close(done)
		<-stopped
		if got := taken.reports.Load(); got != 3 {
			t.Errorf("a message removed at 3.5s: %d reports, want 3", got)
		}
		// Added at 3.5s with a 5s limit: reported at 4s..8s.
		if got := running.reports.Load(); got != 5 {
			t.Errorf("a running message with a 5s limit: %d reports, want 5", got)
		}
		// Reported at 1s..9s; from 10s on it has waited HandlerTimeout.
		if got := stuck.reports.Load(); got != 9 {
			t.Errorf("a message waiting for a minute with a 10s limit: %d reports, want 9", got)
		}
		// No limit: every second until its removal at 63.5s.
		if got := unlimited.reports.Load(); got != 63 {
			t.Errorf("a message without a limit, removed at 63.5s: %d reports, want 63", got)
		}
	})
}
