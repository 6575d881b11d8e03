package idemredis_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idemredis"
)

// TestBreakGiveBackRace: many acquires of one message at once on a master
// without replicas (every WAIT falls short), one by one and in batches
// holding the message twice: none returns a lease, each that issued one
// gives it back, and afterwards nothing is held: the next acquire without
// WAIT creates the record afresh (token 1, attempt 1, no recovery
// point), as if none of them had run.
func TestBreakGiveBackRace(t *testing.T) {
	t.Parallel()
	b := setupWith(t, nil, idemredis.Config{WaitReplicas: 1, WaitTimeout: 20 * time.Millisecond})
	plain, err := idemredis.New(b.client, &idemredis.Config{Prefix: b.prefix})
	if err != nil {
		t.Fatal(err)
	}
	params := func() *idemdriver.AcquireParams {
		return &idemdriver.AcquireParams{Consumer: "c", MessageID: "m", Fingerprint: []byte("f"), Lease: time.Minute, StepPrefix: "run:"}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%3 == 0 {
				res, es, err := b.store.AcquireBatch(b.ctx, []*idemdriver.AcquireParams{params(), params()})
				if err != nil {
					errs <- err
					return
				}
				for j := range es {
					if res[j].Acquired || es[j] == nil {
						errs <- errors.New("a batch element acquired without its WAIT")
					}
				}
				return
			}
			res, err := b.store.Acquire(b.ctx, params())
			if res.Acquired || !errors.Is(err, idemredis.ErrNotReplicated) {
				errs <- errors.Join(errors.New("an acquire without its WAIT"), err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	res, err := plain.Acquire(b.ctx, params())
	if err != nil || !res.Acquired || res.Token != 1 || res.Attempt != 1 || len(res.Steps) != 0 {
		t.Errorf("the acquire after the given-back ones: %+v, %v; want a new record (token 1, attempt 1, no point)", res, err)
	}
}
