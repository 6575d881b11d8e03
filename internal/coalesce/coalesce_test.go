package coalesce

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// fake is a store of string calls: each call answers "r:"+p, or the
// error in errs[p]; a call of "fail" in a batch fails the whole batch.
// While gate is set, every store call waits for it to be closed.
type fake struct {
	mu      sync.Mutex
	gate    chan struct{}
	errs    map[string]error
	ones    []string   // the calls sent alone
	manys   [][]string // the batches
	ctxs    []context.Context
	entered chan struct{} // gets a value as each store call starts, when set
}

func (f *fake) record(ctx context.Context, ps ...string) {
	f.mu.Lock()
	if len(ps) == 1 {
		f.ones = append(f.ones, ps[0])
	} else {
		f.manys = append(f.manys, slices.Clone(ps))
	}
	f.ctxs = append(f.ctxs, ctx)
	gate := f.gate
	f.mu.Unlock()
	if f.entered != nil {
		f.entered <- struct{}{}
	}
	if gate != nil {
		<-gate
	}
}

func (f *fake) group(max int) *Group[string, string] {
	return &Group[string, string]{Max: max,
		One: func(ctx context.Context, p string) (string, error) {
			f.record(ctx, p)
			if err := f.errs[p]; err != nil {
				return "", err
			}
			return "r:" + p, nil
		},
		Many: func(ctx context.Context, ps []string) ([]string, []error, error) {
			f.record(ctx, ps...)
			if slices.Contains(ps, "fail") {
				return nil, nil, errors.New("batch failed")
			}
			res, errs := make([]string, len(ps)), make([]error, len(ps))
			for i, p := range ps {
				if errs[i] = f.errs[p]; errs[i] == nil {
					res[i] = "r:" + p
				}
			}
			return res, errs, nil
		}}
}

type answer struct {
	res string
	err error
}

// inFlight starts the call "first", which waits in the store until the
// returned release is called, then the calls ps, one after another, each
// queued before the next starts (synctest.Wait), and returns their
// answers once release was called and all returned.
func inFlight(t *testing.T, f *fake, g *Group[string, string], ctxs map[string]context.Context, ps ...string) (release func() map[string]answer) {
	t.Helper()
	f.gate = make(chan struct{})
	out := map[string]answer{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	do := func(p string) {
		ctx := ctxs[p]
		if ctx == nil {
			ctx = context.Background()
		}
		wg.Go(func() {
			r, err := g.Do(ctx, p)
			mu.Lock()
			out[p] = answer{r, err}
			mu.Unlock()
		})
		synctest.Wait()
	}
	do("first")
	for _, p := range ps {
		do(p)
	}
	return func() map[string]answer {
		close(f.gate)
		wg.Wait()
		return out
	}
}

// TestAloneOnOwnContext: a call made when none is in flight goes out at
// once, alone, on its caller's own context.
func TestAloneOnOwnContext(t *testing.T) {
	f := &fake{}
	g := f.group(8)
	ctx := context.WithValue(context.Background(), struct{}{}, 1)
	for i := range 3 {
		r, err := g.Do(ctx, fmt.Sprint(i))
		if err != nil || r != fmt.Sprint("r:", i) {
			t.Fatalf("Do(%d) = %q, %v", i, r, err)
		}
	}
	if len(f.ones) != 3 || len(f.manys) != 0 || f.ctxs[0] != ctx {
		t.Fatalf("store saw %v alone, %v in batches, first context %v; want 3 alone on the caller's context", f.ones, f.manys, f.ctxs[0])
	}
	if s := g.Stats(); s != (Stats{Calls: 3, Trips: 3}) {
		t.Fatalf("Stats() = %+v; want 3 calls, 3 trips", s)
	}
}

// TestBatchWhileInFlight: the calls made while one is in flight go in
// one batch call, in order, bounded by Max; each gets its own answer, a
// per-call error fails only its call.
func TestBatchWhileInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bad := errors.New("bad one")
		f := &fake{errs: map[string]error{"c": bad}}
		g := f.group(3)
		out := inFlight(t, f, g, nil, "a", "b", "c", "d", "e")()
		for _, p := range []string{"first", "a", "b", "d", "e"} {
			if a := out[p]; a.err != nil || a.res != "r:"+p {
				t.Errorf("%s: %q, %v; want r:%s", p, a.res, a.err, p)
			}
		}
		if a := out["c"]; !errors.Is(a.err, bad) || a.res != "" {
			t.Errorf("c: %q, %v; want its own error", a.res, a.err)
		}
		want := [][]string{{"a", "b", "c"}, {"d", "e"}}
		if !slices.EqualFunc(f.manys, want, slices.Equal) || !slices.Equal(f.ones, []string{"first"}) {
			t.Errorf("store saw %v alone and batches %v; want [first] and %v", f.ones, f.manys, want)
		}
		if s := g.Stats(); s != (Stats{Calls: 6, Trips: 3}) {
			t.Errorf("Stats() = %+v; want 6 calls in 3 trips", s)
		}
	})
}

// TestBatchErrorFailsItsCalls: an error of a batch call fails its calls
// only: the call in flight before it and the batch after it are
// answered.
func TestBatchErrorFailsItsCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{}
		g := f.group(2)
		out := inFlight(t, f, g, nil, "a", "fail", "b", "c")()
		for _, p := range []string{"first", "b", "c"} {
			if a := out[p]; a.err != nil || a.res != "r:"+p {
				t.Errorf("%s: %q, %v; want r:%s", p, a.res, a.err, p)
			}
		}
		for _, p := range []string{"a", "fail"} {
			if a := out[p]; a.err == nil || a.err.Error() != "batch failed" {
				t.Errorf("%s: %q, %v; want the batch's error", p, a.res, a.err)
			}
		}
	})
}

// TestQueuedCancelled: a queued call whose context ends leaves at once
// with the context's error and is never sent, the first in the queue
// (handed the next batch) as well as a later one; the others are sent.
func TestQueuedCancelled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{}
		g := f.group(8)
		ctxA, cancelA := context.WithCancel(context.Background())
		ctxC, cancelC := context.WithCancel(context.Background())
		release := inFlight(t, f, g, map[string]context.Context{"a": ctxA, "c": ctxC}, "a", "b", "c", "d")
		cancelA()
		cancelC()
		synctest.Wait() // a and c returned, the first call still in flight
		out := release()
		for _, p := range []string{"a", "c"} {
			if a := out[p]; !errors.Is(a.err, context.Canceled) {
				t.Errorf("%s: %q, %v; want context.Canceled", p, a.res, a.err)
			}
		}
		for _, p := range []string{"first", "b", "d"} {
			if a := out[p]; a.err != nil || a.res != "r:"+p {
				t.Errorf("%s: %q, %v; want r:%s", p, a.res, a.err, p)
			}
		}
		if want := [][]string{{"b", "d"}}; !slices.EqualFunc(f.manys, want, slices.Equal) || len(f.ones) != 1 {
			t.Errorf("store saw %v alone and batches %v; want [first] and %v", f.ones, f.manys, want)
		}
		// The hand-over went on: a call made now goes alone at once.
		f.gate = nil
		if r, err := g.Do(context.Background(), "z"); err != nil || r != "r:z" {
			t.Errorf("Do after the cancellations = %q, %v", r, err)
		}
	})
}

// endedCtx is a context that has ended (Err) without its Done channel
// closing: a call on it stays queued until a batch takes it.
type endedCtx struct{ context.Context }

func (endedCtx) Err() error { return context.Canceled }

// TestTakenEndedNotSent: a queued call whose context has ended when the
// batch is taken is answered with its context's error, unsent, and the
// others go.
func TestTakenEndedNotSent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{}
		g := f.group(8)
		out := inFlight(t, f, g, map[string]context.Context{"b": endedCtx{context.Background()}}, "a", "b", "c")()
		if a := out["b"]; !errors.Is(a.err, context.Canceled) {
			t.Errorf("b: %q, %v; want context.Canceled", a.res, a.err)
		}
		for _, p := range []string{"first", "a", "c"} {
			if a := out[p]; a.err != nil || a.res != "r:"+p {
				t.Errorf("%s: %q, %v; want r:%s", p, a.res, a.err, p)
			}
		}
		if want := [][]string{{"a", "c"}}; !slices.EqualFunc(f.manys, want, slices.Equal) {
			t.Errorf("batches %v; want %v", f.manys, want)
		}
	})
}

// TestBatchDeadline: a batch call runs until the earliest deadline of its
// calls' contexts, without their cancellation: a call cancelled after it
// was sent waits for, and gets, the store's answer.
func TestBatchDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{gate: make(chan struct{})}
		g := f.group(8)
		start := time.Now()
		ctxA, cancelA := context.WithDeadline(context.Background(), start.Add(5*time.Second))
		defer cancelA()
		ctxB, cancelB := context.WithDeadline(context.Background(), start.Add(3*time.Second))
		defer cancelB()
		out := make(map[string]answer)
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, c := range []struct {
			p   string
			ctx context.Context
		}{{"first", context.Background()}, {"a", ctxA}, {"b", ctxB}} {
			wg.Go(func() {
				r, err := g.Do(c.ctx, c.p)
				mu.Lock()
				out[c.p] = answer{r, err}
				mu.Unlock()
			})
			synctest.Wait()
		}
		second := make(chan struct{})
		f.mu.Lock()
		first := f.gate
		f.gate = second
		f.mu.Unlock()
		close(first)
		synctest.Wait() // the batch of a and b is in the store
		cancelA()
		synctest.Wait()
		mu.Lock()
		_, aDone := out["a"]
		mu.Unlock()
		if aDone {
			t.Error("a returned while its call was in the store")
		}
		f.mu.Lock()
		bctx := f.ctxs[1]
		f.mu.Unlock()
		if dl, ok := bctx.Deadline(); !ok || !dl.Equal(start.Add(3*time.Second)) || bctx.Err() != nil {
			t.Errorf("batch context: deadline %v, %v, err %v; want b's, %v, not ended", dl, ok, bctx.Err(), start.Add(3*time.Second))
		}
		close(second)
		wg.Wait()
		if a := out["a"]; a.err != nil || a.res != "r:a" {
			t.Errorf("a: %q, %v; want the store's answer", a.res, a.err)
		}
		if !slices.EqualFunc(f.manys, [][]string{{"a", "b"}}, slices.Equal) {
			t.Errorf("batches %v; want [[a b]]", f.manys)
		}
	})
}

// TestStress: many callers, a quarter of them cancelled at random
// moments, against a store that yields: every call returns, the ones
// answered by the store were sent exactly once, those with the context's
// error never were, and no batch is over Max.
func TestStress(t *testing.T) {
	f := &fake{}
	g := f.group(4)
	const n = 2000
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if i%4 == 0 {
				go cancel()
			}
			_, errs[i] = g.Do(ctx, fmt.Sprint(i))
		})
	}
	wg.Wait()
	sent := map[string]int{}
	for _, p := range f.ones {
		sent[p]++
	}
	for _, b := range f.manys {
		if len(b) > 4 {
			t.Fatalf("batch of %d, over Max 4", len(b))
		}
		for _, p := range b {
			sent[p]++
		}
	}
	for i, err := range errs {
		p := fmt.Sprint(i)
		switch {
		case err == nil && sent[p] != 1:
			t.Fatalf("call %d answered, sent %d times", i, sent[p])
		case errors.Is(err, context.Canceled) && sent[p] != 0:
			t.Fatalf("call %d cancelled, sent %d times", i, sent[p])
		case err != nil && !errors.Is(err, context.Canceled):
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if s, total := g.Stats(), len(f.ones)+len(slices.Concat(f.manys...)); s.Calls != uint64(total) {
		t.Fatalf("Stats() = %+v; %d calls sent", s, total)
	}
}

// TestPanicAnswersTheBatch: a batch call that panics answers its calls
// with an error; the panic goes on in the caller that sent it, and the
// group is usable after.
func TestPanicAnswersTheBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{}
		g := f.group(8)
		many := g.Many
		g.Many = func(ctx context.Context, ps []string) ([]string, []error, error) {
			f.record(ctx, ps...)
			panic("store bug")
		}
		f.gate = make(chan struct{})
		errs := make(chan error, 3)
		panics := make(chan any, 3)
		do := func(p string) {
			go func() {
				defer func() {
					if r := recover(); r != nil {
						panics <- r
					}
				}()
				_, err := g.Do(context.Background(), p)
				errs <- err
			}()
			synctest.Wait()
		}
		do("first")
		do("a")
		do("b")
		close(f.gate)
		synctest.Wait()
		if len(panics) != 1 || len(errs) != 2 {
			t.Fatalf("%d panics, %d answers; want the sender's panic and 2 answers", len(panics), len(errs))
		}
		var nerr int
		for range 2 {
			if err := <-errs; err != nil {
				nerr++
			}
		}
		if nerr != 1 {
			t.Errorf("%d answers with an error; want the other member's", nerr)
		}
		g.Many = many
		f.gate = nil
		if r, err := g.Do(context.Background(), "z"); err != nil || r != "r:z" {
			t.Errorf("Do after the panic = %q, %v", r, err)
		}
	})
}
