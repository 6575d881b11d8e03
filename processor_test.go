package idem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// The Processors Bind, BindBatch and BindLease give an adapter run the same
// consumer semantics as calling the consumer directly: the second delivery
// of an ID is a Duplicate and the handler ran once.
func TestProcessorsBindTheirConsumer(t *testing.T) {
	ctx := context.Background()
	store := idem.NewMemoryStore(nil)

	tx, err := idem.NewConsumer[*idem.MemoryTx](store, idem.Config{Name: "tx", PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	lease, err := idem.NewLeaseConsumer(store, idem.Config{Name: "lease", PurgeInterval: -1, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Close()

	calls := map[string]int{}
	procs := map[string]idem.Processor{
		"Bind": idem.Bind(tx, func(ctx context.Context, _ *idem.MemoryTx, m idem.Message) error {
			calls["Bind"]++
			return nil
		}),
		"BindLease": idem.BindLease(lease, func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
			calls["BindLease"]++
			return idem.Result{Body: []byte("ok")}, nil
		}),
	}
	for name, p := range procs {
		msg := idem.Message{ID: "m-" + name, Payload: []byte("p")}
		for i, want := range []idem.Status{idem.Processed, idem.Duplicate} {
			out, err := p.Process(ctx, msg)
			if err != nil || out.Status != want {
				t.Errorf("%s delivery %d: got %v, %v; want %v, nil", name, i+1, out.Status, err, want)
			}
		}
		if calls[name] != 1 {
			t.Errorf("%s: handler ran %d times, want 1", name, calls[name])
		}
	}

	batch := idem.BindBatch(tx, func(ctx context.Context, _ *idem.MemoryTx, msgs []idem.Message) error {
		calls["BindBatch"] += len(msgs)
		return nil
	})
	msgs := []idem.Message{{ID: "b1", Payload: []byte("x")}, {ID: "b2", Payload: []byte("y")}, {ID: "m-Bind", Payload: []byte("p")}}
	outs, err := batch.ProcessBatch(ctx, msgs)
	if err != nil {
		t.Fatal(err)
	}
	want := []idem.Status{idem.Processed, idem.Processed, idem.Duplicate}
	for i := range want {
		if outs[i].Status != want[i] {
			t.Errorf("batch outcome %d: got %v, want %v", i, outs[i].Status, want[i])
		}
	}
	if calls["BindBatch"] != 2 {
		t.Errorf("batch handler saw %d messages, want 2", calls["BindBatch"])
	}

	// A ProcessorFunc wrapper sees the same outcome and error the consumer gave.
	boom := errors.New("boom")
	var seen idem.Status
	wrapped := idem.ProcessorFunc(func(ctx context.Context, m idem.Message) (idem.Outcome, error) {
		out, err := idem.Bind(tx, func(context.Context, *idem.MemoryTx, idem.Message) error { return boom }).Process(ctx, m)
		seen = out.Status
		return out, err
	})
	if _, err := wrapped.Process(ctx, idem.Message{ID: "fails", Payload: []byte("z")}); !errors.Is(err, boom) || seen != idem.Failed {
		t.Errorf("failing handler: got %v, %v; want Failed, boom", seen, err)
	}
}

// A transactional handler's Permanent error makes the Outcome poison, so
// an adapter dead-letters it instead of redelivering it for ever; the claim
// rolls back with the effects. A plain error is not poison.
func TestTransactionalPermanentIsPoison(t *testing.T) {
	ctx := context.Background()
	store := idem.NewMemoryStore(nil)
	c, err := idem.NewConsumer[*idem.MemoryTx](store, idem.Config{Name: "tx", PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	declined := errors.New("card declined")
	for _, tc := range []struct {
		err        error
		poison     bool
		deadLetter bool
	}{{idem.Permanent(declined), true, true}, {declined, false, false}} {
		msg := idem.Message{ID: "pay-" + tc.err.Error() + map[bool]string{true: "-p"}[tc.poison], Payload: []byte("x")}
		for _, process := range []func() (idem.Outcome, error){
			func() (idem.Outcome, error) {
				return c.Process(ctx, msg, func(context.Context, *idem.MemoryTx, idem.Message) error { return tc.err })
			},
			func() (idem.Outcome, error) {
				tx, err := store.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer store.Rollback(ctx, tx) // ProcessTx's caller rolls back after an error
				return c.ProcessTx(ctx, tx, msg, func(context.Context, *idem.MemoryTx, idem.Message) error { return tc.err })
			},
		} {
			out, err := process()
			if out.Status != idem.Failed || out.Poison != tc.poison || out.DeadLetter() != tc.deadLetter || !errors.Is(err, declined) {
				t.Errorf("%v: got %v poison=%v deadLetter=%v err=%v; want Failed poison=%v deadLetter=%v", tc.err, out.Status, out.Poison, out.DeadLetter(), err, tc.poison, tc.deadLetter)
			}
		}
		// Nothing was recorded: a redelivery runs the handler again.
		out, _ := c.Process(ctx, msg, func(context.Context, *idem.MemoryTx, idem.Message) error { return nil })
		if out.Status != idem.Processed {
			t.Errorf("%v: redelivery got %v, want Processed", tc.err, out.Status)
		}
	}
}

// Guard turns whatever a Processor does wrong into an Outcome that is never
// acknowledged, and marks permanent failures for the dead letter.
func TestGuard(t *testing.T) {
	ctx := context.Background()
	msg := idem.Message{ID: "m1", Payload: []byte("p")}
	boom := errors.New("boom")
	for _, tc := range []struct {
		name       string
		p          idem.ProcessorFunc
		status     idem.Status
		deadLetter bool
		errIs      error
	}{
		{"processed", func(context.Context, idem.Message) (idem.Outcome, error) {
			return idem.Outcome{Status: idem.Processed}, nil
		}, idem.Processed, false, nil},
		{"panic", func(context.Context, idem.Message) (idem.Outcome, error) { panic("bad") }, idem.Failed, false, idem.ErrHandlerPanic},
		{"no status", func(context.Context, idem.Message) (idem.Outcome, error) { return idem.Outcome{}, nil }, idem.Failed, false, nil},
		{"ack with error", func(context.Context, idem.Message) (idem.Outcome, error) {
			return idem.Outcome{Status: idem.Processed}, boom
		}, idem.Failed, false, boom},
		{"failed without Err", func(context.Context, idem.Message) (idem.Outcome, error) {
			return idem.Outcome{Status: idem.Failed}, boom
		}, idem.Failed, false, boom},
		{"permanent", func(context.Context, idem.Message) (idem.Outcome, error) {
			err := idem.Permanent(boom)
			return idem.Outcome{Status: idem.Failed, Err: err}, err
		}, idem.Failed, true, idem.ErrPermanent},
		{"rejected", func(context.Context, idem.Message) (idem.Outcome, error) {
			return idem.Outcome{Status: idem.Rejected}, nil
		}, idem.Rejected, true, nil},
	} {
		out := idem.Guard(ctx, tc.p, msg)
		if out.Status != tc.status || out.DeadLetter() != tc.deadLetter || out.MessageID != "m1" {
			t.Errorf("%s: got %v deadLetter=%v id=%q; want %v deadLetter=%v id=m1", tc.name, out.Status, out.DeadLetter(), out.MessageID, tc.status, tc.deadLetter)
		}
		if !out.Ack() && out.Err == nil {
			t.Errorf("%s: a %v outcome without an error", tc.name, out.Status)
		}
		if tc.errIs != nil && !errors.Is(out.Err, tc.errIs) {
			t.Errorf("%s: Err = %v, want one matching %v", tc.name, out.Err, tc.errIs)
		}
	}
}
