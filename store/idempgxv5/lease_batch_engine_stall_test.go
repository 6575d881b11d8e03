package idempgxv5_test

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/leakcheck"
	"github.com/idem-go/idem/internal/testenv"
)

// TestLeaseEngineBatchStall: the lease engine's AcquireBatch and
// CompleteBatch over PostgreSQL through a fault proxy. A CompleteBatch
// whose connection stalls fails every attempt at the store timeout with
// ErrStore and ErrStoreTimeout, none acknowledged, each attempt still held
// (its context live) until the caller abandons it; an AcquireBatch whose
// answers are cut (the claims may have been written) holds nothing and
// fails every message with ErrStore. The records are then in progress,
// completed by nobody (read past the proxy); once their leases end, a
// consumer on a healthy connection takes them over with AcquireBatch and
// completes them with CompleteBatch; and no goroutine of the engine is
// left behind (not parallel: the goroutines of the other tests would
// count).
func TestLeaseEngineBatchStall(t *testing.T) {
	const n, storeTimeout = 8, time.Second
	direct, proxy, store := proxiedStore(t)
	before := leakcheck.Goroutines()
	const consumer = "engine-batch-stall"
	cfg := idem.Config{Name: consumer, Lease: time.Minute, StoreTimeout: storeTimeout, PurgeInterval: -1,
		Logger: slog.New(slog.DiscardHandler)}
	c, err := idem.NewLeaseConsumer(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	batch := func(prefix string) []idem.Message {
		ms := make([]idem.Message, n)
		for i := range ms {
			ms[i] = idem.Message{ID: fmt.Sprintf("%s-%d", prefix, i), Payload: []byte("p")}
		}
		return ms
	}
	opt := idem.AcquireOptions{StepPrefix: "run"}

	// The completions stall.
	stalledMs := batch("s")
	atts, outs, err := c.AcquireBatch(ctx, stalledMs, opt)
	if err != nil {
		t.Fatal(err)
	}
	results := make([]idem.Result, n)
	for i, a := range atts {
		if a == nil {
			t.Fatalf("%s not held: %v %v", stalledMs[i].ID, outs[i].Status, outs[i].Err)
		}
		results[i] = idem.Result{Body: []byte("lost")}
	}
	if proxy.Stall() < 1 {
		t.Fatal("no connection to stall")
	}
	start := time.Now()
	couts, err := c.CompleteBatch(ctx, atts, results)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	for i, out := range couts {
		if out.Status != idem.Failed || !errors.Is(out.Err, idem.ErrStore) || !errors.Is(out.Err, idem.ErrStoreTimeout) || out.Ack() {
			t.Errorf("%s, completed on a stalled connection: %v %v; want Failed, ErrStore and ErrStoreTimeout", stalledMs[i].ID, out.Status, out.Err)
		}
		if atts[i].Context().Err() != nil {
			t.Errorf("%s: attempt ended by the failed CompleteBatch; want it still held", stalledMs[i].ID)
		}
		if _, err := atts[i].Abandon(ctx, out.Err); err == nil {
			t.Errorf("%s: Abandon reported no error", stalledMs[i].ID)
		}
	}
	if took < storeTimeout || took > storeTimeout+5*time.Second {
		t.Errorf("the stalled CompleteBatch returned after %v, want the store timeout (%v)", took, storeTimeout)
	}

	// The claims' answers are cut (or their connection is a stalled one).
	cutMs := batch("c")
	proxy.CutAnswers(time.Hour)
	atts, outs, err = c.AcquireBatch(ctx, cutMs, opt)
	if err != nil {
		t.Fatal(err)
	}
	for i := range cutMs {
		if atts[i] != nil || outs[i].Status != idem.Failed || !errors.Is(outs[i].Err, idem.ErrStore) || outs[i].Ack() {
			t.Errorf("%s, claimed with its answer cut: held %v, %v %v; want not held, Failed with ErrStore", cutMs[i].ID, atts[i] != nil, outs[i].Status, outs[i].Err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	// Past the proxy: nothing completed; every stalled record in
	// progress, each cut claim in progress or never written.
	all := append(append([]idem.Message{}, stalledMs...), cutMs...)
	for _, m := range all {
		r, err := direct.store.Acquire(ctx, &idemdriver.AcquireParams{Consumer: consumer, MessageID: m.ID, Fingerprint: fingerprintOf(t, "p"), Lease: time.Minute})
		switch {
		case err != nil:
			t.Fatalf("%s, read past the proxy: %v", m.ID, err)
		case r.Acquired && strings.HasPrefix(m.ID, "c-"):
			// The cut claim never reached the table: the read made the
			// record; its lease ends below like the others'.
		case r.Acquired || r.State != idemdriver.StateInProgress:
			t.Errorf("%s, read past the proxy: acquired %v, state %v; want in progress, not completed", m.ID, r.Acquired, r.State)
		}
		if err := direct.expireLease(ctx, consumer, m.ID); err != nil {
			t.Fatal(err)
		}
	}

	// A healthy consumer takes every record over after its lease.
	c2, err := idem.NewLeaseConsumer(direct.store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	atts, outs, err = c2.AcquireBatch(ctx, all, opt)
	if err != nil {
		t.Fatal(err)
	}
	results = make([]idem.Result, len(all))
	for i, a := range atts {
		if a == nil {
			t.Fatalf("%s, after its lease ended: not taken over: %v %v", all[i].ID, outs[i].Status, outs[i].Err)
		}
		if a.Number < 2 {
			t.Errorf("%s taken over by attempt %d, want 2 or more", all[i].ID, a.Number)
		}
		results[i] = idem.Result{Body: []byte("r-" + all[i].ID)}
	}
	couts, err = c2.CompleteBatch(ctx, atts, results)
	if err != nil {
		t.Fatal(err)
	}
	for i, out := range couts {
		if out.Status != idem.Processed || out.Err != nil {
			t.Errorf("%s, completed after the takeover: %v %v", all[i].ID, out.Status, out.Err)
		}
		if r := recordState(t, direct, consumer, all[i].ID); r.State != idemdriver.StateCompleted || string(r.Result) != "r-"+all[i].ID {
			t.Errorf("%s: record %v %q, want completed with r-%s", all[i].ID, r.State, r.Result, all[i].ID)
		}
	}
	if err := c2.Close(); err != nil {
		t.Fatal(err)
	}
	// Every engine goroutine (renewals, the store calls' watchers) ended
	// with its attempts: only the pools' and the proxy's may remain.
	var leaked []string
	testenv.Eventually(t, 5*time.Second, "no goroutine of the lease engine left", func() bool {
		leaked = nil
		for _, s := range leakcheck.Leaked(before) {
			if strings.Contains(s, "github.com/idem-go/idem.") {
				leaked = append(leaked, s)
			}
		}
		return len(leaked) == 0
	}, func() string { return strings.Join(leaked, "\n\n") })
}
