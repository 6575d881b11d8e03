package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// lostRenewStore is the memory store whose renewals all find the lease
// lost (ErrLeaseLost), as a store's do once the record's lease ran out by
// its clock: nobody took the message over, so a Complete would still
// land. Renewals go one by one, through Renew.
type lostRenewStore struct{ *idem.MemoryStore }

func (lostRenewStore) Renew(context.Context, *idemdriver.RenewParams) error { return idem.ErrLeaseLost }

func (lostRenewStore) RenewsBatches() bool { return false }

// An attempt whose lease the store said lost while its call ran is
// abandoned, its answer not recorded, by ProcessBatch as by Process: the
// message is redelivered with an error matching ErrLeaseLost, and its
// record stays in progress (not completed) although the store would
// have taken the completion.
func TestDeliverLostLeaseAbandoned(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch-%v", batch), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				const lease = time.Second
				b := setupDeliverOn(t, func(s *idem.MemoryStore) idemdriver.LeaseStore { return lostRenewStore{s} },
					idem.Config{Lease: lease}, DelivererOptions{Timeout: 10 * time.Second},
					func(int, *http.Request) (*http.Response, error) {
						time.Sleep(lease / 2) // past the first renewal (Lease/3), which finds the lease lost
						return response(200, nil, "ok"), nil
					})
				msg := idem.Message{ID: "m-1", Payload: []byte("p")}
				var s idem.Settlement
				if batch {
					s = b.settleBatch([]idem.Message{msg})[0]
				} else {
					s = b.settle(msg)
				}
				if s.Action != idem.Redeliver || !errors.Is(s.Err, idem.ErrLeaseLost) {
					t.Errorf("settled %v (%v), want Redeliver with an error matching ErrLeaseLost", s.Action, s.Err)
				}
				rec, err := b.store.Inspect(context.Background(), b.lc.Name(), msg.ID)
				if err != nil {
					t.Fatal(err)
				}
				if rec.State != idemdriver.StateInProgress {
					t.Errorf("record %v, want in progress: the answer of an attempt that lost its lease is not recorded", rec.State)
				}
				if n := b.svc.count(msg.ID); n != 1 {
					t.Errorf("%d calls, want 1", n)
				}
			})
		})
	}
}
