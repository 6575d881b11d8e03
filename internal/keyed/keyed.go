// Package keyed holds what the idempotency-key front ends of this
// repository (idemhttp's middleware and proxy, idemgrpc's interceptor)
// share on top of the core's lease engine: the record ID of a scoped key,
// the final writes of an attempt (its result, its release) retried while
// the lease is held, the at-most-once recovery points, and the clients'
// full-jitter backoff. It is internal: not part of idem's API. Standard
// library and the root package only, like the root module.
package keyed

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// maxInlineKey is the longest key kept readable in a record ID: the scope
// hash (22 bytes) and a separator leave 232 of the store's 255 bytes.
const maxInlineKey = 255 - 23

// RecordID returns the store message ID of a scope and key: the
// base64url (unpadded, 22 characters) of the first 16 bytes of the
// SHA-256 of scope, then ':' and the key when it fits in 232 bytes, or
// '!' and the hex SHA-256 of the key when it does not. The scope is never
// stored in clear; the key stays readable for inspection.
func RecordID(scope, key string) string {
	// Built in one buffer, one allocation for the string: this runs for
	// every keyed request.
	var arr [23 + maxInlineKey]byte
	sh := sha256.Sum256([]byte(scope))
	b := base64.RawURLEncoding.AppendEncode(arr[:0], sh[:16])
	if len(key) <= maxInlineKey {
		b = append(append(b, ':'), key...)
	} else {
		kh := sha256.Sum256([]byte(key))
		b = hex.AppendEncode(append(b, '!'), kh[:])
	}
	return string(b)
}

// Finisher ends the attempts of one front end. Its fields are set once,
// before use.
type Finisher struct {
	// Name starts log messages ("idemhttp") and the recovery points'
	// names (Name+":run:"+token, Name+":settled:"+token).
	Name string
	// Consumer is logged with each message.
	Consumer string
	// Lease bounds the retries of one write; StoreTimeout bounds each
	// call. A StoreTimeout of 0 adds no bound of its own: for a front
	// end whose lease engine bounds every store call by the same timeout
	// (idem.Config.StoreTimeout), one timer fewer per write.
	Lease, StoreTimeout time.Duration
	// AtMostOnce makes Release record, with the release, that the
	// attempt's outcome is known (see RunPrefix).
	AtMostOnce bool
	Logger     *slog.Logger
	// StoreErrors counts failed store calls; Released counts releases.
	StoreErrors, Released *atomic.Int64
}

// RunPrefix is the idem.AcquireOptions.StepPrefix of an attempt that
// records, with its acquisition and before it acts, a recovery point
// under its fencing token (Name+":run:"+token): an attempt that later
// takes the key over and finds it without a settled point (Unsettled)
// knows this one may have acted and never recorded its outcome.
func (f *Finisher) RunPrefix() string { return f.Name + ":run:" }

func (f *Finisher) settledStep(tok int64) string {
	return f.Name + ":settled:" + strconv.FormatInt(tok, 10)
}

// SettleOnRelease makes the attempt's release record that its outcome
// is known (it did not act, or acted and failed in a way that is known),
// in the same store write as the release (idem.Attempt.SaveStepOnRelease),
// so Unsettled no longer reports it.
func (f *Finisher) SettleOnRelease(a *idem.Attempt) {
	_ = a.SaveStepOnRelease(f.settledStep(a.Token)) // a valid name: Name is a constant
}

// Unsettled returns the token of an earlier attempt that saved a run
// point and no settled point: it may have acted, and it never recorded
// its result nor released the key with a known outcome. a's own run
// point is not one.
func (f *Finisher) Unsettled(a *idem.Attempt) (string, bool) {
	if a.Number <= 1 {
		// The key's first attempt: no earlier one left a point (the
		// conformance suite holds every store to counting attempts).
		return "", false
	}
	steps := a.Steps()
	var ownArr [20]byte
	own := strconv.AppendInt(ownArr[:0], a.Token, 10)
	var arr [64]byte
	for name := range steps {
		// No allocation for the common case, the attempt's own run point
		// alone: the names are compared in place.
		rest, ok := strings.CutPrefix(name, f.Name)
		if !ok {
			continue
		}
		tok, ok := strings.CutPrefix(rest, ":run:")
		if !ok || tok == string(own) {
			continue
		}
		settled := append(append(append(arr[:0], f.Name...), ":settled:"...), tok...)
		if _, done := steps[string(settled)]; !done {
			return tok, true
		}
	}
	return "", false
}

// RetryWrite calls write, each call bounded by StoreTimeout (when set), until it
// succeeds or fails for a reason other than the store's (ErrLeaseLost:
// another attempt owns the key; ErrAttemptEnded), retrying store failures
// with backoff (from 20ms, growing by half with ±50% jitter, at most 1s
// apart) while the attempt holds its lease: the retries end when the lease
// is lost (by the store, or by the local clock when no renewal lands in
// time), with an error matching idem.ErrLeaseLost (and the last store
// error, matching idem.ErrStore), or after one Lease of retries (a store
// that renews leases but refuses this write), with the last store error;
// the caller then abandons the attempt, whose lease runs out. They go on
// after the client left.
func (f *Finisher) RetryWrite(a *idem.Attempt, write func(ctx context.Context) error) error {
	lctx := a.LeaseContext()
	start := time.Now()
	interval := 20 * time.Millisecond
	for {
		err := f.write(lctx, write)
		if err == nil || !errors.Is(err, idem.ErrStore) || errors.Is(err, idem.ErrLeaseLost) {
			return err
		}
		f.StoreErrors.Add(1)
		if cause := context.Cause(lctx); cause != nil {
			return errors.Join(cause, err)
		}
		wait := time.Duration(float64(interval) * (0.5 + rand.Float64()))
		interval = min(interval*3/2, time.Second)
		if time.Since(start)+wait > f.Lease {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-lctx.Done():
			t.Stop()
			return errors.Join(context.Cause(lctx), err)
		case <-t.C:
		}
	}
}

// write makes one call of write under lctx, bounded by StoreTimeout when
// it is set.
func (f *Finisher) write(lctx context.Context, write func(ctx context.Context) error) error {
	if f.StoreTimeout <= 0 {
		return write(lctx)
	}
	ctx, cancel := context.WithTimeout(lctx, f.StoreTimeout)
	defer cancel()
	return write(ctx)
}

// Complete records res as the key's result (retried while the lease is
// held) and ends the attempt; nil when it was recorded. On failure the
// attempt is abandoned: its lease runs out.
func (f *Finisher) Complete(a *idem.Attempt, res idem.Result) error {
	err := f.RetryWrite(a, func(ctx context.Context) error {
		_, err := a.Complete(ctx, res)
		return err
	})
	if err != nil {
		_, _ = a.Abandon(context.WithoutCancel(a.Context()), err)
	}
	return err
}

// Release releases the key after cause so the next retry runs (retried
// while the lease is held), recording in the same write, when AtMostOnce,
// that this attempt's outcome is known (SettleOnRelease). It returns nil,
// or the error (matching idem.ErrLeaseLost or idem.ErrStore) that kept
// the key from being released; the attempt is then abandoned, and a later
// attempt takes over when its lease runs out.
func (f *Finisher) Release(a *idem.Attempt, cause error) error {
	f.Released.Add(1)
	if f.AtMostOnce {
		f.SettleOnRelease(a)
	}
	err := f.RetryWrite(a, func(ctx context.Context) error {
		_, err := a.Release(ctx, cause)
		if err != nil && !errors.Is(err, idem.ErrStore) && !errors.Is(err, idem.ErrLeaseLost) {
			return nil // the cause itself: released
		}
		return err
	})
	if err != nil {
		f.Logger.Warn(f.Name+": could not release the key; it frees when its lease runs out",
			"consumer", f.Consumer, "record", a.Message.ID, "error", err)
		_, _ = a.Abandon(context.WithoutCancel(a.Context()), errors.Join(cause, err))
	}
	return err
}

// FullJitter is an exponential backoff with full jitter (AWS Architecture
// Blog, "Exponential Backoff And Jitter"): wait n is drawn uniformly from
// [0, min(Max, Initial * Multiplier^(n-1))]. It has the methods of
// github.com/cenkalti/backoff/v5's BackOff interface and never stops (the
// caller bounds the tries). Not safe for concurrent use: one per
// operation.
type FullJitter struct {
	Initial, Max time.Duration
	Multiplier   float64
	ceiling      time.Duration
}

// NextBackOff returns the next wait.
func (j *FullJitter) NextBackOff() time.Duration {
	switch {
	case j.ceiling == 0:
		j.ceiling = j.Initial
	case float64(j.ceiling)*j.Multiplier >= float64(j.Max):
		j.ceiling = j.Max
	default:
		j.ceiling = time.Duration(float64(j.ceiling) * j.Multiplier)
	}
	if j.ceiling <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(j.ceiling) + 1))
}

// Reset starts the schedule again from Initial.
func (j *FullJitter) Reset() { j.ceiling = 0 }

// NewLeaseConsumer returns the lease consumer of a front end named name
// over store, from cfg's retention, purge, logger, hooks and lease: the
// message payload is the request's fingerprint, used as it is, and a key
// is retried for as long as its clients retry (a released response never
// poisons it).
func NewLeaseConsumer(store idemdriver.LeaseStore, name string, cfg idem.Config) (*idem.LeaseConsumer, error) {
	cfg.Name = name
	cfg.Fingerprinter = func(fp []byte) ([]byte, error) { return fp, nil }
	cfg.MaxAttempts = math.MaxInt32
	cfg.Retryable = func(error) bool { return true }
	return idem.NewLeaseConsumer(store, cfg)
}

// IsConfigError reports whether err, from a store call, is a
// configuration or input error (the store refused the call) rather than
// an outage.
func IsConfigError(err error) bool {
	return errors.Is(err, idem.ErrInvalidConfig) || errors.Is(err, idem.ErrInvalidConsumerName) ||
		errors.Is(err, idem.ErrInvalidMessageID) || errors.Is(err, idem.ErrInvalidPayload)
}

// CheckNamespace checks a front end's namespace: 1 to maxLen bytes, and
// prefix+ns a valid consumer name. The error says which rule failed; the
// caller wraps it in its own options error.
func CheckNamespace(prefix, ns string, maxLen int) error {
	if ns == "" || len(ns) > maxLen {
		return fmt.Errorf("Namespace must be 1 to %d bytes", maxLen)
	}
	if err := idem.ValidateConsumerName(prefix + ns); err != nil {
		return fmt.Errorf("Namespace: %w", err)
	}
	return nil
}
