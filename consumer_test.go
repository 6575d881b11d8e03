package idem_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/idem-go/idem/idemdriver"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
)

// recordingStore records the IDs of every batch claim.
type recordingStore struct {
	*idem.MemoryStore
	mu      sync.Mutex
	batches [][]string
}

func (s *recordingStore) ClaimBatchTx(ctx context.Context, tx *idem.MemoryTx, p *idemdriver.ClaimBatchParams) ([]idemdriver.ClaimResult, error) {
	var ids []string
	for _, m := range p.Messages {
		ids = append(ids, m.MessageID)
	}
	s.mu.Lock()
	s.batches = append(s.batches, ids)
	s.mu.Unlock()
	return s.MemoryStore.ClaimBatchTx(ctx, tx, p)
}

// The Consumer claims a batch in message ID order, so that concurrent
// batches sharing IDs lock them in one order and cannot deadlock, while the
// handler still sees the new messages in delivery order.
func TestProcessBatchClaimsInIDOrder(t *testing.T) {
	t.Parallel()
	store := &recordingStore{MemoryStore: idem.NewMemoryStore(nil)}
	c, err := idem.NewConsumer(store, idem.Config{Name: "c", PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.ProcessBatch(t.Context(), []idem.Message{{ID: "m", Payload: []byte("p")}}, func(context.Context, *idem.MemoryTx, []idem.Message) error { return nil }); err != nil {
		t.Fatal(err)
	}
	store.batches = nil

	batch := []idem.Message{{ID: "z"}, {ID: "b"}, {ID: "m", Payload: []byte("p")}, {ID: ""}, {ID: "a"}, {ID: "b"}, {ID: "Z"}}
	var handled []string
	outs, _ := c.ProcessBatch(t.Context(), batch, func(_ context.Context, _ *idem.MemoryTx, msgs []idem.Message) error {
		for _, m := range msgs {
			handled = append(handled, m.ID)
		}
		return nil
	})
	if want := [][]string{{"Z", "a", "b", "m", "z"}}; !slices.EqualFunc(store.batches, want, slices.Equal) {
		t.Errorf("claims %q, want %q (distinct valid IDs in byte order)", store.batches, want)
	}
	if want := []string{"z", "b", "a", "Z"}; !slices.Equal(handled, want) {
		t.Errorf("handler got %q, want the new messages in delivery order %q", handled, want)
	}
	want := []idem.Status{idem.Processed, idem.Processed, idem.Duplicate, idem.Rejected, idem.Processed, idem.Duplicate, idem.Processed}
	for i, o := range outs {
		if o.Status != want[i] || o.MessageID != batch[i].ID {
			t.Errorf("outcome %d: %v %q, want %v %q", i, o.Status, o.MessageID, want[i], batch[i].ID)
		}
	}
}

// The background purge loop purges on its interval with the injected
// clock of testing/synctest, and Close stops it: synctest.Test fails if a
// goroutine of the bubble is left running.
func TestPurgeLoop(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		store := idem.NewMemoryStore(nil)
		c, err := idem.NewConsumer(store, idem.Config{
			Name:            "c",
			PurgeInterval:   time.Hour,
			RetentionWindow: 2 * time.Hour,
			Logger:          slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if err != nil {
			t.Fatal(err)
		}
		h := func(context.Context, *idem.MemoryTx, idem.Message) error { return nil }
		process := func(id string) {
			if _, err := c.Process(t.Context(), idem.Message{ID: id}, h); err != nil {
				t.Fatal(err)
			}
		}
		process("old-1")
		process("old-2")
		<-time.After(90 * time.Minute) // one purge tick (54 to 66 minutes) has passed
		synctest.Wait()
		if n := idem.CountRecords(store, "c"); n != 2 {
			t.Errorf("records after 90 minutes of running with a 2-hour window: %d, want 2", n)
		}
		process("new")
		// The third tick comes 162 to 198 minutes in: the consumer has run
		// for more than 2 hours since old-1 and old-2, not since new.
		<-time.After(110 * time.Minute)
		synctest.Wait()
		if n := idem.CountRecords(store, "c"); n != 1 {
			t.Errorf("records after 200 minutes of running: %d, want 1 (new)", n)
		}
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
}

// Consumer.Purge reports store failures as ErrStore, and a running purge
// as ErrPurgeInProgress, unwrapped.
func TestConsumerPurgeErrors(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	for _, tt := range []struct {
		storeErr error
		want     []error
	}{
		{boom, []error{idem.ErrStore, boom}},
		{idem.ErrPurgeInProgress, []error{idem.ErrPurgeInProgress}},
	} {
		c, err := idem.NewConsumer(purgeErrStore{idem.NewMemoryStore(nil), tt.storeErr}, idem.Config{Name: "c", PurgeInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Purge(t.Context())
		for _, w := range tt.want {
			if !errors.Is(err, w) {
				t.Errorf("Purge with the store failing with %v: err = %v, want it to match %v", tt.storeErr, err, w)
			}
		}
		if tt.storeErr == idem.ErrPurgeInProgress && errors.Is(err, idem.ErrStore) {
			t.Errorf("Purge while another runs: err = %v, which should not match ErrStore", err)
		}
		_ = c.Close()
	}
}

type purgeErrStore struct {
	*idem.MemoryStore
	err error
}

func (s purgeErrStore) BeginPurge(context.Context, *idemdriver.BeginPurgeParams) (idemdriver.PurgeSession, error) {
	return nil, s.err
}

func TestOutcome(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		s         idem.Status
		name      string
		ack, dead bool
	}{
		{idem.Processed, "Processed", true, false},
		{idem.Duplicate, "Duplicate", true, false},
		{idem.InProgress, "InProgress", false, false},
		{idem.FingerprintMismatch, "FingerprintMismatch", false, true},
		{idem.Failed, "Failed", false, false},
		{idem.Rejected, "Rejected", false, true},
		{0, "Status(invalid)", false, false},
	} {
		o := idem.Outcome{Status: tt.s}
		if got := fmt.Sprint(tt.s); got != tt.name || o.Ack() != tt.ack || o.DeadLetter() != tt.dead {
			t.Errorf("status %d: String %q, Ack %v, DeadLetter %v; want %q, %v, %v", tt.s, got, o.Ack(), o.DeadLetter(), tt.name, tt.ack, tt.dead)
		}
	}
}

func TestPanicError(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	var err error = &idem.PanicError{Value: boom}
	if !errors.Is(err, idem.ErrHandlerPanic) || !errors.Is(err, boom) || idem.IsPermanent(err) {
		t.Errorf("PanicError{boom}: Is(ErrHandlerPanic) %v, Is(boom) %v, IsPermanent %v; want true, true, false",
			errors.Is(err, idem.ErrHandlerPanic), errors.Is(err, boom), idem.IsPermanent(err))
	}
	err = &idem.PanicError{Value: 42}
	if errors.Unwrap(err) != nil || err.Error() != "idem: handler panicked: 42" {
		t.Errorf("PanicError{42}: Unwrap %v, Error %q", errors.Unwrap(err), err.Error())
	}
}
