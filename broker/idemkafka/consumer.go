package idemkafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idem-go/idem"
)

// Consumer runs the records of a consumer group client through an
// Idempotent Consumer and commits their offsets once they are done. See the
// package documentation for the offset, rebalance and retry rules.
type Consumer struct {
	cl    *kgo.Client
	cfg   Config
	log   *slog.Logger
	chunk int // records per Processor call: 1, or BatchSize in batch mode

	sem      chan struct{} // Concurrency slots
	commitCh chan struct{} // wakes the committer; buffered 1
	done     chan struct{} // closed when Run returns, or by Stop before Run
	doneOnce sync.Once
	crashed  atomic.Bool // tests: behave as a killed process
	workers  sync.WaitGroup

	commitMu sync.Mutex // serialises offset commits

	mu         sync.Mutex
	parts      map[topicPartition]*partition
	ran        bool
	stopping   bool
	stopCalled bool // Stop was called: Run returns nil, not ctx's error
	cancelPoll context.CancelFunc
	cancelWork context.CancelFunc
	finalErr   error // the final commit's error, returned by Stop
}

type topicPartition struct {
	topic     string
	partition int32
}

// partition is the Consumer's state for one assigned partition. A new one
// is made each time the partition is (re)assigned to this member.
type partition struct {
	tp        topicPartition
	tracker   *offsetTracker
	committed int64 // offset last committed by this member; -1 if none

	queue   []*kgo.Record // received, not yet processed, in offset order
	next    int64         // offset after the last record queued
	paused  bool          // fetching paused by this Consumer
	running bool          // a worker goroutine owns the queue
	exited  chan struct{} // closed when the running worker returns
	stopped bool          // revoked, lost or stopping: take no more records
	revoked bool          // revoked or lost: only the revocation commits it
	stop    chan struct{} // closed when stopped; ends retry waits
	ctx     context.Context
	cancel  context.CancelFunc // cancels the handlers in flight

	// OrderKey only.
	busy     map[string]struct{} // keys with a record in flight or waiting to retry
	inflight int                 // records taken off the queue, not yet finished
	wake     chan struct{}       // wakes the worker (a record finished, records queued); buffered 1
}

// NewConsumer returns a Consumer of cl, a consumer group client built with
// ClientOpts (see there). The client stays the caller's: the Consumer
// polls, pauses, resumes and commits on it, and produces dead letters with
// it, but never closes it. Close the client after Stop, so the group
// reassigns its partitions.
//
// Errors match idem.ErrInvalidConfig: a nil client, a client without a
// consumer group or without ClientOpts, a DeadLetter topic the client
// consumes (named in kgo.ConsumeTopics, or matched by one of its patterns
// under kgo.ConsumeRegex: each dead letter would come back to be
// dead-lettered again, for ever), a client already driven by another
// Consumer that has not finished (its Run has not returned and it was not
// stopped before running), or a Config out of range.
func NewConsumer(cl *kgo.Client, cfg Config) (*Consumer, error) {
	if err := checkClient(cl); err != nil {
		return nil, err
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := checkDeadLetterTopic(cl, cfg.DeadLetter); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	c := &Consumer{
		cl:       cl,
		cfg:      cfg,
		log:      cfg.Logger,
		chunk:    1,
		sem:      make(chan struct{}, cfg.Concurrency),
		commitCh: make(chan struct{}, 1),
		done:     make(chan struct{}),
		parts:    make(map[topicPartition]*partition),
	}
	if cfg.BatchProcessor != nil {
		c.chunk = cfg.BatchSize
	}
	if prev, loaded := registry.LoadOrStore(cl, c); loaded {
		p := prev.(*Consumer)
		select {
		case <-p.done:
		default:
			return nil, invalid("the client is already driven by another Consumer")
		}
		registry.Store(cl, c)
	}
	return c, nil
}

// Run polls records and processes them until ctx ends, Stop is called or
// the client is closed. It returns nil after Stop; ctx.Err() when ctx ended
// (handlers in flight see their context canceled; what finished is still
// committed); an error matching kgo.ErrClientClosed when the client was
// closed under it; an error matching idem.ErrAlreadyRunning on a second
// call.
func (c *Consumer) Run(ctx context.Context) error {
	c.mu.Lock()
	if c.ran {
		c.mu.Unlock()
		return fmt.Errorf("idemkafka: %w", idem.ErrAlreadyRunning)
	}
	c.ran = true
	if c.stopping {
		c.mu.Unlock()
		c.finish()
		return nil
	}
	pollCtx, cancelPoll := context.WithCancel(ctx)
	workCtx, cancelWork := context.WithCancel(ctx)
	c.cancelPoll, c.cancelWork = cancelPoll, cancelWork
	c.mu.Unlock()
	defer cancelPoll()
	defer cancelWork()

	c.checkRetention(workCtx) // not cut short by Stop
	c.checkResetOffset()

	quit := make(chan struct{})
	var committer sync.WaitGroup
	committer.Go(func() { c.commitLoop(quit) })

	err := c.poll(pollCtx, workCtx)

	// No new deliveries; the ones in flight finish.
	c.mu.Lock()
	c.stopping = true
	for _, p := range c.parts {
		c.stopLocked(p)
		c.resumeLocked(p)
	}
	c.mu.Unlock()
	c.cl.AllowRebalance()
	c.workers.Wait()
	close(quit)
	committer.Wait()

	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.CommitTimeout)
	cerr := c.commit(fctx, nil)
	cancel()
	if cerr != nil {
		c.log.Warn("idemkafka: final offset commit failed", "err", cerr)
	}
	c.mu.Lock()
	c.finalErr = cerr
	c.mu.Unlock()
	c.finish()

	c.mu.Lock()
	stopCalled := c.stopCalled
	c.mu.Unlock()
	if err == nil && ctx.Err() != nil && !stopCalled {
		err = ctx.Err()
	}
	return err
}

// Stop stops the Consumer gracefully: it takes no new records, lets the
// records in flight finish (a retry wait is cut short; that record stays
// uncommitted and is redelivered), commits the offsets of what finished,
// and returns, leaving the client in the group (close it next). If ctx ends
// first, Stop cancels the handlers' context and returns ctx.Err() without
// waiting further. It returns the final commit's error, if any, and nil
// when Run was never called (a later Run then returns nil at once, and the
// client may be given to a new Consumer).
func (c *Consumer) Stop(ctx context.Context) error {
	c.mu.Lock()
	c.stopping, c.stopCalled = true, true
	ran, cancelPoll, cancelWork := c.ran, c.cancelPoll, c.cancelWork
	c.mu.Unlock()
	if !ran {
		// Finished: the client may be given to another Consumer.
		c.finish()
		return nil
	}
	if cancelPoll != nil {
		cancelPoll()
	}
	select {
	case <-c.done:
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.finalErr
	case <-ctx.Done():
		if cancelWork != nil {
			cancelWork()
		}
		return ctx.Err()
	}
}

// finish marks the Consumer finished (Run returned, or Stop came before
// Run): NewConsumer may then attach another Consumer to the client.
func (c *Consumer) finish() { c.doneOnce.Do(func() { close(c.done) }) }

// crash makes the Consumer behave as a killed process (for the tests,
// through testhook.Crash): from now on nothing is committed or
// dead-lettered, handlers in flight are canceled, and Run returns without
// waiting for them to be settled.
func (c *Consumer) crash() {
	c.crashed.Store(true)
	c.mu.Lock()
	c.stopping = true
	for _, p := range c.parts {
		c.stopLocked(p)
		p.cancel()
	}
	cancelPoll, cancelWork := c.cancelPoll, c.cancelWork
	c.mu.Unlock()
	if cancelPoll != nil {
		cancelPoll()
	}
	if cancelWork != nil {
		cancelWork()
	}
}

// poll hands polled records to the partitions' workers until pollCtx ends
// or the client is closed. With BlockRebalanceOnPoll, no revocation runs
// between a poll and AllowRebalance, so records are only queued for
// partitions this member owns.
func (c *Consumer) poll(pollCtx, workCtx context.Context) error {
	for {
		fs := c.cl.PollRecords(pollCtx, c.cfg.MaxPollRecords)
		if fs.IsClientClosed() {
			c.cl.AllowRebalance()
			c.mu.Lock()
			stopping := c.stopping
			c.mu.Unlock()
			if stopping {
				return nil
			}
			return fmt.Errorf("idemkafka: %w", kgo.ErrClientClosed)
		}
		if pollCtx.Err() != nil {
			c.cl.AllowRebalance()
			return nil
		}
		fs.EachError(func(topic string, part int32, err error) {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return
			}
			c.log.Warn("idemkafka: fetch error", "topic", topic, "partition", part, "err", err)
		})
		c.mu.Lock()
		if !c.stopping {
			fs.EachPartition(func(ftp kgo.FetchTopicPartition) {
				if len(ftp.Records) > 0 {
					c.dispatchLocked(workCtx, ftp.Topic, ftp.Partition, ftp.Records)
				}
			})
		}
		c.mu.Unlock()
		c.cl.AllowRebalance()
	}
}

// highWater is the queue length at which a partition's fetching pauses;
// it resumes below half of it.
func (c *Consumer) highWater() int {
	if c.cfg.Order == OrderKey {
		return max(64, 2*c.cfg.Concurrency)
	}
	return max(4*c.chunk, 64)
}

func (c *Consumer) dispatchLocked(workCtx context.Context, topic string, part int32, recs []*kgo.Record) {
	tp := topicPartition{topic, part}
	p := c.parts[tp]
	if p == nil {
		ctx, cancel := context.WithCancel(workCtx)
		p = &partition{tp: tp, tracker: newOffsetTracker(), committed: -1, stop: make(chan struct{}), ctx: ctx, cancel: cancel}
		if c.cfg.Order == OrderKey {
			p.busy = make(map[string]struct{})
			p.wake = make(chan struct{}, 1)
		}
		c.parts[tp] = p
	}
	if p.stopped {
		return
	}
	for _, r := range recs {
		if r.Offset < p.next || !p.tracker.add(r.Offset, r.LeaderEpoch) {
			continue // already queued (a refetch)
		}
		p.queue = append(p.queue, r)
		p.next = r.Offset + 1
	}
	if c.backlog(p) >= c.highWater() {
		c.pauseLocked(p)
	}
	switch {
	case p.running && p.wake != nil:
		wake(p)
	case !p.running && len(p.queue) > 0:
		p.running = true
		p.exited = make(chan struct{})
		c.workers.Add(1)
		if p.wake != nil {
			go c.workKeys(p, p.exited)
		} else {
			go c.work(p, p.exited)
		}
	}
}

// backlog is what the partition's pause threshold counts: its queue in
// partition order; under OrderKey every record received and not yet in the
// done prefix (queued, in flight, waiting to retry, or done behind one that
// is not), since a key that keeps failing lets the others run ahead of
// the commit point and their records must not pile up without bound.
func (c *Consumer) backlog(p *partition) int {
	if p.wake != nil {
		return p.tracker.outstanding()
	}
	return len(p.queue)
}

func wake(p *partition) {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (c *Consumer) stopLocked(p *partition) {
	if !p.stopped {
		p.stopped = true
		close(p.stop)
	}
	p.queue = nil
}

func (c *Consumer) pauseLocked(p *partition) {
	if p.paused || p.stopped {
		return
	}
	c.cl.PauseFetchPartitions(map[string][]int32{p.tp.topic: {p.tp.partition}})
	p.paused = true
}

func (c *Consumer) resumeLocked(p *partition) {
	if !p.paused {
		return
	}
	c.cl.ResumeFetchPartitions(map[string][]int32{p.tp.topic: {p.tp.partition}})
	p.paused = false
}

// work processes p's queue in offset order, one chunk at a time, until the
// queue is empty or p is stopped.
func (c *Consumer) work(p *partition, exited chan struct{}) {
	defer c.workers.Done()
	defer close(exited)
	for {
		c.mu.Lock()
		if p.stopped || len(p.queue) == 0 {
			p.running = false
			if !p.stopped {
				c.resumeLocked(p)
			}
			c.mu.Unlock()
			return
		}
		n := min(len(p.queue), c.chunk)
		recs := slices.Clone(p.queue[:n])
		c.mu.Unlock()

		if !c.acquire(p) {
			continue // stopped: the loop ends
		}
		outs := c.process(p.ctx, recs)
		<-c.sem
		retry, delay := c.settle(p, recs, outs)

		c.mu.Lock()
		if !p.stopped {
			p.queue = append(retry, p.queue[n:]...)
			if len(retry) > 0 {
				c.pauseLocked(p) // do not skip ahead; fetch nothing meanwhile
			} else if len(p.queue) < c.highWater()/2 {
				c.resumeLocked(p)
			}
		}
		c.mu.Unlock()
		c.signalCommit()

		if len(retry) > 0 {
			waitRetry(p, delay)
		}
	}
}

// waitRetry waits delay before a record of p is retried in place, or
// until p is stopped.
func waitRetry(p *partition, delay time.Duration) {
	t := time.NewTimer(delay)
	select {
	case <-t.C:
	case <-p.stop:
		t.Stop()
	}
}

// workKeys is work under OrderKey: it starts the records of p's queue
// whose key has no record in flight, each on its own goroutine holding one
// of the Concurrency slots, until the queue is empty and nothing is in
// flight, or p is stopped and nothing is in flight. The first queued record
// whose key is not busy is the oldest record of its key (an older one of
// the same key would be queued before it, with the same key not busy), so
// records of one key start in offset order, each after the previous one
// finished.
func (c *Consumer) workKeys(p *partition, exited chan struct{}) {
	defer c.workers.Done()
	defer close(exited)
	for {
		c.mu.Lock()
		if p.inflight == 0 && (p.stopped || len(p.queue) == 0) {
			p.running = false
			if !p.stopped {
				c.resumeLocked(p)
			}
			c.mu.Unlock()
			return
		}
		i := -1
		if !p.stopped {
			i = slices.IndexFunc(p.queue, func(r *kgo.Record) bool {
				_, busy := p.busy[string(r.Key)]
				return !busy
			})
		}
		stopped := p.stopped
		c.mu.Unlock()
		if i < 0 {
			if stopped {
				<-p.wake // the records in flight finish
			} else {
				select {
				case <-p.wake:
				case <-p.stop:
				}
			}
			continue
		}

		if !c.acquire(p) {
			continue
		}
		c.mu.Lock()
		if p.stopped {
			c.mu.Unlock()
			<-c.sem
			continue
		}
		// Only this goroutine takes records off the queue; the poller
		// appends. So the record is still at i.
		r := p.queue[i]
		p.queue = slices.Delete(p.queue, i, i+1)
		p.busy[string(r.Key)] = struct{}{}
		p.inflight++
		c.mu.Unlock()
		go c.runKeyed(p, r)
	}
}

// runKeyed processes r, holding the Concurrency slot workKeys took for it,
// and retries it in place until it is done or p is stopped: only its key
// waits meanwhile (the slot is given back during the wait), and the commit
// point stays before it. It then frees the key and wakes the worker.
func (c *Consumer) runKeyed(p *partition, r *kgo.Record) {
	recs := []*kgo.Record{r}
	for {
		outs := c.process(p.ctx, recs)
		<-c.sem
		retry, delay := c.settle(p, recs, outs)
		c.signalCommit()
		if len(retry) == 0 {
			break
		}
		waitRetry(p, delay)
		if !c.acquire(p) {
			break // stopped: left undone, the next owner reads it again
		}
	}
	c.mu.Lock()
	delete(p.busy, string(r.Key))
	p.inflight--
	if !p.stopped && p.tracker.outstanding() < c.highWater()/2 {
		c.resumeLocked(p)
	}
	c.mu.Unlock()
	wake(p)
}

// acquire takes a Concurrency slot for p, reporting false (no slot taken)
// when p is stopped first.
func (c *Consumer) acquire(p *partition) bool {
	select {
	case <-p.stop:
		return false
	default:
	}
	select {
	case c.sem <- struct{}{}:
		return true
	case <-p.stop:
		return false
	}
}

// process runs recs through the Processor (one record, idem.Guard) or the
// BatchProcessor (idem.GuardBatch), returning one normalised Outcome per
// record.
func (c *Consumer) process(ctx context.Context, recs []*kgo.Record) []idem.Outcome {
	outs := make([]idem.Outcome, len(recs))
	msgs := make([]idem.Message, 0, len(recs))
	idx := make([]int, 0, len(recs))
	for i, r := range recs {
		id, err := c.messageID(r)
		if err != nil {
			outs[i] = idem.Outcome{Status: idem.Rejected, Err: err}
			continue
		}
		msgs = append(msgs, idem.Message{ID: id, Payload: r.Value, Headers: recordHeaders(r)})
		idx = append(idx, i)
	}
	if len(msgs) == 0 {
		return outs
	}
	if c.cfg.Processor != nil {
		for j, m := range msgs {
			outs[idx[j]] = c.guard(c.withDelivery(ctx, recs[idx[j]].Topic, msgs[j:j+1]), m)
		}
		return outs
	}
	bouts := c.guardBatch(c.withDelivery(ctx, recs[idx[0]].Topic, msgs), msgs)
	if len(msgs) > 1 {
		c.isolate(ctx, msgs, bouts)
	}
	for j := range msgs {
		outs[idx[j]] = bouts[j]
	}
	return outs
}

// isolate re-runs, one at a time and in order, the messages of a batch
// that failed with an error no retry can fix. One handler error fails
// every new message of a batch (idem.Consumer.ProcessBatch), so without
// this a single poison message would send the whole batch to the dead
// letter. The batch rolled back, so each message runs again in its own
// one-message batch, and only the one whose handler fails for good is
// dead-lettered. Transient failures are left to the retry of the batch.
func (c *Consumer) isolate(ctx context.Context, msgs []idem.Message, bouts []idem.Outcome) {
	for j, m := range msgs {
		if bouts[j].Status != idem.Failed || bouts[j].Settle(c.cfg.RetryDelay).Action != idem.DeadLetter {
			continue
		}
		bouts[j] = c.guardBatch(ctx, []idem.Message{m})[0]
	}
}

// guard runs m through the Processor (idem.Guard) under a context that
// ends after Config.HandlerTimeout.
func (c *Consumer) guard(ctx context.Context, m idem.Message) idem.Outcome {
	ctx, cancel := c.bound(ctx)
	defer cancel()
	return idem.Guard(ctx, c.cfg.Processor, m)
}

// guardBatch runs msgs through the BatchProcessor (idem.GuardBatch) under a
// context that ends after Config.HandlerTimeout.
func (c *Consumer) guardBatch(ctx context.Context, msgs []idem.Message) []idem.Outcome {
	ctx, cancel := c.bound(ctx)
	defer cancel()
	return idem.GuardBatch(ctx, c.cfg.BatchProcessor, msgs)
}

// bound returns ctx ending after Config.HandlerTimeout, or ctx itself when
// HandlerTimeout is negative (off).
func (c *Consumer) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if c.cfg.HandlerTimeout < 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, c.cfg.HandlerTimeout)
}

// settle carries out what idem.Outcome.Settle decides for each of recs:
// Ack counts the offset as done, DeadLetter produces to the dead letter and
// then counts it done, Redeliver keeps the record to process again in
// place. It returns those records, in order, and how long to wait first
// (the longest of their delays).
func (c *Consumer) settle(p *partition, recs []*kgo.Record, outs []idem.Outcome) ([]*kgo.Record, time.Duration) {
	var retry []*kgo.Record
	var delay time.Duration
	for i, r := range recs {
		if c.crashed.Load() {
			return nil, 0
		}
		st := outs[i].Settle(c.cfg.RetryDelay)
		switch st.Action {
		case idem.Ack:
			c.markDone(p, r)
		case idem.DeadLetter:
			if err := c.deadLetter(p.ctx, r, st); err != nil {
				c.log.Warn("idemkafka: dead letter not produced; retrying the record", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "err", err)
				retry = append(retry, r)
				delay = max(delay, c.cfg.RetryDelay)
				continue
			}
			c.markDone(p, r)
		default: // Redeliver: in place, after the delay
			retry = append(retry, r)
			delay = max(delay, st.Delay)
		}
		st.Log(p.ctx, c.log, "idemkafka", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "dead_letter", c.cfg.DeadLetter)
	}
	return retry, delay
}

func (c *Consumer) markDone(p *partition, r *kgo.Record) {
	c.mu.Lock()
	p.tracker.done(r.Offset)
	c.mu.Unlock()
}

func (c *Consumer) signalCommit() {
	select {
	case c.commitCh <- struct{}{}:
	default:
	}
}

// commitLoop commits done offsets whenever a worker signals, one commit at
// a time (signals arriving meanwhile coalesce), retrying a failed commit
// after RetryDelay.
func (c *Consumer) commitLoop(quit <-chan struct{}) {
	var retry <-chan time.Time
	for {
		select {
		case <-quit:
			return
		case <-c.commitCh:
		case <-retry:
		}
		retry = nil
		if err := c.commit(context.Background(), nil); err != nil {
			c.log.Warn("idemkafka: offset commit failed; will retry", "err", err)
			retry = time.After(c.cfg.RetryDelay)
		}
	}
}

// commit commits the done offsets of only (when nil: every partition not
// being revoked; a revocation commits its own, before the partitions go,
// and nothing may be committed for them afterwards) that moved since the
// last commit.
func (c *Consumer) commit(ctx context.Context, only []*partition) error {
	if c.crashed.Load() {
		return nil
	}
	c.commitMu.Lock()
	defer c.commitMu.Unlock()

	c.mu.Lock()
	if only == nil {
		for _, p := range c.parts {
			if !p.revoked {
				only = append(only, p)
			}
		}
	}
	offsets := make(map[string]map[int32]kgo.EpochOffset)
	byTP := make(map[topicPartition]*partition)
	for _, p := range only {
		eo, ok := p.tracker.committable()
		if !ok || eo.Offset <= p.committed {
			continue
		}
		if offsets[p.tp.topic] == nil {
			offsets[p.tp.topic] = make(map[int32]kgo.EpochOffset)
		}
		offsets[p.tp.topic][p.tp.partition] = eo
		byTP[p.tp] = p
	}
	c.mu.Unlock()
	if len(offsets) == 0 || c.crashed.Load() {
		return nil
	}

	ctx, cancel := context.WithTimeout(ctx, c.cfg.CommitTimeout)
	defer cancel()
	var errs []error
	c.cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			errs = append(errs, err)
			return
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, t := range resp.Topics {
			for _, rp := range t.Partitions {
				if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
					errs = append(errs, fmt.Errorf("%s/%d: %w", t.Topic, rp.Partition, err))
					continue
				}
				if p := byTP[topicPartition{t.Topic, rp.Partition}]; p != nil {
					p.committed = max(p.committed, offsets[t.Topic][rp.Partition].Offset)
				}
			}
		}
	})
	if len(errs) > 0 {
		return fmt.Errorf("idemkafka: commit offsets: %w", errors.Join(errs...))
	}
	return nil
}

// registry maps a client to the Consumer driving it, for the group
// callbacks installed by ClientOpts, which receive only the client.
var registry sync.Map // *kgo.Client -> *Consumer

func consumerOf(cl *kgo.Client) *Consumer {
	if v, ok := registry.Load(cl); ok {
		return v.(*Consumer)
	}
	return nil
}

// clientMarker marks a client built with ClientOpts, and forgets its
// Consumer when the client closes.
type clientMarker struct{}

// OnClientClosed implements kgo.HookClientClosed.
func (clientMarker) OnClientClosed(cl *kgo.Client) { registry.Delete(cl) }

func onRevoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	if c := consumerOf(cl); c != nil {
		c.revoke(ctx, revoked, true)
	}
}

func onLost(ctx context.Context, cl *kgo.Client, lost map[string][]int32) {
	if c := consumerOf(cl); c != nil {
		c.revoke(ctx, lost, false)
	}
}

// revoke gives up partitions: it stops taking their records and, when the
// partitions were revoked (not lost) and this member has not crashed, waits
// up to RevokeTimeout for the records in flight and commits what finished,
// before the partitions go to their next owner.
func (c *Consumer) revoke(ctx context.Context, m map[string][]int32, commit bool) {
	commit = commit && !c.crashed.Load()
	if c.cfg.testOnRevoke != nil {
		c.cfg.testOnRevoke(m)
	}
	var ps []*partition
	var waits []chan struct{}
	c.mu.Lock()
	for topic, parts := range m {
		for _, part := range parts {
			p := c.parts[topicPartition{topic, part}]
			if p == nil {
				continue
			}
			c.stopLocked(p)
			p.revoked = true
			ps = append(ps, p)
			if p.running {
				waits = append(waits, p.exited)
			}
		}
	}
	c.mu.Unlock()
	if len(ps) == 0 {
		return
	}

	if commit {
		t := time.NewTimer(c.cfg.RevokeTimeout)
	wait:
		for _, w := range waits {
			select {
			case <-w:
			case <-t.C:
				c.log.Warn("idemkafka: records still in flight at revocation; committing what finished", "timeout", c.cfg.RevokeTimeout)
				break wait
			case <-ctx.Done():
				break wait
			}
		}
		t.Stop()
		if err := c.commit(context.WithoutCancel(ctx), ps); err != nil {
			c.log.Warn("idemkafka: offset commit on revocation failed; the next owner will see duplicates", "err", err)
		}
	}

	c.mu.Lock()
	for _, p := range ps {
		p.cancel() // a handler still running belongs to no owner now
		if c.parts[p.tp] == p {
			delete(c.parts, p.tp)
		}
		c.resumeLocked(p)
	}
	c.mu.Unlock()
}

// recordHeaders returns r's headers by key (idem.Message.Headers), values
// in record order; nil when it has none.
func recordHeaders(r *kgo.Record) idem.Headers {
	if len(r.Headers) == 0 {
		return nil
	}
	h := make(idem.Headers, len(r.Headers))
	for _, rh := range r.Headers {
		h[rh.Key] = append(h[rh.Key], string(rh.Value))
	}
	return h
}
