package idemcli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/secret"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/store/idemsql"
)

// proxyFlags are the flags of `idem proxy`.
type proxyFlags struct {
	listen, upstream, store, table, redisPrefix  string
	namespace, scopeHeader, unscoped, healthPath string
	metricsAddr, scopeSecret                     string
	methods                                      []string
	requireKey, strictKey, canonicalJSON         bool
	store5xx, releaseUnknown, failOpen, migrate  bool
	lease, wait, retention                       time.Duration
	maxRequestBytes, maxResponseBytes            int64
	maxHeaderBytes                               int
	readHeaderTimeout, readTimeout               time.Duration
	writeTimeout, idleTimeout                    time.Duration
	upstreamTimeout, dialTimeout                 time.Duration
	shutdownTimeout                              time.Duration
	log                                          logFlags
	profile                                      profileFlags
}

func newProxyCmd() *cobra.Command {
	var f proxyFlags
	cmd := &cobra.Command{
		Use:   "proxy",
		Short: "Serve the idempotency-key middleware in front of any HTTP service",
		Long: `proxy is a reverse proxy that makes POST and PATCH requests carrying an
Idempotency-Key safe to retry, for a service that knows nothing about keys:
the first request with a key is forwarded to the upstream once, and its
retries replay the recorded response (Idempotent-Replayed: true) without
reaching the upstream. Keys are scoped by a request header (Authorization by
default), hashed before they are stored.

Set a scope secret (IDEM_SCOPE_SECRET, or --scope-secret; at least 16
bytes, random, the same on every proxy sharing the store): the scope is then
an HMAC-SHA-256 of the header under it, and reading the store does not let
anyone test guesses of the credentials offline. Without one the scope is the
plain SHA-256 of the header, as in earlier versions, and the proxy warns at
start. Introducing or changing the secret makes every recorded key unknown:
a retry of a request answered before the change is forwarded again, and a
request in flight at the change may reach the upstream twice. Make the change
when no client is retrying (a quiet period); see the idemhttp package doc,
"Keying the proxy's scope".

  idem proxy --listen :8080 --upstream http://127.0.0.1:9000 --store sqlite:/var/lib/idem/proxy.db

--store: sqlite:PATH, postgres://..., mysql://..., or Redis. ` + redisStoreHelp + `

Upstream outcomes: a connection that cannot be made releases the key (502
upstream-unavailable, the retry is forwarded); a connection lost after the
request was sent stores 502 upstream-outcome-unknown, so the request never
reaches the upstream twice; upstream 5xx, 408 and 429 release the key unless
--store-5xx. The upstream response is read and recorded even when the client
has hung up. The same holds when the proxy itself dies (or loses its store)
while the upstream runs: a recovery point is recorded before the request is
forwarded, and the retry that takes the key over gets the stored 502
upstream-outcome-unknown instead of a second forward. --release-unknown turns
both protections off (at least once).

GET --health-path (default /healthz) reports whether the store answers:
200 {"status":"ok"} or 503 {"status":"unavailable"}; the reason is logged.
--metrics-addr serves Prometheus metrics on http://ADDR/metrics: requests on
the idempotency path by outcome and response status
(idem_http_responses_total{idem_http_replayed="true"} counts replays), their
durations, claims, lease renewals and takeovers, store errors, purges, and the
Go runtime.

Logging: one line per request at info on stderr (--log-format text or json):
method, path without the query string, status, bytes, duration_ms, and for
requests with a key the outcome (Processed, Duplicate, ...), replayed, the
problem type of the proxy's own answers and key_hash, the first 16 hex
digits of the SHA-256 of the record ID (hashed scope and key), which matches
the lines of one key's retries without logging the key. No header value
(Authorization, the key) and no body is logged.

Tracing and OTLP: with OTEL_EXPORTER_OTLP_ENDPOINT set, traces and metrics
are exported over OTLP/HTTP (protobuf), configured by the standard OTEL_*
variables (OTEL_SERVICE_NAME, default idem-proxy; OTEL_RESOURCE_ATTRIBUTES;
OTEL_EXPORTER_OTLP_HEADERS; OTEL_TRACES_EXPORTER=none or
OTEL_METRICS_EXPORTER=none for one signal only). Each keyed request is a span
that continues the caller's traceparent, and the request forwarded upstream
carries the traceparent of that span.

On SIGINT or SIGTERM the proxy stops accepting connections and lets requests
in flight finish (up to --shutdown-timeout).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runProxy(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), &f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.listen, "listen", "127.0.0.1:8080", "address to listen on, host:port")
	fl.StringVar(&f.upstream, "upstream", "", "URL of the service behind the proxy, as in http://127.0.0.1:9000 (required)")
	fl.StringVar(&f.store, "store", "", "store URL: sqlite:PATH, postgres://..., mysql://..., redis://..., redis-sentinel://..., redis-cluster://... (required)")
	fl.StringVar(&f.table, "table", "", "records table of a SQL store (default idem_processed)")
	fl.StringVar(&f.redisPrefix, "redis-prefix", "idem:", "key prefix of a Redis store")
	fl.BoolVar(&f.migrate, "migrate", true, "create or upgrade the SQL store's tables at start")
	fl.StringVar(&f.namespace, "namespace", "", "namespace of this service's keys (default proxy:HOST:PORT of the upstream)")
	fl.StringVar(&f.scopeHeader, "scope-header", idemhttp.DefaultProxyScopeHeader, "request header whose value (keyed with the scope secret, HMAC-SHA-256) scopes the keys")
	fl.StringVar(&f.scopeSecret, "scope-secret", "", "per-deployment key of the scope, at least 16 bytes; prefer IDEM_SCOPE_SECRET, which the process list does not show (default: none, unkeyed SHA-256, with a warning)")
	markSecret(cmd, "scope-secret")
	fl.StringVar(&f.unscoped, "unscoped", "reject", "a keyed request without the scope header: reject (401) or pass (forwarded without idempotency)")
	fl.StringSliceVar(&f.methods, "methods", []string{http.MethodPost, http.MethodPatch}, "methods the keys apply to")
	fl.BoolVar(&f.requireKey, "require-key", false, "answer 400 to a request of a covered method without Idempotency-Key")
	fl.BoolVar(&f.strictKey, "strict-key", false, `accept only the RFC 9651 sf-string form of the key ("...")`)
	fl.BoolVar(&f.canonicalJSON, "canonical-json", false, "fingerprint JSON bodies by their canonical form (key order and whitespace ignored)")
	fl.BoolVar(&f.store5xx, "store-5xx", false, "store and replay upstream 5xx responses instead of releasing the key")
	fl.BoolVar(&f.releaseUnknown, "release-unknown", false, "release the key when the upstream outcome is unknown, after a lost connection or the proxy's own crash: at least once (for upstreams that deduplicate by the forwarded key)")
	fl.BoolVar(&f.failOpen, "fail-open", false, "forward requests without idempotency when the store is unavailable (default: 503)")
	fl.DurationVar(&f.lease, "lease", idemhttp.DefaultLease, "lease of a request on its key, renewed while the upstream works")
	fl.DurationVar(&f.wait, "wait", 0, "how long a duplicate waits for the first request's response (0: 409 at once)")
	fl.DurationVar(&f.retention, "retention", idemhttp.DefaultRetention, "how long completed keys are kept")
	fl.Int64Var(&f.maxRequestBytes, "max-request-bytes", idemhttp.DefaultMaxRequestBytes, "largest request body accepted (413 beyond)")
	fl.Int64Var(&f.maxResponseBytes, "max-response-bytes", idemhttp.DefaultMaxResponseBytes, "largest response body stored for replay")
	fl.IntVar(&f.maxHeaderBytes, "max-header-bytes", 64<<10, "largest request header block accepted (431 beyond)")
	fl.DurationVar(&f.readHeaderTimeout, "read-header-timeout", 10*time.Second, "time to read a request's headers")
	fl.DurationVar(&f.readTimeout, "read-timeout", 2*time.Minute, "time to read a whole request, body included (0: none)")
	fl.DurationVar(&f.writeTimeout, "write-timeout", 5*time.Minute, "time to write a response, from the end of the request headers; it also bounds how long a client that stops reading a streamed response holds its key (0: none)")
	fl.DurationVar(&f.idleTimeout, "idle-timeout", 2*time.Minute, "how long an idle client connection is kept")
	fl.DurationVar(&f.upstreamTimeout, "upstream-timeout", idemhttp.DefaultUpstreamTimeout, "time for the upstream to answer a request, body included")
	fl.DurationVar(&f.dialTimeout, "dial-timeout", idemhttp.DefaultUpstreamDialTimeout, "time to connect to the upstream")
	fl.DurationVar(&f.shutdownTimeout, "shutdown-timeout", 30*time.Second, "how long requests in flight may take to finish at shutdown")
	fl.StringVar(&f.healthPath, "health-path", idemhttp.DefaultProxyHealthPath, `path answered with the store's health ("-": none)`)
	f.log.register(fl, "request")
	f.profile.register(fl)
	fl.StringVar(&f.metricsAddr, "metrics-addr", "", "serve Prometheus metrics (idem_messages_total by outcome and HTTP status, idem_http_request_duration_seconds, ...) on http://ADDR/metrics, e.g. 127.0.0.1:9464 (default: off)")
	return cmd
}

// check validates the flags (usage errors, exit status 2).
func (f *proxyFlags) check() (*url.URL, error) {
	if f.upstream == "" {
		return nil, usageError{errors.New("--upstream is required (or IDEM_UPSTREAM)")}
	}
	if f.store == "" {
		return nil, usageError{errors.New("--store is required (or IDEM_STORE)")}
	}
	u, err := url.Parse(f.upstream)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, usageError{fmt.Errorf("--upstream %q: want an absolute http:// or https:// URL", f.upstream)}
	}
	if _, _, err := net.SplitHostPort(f.listen); err != nil {
		return nil, usageError{fmt.Errorf("--listen %q: want host:port, as in :8080: %v", f.listen, err)}
	}
	if f.metricsAddr != "" {
		if _, _, err := net.SplitHostPort(f.metricsAddr); err != nil {
			return nil, usageError{fmt.Errorf("--metrics-addr %q: want host:port, as in 127.0.0.1:9464: %v", f.metricsAddr, err)}
		}
	}
	if f.scopeSecret != "" && len(f.scopeSecret) < idemhttp.MinScopeSecretBytes {
		return nil, usageError{fmt.Errorf("--scope-secret has %d bytes, want at least %d (random)", len(f.scopeSecret), idemhttp.MinScopeSecretBytes)}
	}
	if f.unscoped != "reject" && f.unscoped != "pass" {
		return nil, usageError{fmt.Errorf("--unscoped %q: want reject or pass", f.unscoped)}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"read-header-timeout", f.readHeaderTimeout}, {"read-timeout", f.readTimeout},
		{"write-timeout", f.writeTimeout}, {"idle-timeout", f.idleTimeout}, {"shutdown-timeout", f.shutdownTimeout},
	} {
		if d.v < 0 {
			return nil, usageError{fmt.Errorf("--%s must not be negative", d.name)}
		}
	}
	if f.maxHeaderBytes <= 0 {
		return nil, usageError{errors.New("--max-header-bytes must be positive")}
	}
	return u, nil
}

// proxyStore is the opened store of `idem proxy`.
type proxyStore struct {
	store idemdriver.LeaseStore
	where string
	ping  func(ctx context.Context) error
	close func() error
}

// openProxyStore opens the lease-mode store named by rawURL: a SQL store
// (see openSQLStore) migrated when migrate is set, or Redis. With pgx set,
// a PostgreSQL store not behind a pooler is the pgx one (idempgxv5, over
// a pool of its own, on the tables openSQLStore's store migrated), whose
// lease batches go in one round trip (database/sql cannot pipeline).
func openProxyStore(ctx context.Context, rawURL, table, redisPrefix string, migrate, pgx bool) (_ *proxyStore, err error) {
	defer func() { err = secret.Error(err, rawURL) }()
	if isRedisURL(rawURL) {
		rs, err := openRedisStore(ctx, rawURL, redisPrefix)
		if err != nil {
			return nil, err
		}
		client := rs.client
		return &proxyStore{store: rs.store, where: rs.where, close: client.Close,
			ping: func(ctx context.Context) error { return secret.Error(client.Ping(ctx).Err(), rawURL) }}, nil
	}
	st, err := openSQLStore(ctx, rawURL, table)
	if err != nil {
		return nil, err
	}
	if migrate {
		if err := st.store.Migrate(ctx); err != nil {
			st.db.Close()
			return nil, fmt.Errorf("migrate %s: %w", st.where, err)
		}
	}
	if pgx && st.dialect == idemsql.Postgres && !st.pooler {
		s, pool, err := openPgxStore(ctx, rawURL, st.where, table)
		if err != nil {
			st.db.Close()
			return nil, err
		}
		return &proxyStore{store: s, where: st.where, close: func() error { pool.Close(); return st.db.Close() },
			ping: func(ctx context.Context) error { return secret.Error(pool.Ping(ctx), rawURL) }}, nil
	}
	return &proxyStore{store: st.store, where: st.where, close: st.db.Close,
		ping: func(ctx context.Context) error { return secret.Error(st.db.PingContext(ctx), rawURL) }}, nil
}

// runProxy serves the proxy until ctx ends, then shuts it down gracefully.
func runProxy(ctx context.Context, stdout, stderr io.Writer, f *proxyFlags) error {
	up, err := f.check()
	if err != nil {
		return err
	}
	ps, err := openProxyStore(ctx, f.store, f.table, f.redisPrefix, f.migrate, false)
	if err != nil {
		return err
	}
	defer ps.close()
	stopProfile, err := f.profile.startFor("proxy", stderr)
	if err != nil {
		return err
	}
	defer stopProfile()

	logger, err := f.log.newLogger(stderr)
	if err != nil {
		return err
	}
	var metrics *metricsServer
	if f.metricsAddr != "" {
		if metrics, err = serveMetrics(f.metricsAddr); err != nil {
			return err
		}
		defer metrics.close()
	}
	otlp, err := setupOTLP(ctx, "idem-proxy")
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := otlp.close(sctx); err != nil {
			logger.Warn("idem proxy: OTLP export at shutdown failed", "err", err)
		}
	}()
	o := &idemhttp.ProxyOptions{
		Options: idemhttp.Options{
			Namespace:        f.namespace,
			Methods:          f.methods,
			RequireKey:       f.requireKey,
			StrictKey:        f.strictKey,
			CanonicalJSON:    f.canonicalJSON,
			MaxRequestBytes:  f.maxRequestBytes,
			MaxResponseBytes: f.maxResponseBytes,
			Lease:            f.lease,
			Wait:             f.wait,
			Retention:        f.retention,
			FailOpen:         f.failOpen,
			Logger:           logger,
			Hooks:            append(append(metrics.hooks(), otlp.hooks()...), requestLogHook{}),
		},
		InjectHeaders:   otlp.injector(),
		ScopeHeader:     f.scopeHeader,
		ScopeSecret:     []byte(f.scopeSecret),
		UpstreamTimeout: f.upstreamTimeout,
		DialTimeout:     f.dialTimeout,
		HealthPath:      f.healthPath,
		Health:          ps.ping,
	}
	for i, m := range o.Options.Methods {
		o.Options.Methods[i] = strings.ToUpper(strings.TrimSpace(m))
	}
	if f.unscoped == "pass" {
		o.Options.Unscoped = idemhttp.PassUnscoped
	}
	if f.store5xx {
		o.Options.ReleaseStatus = func(s int) bool { return s == http.StatusRequestTimeout || s == http.StatusTooManyRequests }
	}
	if f.releaseUnknown {
		o.UnknownOutcome = idemhttp.ReleaseUnknownOutcome
	}
	p, err := idemhttp.NewProxy(up, ps.store, o)
	if err != nil {
		if errors.Is(err, idem.ErrInvalidConfig) {
			return usageError{err}
		}
		return err
	}
	defer p.Close()

	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", f.listen, err)
	}
	srv := &http.Server{
		Handler:           logRequests(logger, p),
		ReadHeaderTimeout: f.readHeaderTimeout,
		ReadTimeout:       f.readTimeout,
		WriteTimeout:      f.writeTimeout,
		IdleTimeout:       f.idleTimeout,
		MaxHeaderBytes:    f.maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	fmt.Fprintf(stdout, "idem proxy: listening on http://%s, forwarding to %s, keys in %s\n", ln.Addr(), redact(f.upstream), ps.where)
	if metrics != nil {
		fmt.Fprintf(stdout, "idem proxy: metrics on %s\n", metrics.url())
	}

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.shutdownTimeout)
	defer cancel()
	err = srv.Shutdown(sctx)
	<-errc // http.ErrServerClosed
	if err != nil {
		srv.Close()
		return fmt.Errorf("shutdown: requests still running after %v: %w", f.shutdownTimeout, err)
	}
	fmt.Fprintln(stdout, "idem proxy: stopped")
	return nil
}
