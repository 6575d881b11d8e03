package idemhttp

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/keyed"
	"github.com/idem-go/idem/internal/lastval"
)

// The request headers a [Deliverer] sends with each message, beside
// Idempotency-Key (the message ID, as it is: not an sf-string).
const (
	// HeaderMessageID is the message ID again, under a name no proxy or
	// framework gives another meaning.
	HeaderMessageID = "Idem-Message-Id"
	// HeaderAttempt is the lease-mode attempt number: 1 for the first
	// delivery, one more for each retry or takeover.
	HeaderAttempt = "Idem-Attempt"
	// HeaderDeadline is the instant (RFC 3339, UTC, milliseconds) after
	// which the Deliverer stops waiting for the answer: an answer that
	// comes later is not recorded, and the call's outcome counts as
	// unknown.
	HeaderDeadline = "Idem-Deadline"
	// HeaderBrokerPrefix starts the name of every broker header of the
	// message (idem.Message.Headers): broker header "trace-id" is sent as
	// "Idem-Header-Trace-Id" (net/http's canonical form). Headers whose
	// name is not an HTTP token or whose value holds a control character
	// are left out. A broker header named Content-Type (any case) is also
	// the request's Content-Type.
	HeaderBrokerPrefix = "Idem-Header-"
)

// Deliverer defaults, applied by NewDeliverer to zero DelivererOptions fields.
const (
	// DefaultDeliveryTimeout bounds one call to the service, from sending
	// the request to the end of the response body.
	DefaultDeliveryTimeout = 30 * time.Second
	// DefaultDeliveryRetryBase is the first redelivery delay after a
	// retryable answer or a call that could not be sent; it doubles with
	// each attempt (with jitter) up to DefaultDeliveryRetryMax.
	DefaultDeliveryRetryBase = 500 * time.Millisecond
	// DefaultDeliveryRetryMax caps the backoff (not a longer Retry-After).
	DefaultDeliveryRetryMax = time.Minute
	// DefaultMaxAnswerBytes is the most of a response body that is read
	// and recorded; the rest is discarded.
	DefaultMaxAnswerBytes = 64 << 10
	// answerContentType is the content type of a recorded answer.
	answerContentType = "application/vnd.idem.delivery-answer+json"
)

// deliverPoints names the recovery points of a delivery in at-most-once
// mode (keyed.Finisher, shared with the middleware, the proxy and
// idemgrpc): a run point is saved before the request leaves, a settled
// point when the call ended with a known outcome that does not complete
// the message (nothing sent, or a retryable answer).
const deliverPoints = "idemhttp:deliver"

// ErrServiceRefused matches the error of a message the service answered
// with a status that is neither a success nor retryable (400, 404, 422,
// ...; also 3xx, which is not followed): the message is dead-lettered
// with reason permanent and the answer in the error text.
var ErrServiceRefused = errors.New("idemhttp: the service refused the message")

// ServiceAnswerError is a service's answer that did not complete the
// message: retryable (409, 429, 5xx; RetryAfter from its Retry-After
// header) or a refusal (matching ErrServiceRefused).
type ServiceAnswerError struct {
	// Status is the HTTP status code.
	Status int
	// Body is the start of the response body (at most 512 bytes).
	Body string
	// RetryAfter is the wait its Retry-After header asked for; zero when
	// it had none.
	RetryAfter time.Duration
}

// Error returns "idemhttp: the service answered", the status code and its
// text, then ": " and the start of the body when there is one.
func (e *ServiceAnswerError) Error() string {
	s := fmt.Sprintf("idemhttp: the service answered %d %s", e.Status, http.StatusText(e.Status))
	if e.Body != "" {
		s += ": " + e.Body
	}
	return s
}

// Is matches ErrServiceRefused for a status that is not retryable.
func (e *ServiceAnswerError) Is(target error) bool {
	return target == ErrServiceRefused && !retryableDeliveryStatus(e.Status)
}

// DelivererOptions configures a Deliverer. Zero values take the defaults
// named in the comments.
type DelivererOptions struct {
	// Target is the URL every message is POSTed to (required): an
	// absolute http or https URL.
	Target *url.URL
	// Transport sends the requests. Defaults to an *http.Transport with
	// DefaultUpstreamDialTimeout and DefaultUpstreamIdleTimeout. Either
	// way net/http's own re-send of a failed request on a reused
	// connection is turned off: it would send a message twice.
	Transport http.RoundTripper
	// Timeout bounds one call (HeaderDeadline tells the service). Defaults
	// to DefaultDeliveryTimeout.
	Timeout time.Duration
	// MaxCalls is the most calls to the service at once; 0 (the default)
	// sets no limit. A delivery whose message is claimed (its lease
	// acquired, renewed meanwhile by the lease engine) waits for a free
	// call in the order the deliveries arrived, so that an adapter may run
	// more deliveries than the service takes calls: their claims then
	// reach the store together (in one batch, through a batching store).
	// Timeout starts when the call does. A delivery whose context ends
	// while it waits (its lease lost, the adapter stopping) is not sent
	// and is redelivered after the backoff, like a call not sent.
	//
	// In at-most-once mode a waiting message's claim has recorded its
	// recovery point: if the process dies while it waits, the attempt
	// that takes it over dead-letters it as outcome-unknown, as it does a
	// message whose call was running (unless PointAtCall).
	MaxCalls int
	// PointAtCall, in at-most-once mode with MaxCalls, records the
	// recovery point of a message that has to wait for a call when it
	// gets the call, in a store write of its own (Attempt.SaveStep, not
	// batched) just before the request leaves, instead of with its claim.
	// If the process dies while a message waits, the attempt that takes
	// it over then finds no recovery point of the dead one and sends the
	// message, which was never sent: only a message whose call may have
	// started is dead-lettered as outcome-unknown. A message that finds a
	// call free when it arrives still records its point with its claim.
	// The price is that third store write for each message that waits,
	// in the call's place: with many more deliveries than calls and a
	// fast service, it can cost more than half the throughput.
	PointAtCall bool
	// InOrder makes ProcessBatch keep the order of the messages it is
	// given, for an adapter whose batches are consecutive messages of one
	// ordered stream (idemkafka's batch mode: records of one partition in
	// offset order). The batch is still claimed in one store call and
	// its answers recorded in one more, but its calls are made one after
	// the other, in the order given, each once the one before it ended
	// (through one of the MaxCalls calls). A message that would be
	// redelivered (its call ended retryable or was not sent, it is in
	// progress elsewhere, or the store failed) is retried in place
	// before the next message is called: the answers of the messages
	// before it are recorded first (one CompleteBatch), then, after the
	// backoff (or its Retry-After), it is processed again as Process
	// does, until it ends otherwise; the later messages stay held
	// meanwhile, their leases renewed, and are not claimed again, so
	// they use no attempt of their MaxAttempts. If ctx ends first,
	// the messages not yet ended (the one retried and those after it)
	// are released without a call (one store call each) and returned
	// Failed, to be redelivered: so no message's answer is recorded
	// ahead of an earlier message that is redelivered. A message
	// dead-lettered (a refusal, outcome-unknown, poison, a fingerprint
	// mismatch) does not stop the ones after it, which are called before
	// the adapter produces its dead letter. With PointAtCall (and
	// MaxCalls, at most once) each message is processed by Process in
	// turn instead, claimed on its own. Process is unaffected. An adapter
	// that stops gracefully (its handlers in flight finish) calls
	// EndRetries first, so that a retry in place does not hold its stop.
	InOrder bool
	// AtLeastOnce turns the at-most-once protection off: a call whose
	// outcome is unknown (the connection broke after the request was
	// sent, or the process died and a later attempt takes the message
	// over) is sent again instead of being dead-lettered with reason
	// outcome-unknown. For services that deduplicate by Idempotency-Key.
	AtLeastOnce bool
	// RetryBase and RetryMax shape the backoff of redeliveries after a
	// retryable answer or a call not sent: RetryBase * 2^(attempt-1), at
	// most RetryMax, with jitter (between half and all of it), or the
	// answer's Retry-After when that is longer. Default to
	// DefaultDeliveryRetryBase and DefaultDeliveryRetryMax.
	RetryBase, RetryMax time.Duration
	// MaxAnswerBytes is the most of a response body read and recorded.
	// Defaults to DefaultMaxAnswerBytes.
	MaxAnswerBytes int64
	// ContentType is the request's Content-Type when the message has no
	// Content-Type header. Defaults to "application/octet-stream".
	ContentType string
	// Logger gets a warning for every unknown outcome. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

// Deliverer delivers each message to an HTTP service, once: it is the
// idem.Processor of `idem consume`, which a broker adapter drives. Each
// message is POSTed to Target (the payload as the body, the message ID in
// Idempotency-Key and HeaderMessageID, the broker's headers under
// HeaderBrokerPrefix, HeaderAttempt and HeaderDeadline) in lease mode,
// under the core's lease engine (idem.LeaseConsumer: the lease, its
// renewal, recovery points, MaxAttempts, retention), and the service's
// answer is recorded before the delivery is settled:
//
//	2xx                               recorded; ack (a redelivery is acked without a call)
//	409, 429, 5xx                     not recorded; redelivered after the backoff or Retry-After;
//	                                  poison (dead letter, reason poison) after MaxAttempts
//	another status (4xx, 3xx)         recorded; dead letter, reason permanent, the answer as the error
//	not sent (refused, DNS, dial)     redelivered after the backoff
//	sent, no complete answer          recorded as unknown; dead letter, reason outcome-unknown
//	earlier attempt died after send   recorded as unknown; dead letter, reason outcome-unknown
//
// The last two rows are the at-most-once protection, the same as a Proxy's:
// before the request leaves, the attempt records a recovery point under its
// fencing token, so the attempt that takes the message over after a crash
// (when the lease runs out) knows the service may have acted and does not
// call it again. With DelivererOptions.AtLeastOnce both rows send the
// message again instead. A recorded answer is kept for the retention
// window: every redelivery of the message is settled the same way (acked,
// or dead-lettered with the same reason) without calling the service.
//
// A call runs on the context the adapter gives Process, cancelled when the
// lease is lost: a call cut short after its request was sent (an adapter
// whose stop outlasted its timeout, a lease lost while the service
// worked) is an unknown outcome like any other.
//
// A Deliverer is safe for concurrent use.
type Deliverer struct {
	lc     *idem.LeaseConsumer
	o      DelivererOptions
	target string // o.Target, rendered once
	// rt sends the calls: the transport itself, not an http.Client,
	// whose Do copies each request's headers and URL for redirects the
	// Deliverer does not follow (a redirect is an answer).
	rt http.RoundTripper
	// req is the request every call copies (Request.WithContext): the
	// method, the target parsed once and its Host; each copy gets its
	// own headers and body. The transport only reads req.URL.
	req *http.Request
	// runPrefix is fin.RunPrefix(), made once.
	runPrefix string
	// deadlines is the last Idem-Deadline value made, by its instant
	// in Unix milliseconds: the calls sent in one millisecond share it.
	deadlines lastval.Cache[int64, string]
	// keys maps the broker header names seen to their request header
	// names (headerKey), at most maxHeaderKeys of them; replaced, never
	// changed, when a name is added.
	keys atomic.Pointer[map[string]string]
	// auth is the Authorization value of o.Target's user information
	// (basic authentication, as http.Client sets it), or empty; errURL
	// is target with its password replaced by "***", as http.Client
	// reports it in errors.
	auth, errURL string
	fin          keyed.Finisher // the recovery points
	calls        chan struct{}  // one place per call running; nil: no MaxCalls
	// retriesEnded is closed by EndRetries: InOrder retries in place
	// stop waiting.
	retriesEnded chan struct{}
	endRetries   sync.Once
	stats        struct {
		calls, delivered, replayed, retried, refused, unknown atomic.Int64
		storeErrors, released                                 atomic.Int64
	}
}

// DeliveryStats counts what a Deliverer did since NewDeliverer.
type DeliveryStats struct {
	// Calls: requests that reached the service, or may have.
	Calls int64
	// Delivered: messages acknowledged after a 2xx answer of this process.
	Delivered int64
	// Replayed: deliveries settled from a recorded answer, without a call.
	Replayed int64
	// Retried: deliveries left for redelivery (retryable answer, not sent,
	// store failure, another delivery in progress).
	Retried int64
	// Refused: deliveries dead-lettered because of the service's answer.
	Refused int64
	// Unknown: deliveries dead-lettered as outcome-unknown.
	Unknown int64
}

// NewDeliverer returns a Deliverer that runs each message through lc (its
// Config sets the consumer name, the lease, MaxAttempts and the hooks).
// Errors match idem.ErrInvalidConfig.
func NewDeliverer(lc *idem.LeaseConsumer, opts DelivererOptions) (*Deliverer, error) {
	o := opts
	switch {
	case lc == nil:
		return nil, fmt.Errorf("%w: nil LeaseConsumer", idem.ErrInvalidConfig)
	case o.Target == nil || (o.Target.Scheme != "http" && o.Target.Scheme != "https") || o.Target.Host == "":
		return nil, fmt.Errorf("%w: target %v: want an absolute http:// or https:// URL", idem.ErrInvalidConfig, o.Target)
	case o.Timeout < 0, o.RetryBase < 0, o.RetryMax < 0, o.MaxAnswerBytes < 0, o.MaxCalls < 0:
		return nil, fmt.Errorf("%w: negative delivery option", idem.ErrInvalidConfig)
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultDeliveryTimeout
	}
	if o.RetryBase == 0 {
		o.RetryBase = DefaultDeliveryRetryBase
	}
	if o.RetryMax == 0 {
		o.RetryMax = DefaultDeliveryRetryMax
	}
	if o.MaxAnswerBytes == 0 {
		o.MaxAnswerBytes = DefaultMaxAnswerBytes
	}
	if o.ContentType == "" {
		o.ContentType = "application/octet-stream"
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	tr := o.Transport
	if tr == nil {
		tr = newUpstreamTransport(DefaultUpstreamDialTimeout, DefaultUpstreamIdleTimeout)
	}
	d := &Deliverer{lc: lc, o: o, target: o.Target.String(), rt: noInternalRetry{tr}, retriesEnded: make(chan struct{})}
	req, err := http.NewRequest(http.MethodPost, d.target, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: target %v: %v", idem.ErrInvalidConfig, o.Target, err)
	}
	d.req = req
	d.errURL = d.target
	if u := o.Target.User; u != nil {
		pw, set := u.Password()
		d.auth = "Basic " + base64.StdEncoding.EncodeToString([]byte(u.Username()+":"+pw))
		if set {
			d.errURL = strings.Replace(d.target, pw+"@", "***@", 1)
		}
	}
	if o.MaxCalls > 0 {
		d.calls = make(chan struct{}, o.MaxCalls)
	}
	// A recovery point is written like a call is bounded: each try and
	// all of its retries within o.Timeout.
	d.fin = keyed.Finisher{Name: deliverPoints, Lease: o.Timeout, StoreTimeout: o.Timeout, AtMostOnce: !o.AtLeastOnce,
		Logger: o.Logger, StoreErrors: &d.stats.storeErrors, Released: &d.stats.released}
	d.runPrefix = d.fin.RunPrefix()
	return d, nil
}

// Stats returns the counts so far.
func (d *Deliverer) Stats() DeliveryStats {
	s := &d.stats
	return DeliveryStats{Calls: s.calls.Load(), Delivered: s.delivered.Load(), Replayed: s.replayed.Load(),
		Retried: s.retried.Load(), Refused: s.refused.Load(), Unknown: s.unknown.Load()}
}

// Process delivers msg (see Deliverer) and returns its Outcome, which the
// adapter settles (idem.Outcome.Settle): Processed or Duplicate for a 2xx
// answer; Failed with RetryAfter set for a retry; Failed and Poison with
// an error matching ErrServiceRefused (reason permanent) or
// idem.ErrOutcomeUnknown (reason outcome-unknown) for a dead letter; the
// lease engine's other outcomes (InProgress, FingerprintMismatch,
// Rejected, poison after MaxAttempts) as they are.
func (d *Deliverer) Process(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
	var opt idem.AcquireOptions
	slot := &callSlot{}
	if !d.o.AtLeastOnce {
		if d.calls == nil || !d.o.PointAtCall || slot.take(d.calls) {
			// A call is free (or the point goes with the claim
			// anyway): the recovery point is saved with the
			// acquisition, before the request leaves: if this process
			// dies while the service works, the attempt that takes the
			// message over finds it and does not send the message again.
			opt.StepPrefix = d.runPrefix
		} else {
			// The message waits for a call: its point is saved when
			// the call is taken (call), so that a crash while it
			// waits leaves it to be sent, not dead-lettered.
			slot.late = true
		}
	}
	var mine *answer // the answer this attempt recorded, as deliver made it
	out, _ := d.lc.ProcessWith(ctx, msg, opt, func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
		ans, err := d.deliver(ctx, a, slot)
		if err != nil {
			return idem.Result{}, err
		}
		mine = ans
		return encodeAnswer(ans), nil
	})
	if slot.held {
		<-d.calls // the handler did not run (a duplicate, a store failure): the call taken for it is free again
	}
	if out.Status != idem.Processed {
		mine = nil // a recorded answer: decoded from the record
	}
	out = d.settle(out, mine)
	return out, out.Err
}

// callSlot is a delivery's place among the MaxCalls calls: held when
// Process took it before the claim (so the call is certain and the
// recovery point goes with the claim); late when the delivery waits for
// one and saves its recovery point once it has it.
type callSlot struct {
	held, late bool
}

// take takes a free place of calls without waiting.
func (s *callSlot) take(calls chan struct{}) bool {
	select {
	case calls <- struct{}{}:
		s.held = true
		return true
	default:
		return false
	}
}

// settle turns the lease engine's outcome into the delivery's: a recorded
// answer decides ack or dead letter, and a retry gets its backoff. mine,
// when set, is the answer of a Processed outcome (its Result encoded),
// not decoded again.
func (d *Deliverer) settle(out idem.Outcome, mine *answer) idem.Outcome {
	switch {
	case out.Ack() && out.Err == nil:
		ans := mine
		if ans == nil {
			var err error
			if ans, err = decodeAnswer(out.ContentType, out.Result); err != nil {
				return idem.Outcome{Status: idem.Failed, MessageID: out.MessageID, Attempt: out.Attempt, Poison: true, Err: idem.Permanent(err)}
			}
		}
		if out.Status == idem.Duplicate {
			d.stats.replayed.Add(1)
		}
		switch ans.deadLetterReason() {
		case idem.ReasonOutcomeUnknown:
			d.stats.unknown.Add(1)
			err := fmt.Errorf("%w: message %q: %s", idem.ErrOutcomeUnknown, out.MessageID, ans.Unknown)
			return idem.Outcome{Status: idem.Failed, MessageID: out.MessageID, Attempt: out.Attempt, Poison: true, Err: idem.Permanent(err)}
		case idem.ReasonPermanent:
			d.stats.refused.Add(1)
			err := &ServiceAnswerError{Status: ans.Status, Body: excerpt(ans.Body)}
			return idem.Outcome{Status: idem.Failed, MessageID: out.MessageID, Attempt: out.Attempt, Poison: true, Err: idem.Permanent(err)}
		}
		if out.Status == idem.Processed {
			d.stats.delivered.Add(1)
		}
		return out
	case out.Status == idem.Failed && !out.Poison:
		d.stats.retried.Add(1)
		wait := d.backoff(out.Attempt)
		var se *ServiceAnswerError
		if errors.As(out.Err, &se) {
			wait = max(wait, se.RetryAfter)
		}
		out.RetryAfter = wait
	case out.Status == idem.InProgress:
		d.stats.retried.Add(1)
	}
	return out
}

// backoff is the redelivery delay after attempt n (1 for the first).
func (d *Deliverer) backoff(n int) time.Duration {
	c := d.o.RetryBase
	for i := 1; i < n && c < d.o.RetryMax; i++ {
		c *= 2
	}
	c = min(c, d.o.RetryMax)
	return c/2 + rand.N(c/2+1)
}

// deliver is the LeaseHandler's body: one call to the service under the
// attempt's lease, and the answer to record (nil with an error).
func (d *Deliverer) deliver(ctx context.Context, a *idem.Attempt, slot *callSlot) (*answer, error) {
	// The first attempt (Number 1) has no earlier one whose call may be
	// unsettled: no look through its steps (a copy of them).
	if !d.o.AtLeastOnce && a.Number > 1 {
		if prev, ok := d.fin.Unsettled(a); ok {
			d.o.Logger.Warn("idemhttp: an earlier attempt sent the message and never recorded the answer; not sending it again",
				"consumer", a.Consumer, "message_id", a.Message.ID, "earlier_token", prev, "attempt", a.Number)
			return &answer{Unknown: fmt.Sprintf("attempt with token %s sent it and ended without recording the service's answer", prev)}, nil
		}
	}
	ans, sent, err := d.call(ctx, a, slot)
	switch {
	case err != nil && !sent:
		return nil, d.settled(a, fmt.Errorf("idemhttp: the message was not sent: %w", err))
	case err != nil:
		if d.o.AtLeastOnce {
			return nil, fmt.Errorf("idemhttp: the message was sent and its answer is unknown; sending it again (at least once): %w", err)
		}
		d.o.Logger.Warn("idemhttp: the message was sent and its answer is unknown; not sending it again",
			"consumer", a.Consumer, "message_id", a.Message.ID, "attempt", a.Number, "error", err)
		return &answer{Unknown: "sent, and no complete answer came back: " + err.Error()}, nil
	case retryableDeliveryStatus(ans.Status):
		ra, _ := retryAfter(ans.retryAfter, time.Now())
		return nil, d.settled(a, &ServiceAnswerError{Status: ans.Status, Body: excerpt(ans.Body), RetryAfter: ra})
	}
	return ans, nil
}

// settled records, in at-most-once mode, that the attempt's call ended
// with a known outcome that does not complete the message, in the write
// that releases it (keyed.Finisher.SettleOnRelease), and returns cause. A
// release that fails leaves the point unsaved: the next attempt then
// takes the call as unknown, which never sends a message twice.
func (d *Deliverer) settled(a *idem.Attempt, cause error) error {
	if !d.o.AtLeastOnce {
		d.fin.SettleOnRelease(a)
	}
	return cause
}

// call POSTs the message, in one of the MaxCalls calls (slot's, or the
// next free one, waited for). A delivery that waited (slot.late) saves
// its recovery point first: not saved, not sent. sent reports whether the
// request may have reached the service (its headers were written to a
// connection).
func (d *Deliverer) call(ctx context.Context, a *idem.Attempt, slot *callSlot) (ans *answer, sent bool, err error) {
	switch {
	case slot.held:
		slot.held = false // this call frees it
		defer func() { <-d.calls }()
	case d.calls != nil:
		select {
		case d.calls <- struct{}{}:
			defer func() { <-d.calls }()
		case <-ctx.Done():
			return nil, false, fmt.Errorf("waiting for one of the %d calls: %w", cap(d.calls), context.Cause(ctx))
		}
	}
	if slot.late {
		if err := a.SaveStep(ctx, idemdriver.PrefixStep(d.runPrefix, a.Token), nil); err != nil {
			return nil, false, fmt.Errorf("recording the recovery point before the call: %w", err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, d.o.Timeout)
	defer cancel()
	cs := &callState{}
	cs.trace.WroteHeaders = func() { cs.wrote.Store(true) }
	req := d.req.WithContext(httptrace.WithClientTrace(ctx, &cs.trace))
	if n := len(a.Message.Payload); n > 0 {
		cs.body.Reset(a.Message.Payload)
		// A *bytes.Reader in io.NopCloser, as http.NewRequest makes it:
		// the transport knows it is in memory and writes the headers
		// and the body together (another reader's headers are flushed
		// alone first: one more write, and one more packet, per call).
		req.Body, req.ContentLength = io.NopCloser(&cs.body), int64(n)
	} else {
		req.Body = http.NoBody // as http.NewRequest makes an empty body
	}
	d.headers(req, a, cs.vals[:0])
	d.stats.calls.Add(1)
	resp, err := d.rt.RoundTrip(req)
	if err != nil {
		// As http.Client reports it.
		return nil, cs.wrote.Load(), &url.Error{Op: "Post", URL: d.errURL, Err: err}
	}
	if resp.Body == nil {
		resp.Body = http.NoBody
	}
	defer resp.Body.Close()
	body, err := readAnswer(resp, d.o.MaxAnswerBytes)
	if err == nil {
		_, err = io.Copy(io.Discard, resp.Body) // the end of the answer, not recorded
	}
	if err != nil {
		return nil, true, fmt.Errorf("reading the answer: %w", err)
	}
	cs.ans = answer{Status: resp.StatusCode, ContentType: resp.Header.Get("Content-Type"), Body: body,
		retryAfter: resp.Header.Get("Retry-After")}
	return &cs.ans, true, nil
}

// callState is what one call needs beside its request, in one
// allocation: the reader of the request body (the payload; no GetBody,
// so the transport never sends it again on its own, which
// noInternalRetry ensures anyway), the trace that tells whether the
// request may have reached the service (its headers were written to a
// connection), the service's answer and the request's header values.
type callState struct {
	body  bytes.Reader
	wrote atomic.Bool
	trace httptrace.ClientTrace
	ans   answer
	// vals holds the request's header values (headers) when they fit:
	// the five of every call and up to three of the broker's.
	vals [8]string
}

// readAnswer reads the start of resp's body, at most limit bytes: none for
// an empty answer (net/http's NoBody), into a buffer of its Content-Length
// when the answer declares one within limit, else as io.ReadAll does.
func readAnswer(resp *http.Response, limit int64) ([]byte, error) {
	switch n := resp.ContentLength; {
	case resp.Body == http.NoBody:
		return nil, nil
	case n > 0 && n <= limit:
		b := make([]byte, n)
		if _, err := io.ReadFull(resp.Body, b); err != nil {
			return nil, err
		}
		return b, nil
	}
	return io.ReadAll(io.LimitReader(resp.Body, limit))
}

// headers sets the request headers of the delivery, in a map sized for
// them whose values share one slice: vals when it has room for them (the
// call's own, in its one allocation), else one made here (a second value
// of a name gets its own).
func (d *Deliverer) headers(req *http.Request, a *idem.Attempt, vals []string) {
	n := 0
	for _, vs := range a.Message.Headers {
		n += len(vs)
	}
	h := make(http.Header, n+6)
	req.Header = h
	if cap(vals) < n+5 {
		vals = make([]string, 0, n+5)
	}
	ct := d.o.ContentType
	for name, vs := range a.Message.Headers {
		if !validHeaderName(name) {
			continue
		}
		key := d.headerKey(name)
		for _, v := range vs {
			if !validHeaderValue(v) {
				continue
			}
			if strings.EqualFold(name, "Content-Type") {
				ct = v
			}
			if prev, ok := h[key]; ok {
				h[key] = append(prev, v) // as Header.Add
				continue
			}
			vals = append(vals, v)
			h[key] = vals[len(vals)-1 : len(vals) : len(vals)]
		}
	}
	// The names are in canonical form already (what Header.Set makes).
	k := len(vals)
	vals = append(vals, ct, a.Message.ID, a.Message.ID, strconv.Itoa(a.Number),
		d.deadlines.Get(time.Now().Add(d.o.Timeout).UnixMilli(), formatDeadline))
	for i, name := range [...]string{"Content-Type", HeaderIdempotencyKey, HeaderMessageID, HeaderAttempt, HeaderDeadline} {
		h[name] = vals[k+i : k+i+1 : k+i+1]
	}
	if d.auth != "" {
		h["Authorization"] = []string{d.auth}
	}
}

// formatDeadline is the Idem-Deadline value of the instant ms (Unix
// milliseconds): RFC 3339 in UTC with milliseconds.
func formatDeadline(ms int64) string {
	return time.UnixMilli(ms).UTC().Format("2006-01-02T15:04:05.000Z07:00")
}

// maxHeaderKeys is how many broker header names a Deliverer keeps the
// request header name of (headerKey): a broker's messages carry a few
// names again and again; past this many, a name's is made each time.
const maxHeaderKeys = 256

// headerKey is the request header of the broker header name:
// HeaderBrokerPrefix and name in canonical form (as Header.Set makes
// it), kept for the next message with the same name (d.keys).
func (d *Deliverer) headerKey(name string) string {
	keys := d.keys.Load()
	if keys != nil {
		if k, ok := (*keys)[name]; ok {
			return k
		}
	}
	k := textproto.CanonicalMIMEHeaderKey(HeaderBrokerPrefix + name)
	if keys == nil || len(*keys) < maxHeaderKeys {
		next := make(map[string]string, 1+len(ptrMap(keys)))
		maps.Copy(next, ptrMap(keys))
		next[strings.Clone(name)] = k
		// A lost race drops one name: made again on its next message.
		d.keys.CompareAndSwap(keys, &next)
	}
	return k
}

// ptrMap is *m, or nil when m is nil.
func ptrMap(m *map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	return *m
}

// validHeaderValue reports whether s can be sent as a field value: no
// control characters but tab.
func validHeaderValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// retryableDeliveryStatus reports whether a service's answer asks for the
// message again later: 409, 429 and 5xx.
func retryableDeliveryStatus(s int) bool {
	return s == http.StatusConflict || s == http.StatusTooManyRequests || s >= 500 && s <= 599
}

// excerpt is the start of a body for an error text: at most 512 bytes,
// one line.
func excerpt(b []byte) string {
	const n = 512
	s := string(b)
	if len(s) > n {
		s = s[:n] + "..."
	}
	return strings.Join(strings.Fields(s), " ")
}

// answer is a recorded outcome of a delivery: the service's answer, or
// why its outcome is unknown.
type answer struct {
	Status      int    `json:"status,omitempty"`
	ContentType string `json:"content_type,omitempty"`
	Body        []byte `json:"body,omitempty"`
	// Unknown, when set, says why the call's outcome is unknown.
	Unknown string `json:"unknown,omitempty"`

	retryAfter string
}

// deadLetterReason is the reason a recorded answer dead-letters its
// message with, every time it is delivered: idem.ReasonOutcomeUnknown
// for an unknown outcome, idem.ReasonPermanent for a status that is not
// 2xx; "" for a 2xx answer, which acknowledges it.
func (a *answer) deadLetterReason() string {
	switch {
	case a.Unknown != "":
		return idem.ReasonOutcomeUnknown
	case a.Status < 200 || a.Status > 299:
		return idem.ReasonPermanent
	}
	return ""
}

// DeadLetterAnswer reports whether a record's stored result, its content
// type and bytes as idemdriver.Inspector's Inspect reads them
// (idemdriver.Record's ContentType and Result), is an answer a Deliverer
// recorded that dead-letters the message, and with which reason:
// idem.ReasonPermanent for a service's status that is not 2xx (a 4xx or
// 3xx refusal), idem.ReasonOutcomeUnknown for a call whose outcome is
// unknown. It is the rule by which the Deliverer settles every
// redelivery of the message. ok is false for a 2xx answer (the message
// was delivered) and for a result that is not a Deliverer's answer
// (another consumer's record, or none). The content type alone does not
// tell: a success is recorded with the same one.
//
// The idem command's replay reopens a record whose result is such an
// answer (idemdriver.Reopener), so that the replayed message calls the
// service again; it refuses a record holding a success.
func DeadLetterAnswer(contentType string, result []byte) (reason string, ok bool) {
	ans, err := decodeAnswer(contentType, result)
	if err != nil {
		return "", false
	}
	reason = ans.deadLetterReason()
	return reason, reason != ""
}

// encodeAnswer is the record of a: what json.Marshal makes of it, byte
// for byte, written by hand when its strings need no escaping (the
// usual answer: a status, maybe a plain content type and a body), else
// by json.Marshal.
func encodeAnswer(a *answer) idem.Result {
	if !plainJSON(a.ContentType) || !plainJSON(a.Unknown) {
		b, _ := json.Marshal(a) // cannot fail: plain fields
		return idem.Result{Body: b, ContentType: answerContentType}
	}
	n := 2 // the braces
	if a.Status != 0 {
		n += len(`"status":,`) + 20
	}
	if a.ContentType != "" {
		n += len(`"content_type":"",`) + len(a.ContentType)
	}
	if len(a.Body) > 0 {
		n += len(`"body":"",`) + base64.StdEncoding.EncodedLen(len(a.Body))
	}
	if a.Unknown != "" {
		n += len(`"unknown":"",`) + len(a.Unknown)
	}
	b := make([]byte, 0, n)
	sep := byte('{')
	field := func(name string) {
		b = append(b, sep, '"')
		b = append(b, name...)
		b = append(b, '"', ':')
		sep = ','
	}
	if a.Status != 0 {
		field("status")
		b = strconv.AppendInt(b, int64(a.Status), 10)
	}
	if a.ContentType != "" {
		field("content_type")
		b = append(append(append(b, '"'), a.ContentType...), '"')
	}
	if len(a.Body) > 0 {
		field("body")
		b = append(base64.StdEncoding.AppendEncode(append(b, '"'), a.Body), '"')
	}
	if a.Unknown != "" {
		field("unknown")
		b = append(append(append(b, '"'), a.Unknown...), '"')
	}
	if sep == '{' {
		b = append(b, '{')
	}
	b = append(b, '}')
	return idem.Result{Body: b, ContentType: answerContentType}
}

// plainJSON reports whether json.Marshal writes s as it is between its
// quotes: printable ASCII without a quote, a backslash or the characters
// it escapes for HTML (<, >, &).
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c > 0x7e, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}

func decodeAnswer(contentType string, b []byte) (*answer, error) {
	var a answer
	if contentType != answerContentType || json.Unmarshal(b, &a) != nil || (a.Unknown == "" && a.Status == 0) {
		return nil, fmt.Errorf("idemhttp: the message's record holds no delivery answer (content type %q): is another consumer using the same name?", contentType)
	}
	return &a, nil
}
