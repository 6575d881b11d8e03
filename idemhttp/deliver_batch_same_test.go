package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// behaviourService answers each message by its ID's first word (the
// part before "."): ok (200), refused (404), busy (503, Retry-After 7),
// fenced (409, as a service that refuses a stale fencing token),
// throttled (429), notsent (an error before the request is written),
// cut (the request written, then the connection breaks), slow (no answer
// before the call's timeout), boom (the transport panics), stolen (the
// operator ends the lease and another attempt takes the message over
// while the service works; then 200).
type behaviourService struct {
	fake  *fakeService
	steal func(id string)
}

func (s *behaviourService) answer(n int, r *http.Request) (*http.Response, error) {
	id := r.Header.Get(HeaderMessageID)
	switch kind, _, _ := strings.Cut(id, "."); kind {
	case "refused":
		return response(404, nil, "no such order"), nil
	case "busy":
		return response(503, http.Header{"Retry-After": {"7"}}, ""), nil
	case "fenced":
		return response(409, nil, "stale token"), nil
	case "throttled":
		return response(429, nil, ""), nil
	case "cut":
		return nil, errors.New("connection reset by peer")
	case "slow":
		<-r.Context().Done()
		return nil, r.Context().Err()
	case "boom":
		panic("the transport broke")
	case "stolen":
		if n == 1 {
			s.steal(id)
		}
	}
	return response(200, nil, "ok"), nil
}

// RoundTrip is the fake service's, except that a notsent message fails
// before its request is written (no WroteHeaders: not sent).
func (s *behaviourService) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasPrefix(r.Header.Get(HeaderMessageID), "notsent") {
		_ = httptrace.ContextClientTrace(r.Context())
		return nil, errors.New("dial tcp: connection refused")
	}
	return s.fake.RoundTrip(r)
}

// settledAs is what the comparison looks at in a Settlement: the
// action, its reason, whether it waits, whether the wait honours the
// service's Retry-After, and the kind of its error.
type settledAs struct {
	Action  idem.Action
	Reason  string
	Delayed bool
	Honours bool // Delay >= 7s (busy's Retry-After)
	Kind    string
}

func settledOf(s idem.Settlement) settledAs {
	kind := "nil"
	for _, k := range []struct {
		name string
		err  error
	}{
		{"outcome-unknown", idem.ErrOutcomeUnknown}, {"refused", ErrServiceRefused}, {"in-progress", idem.ErrInProgress},
		{"lease-lost", idem.ErrLeaseLost}, {"panic", idem.ErrHandlerPanic}, {"poison", idem.ErrPoison},
		{"mismatch", idem.ErrFingerprintMismatch}, {"missing-id", idem.ErrMissingMessageID}, {"store", idem.ErrStore},
	} {
		if errors.Is(s.Err, k.err) {
			kind = k.name
			break
		}
	}
	if kind == "nil" && s.Err != nil {
		kind = "other"
	}
	return settledAs{Action: s.Action, Reason: s.Reason, Delayed: s.Delay > 0, Honours: s.Delay >= 7*time.Second, Kind: kind}
}

// TestDeliverBatchSettlesAsProcess runs the same messages through
// Process (one at a time) and through ProcessBatch (one batch), each on
// a store of its own, twice (the second round is the redelivery of all
// of them), in at-most-once and at-least-once mode and with MaxCalls:
// every message is settled the same way by both paths (action, reason,
// backoff, error kind), the service is called as many times for each
// message, and the records end in the same state.
func TestDeliverBatchSettlesAsProcess(t *testing.T) {
	t.Parallel()
	kinds := []string{"ok", "refused", "busy", "fenced", "throttled", "notsent", "cut", "slow", "boom", "stolen",
		"done", "held", "mismatch", "crashed", ""}
	modes := []struct {
		name string
		o    DelivererOptions
	}{
		{"at-most-once", DelivererOptions{}},
		{"at-least-once", DelivererOptions{AtLeastOnce: true}},
		{"max-calls", DelivererOptions{MaxCalls: 2}},
		{"point-at-call", DelivererOptions{MaxCalls: 2, PointAtCall: true}},
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				run := func(batch bool) (rounds [2][]settledAs, calls map[string]int, states map[string]idemdriver.RecordState) {
					svc := &behaviourService{}
					o := m.o
					o.Timeout = 300 * time.Millisecond
					o.Transport = svc
					b := setupDeliver(t, idem.Config{MaxAttempts: 5}, o, nil)
					svc.fake = &fakeService{calls: map[string]int{}, answer: svc.answer}
					b.svc = svc.fake
					ctx := context.Background()
					// thief takes a message over while its call runs.
					thief, err := idem.NewLeaseConsumer(b.store, idem.Config{Name: b.lc.Name(), Lease: time.Second, PurgeInterval: -1})
					if err != nil {
						t.Fatal(err)
					}
					defer thief.Close()
					var kept []*idem.Attempt
					defer func() {
						for _, a := range kept {
							_, _ = a.Abandon(ctx, nil)
						}
					}()
					svc.steal = func(id string) {
						rec, err := b.store.Inspect(ctx, b.lc.Name(), id)
						if err != nil {
							t.Errorf("inspect %s: %v", id, err)
							return
						}
						if _, err := b.store.ReleaseLease(ctx, &idemdriver.ReleaseLeaseParams{Consumer: b.lc.Name(), MessageID: id, Token: rec.Token}); err != nil {
							t.Errorf("end the lease of %s: %v", id, err)
							return
						}
						a, _, err := thief.Acquire(ctx, idem.Message{ID: id, Payload: []byte("p")}, idem.AcquireOptions{})
						if a == nil {
							t.Errorf("take %s over: %v", id, err)
							return
						}
						kept = append(kept, a)
					}
					msgs := make([]idem.Message, len(kinds))
					for i, k := range kinds {
						msgs[i] = idem.Message{ID: k, Payload: []byte("p")}
						if k != "" {
							msgs[i].ID = k + ".1"
						}
					}
					for i, k := range kinds {
						switch k {
						case "done":
							if s := b.settle(msgs[i]); s.Action != idem.Ack {
								t.Fatalf("complete %s first: %v (%v)", msgs[i].ID, s.Action, s.Err)
							}
						case "mismatch":
							if s := b.settle(idem.Message{ID: msgs[i].ID, Payload: []byte("another")}); s.Action != idem.Ack {
								t.Fatalf("complete %s first: %v (%v)", msgs[i].ID, s.Action, s.Err)
							}
						case "held":
							a, _, err := thief.Acquire(ctx, msgs[i], idem.AcquireOptions{})
							if a == nil {
								t.Fatalf("hold %s: %v", msgs[i].ID, err)
							}
							kept = append(kept, a)
						case "crashed":
							crashAfterSend(t, b.lc, msgs[i])
						}
					}
					for r := range rounds {
						var ss []idem.Settlement
						if batch {
							ss = b.settleBatch(msgs)
						} else {
							for _, msg := range msgs {
								ss = append(ss, b.settle(msg))
							}
						}
						for _, s := range ss {
							rounds[r] = append(rounds[r], settledOf(s))
						}
						time.Sleep(2 * time.Second) // every lease left by a round runs out
					}
					calls, states = map[string]int{}, map[string]idemdriver.RecordState{}
					for _, msg := range msgs {
						calls[msg.ID] = b.svc.count(msg.ID)
						if msg.ID == "" {
							continue
						}
						rec, err := b.store.Inspect(ctx, b.lc.Name(), msg.ID)
						if err != nil {
							t.Fatalf("inspect %s: %v", msg.ID, err)
						}
						states[msg.ID] = rec.State
					}
					return rounds, calls, states
				}
				one, oneCalls, oneStates := run(false)
				batch, batchCalls, batchStates := run(true)
				for r := range one {
					for i, k := range kinds {
						if one[r][i] != batch[r][i] {
							t.Errorf("round %d, %q: Process settles %+v, ProcessBatch %+v", r+1, k, one[r][i], batch[r][i])
						}
					}
				}
				if fmt.Sprint(oneCalls) != fmt.Sprint(batchCalls) {
					t.Errorf("calls: Process %v, ProcessBatch %v", oneCalls, batchCalls)
				}
				if fmt.Sprint(oneStates) != fmt.Sprint(batchStates) {
					t.Errorf("records: Process %v, ProcessBatch %v", oneStates, batchStates)
				}
				t.Logf("round 1: %+v", one[0])
			})
		})
	}
}

// A batch of more than idemdriver.MaxLeaseBatch messages is processed in
// parts of at most that many: two AcquireBatch and two CompleteBatch
// calls for MaxLeaseBatch+3 messages, each message called once and acked;
// the lease engine refuses such a batch itself (ErrInvalidConfig).
func TestDeliverBatchOverMaxLeaseBatch(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b, trips := setupCountedDeliver(t, DelivererOptions{MaxCalls: 8}, func(int, *http.Request) (*http.Response, error) {
			return response(200, nil, "ok"), nil
		})
		msgs := numbered(idemdriver.MaxLeaseBatch + 3)
		if _, _, err := b.lc.AcquireBatch(context.Background(), msgs, idem.AcquireOptions{}); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Fatalf("AcquireBatch of %d: %v, want ErrInvalidConfig", len(msgs), err)
		}
		ss := b.settleBatch(msgs)
		for i, s := range ss {
			if s.Action != idem.Ack || b.svc.count(msgs[i].ID) != 1 {
				t.Fatalf("%s: %v (%v), %d calls; want Ack after 1 call", msgs[i].ID, s.Action, s.Err, b.svc.count(msgs[i].ID))
			}
		}
		if ab, cb := trips.Batches(); ab != 2 || cb != 2 {
			t.Errorf("AcquireBatch %d, CompleteBatch %d; want 2 and 2", ab, cb)
		}
	})
}
