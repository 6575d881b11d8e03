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

// TestWaitingSetReports: a message waiting for a handler is reported in
// progress every period until it leaves the queue, and for at most
// HandlerTimeout.
func TestWaitingSetReports(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w := &waitingSet{msgs: map[jetstream.Msg]time.Time{}, maxWait: 10 * time.Second}
		stuck, taken := &progressMsg{}, &progressMsg{}
		w.add(stuck)
		w.add(taken)
		done := make(chan struct{})
		stopped := make(chan struct{})
		go func() {
			defer close(stopped)
			w.report(done, time.Second, slog.New(slog.DiscardHandler))
		}()
		time.Sleep(3500 * time.Millisecond)
		synctest.Wait()
		if got := taken.reports.Load(); got != 3 {
			t.Fatalf("after 3.5s: %d reports, want 3 (one a second)", got)
		}
		w.remove(taken) // a handler took it
		time.Sleep(time.Minute)
		synctest.Wait()
		close(done)
		<-stopped
		if got := taken.reports.Load(); got != 3 {
			t.Errorf("a message taken by a handler at 3.5s: %d reports, want 3", got)
		}
		// Reported at 1s..9s; from 10s on it has waited HandlerTimeout.
		if got := stuck.reports.Load(); got != 9 {
			t.Errorf("a message waiting for a minute with a 10s HandlerTimeout: %d reports, want 9", got)
		}
	})
}
