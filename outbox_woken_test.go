package idem_test

import (
	"context"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// confirmAll is a publisher that confirms every message at once.
var confirmAll = idem.PublisherFunc(func(_ context.Context, m []idem.Outgoing) []error { return make([]error, len(m)) })

// emitRecorder is the memory store, recording the RelayWoken of every
// EmitTx; emitCommitRecorder also commits in one call (OutboxCommitter).
type emitRecorder struct {
	*idem.MemoryStore
	woken *[]bool
}

func (s emitRecorder) EmitTx(ctx context.Context, tx *idem.MemoryTx, p *idemdriver.EmitParams) error {
	*s.woken = append(*s.woken, p.RelayWoken)
	return s.MemoryStore.EmitTx(ctx, tx, p)
}

type emitCommitRecorder struct{ emitRecorder }

func (s emitCommitRecorder) EmitCommit(ctx context.Context, tx *idem.MemoryTx, p *idemdriver.EmitParams) error {
	if err := s.EmitTx(ctx, tx, p); err != nil {
		return err
	}
	return s.Commit(ctx, tx)
}

// The Consumer tells the store whether it wakes a relay of its own after
// the commit (Config.Relay): EmitParams.RelayWoken, through EmitTx and
// through EmitCommit, in Process and ProcessBatch; never in ProcessTx,
// whose caller commits later than the Consumer's wake.
func TestEmitParamsRelayWoken(t *testing.T) {
	ctx := context.Background()
	emit := func(ctx context.Context, _ *idem.MemoryTx, m idem.Message) error {
		_, err := idem.Emit(ctx, idem.OutgoingMessage{Destination: "d", Payload: m.Payload})
		return err
	}
	for _, commit := range []bool{false, true} {
		for _, withRelay := range []bool{false, true} {
			mem := idem.NewMemoryStore(nil)
			var woken []bool
			var store idemdriver.TxStore[*idem.MemoryTx] = emitRecorder{mem, &woken}
			if commit {
				store = emitCommitRecorder{emitRecorder{mem, &woken}}
			}
			cfg := idem.Config{Name: "c", PurgeInterval: -1}
			if withRelay {
				r, err := idem.NewRelay(idem.RelayConfig{Store: mem, Publisher: confirmAll})
				if err != nil {
					t.Fatal(err)
				}
				cfg.Relay = r
			}
			c, err := idem.NewConsumer[*idem.MemoryTx](store, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Process(ctx, idem.Message{ID: "m1", Payload: []byte("p")}, emit); err != nil {
				t.Fatal(err)
			}
			if _, err := c.ProcessBatch(ctx, []idem.Message{{ID: "m2", Payload: []byte("p")}}, func(ctx context.Context, tx *idem.MemoryTx, ms []idem.Message) error {
				return emit(ctx, tx, ms[0])
			}); err != nil {
				t.Fatal(err)
			}
			tx, err := mem.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.ProcessTx(ctx, tx, idem.Message{ID: "m3", Payload: []byte("p")}, emit); err != nil {
				t.Fatal(err)
			}
			if err := mem.Commit(ctx, tx); err != nil {
				t.Fatal(err)
			}
			want := []bool{withRelay, withRelay, false}
			if len(woken) != len(want) || woken[0] != want[0] || woken[1] != want[1] || woken[2] != want[2] {
				t.Errorf("EmitCommit %v, Config.Relay %v: RelayWoken of Process, ProcessBatch, ProcessTx = %v, want %v", commit, withRelay, woken, want)
			}
			st, err := mem.OutboxStats(ctx)
			if err != nil || st.Pending != 3 {
				t.Errorf("EmitCommit %v, Config.Relay %v: %d rows pending, %v; want 3", commit, withRelay, st.Pending, err)
			}
			_ = c.Close()
		}
	}
}
