package idemhttp

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// Proxy defaults, applied by NewProxy to zero ProxyOptions fields.
const (
	// DefaultProxyScopeHeader is the request header whose value (hashed)
	// scopes the keys of a Proxy: the credentials of the caller.
	DefaultProxyScopeHeader = "Authorization"
	// DefaultProxyHealthPath is the path a Proxy answers itself with its
	// store's health, instead of forwarding it.
	DefaultProxyHealthPath = "/healthz"
	// DefaultUpstreamTimeout bounds one forwarded request, from sending it
	// to the end of the upstream response body. It is not shortened when
	// the client hangs up: the response is still read and stored.
	DefaultUpstreamTimeout = 60 * time.Second
	// DefaultUpstreamDialTimeout bounds connecting to the upstream.
	DefaultUpstreamDialTimeout = 5 * time.Second
	// DefaultUpstreamIdleTimeout is how long an idle upstream connection is
	// kept for reuse. It is short on purpose, below the keep-alive timeout
	// of common servers (Node's 5 s, Gunicorn's 2 s): a request sent on a
	// connection the upstream is closing at that moment ends in an unknown
	// outcome, since the proxy cannot tell whether it was processed.
	DefaultUpstreamIdleTimeout = 1500 * time.Millisecond
	// DefaultHealthTimeout bounds the store check of the health endpoint.
	DefaultHealthTimeout = 2 * time.Second
	// MinScopeSecretBytes is the shortest ProxyOptions.ScopeSecret
	// accepted: a shorter key could itself be guessed offline.
	MinScopeSecretBytes = 16
)

// Problem types of the proxy, beside the middleware's.
const (
	// ProblemUpstreamUnavailable: 502 with Retry-After, the upstream could
	// not be reached (connection refused, DNS failure, dial timeout) and
	// nothing was sent to it. The key is released: the retry is forwarded.
	ProblemUpstreamUnavailable = ProblemTypeBase + "upstream-unavailable"
	// ProblemUpstreamOutcomeUnknown: 502, the request was sent to the
	// upstream but the connection failed (reset, EOF, timeout) before its
	// response was complete, so whether the upstream acted on it is
	// unknown; or an earlier attempt was forwarded and its proxy was killed
	// (or lost its store) before recording the response. By default this
	// answer is stored and replayed to every retry, so the request is never
	// sent twice; the caller must find out the outcome another way (a GET
	// on the resource).
	ProblemUpstreamOutcomeUnknown = ProblemTypeBase + "upstream-outcome-unknown"
)

// Sentinels of the proxy's problem types (see Problem.Is).
var (
	// ErrUpstreamUnavailable matches a ProblemUpstreamUnavailable answer:
	// nothing reached the upstream; retry with the same key.
	ErrUpstreamUnavailable = errors.New("idemhttp: upstream unavailable")
	// ErrUpstreamOutcomeUnknown matches a ProblemUpstreamOutcomeUnknown
	// answer: the upstream may have acted; a retry with the same key gets
	// the same answer (StoreUnknownOutcome).
	ErrUpstreamOutcomeUnknown = errors.New("idemhttp: upstream outcome unknown")
)

func init() {
	problemErrs[ProblemUpstreamUnavailable] = ErrUpstreamUnavailable
	problemErrs[ProblemUpstreamOutcomeUnknown] = ErrUpstreamOutcomeUnknown
}

// UnknownOutcomePolicy says what a Proxy does with a request whose upstream
// outcome is unknown (the connection failed after the request was sent).
type UnknownOutcomePolicy uint8

const (
	// StoreUnknownOutcome (the default) stores a 502
	// upstream-outcome-unknown answer for the key: every retry replays it
	// and the request reaches the upstream at most once, across crashes of
	// the proxy too (Options.AfterCrash becomes AnswerUnknownAfterCrash).
	StoreUnknownOutcome UnknownOutcomePolicy = iota
	// ReleaseUnknownOutcome releases the key: the retry is forwarded
	// again, so an upstream that did act on the first request may act
	// twice; after a crash of the proxy the retry is forwarded too
	// (RunAgainAfterCrash). For upstreams that deduplicate by the
	// forwarded Idempotency-Key themselves.
	ReleaseUnknownOutcome
)

// ProxyOptions configures a Proxy. Zero values take the defaults named in
// the comments.
type ProxyOptions struct {
	// Options configures the idempotency middleware in front of the
	// upstream (methods, key rules, limits, lease, wait mode, retention,
	// store policies). Two fields differ from New's: Namespace defaults to
	// the upstream's host:port, and Scope defaults to the value of
	// ScopeHeader. Options.ReleaseStatus decides which upstream statuses
	// are stored: by default 5xx, 408 and 429 release the key.
	Options Options
	// ScopeHeader names the request header that scopes keys when
	// Options.Scope is nil: its values, joined, keyed with ScopeSecret
	// (HMAC-SHA-256; without a secret, plain SHA-256), are the principal;
	// the credential itself never reaches the store. Defaults
	// to DefaultProxyScopeHeader ("Authorization"). A request without it
	// is handled by Options.Unscoped (401 by default). The scope must stay
	// the same across a client's retries: behind an auth gateway that
	// sets a stable principal header (X-User-ID), prefer it to short-lived
	// bearer tokens, which change when they are refreshed and would make
	// a retry after a refresh look like a new request.
	ScopeHeader string
	// ScopeSecret is the per-deployment key of the scope (at least
	// MinScopeSecretBytes bytes; `idem proxy --scope-secret` or
	// IDEM_SCOPE_SECRET): the scope is the HMAC-SHA-256 of the ScopeHeader
	// values under it ([HMACHeaderScope]), so whoever can read the store
	// cannot test guesses of the credentials offline (a Basic password, a
	// short API key) without the secret too. It applies to the ScopeHeader
	// scope only: setting it with Options.Scope is an error. Every proxy
	// sharing a store's namespace must use the same secret.
	//
	// Without a secret the scope is the unkeyed SHA-256 of the header
	// values ([HeaderScope]), as in earlier versions, and NewProxy logs a
	// warning (once) on Options.Logger. Introducing or changing the secret
	// changes every scope: keys recorded before no longer match, so a
	// retry of a request sent before the change, within the retention
	// window, is forwarded again instead of replayed, and a request in
	// flight at the change can run twice. See the package doc, "Keying the
	// proxy's scope", for how to roll it out.
	ScopeSecret []byte
	// Transport sends requests upstream. Defaults to an *http.Transport
	// with DialTimeout, UpstreamIdleTimeout and HTTP/2 when the upstream
	// offers it over TLS.
	Transport http.RoundTripper
	// UpstreamTimeout bounds one forwarded request until its response body
	// has been read. Defaults to DefaultUpstreamTimeout.
	UpstreamTimeout time.Duration
	// DialTimeout bounds connecting to the upstream (default Transport
	// only). Defaults to DefaultUpstreamDialTimeout.
	DialTimeout time.Duration
	// UpstreamIdleTimeout is how long idle upstream connections are kept
	// (default Transport only). Defaults to DefaultUpstreamIdleTimeout.
	UpstreamIdleTimeout time.Duration
	// UnknownOutcome is the policy for a request whose upstream outcome
	// is unknown. Defaults to StoreUnknownOutcome.
	UnknownOutcome UnknownOutcomePolicy
	// StripKey removes the Idempotency-Key header from requests sent
	// upstream. By default it is forwarded unchanged, so an upstream that
	// understands keys can use them too.
	StripKey bool
	// HealthPath is the path answered by the proxy itself with the health
	// of its store: 200 {"status":"ok"}, or 503 {"status":"unavailable"}
	// when Health fails. The body is fixed: the reason (the store's error,
	// which may name a database, a user or an internal address) goes to
	// Options.Logger at warn level, never to the client. Defaults to
	// DefaultProxyHealthPath; "-" forwards every path.
	HealthPath string
	// Health checks that the store is reachable (a ping), bounded by
	// DefaultHealthTimeout. Nil: the health endpoint always reports ok.
	Health func(ctx context.Context) error
	// InjectHeaders, when set, writes headers onto each request forwarded
	// upstream from its context, after the incoming headers were copied:
	// idemotel.InjectTraceContext writes the traceparent of the
	// idempotency span, so the upstream's spans continue the trace. Without
	// it the incoming traceparent is forwarded unchanged.
	InjectHeaders idem.HeaderInjector
}

// Proxy is a reverse proxy that puts the idempotency middleware in front of
// any HTTP service: `idem proxy` serves one. A request with an
// Idempotency-Key is forwarded once per (scope, key); its retries replay the
// stored upstream response without reaching the upstream.
//
// The upstream outcome is classified so that a request reaches the upstream
// at most once per key:
//   - nothing sent (connection refused, DNS failure, dial or TLS failure):
//     502 upstream-unavailable, the key is released and the retry is
//     forwarded;
//   - sent, then the connection failed before the response was complete
//     (reset, EOF, timeout): 502 upstream-outcome-unknown, stored under the
//     key by default (UnknownOutcomePolicy);
//   - a response: stored or released by Options.ReleaseStatus, as the
//     middleware does for a handler;
//   - the proxy was killed (or lost its store) while the upstream worked:
//     before forwarding, the attempt recorded a recovery point under its
//     fencing token (Options.AfterCrash is AnswerUnknownAfterCrash), so
//     the retry that takes the key over when the lease runs out answers
//     502 upstream-outcome-unknown, stored, instead of forwarding again.
//     A final write (recording the response) that fails is retried with
//     backoff while the lease is held; if the lease is lost first, the
//     client gets 503 idempotency-unavailable and its retries get
//     upstream-outcome-unknown.
//
// With ReleaseUnknownOutcome (`idem proxy --release-unknown`) both unknown
// cases release the key instead: at least once, for upstreams that
// deduplicate by the forwarded Idempotency-Key themselves.
//
// The upstream response is read to its end and recorded even when the
// client hangs up: the forwarded request runs on a context detached from the
// client's, bounded by UpstreamTimeout. A response is held by the proxy
// until its body is complete (up to Options.MaxResponseBytes) so that a
// failure in the middle of the body can still become upstream-outcome-unknown;
// Server-Sent Events (text/event-stream) and larger bodies are streamed, and
// a failure after streaming began aborts the client's connection (it never
// sees a short body as complete) while the key is handled as any unknown
// outcome: by default upstream-outcome-unknown is stored and replayed.
//
// Requests with methods the middleware does not cover (GET, by default)
// and requests without a key are forwarded as a plain reverse proxy would.
type Proxy struct {
	mw          *Middleware
	handler     http.Handler
	rp          *httputil.ReverseProxy
	transport   http.RoundTripper
	ownedTr     *http.Transport
	timeout     time.Duration
	healthPath  string
	health      func(ctx context.Context) error
	unknown     UnknownOutcomePolicy
	holdLimit   int64
	maxReqBytes int64
	stripKey    bool
	closeOnce   sync.Once
}

// NewProxy returns a Proxy forwarding to upstream (an absolute http or
// https URL; its path prefixes every forwarded path) with keys recorded in
// store. opts may be nil (all defaults). Errors match idem.ErrInvalidConfig
// (and ErrInvalidOptions for middleware options). Close it to stop the
// middleware's background loops and the upstream connections.
func NewProxy(upstream *url.URL, store idemdriver.LeaseStore, opts *ProxyOptions) (*Proxy, error) {
	if upstream == nil || (upstream.Scheme != "http" && upstream.Scheme != "https") || upstream.Host == "" {
		return nil, fmt.Errorf("%w: upstream %v: want an absolute http:// or https:// URL", idem.ErrInvalidConfig, upstream)
	}
	if store == nil {
		return nil, fmt.Errorf("%w: nil store", idem.ErrInvalidConfig)
	}
	var o ProxyOptions
	if opts != nil {
		o = *opts
	}
	if o.ScopeHeader == "" {
		o.ScopeHeader = DefaultProxyScopeHeader
	}
	if o.UpstreamTimeout == 0 {
		o.UpstreamTimeout = DefaultUpstreamTimeout
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = DefaultUpstreamDialTimeout
	}
	if o.UpstreamIdleTimeout == 0 {
		o.UpstreamIdleTimeout = DefaultUpstreamIdleTimeout
	}
	if o.HealthPath == "" {
		o.HealthPath = DefaultProxyHealthPath
	}
	switch {
	case o.UpstreamTimeout < 0, o.DialTimeout < 0, o.UpstreamIdleTimeout < 0:
		return nil, fmt.Errorf("%w: negative proxy timeout", idem.ErrInvalidConfig)
	case o.UnknownOutcome > ReleaseUnknownOutcome:
		return nil, fmt.Errorf("%w: unknown UnknownOutcome policy %d", idem.ErrInvalidConfig, o.UnknownOutcome)
	case o.HealthPath != "-" && !strings.HasPrefix(o.HealthPath, "/"):
		return nil, fmt.Errorf("%w: HealthPath %q must start with /", idem.ErrInvalidConfig, o.HealthPath)
	case strings.ContainsAny(o.ScopeHeader, " \t\r\n:"):
		return nil, fmt.Errorf("%w: ScopeHeader %q is not a header name", idem.ErrInvalidConfig, o.ScopeHeader)
	case len(o.ScopeSecret) > 0 && len(o.ScopeSecret) < MinScopeSecretBytes:
		return nil, fmt.Errorf("%w: ScopeSecret has %d bytes, want at least %d", idem.ErrInvalidConfig, len(o.ScopeSecret), MinScopeSecretBytes)
	case len(o.ScopeSecret) > 0 && o.Options.Scope != nil:
		return nil, fmt.Errorf("%w: ScopeSecret keys the ScopeHeader scope; Options.Scope replaces it", idem.ErrInvalidConfig)
	}
	mo := o.Options
	if mo.Namespace == "" {
		mo.Namespace = "proxy:" + upstream.Host
	}
	if mo.Scope == nil {
		if len(o.ScopeSecret) > 0 {
			mo.Scope = HMACHeaderScope(o.ScopeHeader, o.ScopeSecret)
		} else {
			mo.Scope = HeaderScope(o.ScopeHeader)
			cmp.Or(mo.Logger, slog.Default()).Warn("idemhttp: the proxy's scope is not keyed: it is the plain SHA-256 of the "+o.ScopeHeader+
				" header, so whoever can read the store can test guesses of the credentials offline; set a scope secret (ProxyOptions.ScopeSecret, idem proxy --scope-secret or IDEM_SCOPE_SECRET)",
				"namespace", mo.Namespace)
		}
	}
	// The proxy's guarantee holds across its own crashes too: unless the
	// operator chose at least once, a recovery point is recorded before
	// the request is forwarded, and an attempt that takes over a key
	// whose forwarding never ended answers upstream-outcome-unknown.
	mo.AfterCrash = AnswerUnknownAfterCrash
	if o.UnknownOutcome == ReleaseUnknownOutcome {
		mo.AfterCrash = RunAgainAfterCrash
	}
	mw, err := New(store, mo)
	if err != nil {
		return nil, err
	}
	p := &Proxy{
		mw:         mw,
		timeout:    o.UpstreamTimeout,
		healthPath: o.HealthPath,
		health:     o.Health,
		unknown:    o.UnknownOutcome,
		stripKey:   o.StripKey,
	}
	p.holdLimit = mo.MaxResponseBytes
	if p.holdLimit <= 0 {
		p.holdLimit = DefaultMaxResponseBytes
	}
	p.maxReqBytes = mo.MaxRequestBytes
	if p.maxReqBytes <= 0 {
		p.maxReqBytes = DefaultMaxRequestBytes
	}
	p.transport = o.Transport
	if p.transport == nil {
		p.ownedTr = newUpstreamTransport(o.DialTimeout, o.UpstreamIdleTimeout)
		p.transport = p.ownedTr
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			pr.SetXForwarded()
			if p.stripKey {
				pr.Out.Header.Del(HeaderIdempotencyKey)
			}
			if inject := o.InjectHeaders; inject != nil {
				inject(pr.Out.Context(), pr.Out.Header.Set)
			}
		},
		Transport:      noInternalRetry{p.transport},
		BufferPool:     copyBuffers{},
		ErrorHandler:   p.upstreamError,
		ModifyResponse: p.guardBody,
		ErrorLog:       slog.NewLogLogger(cmp.Or(mo.Logger, slog.Default()).Handler(), slog.LevelWarn),
	}
	mw.unknown = func() *Problem {
		return &Problem{
			Type:   ProblemUpstreamOutcomeUnknown,
			Title:  "Upstream outcome unknown",
			Status: http.StatusBadGateway,
			Detail: "an earlier attempt with this Idempotency-Key was forwarded to the upstream and never recorded its response (the proxy stopped or lost its store); the upstream may have processed it. This answer is stored for the key: retries get it too",
			Err:    ErrUpstreamOutcomeUnknown,
		}
	}
	p.handler = mw.Wrap(http.HandlerFunc(p.forward))
	return p, nil
}

// HeaderScope returns an Options.Scope function that scopes keys by the
// values of the request header name (e.g. "Authorization", "X-Tenant-ID"),
// hashed with SHA-256 so the credential itself is never stored: the
// lowercase hex digest of the values joined by newlines. A request without
// the header has no scope ("", handled by Options.Unscoped).
//
// The hash is not keyed: whoever can read the store can hash guesses of a
// credential and compare. For credentials, prefer [HMACHeaderScope].
func HeaderScope(name string) func(r *http.Request) (string, error) {
	return func(r *http.Request) (string, error) {
		vs, ok := headerValues(r, name)
		if !ok {
			return "", nil
		}
		sum := sha256.Sum256([]byte(vs))
		return hexString(sum[:]), nil
	}
}

// HMACHeaderScope is [HeaderScope] keyed with secret: the lowercase hex
// HMAC-SHA-256, under secret, of the values of the request header name
// joined by newlines. Without secret, a stored scope does not let anyone
// test guesses of the credential. The same header under two secrets gives
// two unrelated scopes. secret is copied; it should have at least
// MinScopeSecretBytes random bytes.
func HMACHeaderScope(name string, secret []byte) func(r *http.Request) (string, error) {
	key := append([]byte(nil), secret...)
	return func(r *http.Request) (string, error) {
		vs, ok := headerValues(r, name)
		if !ok {
			return "", nil
		}
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(vs))
		var sum [sha256.Size]byte
		return hexString(mac.Sum(sum[:0])), nil
	}
}

// hexString is hex.EncodeToString of a digest of up to 32 bytes, encoded
// on the stack: one allocation, the string's.
func hexString(sum []byte) string {
	var arr [2 * sha256.Size]byte
	return string(hex.AppendEncode(arr[:0], sum))
}

// headerValues returns the values of header name joined by newlines, and
// false when the request has none (or one empty value).
func headerValues(r *http.Request, name string) (string, bool) {
	vs := r.Header.Values(name)
	if len(vs) == 0 || (len(vs) == 1 && strings.TrimSpace(vs[0]) == "") {
		return "", false
	}
	return strings.Join(vs, "\n"), true
}

// newUpstreamTransport is the default upstream transport.
func newUpstreamTransport(dial, idle time.Duration) *http.Transport {
	d := &net.Dialer{Timeout: dial, KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy:                 nil,
		DialContext:           d.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       idle,
		TLSHandshakeTimeout:   dial,
		ExpectContinueTimeout: time.Second,
	}
}

// Middleware returns the middleware the proxy runs (for its Stats and
// Purge).
func (p *Proxy) Middleware() *Middleware { return p.mw }

// Close stops the middleware's background loops and closes idle
// upstream connections of the default Transport. Requests in flight are
// not interrupted; stop the http.Server first (Shutdown). Idempotent.
func (p *Proxy) Close() error {
	var err error
	p.closeOnce.Do(func() {
		err = p.mw.Close()
		if p.ownedTr != nil {
			p.ownedTr.CloseIdleConnections()
		}
	})
	return err
}

// ServeHTTP answers the health path itself and forwards everything else
// through the idempotency middleware.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if p.healthPath != "-" && r.URL.Path == p.healthPath {
		p.serveHealth(w, r)
		return
	}
	if r.Body != nil && r.Body != http.NoBody {
		// Bodies the middleware does not read (pass-through methods) are
		// limited too; one byte more than the middleware's limit lets it
		// answer 413 for the requests it covers.
		r.Body = http.MaxBytesReader(w, r.Body, p.maxReqBytes+1)
	}
	p.handler.ServeHTTP(w, r)
}

func (p *Proxy) serveHealth(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if p.health != nil {
		ctx, cancel := context.WithTimeout(r.Context(), DefaultHealthTimeout)
		defer cancel()
		if err := p.health(ctx); err != nil {
			// The reason names the store (user, database, address): the
			// operator's log has it, the client only the verdict.
			p.mw.o.Logger.Warn("idemhttp: health check failed", "consumer", p.mw.consumer, "error", err)
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, `{"status":"unavailable"}`+"\n")
			return
		}
	}
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, `{"status":"ok"}`+"\n")
}

// attemptKey is the context key of the forwarding state of one request.
type attemptKey struct{}

// attempt is what the proxy learns while forwarding one request, with
// the holding writer and the client trace of the request (one allocation
// for the three). It is also the forwarded request's context: the
// upstream context it embeds, whose Value of attemptKey is the attempt.
type attempt struct {
	context.Context
	orig    context.Context // the client's request context (carries Info)
	mu      sync.Mutex
	sent    bool  // request headers were written to an upstream connection
	bodyErr error // the upstream response body failed before its end
	hw      holdWriter
	trace   httptrace.ClientTrace
}

// wroteHeaders is the trace's WroteHeaders: the request may have reached
// the upstream from now on.
func (a *attempt) wroteHeaders() {
	a.mu.Lock()
	a.sent = true
	a.mu.Unlock()
}

// Value returns the attempt for attemptKey, and the embedded context's
// values otherwise.
func (a *attempt) Value(key any) any {
	if _, ok := key.(attemptKey); ok {
		return a
	}
	return a.Context.Value(key)
}

func (a *attempt) wasSent() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.sent
}

// forward sends r upstream on a context detached from the client's and
// writes the response through a holding writer.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength > p.maxReqBytes {
		// Passed through without idempotency (the middleware refuses a
		// keyed one itself): refused before anything reaches upstream.
		newProblem(ProblemBodyTooLarge, fmt.Sprintf("the body has %d bytes; at most %d are accepted", r.ContentLength, p.maxReqBytes)).Write(w)
		return
	}
	a := &attempt{orig: r.Context(), hw: holdWriter{dst: w, header: http.Header{}, limit: p.holdLimit}}
	a.trace.WroteHeaders = a.wroteHeaders
	hw := &a.hw
	var cancel context.CancelFunc
	a.Context, cancel = context.WithTimeout(context.WithoutCancel(r.Context()), p.timeout)
	defer cancel()
	p.rp.ServeHTTP(hw, r.WithContext(httptrace.WithClientTrace(a, &a.trace)))
	a.mu.Lock()
	bodyErr := a.bodyErr
	a.mu.Unlock()
	if bodyErr == nil {
		hw.finish()
		return
	}
	if hw.streaming {
		// Part of the response has reached the client: it cannot be
		// replaced. The client's connection is aborted, so it sees a
		// broken response, not a short one that looks complete; the key
		// is handled as any unknown outcome (stored by default: the
		// upstream did process the request), with the
		// upstream-outcome-unknown problem stored in the response's place.
		p.setUnknownDisposition(a)
		if !abortWith(a.orig, p.unknownProblem(bodyErr)) {
			panic(http.ErrAbortHandler)
		}
		return
	}
	p.writeUnknown(hw.dst, a, bodyErr)
}

// upstreamError is the ReverseProxy's ErrorHandler: the upstream gave no
// response.
func (p *Proxy) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	a, _ := r.Context().Value(attemptKey{}).(*attempt)
	hw, _ := w.(*holdWriter)
	if hw != nil {
		hw.discard()
		w = hw.dst
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		// A passed-through body outgrew MaxRequestBytes while it was
		// forwarded: the upstream got a broken request (no end of body),
		// which it cannot take as complete.
		if a != nil {
			SetDisposition(a.orig, DispositionRelease)
		}
		newProblem(ProblemBodyTooLarge, fmt.Sprintf("the body exceeds %d bytes", p.maxReqBytes)).Write(w)
		return
	}
	if a == nil || !a.wasSent() {
		ctx := r.Context()
		if a != nil {
			ctx = a.orig
		}
		SetDisposition(ctx, DispositionRelease)
		// The error names the upstream's address: logged, not shown to clients.
		p.mw.o.Logger.Warn("idemhttp: upstream unreachable", "consumer", p.mw.consumer, "error", err)
		pr := &Problem{
			Type:       ProblemUpstreamUnavailable,
			Title:      "Upstream unavailable",
			Status:     http.StatusBadGateway,
			Detail:     "the upstream could not be reached; nothing was sent to it",
			RetryAfter: time.Second,
			Err:        ErrUpstreamUnavailable,
		}
		pr.Write(w)
		return
	}
	p.writeUnknown(w, a, err)
}

// writeUnknown answers a request whose upstream outcome is unknown.
func (p *Proxy) writeUnknown(w http.ResponseWriter, a *attempt, err error) {
	p.setUnknownDisposition(a)
	p.unknownProblem(err).Write(w)
}

// setUnknownDisposition stores or releases the key of an attempt whose
// upstream outcome is unknown, as the UnknownOutcomePolicy says.
func (p *Proxy) setUnknownDisposition(a *attempt) {
	d := DispositionStore
	if p.unknown == ReleaseUnknownOutcome {
		d = DispositionRelease
	}
	SetDisposition(a.orig, d)
}

// unknownProblem is the 502 upstream-outcome-unknown answer for err. The
// error (which names the upstream's address) is logged, not shown.
func (p *Proxy) unknownProblem(err error) *Problem {
	p.mw.o.Logger.Warn("idemhttp: upstream outcome unknown", "consumer", p.mw.consumer, "error", err)
	detail := "the request was sent to the upstream but the connection failed before its response was complete; it may have been processed. This answer is stored for the key: retries get it too"
	if p.unknown == ReleaseUnknownOutcome {
		detail = "the request was sent to the upstream but the connection failed before its response was complete; it may have been processed"
	}
	return &Problem{
		Type:   ProblemUpstreamOutcomeUnknown,
		Title:  "Upstream outcome unknown",
		Status: http.StatusBadGateway,
		Detail: detail,
		Err:    ErrUpstreamOutcomeUnknown,
	}
}

// guardBody is the ReverseProxy's ModifyResponse: it makes a failure in
// the middle of the upstream body look like its end to the ReverseProxy
// (which would otherwise abort the handler) and records it for forward.
func (p *Proxy) guardBody(resp *http.Response) error {
	a, _ := resp.Request.Context().Value(attemptKey{}).(*attempt)
	if a != nil && resp.Body != nil && resp.Body != http.NoBody {
		resp.Body = &guardedBody{rc: resp.Body, a: a}
	}
	return nil
}

type guardedBody struct {
	rc io.ReadCloser
	a  *attempt
}

func (g *guardedBody) Read(b []byte) (int, error) {
	n, err := g.rc.Read(b)
	if err != nil && err != io.EOF {
		g.a.mu.Lock()
		if g.a.bodyErr == nil {
			g.a.bodyErr = err
		}
		g.a.mu.Unlock()
		return n, io.EOF
	}
	return n, err
}

func (g *guardedBody) Close() error { return g.rc.Close() }

// holdWriter holds the upstream response until its body is complete, so a
// failure in the middle of the body can still be answered as an unknown
// outcome. It starts streaming to dst when the body passes limit bytes or
// the response is an event stream (which must reach the client as it
// comes). Errors writing to dst (a client that left) are swallowed so the
// ReverseProxy keeps reading the upstream to its end; the middleware
// behind dst records what it was given.
type holdWriter struct {
	dst       http.ResponseWriter
	header    http.Header // the header; from WriteHeader on, as it was sent
	trailer   http.Header // fields set after WriteHeader: trailers
	limit     int64
	status    int
	buf       []byte
	streaming bool
	dstFailed bool
}

// Header returns the header being built before WriteHeader, and after it
// a map of its own where the ReverseProxy sets the trailers.
func (h *holdWriter) Header() http.Header {
	switch {
	case h.streaming:
		return h.dst.Header()
	case h.status == 0:
		return h.header
	case h.trailer == nil:
		h.trailer = http.Header{}
	}
	return h.trailer
}

func (h *holdWriter) WriteHeader(code int) {
	if code >= 100 && code <= 199 {
		return // informational responses are not relayed
	}
	if h.status != 0 {
		return
	}
	// Fields set from now on go to h.trailer (Header): trailers, which
	// the ReverseProxy sets after the body.
	h.status = code
	if strings.HasPrefix(strings.ToLower(h.header.Get("Content-Type")), "text/event-stream") {
		h.startStreaming()
	}
}

func (h *holdWriter) Write(b []byte) (int, error) {
	if h.status == 0 {
		h.WriteHeader(http.StatusOK)
	}
	if !h.streaming {
		if int64(len(h.buf)+len(b)) <= h.limit {
			h.buf = append(h.buf, b...)
			return len(b), nil
		}
		h.startStreaming()
	}
	if !h.dstFailed {
		if _, err := h.dst.Write(b); err != nil {
			h.dstFailed = true
		}
	}
	return len(b), nil
}

// Flush passes flushes on once streaming; a held response is written at
// its end anyway.
func (h *holdWriter) Flush() {
	if h.streaming && !h.dstFailed {
		_ = http.NewResponseController(h.dst).Flush()
	}
}

// startStreaming writes the held header and body to dst.
func (h *holdWriter) startStreaming() {
	if h.streaming {
		return
	}
	h.streaming = true
	dh := h.dst.Header()
	for k, v := range h.header {
		dh[k] = v
	}
	h.dst.WriteHeader(h.status)
	if len(h.buf) > 0 {
		var err error
		if rc, ok := h.dst.(*recorder); ok {
			// Behind the middleware: the held body is handed over, not
			// copied.
			_, err = rc.writeOwned(h.buf)
		} else {
			_, err = h.dst.Write(h.buf)
		}
		if err != nil {
			h.dstFailed = true
		}
		h.buf = nil
	}
}

// finish writes a response still held.
func (h *holdWriter) finish() {
	if h.status == 0 {
		return // the ErrorHandler wrote to dst itself
	}
	if !h.streaming {
		h.startStreaming()
		// Trailers the ReverseProxy set in the held header after the
		// body go to dst as trailers, not as header fields.
		dh := h.dst.Header()
		for k, vs := range h.trailer {
			if _, ok := h.header[k]; !ok {
				dh[k] = vs
			}
		}
	}
}

// discard drops a held response (the ErrorHandler answers instead).
func (h *holdWriter) discard() {
	h.status, h.buf, h.trailer = 0, nil, nil
	clear(h.header)
}

// copyBuffers is the ReverseProxy's BufferPool: the 32 KiB buffers it
// copies response bodies through come from the pool the request bodies
// are read with, rather than one allocated per request.
type copyBuffers struct{}

func (copyBuffers) Get() []byte { return bufPool.Get().(*[32 << 10]byte)[:] }

func (copyBuffers) Put(b []byte) {
	if len(b) == 32<<10 {
		bufPool.Put((*[32 << 10]byte)(b))
	}
}

// noInternalRetry keeps net/http's Transport from re-sending a request on
// its own. The Transport treats a request carrying an Idempotency-Key
// header as safe to replay and re-sends it after a reused connection fails
// (net/http Request.isReplayable), but the upstream behind the proxy may
// not deduplicate: it would run the request twice. The header is sent under
// its lowercase name, which the Transport's check does not see and HTTP
// (field names are case-insensitive) does not distinguish.
type noInternalRetry struct{ rt http.RoundTripper }

func (n noInternalRetry) RoundTrip(r *http.Request) (*http.Response, error) {
	const canon, lower = "Idempotency-Key", "idempotency-key"
	if v, ok := r.Header[canon]; ok {
		// The ReverseProxy's outgoing request is ours to modify.
		delete(r.Header, canon)
		r.Header[lower] = v
	}
	if v, ok := r.Header["X-Idempotency-Key"]; ok {
		delete(r.Header, "X-Idempotency-Key")
		r.Header["x-idempotency-key"] = v
	}
	return n.rt.RoundTrip(r)
}
