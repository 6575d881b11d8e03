package idem

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"github.com/idem-go/idem/idemdriver"
	"reflect"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// core is what both claim modes share: the configuration, message checks,
// fingerprint comparison, and the background loops of retention (marking
// the consumer running, purging).
type core struct {
	cfg   Config
	hooks *hooks // nil without Config.Hooks
	// sumSHA256 is set when cfg.Fingerprinter is SHA256Fingerprint: prepare
	// then sums into the caller's array instead of allocating the slice
	// the Fingerprinter returns.
	sumSHA256 bool
	closed    atomic.Bool
	store     idemdriver.Retainer

	stopOnce sync.Once
	stop     context.CancelFunc
	loops    sync.WaitGroup

	// txFree holds the contexts of ended transactions for the next ones
	// (txbound.go).
	txFree txFreeList

	// purgeMu guards lastHorizon, the horizon of this process's previous
	// purge that had one (retention.go, purgeNow).
	purgeMu     sync.Mutex
	lastHorizon time.Time
}

// start sets cfg (validated, with defaults applied) and the hooks, and
// starts the loop that marks the consumer running and, unless
// cfg.PurgeInterval is negative, the purge loop.
func (c *core) start(cfg Config, mode Mode, store idemdriver.Retainer) {
	c.cfg, c.store = cfg, store
	c.sumSHA256 = reflect.ValueOf(cfg.Fingerprinter).Pointer() == reflect.ValueOf(SHA256Fingerprint).Pointer()
	c.hooks, _ = newHooks(cfg.Hooks, cfg, mode) // validate checked them
	ctx, cancel := context.WithCancel(context.Background())
	c.stop = cancel
	c.loops.Add(1)
	go c.runLoop(ctx)
	if c.cfg.PurgeInterval > 0 {
		c.loops.Add(1)
		go c.purgeLoop(ctx)
	}
}

// close stops the background loops and waits for them; idempotent.
func (c *core) close() error {
	c.closed.Store(true)
	c.stopOnce.Do(c.stop)
	c.loops.Wait()
	c.txFree.close()
	return nil
}

// prepare validates msg and computes its fingerprint. A non-zero
// out.Status means msg is settled (Rejected, or ErrClosed).
func (c *core) prepare(msg Message) (out Outcome, fp []byte) { return c.prepareInto(msg, nil) }

// prepareInto is prepare that, with the default Fingerprinter and a
// non-nil buf, writes the fingerprint into buf and returns buf[:]: the
// caller's buf is part of something it allocates anyway (the claim's
// parameters), so the fingerprint costs no allocation of its own.
func (c *core) prepareInto(msg Message, buf *[sha256.Size]byte) (out Outcome, fp []byte) {
	if c.closed.Load() {
		return Outcome{Status: Failed, MessageID: msg.ID, Err: ErrClosed}, nil
	}
	if err := ValidateMessageID(msg.ID, c.cfg.MaxIDLength); err != nil {
		return Outcome{Status: Rejected, MessageID: msg.ID, Err: err}, nil
	}
	if c.sumSHA256 && buf != nil {
		*buf = sha256.Sum256(msg.Payload)
		return Outcome{}, buf[:]
	}
	fp, err := fingerprint(c.cfg.Fingerprinter, msg.Payload)
	if err == nil && (len(fp) == 0 || len(fp) > MaxFingerprintLength) {
		err = fmt.Errorf("%w: fingerprinter returned %d bytes, want 1..%d", ErrInvalidPayload, len(fp), MaxFingerprintLength)
	}
	if err != nil {
		if !errors.Is(err, ErrInvalidPayload) {
			err = fmt.Errorf("%w: %w", ErrInvalidPayload, err)
		}
		return Outcome{Status: Rejected, MessageID: msg.ID, Err: err}, nil
	}
	return Outcome{}, fp
}

// duplicate settles a message whose record exists, checking the fingerprint
// on this path too.
func (c *core) duplicate(id string, fp, stored []byte) (Outcome, error) {
	if bytes.Equal(fp, stored) {
		return Outcome{Status: Duplicate, MessageID: id}, nil
	}
	if c.cfg.MismatchPolicy == AcceptMismatchAsDuplicate {
		return Outcome{Status: Duplicate, MessageID: id, MismatchAccepted: true}, nil
	}
	err := fmt.Errorf("%w: consumer %q, message ID %q was processed with another payload", ErrFingerprintMismatch, c.cfg.Name, id)
	return Outcome{Status: FingerprintMismatch, MessageID: id, Err: err}, err
}

// existingTx settles a transactional claim that found a record: the
// fingerprint is checked first, then the record's state, since a lease-mode
// record of the same consumer name may be in progress or poison and must
// not be acknowledged as a duplicate.
func (c *core) existingTx(id string, fp []byte, res idemdriver.ClaimResult) (Outcome, error) {
	out, err := c.duplicate(id, fp, res.Fingerprint)
	if out.Status == FingerprintMismatch {
		return out, err
	}
	switch res.State {
	case 0, idemdriver.StateCompleted:
		return out, err
	case idemdriver.StateInProgress:
		err := fmt.Errorf("%w: message %q is being processed by a lease-mode attempt of consumer %q", ErrInProgress, id, c.cfg.Name)
		return Outcome{Status: InProgress, MessageID: id, Err: err, RetryAfter: txInProgressRetryAfter}, err
	case idemdriver.StateFailed:
		err := fmt.Errorf("%w: message %q failed for good in lease mode (consumer %q)", ErrPoison, id, c.cfg.Name)
		return Outcome{Status: Failed, MessageID: id, Err: err, Poison: true}, err
	}
	return c.failed(id, fmt.Errorf("%w: store returned an unclaimed record in state %d", ErrStore, res.State))
}

// txInProgressRetryAfter is the redelivery delay of a transactional
// delivery that finds a lease-mode record in progress (the claim does not
// report the lease's remaining time).
const txInProgressRetryAfter = time.Second

func (c *core) failed(id string, err error) (Outcome, error) {
	return Outcome{Status: Failed, MessageID: id, Err: err}, err
}

// fingerprint calls f, turning a panic into an error that matches
// ErrInvalidPayload and ErrHandlerPanic: a fingerprinter that panics on
// some payload rejects that message instead of crashing the consumer.
func fingerprint(f Fingerprinter, payload []byte) (fp []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			fp, err = nil, fmt.Errorf("%w: fingerprinter: %w", ErrInvalidPayload, &PanicError{Value: r, Stack: debug.Stack()})
		}
	}()
	return f(payload)
}
