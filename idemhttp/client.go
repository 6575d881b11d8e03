package idemhttp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/keyed"
)

// Client defaults, applied by NewTransport to zero TransportOptions fields.
const (
	// DefaultClientMaxAttempts is how many times one logical operation is
	// sent at most, the first attempt included.
	DefaultClientMaxAttempts = 5
	// DefaultClientMaxElapsed bounds one logical operation, waits included:
	// no retry starts that would begin later than this after the first.
	DefaultClientMaxElapsed = time.Minute
	// DefaultClientInitialInterval is the ceiling of the first backoff.
	DefaultClientInitialInterval = 100 * time.Millisecond
	// DefaultClientMaxInterval caps the backoff ceiling.
	DefaultClientMaxInterval = 10 * time.Second
	// DefaultClientMultiplier is the growth of the backoff ceiling per retry.
	DefaultClientMultiplier = 2.0
	// DefaultClientMaxRetryAfter caps the wait a server asks for with
	// Retry-After.
	DefaultClientMaxRetryAfter = 30 * time.Second
	// DefaultRetryBudgetRatio is the share of first attempts that may be
	// retried once the budget's burst is spent.
	DefaultRetryBudgetRatio = 0.2
	// DefaultRetryBudgetBurst is the retries a fresh budget allows.
	DefaultRetryBudgetBurst = 10
)

// maxProblemPeek is the most of a 409 response body the client reads to
// learn its problem type.
const maxProblemPeek = 64 << 10

// maxDrain is the most of a discarded response body the client reads so
// the connection can be reused.
const maxDrain = 64 << 10

// inProgressSuffix ends the problem type of the 409 a duplicate gets while
// the first request is still running.
const inProgressSuffix = "request-in-progress"

// ErrBodyNotReplayable means a retry was warranted but the request body
// could not be sent again: the request has a Body but no GetBody
// (http.NewRequest sets GetBody for *bytes.Buffer, *bytes.Reader and
// *strings.Reader bodies). The error of the one attempt made is wrapped
// too.
var ErrBodyNotReplayable = errors.New("idemhttp: request body cannot be replayed for a retry")

// RetryError is returned by Transport.RoundTrip when every attempt of a
// logical operation failed without a response (network errors) and the
// retry budget is spent. Key is the idempotency key all the attempts
// carried: a later retry by the caller with the same key is still
// deduplicated by the server. Err is the last attempt's error.
type RetryError struct {
	// Key is the Idempotency-Key value every attempt sent.
	Key string
	// Attempts is how many times the request was sent.
	Attempts int
	// Err is the last attempt's error.
	Err error
}

// Error implements error.
func (e *RetryError) Error() string {
	return fmt.Sprintf("idemhttp: %d attempt(s) with Idempotency-Key %q failed: %v", e.Attempts, e.Key, e.Err)
}

// Unwrap returns the last attempt's error.
func (e *RetryError) Unwrap() error { return e.Err }

// TransportOptions configures a Transport. The zero value is usable: every
// zero field takes the default named in its comment.
type TransportOptions struct {
	// Base sends each attempt. Defaults to http.DefaultTransport.
	Base http.RoundTripper
	// Methods are the methods that get an idempotency key and retries.
	// Defaults to POST and PATCH, the methods the middleware protects by
	// default. A request that already carries an
	// Idempotency-Key header is retried whatever its method; any other
	// request is sent once, untouched.
	Methods []string
	// NewKey makes the key of a logical operation that has none. Defaults
	// to a UUIDv7 (RFC 9562), sent as an RFC 9651 sf-string ("...").
	NewKey func() (string, error)
	// MaxAttempts is the most times one operation is sent, the first
	// included; 1 disables retries. Defaults to DefaultClientMaxAttempts.
	MaxAttempts int
	// MaxElapsed bounds an operation's retries: no retry is started that
	// would begin more than MaxElapsed after the first attempt. Defaults
	// to DefaultClientMaxElapsed; the request's context bounds it too.
	MaxElapsed time.Duration
	// InitialInterval, Multiplier and MaxInterval shape the exponential
	// backoff: before retry n (n = 1, 2, ...) the client waits a uniformly
	// random time in [0, min(MaxInterval, InitialInterval *
	// Multiplier^(n-1))] ("full jitter", AWS Architecture Blog,
	// "Exponential Backoff And Jitter"). Defaults:
	// DefaultClientInitialInterval, DefaultClientMultiplier,
	// DefaultClientMaxInterval.
	InitialInterval time.Duration
	Multiplier      float64
	MaxInterval     time.Duration
	// MaxRetryAfter caps the wait a response's Retry-After header (delay
	// seconds or an HTTP-date, RFC 9110 section 10.2.3) asks for; the
	// server's wait replaces the backoff for that retry. Defaults to
	// DefaultClientMaxRetryAfter.
	MaxRetryAfter time.Duration
	// Budget limits retries across all operations of the Transport, so an
	// outage does not multiply the load by MaxAttempts. Defaults to a
	// budget of DefaultRetryBudgetBurst retries plus
	// DefaultRetryBudgetRatio per operation; set a *RetryBudget to share
	// one between transports, or DisableBudget to retry without one.
	Budget *RetryBudget
	// DisableBudget turns the shared retry budget off (Budget is ignored).
	DisableBudget bool
	// OnRetry, if set, is called before each wait for a retry with the
	// operation's key, the attempt just made (1 for the first), the
	// reason (an error, or the status of the response) and the wait.
	OnRetry func(key string, attempt int, reason error, wait time.Duration)
}

// RetryBudget is a token bucket shared by the operations of one or more
// Transports (Finagle's retry budget, gRPC's retry throttling): each
// operation deposits Ratio of a retry, each retry withdraws one, and the
// balance is capped at Burst. When the balance is below one, failed
// attempts are returned to the caller instead of being retried. Safe for
// concurrent use.
type RetryBudget struct {
	ratio, burst float64
	mu           sync.Mutex
	balance      float64
}

// NewRetryBudget returns a full budget of burst retries that refills by
// ratio per operation. ratio must be in [0, 1000] and burst in [1, 1e9];
// otherwise the error matches idem.ErrInvalidConfig.
func NewRetryBudget(ratio float64, burst int) (*RetryBudget, error) {
	if !(ratio >= 0 && ratio <= 1000) || burst < 1 || burst > 1e9 {
		return nil, fmt.Errorf("%w: retry budget ratio %v burst %d, want ratio in [0, 1000] and burst in [1, 1e9]", idem.ErrInvalidConfig, ratio, burst)
	}
	return &RetryBudget{ratio: ratio, burst: float64(burst), balance: float64(burst)}, nil
}

// deposit credits one operation.
func (b *RetryBudget) deposit() {
	b.mu.Lock()
	b.balance = min(b.burst, b.balance+b.ratio)
	b.mu.Unlock()
}

// withdraw takes one retry, reporting false if the budget is spent.
func (b *RetryBudget) withdraw() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.balance < 1 {
		return false
	}
	b.balance--
	return true
}

// Transport is an http.RoundTripper that makes a request safe to retry and
// retries it: each logical operation (one RoundTrip call) gets one
// Idempotency-Key, sent unchanged on every attempt, so a server behind the
// idemhttp middleware or `idem proxy` runs it at most once however many
// attempts reach it (the design; Stripe's client libraries behave
// the same way).
//
// The key is, in order: the request's own Idempotency-Key header; the key
// put in the request's context with ContextWithKey; or a new one from
// TransportOptions.NewKey (a UUIDv7 by default).
//
// An attempt is retried when it fails with a network error (a refused or
// reset connection, an EOF, a timeout that is not the request context's),
// or when its answer says so. A Stripe-Should-Retry header (which every
// problem answer of this package's middleware and proxy carries) decides
// alone, as in Stripe's client libraries: "true" is retried (409
// request-in-progress and idempotency-lease-lost, 503 unavailable, 500
// handler-panic, 502 upstream-unavailable), "false" is not (the final
// answers: 500 request-outcome-unknown and idempotency-record-corrupt,
// 502 upstream-outcome-unknown, every 4xx). Without the header: 409 whose
// problem type is request-in-progress, 429, or any 5xx. Nothing else is
// retried: not another 4xx, not a 409 of another type, not 422 (the key was
// reused with another request). Waits follow exponential backoff with full jitter (from
// github.com/cenkalti/backoff/v5), or the response's Retry-After, capped at
// MaxRetryAfter. Retries stop at MaxAttempts, at MaxElapsed, when the shared
// RetryBudget is spent, or when the request's context is done; the last
// response (its body unread) or a *RetryError is then returned.
//
// The request body is sent again through Request.GetBody; a request with a
// body and no GetBody is sent once (see ErrBodyNotReplayable). The bodies of
// retried responses are drained (up to 64 KiB) and closed. The request is
// not modified: each attempt sends a clone.
type Transport struct {
	opts    TransportOptions
	methods map[string]bool
}

// NewTransport returns a Transport with opts (nil: all defaults). Values
// out of range return an error matching idem.ErrInvalidConfig.
func NewTransport(opts *TransportOptions) (*Transport, error) {
	var o TransportOptions
	if opts != nil {
		o = *opts
	}
	if o.Base == nil {
		o.Base = http.DefaultTransport
	}
	if o.Methods == nil {
		o.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	if o.NewKey == nil {
		o.NewKey = newUUIDv7Key
	}
	if o.MaxAttempts == 0 {
		o.MaxAttempts = DefaultClientMaxAttempts
	}
	if o.MaxElapsed == 0 {
		o.MaxElapsed = DefaultClientMaxElapsed
	}
	if o.InitialInterval == 0 {
		o.InitialInterval = DefaultClientInitialInterval
	}
	if o.Multiplier == 0 {
		o.Multiplier = DefaultClientMultiplier
	}
	if o.MaxInterval == 0 {
		o.MaxInterval = DefaultClientMaxInterval
	}
	if o.MaxRetryAfter == 0 {
		o.MaxRetryAfter = DefaultClientMaxRetryAfter
	}
	switch {
	case o.MaxAttempts < 1:
		return nil, fmt.Errorf("%w: MaxAttempts %d, want >= 1", idem.ErrInvalidConfig, o.MaxAttempts)
	case o.MaxElapsed < 0, o.InitialInterval < 0, o.MaxInterval < 0, o.MaxRetryAfter < 0:
		return nil, fmt.Errorf("%w: negative duration in TransportOptions", idem.ErrInvalidConfig)
	case !(o.Multiplier >= 1 && o.Multiplier <= 100):
		return nil, fmt.Errorf("%w: Multiplier %v, want 1..100", idem.ErrInvalidConfig, o.Multiplier)
	case o.MaxInterval < o.InitialInterval:
		return nil, fmt.Errorf("%w: MaxInterval %v below InitialInterval %v", idem.ErrInvalidConfig, o.MaxInterval, o.InitialInterval)
	}
	if o.DisableBudget {
		o.Budget = nil
	} else if o.Budget == nil {
		o.Budget, _ = NewRetryBudget(DefaultRetryBudgetRatio, DefaultRetryBudgetBurst)
	}
	t := &Transport{opts: o, methods: map[string]bool{}}
	for _, m := range o.Methods {
		t.methods[strings.ToUpper(m)] = true
	}
	return t, nil
}

// NewClient returns an *http.Client whose Transport is NewTransport(opts).
// Its Timeout is zero: bound each operation, retries included, with the
// request's context.
func NewClient(opts *TransportOptions) (*http.Client, error) {
	t, err := NewTransport(opts)
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: t}, nil
}

type clientKeyCtx struct{}

// ContextWithKey returns a context that makes Transport send key as the
// Idempotency-Key of the requests made with it, instead of a generated
// one: use a business key (an order ID) or a key saved before a crash, so
// an operation retried by a new process is still deduplicated. key is sent
// as given (quote it, as in `"order-42"`, for the strict sf-string form); a
// request's own Idempotency-Key header wins over it.
func ContextWithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, clientKeyCtx{}, key)
}

// newUUIDv7Key returns a UUIDv7 as an RFC 9651 sf-string.
func newUUIDv7Key() (string, error) {
	u, err := uuid.NewV7()
	if err != nil {
		return "", err
	}
	return `"` + u.String() + `"`, nil
}

// retryStatusError is the retry reason for a response that warrants one.
type retryStatusError struct {
	status int
}

func (e *retryStatusError) Error() string {
	return fmt.Sprintf("idemhttp: response %d %s", e.status, http.StatusText(e.status))
}

// RoundTrip sends req as one logical operation with one idempotency key,
// retrying it as the Transport's doc says. It implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	key := req.Header.Get(HeaderIdempotencyKey)
	_, hasHeader := req.Header[HeaderIdempotencyKey]
	if !hasHeader && !t.methods[req.Method] {
		return t.opts.Base.RoundTrip(req)
	}
	ctx := req.Context()
	if !hasHeader {
		if k, ok := ctx.Value(clientKeyCtx{}).(string); ok && k != "" {
			key = k
		} else {
			k, err := t.opts.NewKey()
			if err != nil {
				if req.Body != nil {
					req.Body.Close()
				}
				return nil, fmt.Errorf("idemhttp: new idempotency key: %w", err)
			}
			key = k
		}
	}
	if t.opts.Budget != nil {
		t.opts.Budget.deposit()
	}
	replayable := req.Body == nil || req.Body == http.NoBody || req.GetBody != nil

	var (
		attempts    int
		prev        *http.Response // the last response, open until the next attempt
		notRetried  bool           // a retry was warranted but the body cannot be replayed
		budgetSpent bool
	)
	op := func() (*http.Response, error) {
		if prev != nil {
			drainClose(prev.Body)
			prev = nil
		}
		attempts++
		r := req.Clone(ctx)
		if r.Header == nil {
			r.Header = http.Header{}
		}
		if !hasHeader {
			r.Header.Set(HeaderIdempotencyKey, key)
		}
		if attempts > 1 && req.Body != nil && req.Body != http.NoBody {
			body, err := req.GetBody()
			if err != nil {
				return nil, backoff.Permanent(fmt.Errorf("idemhttp: rewind request body: %w", err))
			}
			r.Body = body
		}
		resp, err := t.opts.Base.RoundTrip(r)
		if err != nil {
			if !retryableError(ctx, err) {
				return nil, backoff.Permanent(err)
			}
			if !replayable {
				notRetried = true
				return nil, backoff.Permanent(err)
			}
			if !t.spend(attempts) {
				budgetSpent = true
				return nil, backoff.Permanent(err)
			}
			return nil, err
		}
		if !t.retryableResponse(resp) {
			return resp, nil
		}
		if !replayable || !t.spend(attempts) {
			return resp, nil
		}
		prev = resp
		reason := error(&retryStatusError{status: resp.StatusCode})
		if d, ok := retryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
			return resp, &backoff.RetryAfterError{Duration: min(d, t.opts.MaxRetryAfter)}
		}
		return resp, reason
	}
	opts := []backoff.RetryOption{
		backoff.WithBackOff(t.newBackOff()),
		backoff.WithMaxTries(uint(t.opts.MaxAttempts)),
		backoff.WithMaxElapsedTime(t.opts.MaxElapsed),
	}
	if t.opts.OnRetry != nil {
		opts = append(opts, backoff.WithNotify(func(err error, wait time.Duration) {
			t.opts.OnRetry(key, attempts, err, wait)
		}))
	}
	resp, err := backoff.Retry(ctx, op, opts...)
	if pe, ok := err.(*backoff.PermanentError); ok {
		err = pe.Err
	}
	if resp != nil {
		if err == nil || (isRetryReason(err) && ctx.Err() == nil) {
			// A response ends the operation, whether it succeeded or was
			// the last retryable one the budget allowed: the caller reads it.
			return resp, nil
		}
		drainClose(resp.Body) // the context ended during a wait
	}
	if err == nil {
		err = errors.New("idemhttp: no response")
	}
	if notRetried {
		err = fmt.Errorf("%w: %w", ErrBodyNotReplayable, err)
	} else if attempts == 1 && !budgetSpent {
		return nil, err // sent once, as a plain transport would
	}
	return nil, &RetryError{Key: key, Attempts: attempts, Err: err}
}

// spend asks the budget for a retry after attempt, if another attempt is
// allowed at all.
func (t *Transport) spend(attempt int) bool {
	if attempt >= t.opts.MaxAttempts {
		return true // the last attempt: Retry stops anyway, no token spent
	}
	return t.opts.Budget == nil || t.opts.Budget.withdraw()
}

// isRetryReason reports whether err is the reason a response was retried
// (so the response itself is the result to return).
func isRetryReason(err error) bool {
	var rs *retryStatusError
	var ra *backoff.RetryAfterError
	return errors.As(err, &rs) || errors.As(err, &ra)
}

// retryableResponse reports whether resp asks for a retry: what its
// Stripe-Should-Retry header says, or else 429, any 5xx, or a 409 whose
// problem type is request-in-progress. It reads at most maxProblemPeek
// bytes of a 409 body and puts them back.
func (t *Transport) retryableResponse(resp *http.Response) bool {
	switch strings.ToLower(strings.TrimSpace(resp.Header.Get(HeaderShouldRetry))) {
	case "true":
		return true
	case "false":
		return false
	}
	switch {
	case resp.StatusCode == http.StatusTooManyRequests, resp.StatusCode >= 500 && resp.StatusCode <= 599:
		return true
	case resp.StatusCode != http.StatusConflict:
		return false
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt != "application/problem+json" || resp.Body == nil {
		return false
	}
	peek, err := io.ReadAll(io.LimitReader(resp.Body, maxProblemPeek))
	resp.Body = &peekedBody{Reader: io.MultiReader(bytes.NewReader(peek), resp.Body), Closer: resp.Body}
	if err != nil {
		return false
	}
	var p struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(peek, &p) != nil {
		return false
	}
	return strings.HasSuffix(p.Type, inProgressSuffix)
}

// peekedBody is a response body with its first bytes read and put back.
type peekedBody struct {
	io.Reader
	io.Closer
}

// retryableError reports whether err, from sending an attempt, is a network
// failure worth a retry: not the request context's own cancellation or
// deadline, and not a malformed request.
func retryableError(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		// A timeout of the transport (not the caller's context) is a
		// network error; the caller's is handled above.
		var ne net.Error
		return errors.As(err, &ne) && ne.Timeout()
	}
	var ne net.Error
	var oe *net.OpError
	switch {
	case errors.As(err, &oe), errors.As(err, &ne):
		return true
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.ECONNABORTED):
		return true
	}
	// net/http reports a connection closed before the response as a plain
	// error in some paths ("server closed idle connection" and the like),
	// and a pooled connection closed under the request, by the server or
	// by CloseIdleConnections on a shared transport (httptest.Server.Close
	// calls it on http.DefaultTransport), as "transport connection broken".
	msg := err.Error()
	return strings.Contains(msg, "connection reset") || strings.Contains(msg, "server closed") ||
		strings.Contains(msg, "broken pipe") || strings.Contains(msg, "transport connection broken")
}

// retryAfter parses a Retry-After value: delay seconds or an HTTP-date
// (RFC 9110 section 10.2.3), relative to now. A date in the past is a zero
// wait.
func retryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return 0, false
		}
		if n > int64(365*24*time.Hour/time.Second) {
			n = int64(365 * 24 * time.Hour / time.Second)
		}
		return time.Duration(n) * time.Second, true
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(0, at.Sub(now)), true
}

// newBackOff returns the backoff schedule of one operation.
func (t *Transport) newBackOff() backoff.BackOff {
	return &keyed.FullJitter{Initial: t.opts.InitialInterval, Multiplier: t.opts.Multiplier, Max: t.opts.MaxInterval}
}

// drainClose reads what is left of a body, up to maxDrain, and closes it.
func drainClose(body io.ReadCloser) {
	if body == nil {
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(body, maxDrain))
	body.Close()
}
