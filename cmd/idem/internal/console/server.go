package console

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// CSP is the Content-Security-Policy of every response: nothing but the
// console's own style sheet, no script at all, forms posted to itself
// only, never framed.
const CSP = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// Config configures a console.
type Config struct {
	// Store is the store shown and acted on.
	Store Store
	// Where names the store on the pages, without credentials.
	Where string
	// Token, when set, is required of every request: a session cookie
	// set by the login form, or an "Authorization: Bearer" header.
	// Compared in constant time.
	Token string
	// ReadOnly removes every action.
	ReadOnly bool
	// ShowPayloads shows the outbox rows' and the dead letters' payloads
	// and headers, and the store's own error messages.
	ShowPayloads bool
	// DeadLetters, if set, is the broker whose dead letters the console
	// lists and replays.
	DeadLetters DeadLetters
	// DeadLetterDests are the dead-letter destinations the dead-letters
	// page links to, each "DEST" or "DEST=CONSUMER" (the consumer whose
	// records a replay makes retryable).
	DeadLetterDests []string
	// Logger receives the audit log of the actions (who, what, when,
	// result); nil discards it.
	Logger *slog.Logger
	// Registerer, if set, gets the counter idem_console_actions_total
	// {action, result}, each pair of an action kind and a result at zero
	// from the start.
	Registerer prometheus.Registerer
	// Metrics, if set, is served at /metrics (behind the token).
	Metrics http.Handler
	// Now is the clock of ages, of the session's expiry and of the
	// sign-in limit; nil is time.Now.
	Now func() time.Time
	// SessionTTL is how long a sign-in lasts (the session cookie's
	// Max-Age and the expiry the server checks). Defaults to
	// DefaultSessionTTL.
	SessionTTL time.Duration
}

// Server is the web console: an http.Handler.
type Server struct {
	cfg     Config
	mux     *http.ServeMux
	tmpl    *template.Template
	actions *prometheus.CounterVec
	signIns signIns

	mu     sync.Mutex
	done   map[string]doneAction    // action keys already used -> their action and result
	keys   []string                 // the same keys, oldest first, to forget
	flight map[string]chan struct{} // action keys whose action runs now
}

// maxKeys is how many used action keys the server remembers.
const maxKeys = 10_000

// New returns the console of cfg.
func New(cfg Config) (*Server, error) {
	if cfg.Store == nil {
		return nil, errors.New("console: no store")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	tmpl, err := template.New("").Funcs(template.FuncMap{"deref": func(s *string) string {
		if s == nil {
			return "-"
		}
		return *s
	}, "dur": func(s float64) string { return time.Duration(s * float64(time.Second)).Round(time.Second).String() }}).
			ParseFS(templateFS, "templates/*.html")
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, tmpl: tmpl, done: map[string]doneAction{}, flight: map[string]chan struct{}{}, mux: http.NewServeMux()}
	s.actions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idem_console_actions_total",
		Help: "Actions run from the idem console, by action and result (changed, unchanged, refused, error; repeated: a form submitted again, answered with its first result without running).",
	}, []string{"action", "result"})
	// Every series starts at zero, so that a dashboard sees 0 rather than
	// no data before the first action.
	s.actions.WithLabelValues("unknown", "refused")
	for _, kind := range []string{ActionRetry, ActionRetryOutbox, ActionRelease, ActionReplay, ActionPurge} {
		for _, result := range []string{"changed", "unchanged", "refused", "error", "repeated"} {
			s.actions.WithLabelValues(kind, result)
		}
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(s.actions); err != nil {
			return nil, err
		}
	}
	static, _ := fs.Sub(staticFS, "static")
	s.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	s.mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/consumers", http.StatusSeeOther) })
	s.mux.HandleFunc("GET /login", s.loginPage)
	s.mux.HandleFunc("POST /login", s.login)
	s.page("consumers", s.consumers)
	s.page("failed", s.failed)
	s.page("outbox", s.outbox)
	s.page("message", s.message)
	s.page("deadletters", s.deadLetters)
	if cfg.Metrics != nil {
		s.mux.Handle("GET /metrics", cfg.Metrics)
	}
	if !cfg.ReadOnly {
		s.mux.HandleFunc("GET /confirm", s.confirm)
		s.mux.HandleFunc("POST /action", s.act)
	}
	return s, nil
}

// ServeHTTP serves the console, with its security headers, after the
// token check.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", CSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	if s.cfg.Token == "" && !loopbackHost(r.Host) {
		// Without a token, loopback is the only barrier: a page of another
		// site whose name resolves to 127.0.0.1 (DNS rebinding) is
		// same-origin to the browser and could read the pages and the
		// confirm forms' CSRF tokens. Its requests carry its own name.
		http.Error(w, "this console answers requests addressed to localhost or a loopback address only (set --token to serve other names)", http.StatusMisdirectedRequest)
		return
	}
	if ok, answered := s.authorized(w, r); !ok {
		if answered {
			return
		}
		if wantsJSON(r) {
			s.jsonError(w, http.StatusUnauthorized, "a token is required: Authorization: Bearer TOKEN")
			return
		}
		http.Redirect(w, r, "/login", http.StatusSeeOther)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// loopbackHost reports whether host (a Host header: a name or an IP
// address, with or without a port) names this machine's loopback
// interface: localhost, or a loopback IP address.
func loopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	} else {
		host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// authorized reports whether r carries the token in an Authorization:
// Bearer header, or a live session cookie. A bearer token is a sign-in:
// a wrong one counts against the client's sign-in limit, and a client
// over the limit is answered 429 with a Retry-After here, without the
// token being compared (answered).
func (s *Server) authorized(w http.ResponseWriter, r *http.Request) (ok, answered bool) {
	if s.cfg.Token == "" || r.URL.Path == "/login" || r.URL.Path == "/static/console.css" {
		return true, false
	}
	if a := r.Header.Get("Authorization"); len(a) > 7 && a[:7] == "Bearer " {
		client, now := clientOf(r), s.cfg.Now()
		if d := s.signIns.wait(client, now); d > 0 {
			secs := int(d.Seconds()) + 1
			s.cfg.Logger.Warn("console bearer token refused: too many failures", "remote", r.RemoteAddr, "retry_after_s", secs, "at", now.UTC())
			w.Header().Set("Retry-After", strconv.Itoa(secs))
			s.jsonError(w, http.StatusTooManyRequests, fmt.Sprintf("too many failed sign-ins from this address: try again in %s", time.Duration(secs)*time.Second))
			return false, true
		}
		if subtle.ConstantTimeCompare([]byte(a[7:]), []byte(s.cfg.Token)) == 1 {
			return true, false
		}
		s.signIns.fail(client, now)
		s.cfg.Logger.Warn("console bearer token wrong", "remote", r.RemoteAddr, "at", now.UTC())
		return false, false
	}
	c, err := r.Cookie("idem_session")
	return err == nil && s.sessionOK(c.Value), false
}

func (s *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	s.render(w, r, "login", map[string]any{"Title": "Sign in", "Public": true})
}

// login signs a client in with the token, at most SignInFailures failed
// attempts per client in SignInWindow: the next get 429 and a
// Retry-After, without the token being compared.
func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	client, now := clientOf(r), s.cfg.Now()
	if d := s.signIns.wait(client, now); d > 0 {
		secs := int(d.Seconds()) + 1
		s.cfg.Logger.Warn("console sign-in refused: too many failures", "remote", r.RemoteAddr, "retry_after_s", secs, "at", now.UTC())
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		w.WriteHeader(http.StatusTooManyRequests)
		s.render(w, r, "login", map[string]any{"Title": "Sign in", "Public": true,
			"Error": fmt.Sprintf("too many failed sign-ins from this address: try again in %s", time.Duration(secs)*time.Second)})
		return
	}
	if s.cfg.Token == "" || subtle.ConstantTimeCompare([]byte(r.PostFormValue("token")), []byte(s.cfg.Token)) != 1 {
		s.signIns.fail(client, now)
		s.cfg.Logger.Warn("console sign-in failed", "remote", r.RemoteAddr, "at", now.UTC())
		w.WriteHeader(http.StatusUnauthorized)
		s.render(w, r, "login", map[string]any{"Title": "Sign in", "Error": "wrong token", "Public": true})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: "idem_session", Value: s.sessionValue(now.Add(s.cfg.SessionTTL)), Path: "/",
		MaxAge: int(s.cfg.SessionTTL.Seconds()), HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	http.Redirect(w, r, "/consumers", http.StatusSeeOther)
}

// page serves /name as HTML and /api/name as JSON from one reader. The
// HTML consumers page of a store that cannot list its consumers
// (idemdriver.ErrUnsupported) is a form asking for a consumer's name,
// status 200; its JSON stays 501.
func (s *Server) page(name string, read func(r *http.Request) (any, error)) {
	serve := func(asJSON bool) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			v, err := read(r)
			if err != nil && !asJSON && name == "consumers" && errors.Is(err, idemdriver.ErrUnsupported) {
				// A store that keeps no list of its consumers (idemredis):
				// the page asks for the consumer's name instead.
				s.render(w, r, "askconsumer", map[string]any{"Title": "consumers", "Reason": err.Error()})
				return
			}
			if err != nil {
				s.fail(w, r, asJSON, err)
				return
			}
			if asJSON {
				w.Header().Set("Content-Type", "application/json")
				_ = WriteJSON(w, v)
				return
			}
			s.render(w, r, name, map[string]any{"Title": name, "Data": v, "Query": r.URL.Query()})
		}
	}
	s.mux.HandleFunc("GET /"+name, serve(false))
	s.mux.HandleFunc("GET /api/"+name, serve(true))
}

// ConsumersView is the consumers page.
type ConsumersView struct {
	Consumers []ConsumerView  `json:"consumers"`
	Outbox    *OutboxStatView `json:"outbox"`
}

// ConsumerView is one consumer's records.
type ConsumerView struct {
	Consumer string `json:"consumer"`
	// Records is null when the store lists its consumers without
	// counting (idemdriver.ConsumerLister).
	Records *int64  `json:"records"`
	Oldest  *string `json:"oldest"`
	Newest  *string `json:"newest"`
}

// consumers lists the consumers without counting their records when the
// store can (idemdriver.ConsumerLister: a skip scan of an index), and
// with Stats (a scan of the table) otherwise.
func (s *Server) consumers(r *http.Request) (any, error) {
	list, counted := s.cfg.Store.Stats, true
	if cl, ok := s.cfg.Store.(idemdriver.ConsumerLister); ok {
		list, counted = cl.Consumers, false
	}
	stats, err := list(r.Context())
	if err != nil {
		return nil, err
	}
	v := ConsumersView{Consumers: []ConsumerView{}}
	for _, c := range stats {
		cv := ConsumerView{Consumer: c.Consumer, Oldest: Time(c.Oldest), Newest: Time(c.Newest)}
		if counted {
			cv.Records = &c.Count
		}
		v.Consumers = append(v.Consumers, cv)
	}
	if op, _, ok := outboxOf(s.cfg.Store); ok {
		st, err := op.OutboxBacklog(r.Context())
		if err != nil {
			return nil, err
		}
		v.Outbox = &OutboxStatView{Pending: st.Pending, Failed: st.Failed, OldestPendingS: st.OldestPending.Seconds()}
	}
	return v, nil
}

func (s *Server) failed(r *http.Request) (any, error) {
	q := r.URL.Query()
	state := idemdriver.StateFailed
	if q.Get("state") == "in_progress" {
		state = idemdriver.StateInProgress
	}
	limit, _ := strconv.Atoi(q.Get("limit"))
	scan, _ := strconv.Atoi(q.Get("scan"))
	p := idemdriver.ListRecordsParams{Consumer: q.Get("consumer"), State: state, Limit: limit, Scan: scan, Cursor: q.Get("cursor")}
	page, err := s.cfg.Store.ListRecords(r.Context(), &p)
	if err != nil {
		return nil, err
	}
	if len(page.Records) == 0 && page.Next == "" && p.Cursor == "" {
		if err := KnownConsumer(r.Context(), s.cfg.Store, p.Consumer); err != nil {
			return nil, err
		}
	}
	return NewRecordPageView(p.Consumer, state, page, s.cfg.Now()), nil
}

func (s *Server) outbox(r *http.Request) (any, error) {
	q := r.URL.Query()
	limit, _ := strconv.Atoi(q.Get("limit"))
	return ReadOutbox(r.Context(), s.cfg.Store, q.Get("error"), limit, q.Get("cursor"), s.cfg.ShowPayloads)
}

func (s *Server) message(r *http.Request) (any, error) {
	q := r.URL.Query()
	rec, err := s.cfg.Store.Inspect(r.Context(), q.Get("consumer"), q.Get("id"))
	if err != nil {
		return nil, err
	}
	v := MessageView{RecordView: NewRecordView(rec, s.cfg.Now()), Steps: []StepView{}}
	if sr, ok := s.cfg.Store.(idemdriver.StepReader); ok {
		steps, err := sr.Steps(r.Context(), rec.Consumer, rec.MessageID)
		if err != nil {
			return nil, err
		}
		for _, st := range steps {
			sv := StepView{Name: st.Name, Size: len(st.Result)}
			if s.cfg.ShowPayloads {
				res := string(st.Result)
				sv.Result = &res
			}
			v.Steps = append(v.Steps, sv)
		}
	}
	return v, nil
}

// deadLetters is the dead-letters page: without dest, the destinations
// configured; with it, its causes and a page of its dead letters.
func (s *Server) deadLetters(r *http.Request) (any, error) {
	q := r.URL.Query()
	if q.Get("dest") == "" {
		if s.cfg.DeadLetters == nil {
			return nil, ErrNoBroker
		}
		v := DeadLetterIndexView{Broker: s.cfg.DeadLetters.Where(), Destinations: []DeadLetterDest{}}
		for _, d := range s.cfg.DeadLetterDests {
			dest, consumer, _ := strings.Cut(d, "=")
			v.Destinations = append(v.Destinations, DeadLetterDest{Destination: dest, Consumer: consumer})
		}
		return v, nil
	}
	limit, _ := strconv.Atoi(q.Get("limit"))
	scan, _ := strconv.Atoi(q.Get("scan"))
	return ReadDeadLetters(r.Context(), s.cfg.DeadLetters, q.Get("dest"), q.Get("consumer"), q.Get("cursor"), limit, scan, s.cfg.ShowPayloads)
}

// DeadLetterIndexView is the dead-letters page without a destination:
// the destinations the console was started with.
type DeadLetterIndexView struct {
	Broker       string           `json:"broker"`
	Destinations []DeadLetterDest `json:"destinations"`
}

// DeadLetterDest is a dead-letter destination and the consumer whose
// records its replays make retryable ("" when not configured).
type DeadLetterDest struct {
	Destination string `json:"destination"`
	Consumer    string `json:"consumer,omitempty"`
}

// MessageView is the message page: the record and its recovery points.
type MessageView struct {
	RecordView
	Steps []StepView `json:"steps"`
}

// StepView is one recovery point; its result is shown only with
// ShowPayloads.
type StepView struct {
	Name   string  `json:"name"`
	Size   int     `json:"result_bytes"`
	Result *string `json:"result,omitempty"`
}

// confirm shows an action before it runs: a form with the CSRF token and
// a one-time action key.
func (s *Server) confirm(w http.ResponseWriter, r *http.Request) {
	a, err := actionOf(r.URL.Query())
	if err != nil {
		s.fail(w, r, false, err)
		return
	}
	s.render(w, r, "confirm", map[string]any{"Title": "Confirm", "Action": a, "What": a.String(),
		"CSRF": s.csrf(w, r), "Key": randomHex()})
}

// act runs a confirmed action once per action key, after the CSRF check,
// and logs it.
func (s *Server) act(w http.ResponseWriter, r *http.Request) {
	asJSON := wantsJSON(r)
	if err := r.ParseForm(); err != nil {
		s.fail(w, r, asJSON, err)
		return
	}
	if !s.csrfOK(r) {
		s.actions.WithLabelValues("unknown", "refused").Inc()
		s.fail(w, r, asJSON, errCSRF)
		return
	}
	a, err := actionOf(r.PostForm)
	key := r.PostForm.Get("key")
	if err == nil && (len(key) < 16 || len(key) > 64) {
		err = errors.New("the action has no key: confirm it first")
	}
	if err != nil {
		s.fail(w, r, asJSON, err)
		return
	}
	v, seen, err := s.claim(r.Context(), key, a)
	if errors.Is(err, ErrBadAction) {
		s.fail(w, r, asJSON, err)
		return
	}
	if err != nil {
		return
	}
	who := "local"
	if s.cfg.Token != "" {
		who = "token holder"
	}
	if !seen {
		v, err = Run(r.Context(), s.cfg.Store, s.cfg.DeadLetters, a, s.cfg.Now)
		result := "changed"
		switch {
		case err == nil && !v.Changed:
			result = "unchanged"
		case errors.Is(err, idemdriver.ErrWrongState), errors.Is(err, idemdriver.ErrNotFound), errors.Is(err, ErrBadAction),
			errors.Is(err, ErrNotReplayable), errors.Is(err, ErrReplayDropped), errors.Is(err, ErrNoDeadLetter), errors.Is(err, ErrUnknownConsumer),
			errors.Is(err, idem.ErrPurgeInProgress), errors.Is(err, ErrNoBroker):
			result = "refused"
		case err != nil:
			result = "error"
		}
		s.actions.WithLabelValues(a.Kind, result).Inc()
		attrs := []any{"who", who, "remote", r.RemoteAddr, "action", a.Kind, "what", a.String(), "result", result, "at", s.cfg.Now().UTC()}
		if err != nil {
			s.cfg.Logger.Warn("console action", append(attrs, "error", err.Error())...)
			s.settle(key, a, nil)
			if a.Kind == ActionReplay && !a.Force && !asJSON && errors.Is(err, ErrForceable) {
				q := url.Values{"action": {a.Kind}, "consumer": {a.Consumer}, "dead_letter": {a.DeadLetter}, "position": {a.Position}, "force": {"true"}}
				w.WriteHeader(http.StatusConflict)
				s.render(w, r, "error", map[string]any{"Title": "Error", "Error": err.Error(), "Code": http.StatusConflict, "Force": "/confirm?" + q.Encode()})
				return
			}
			s.fail(w, r, asJSON, err)
			return
		}
		s.cfg.Logger.Info("console action", attrs...)
		s.settle(key, a, &v)
	} else {
		s.actions.WithLabelValues(a.Kind, "repeated").Inc()
		s.cfg.Logger.Info("console action repeated", "who", who, "remote", r.RemoteAddr, "action", a.Kind, "what", a.String(), "at", s.cfg.Now().UTC())
	}
	if asJSON {
		w.Header().Set("Content-Type", "application/json")
		_ = WriteJSON(w, v)
		return
	}
	s.render(w, r, "done", map[string]any{"Title": "Done", "Result": v, "Repeated": seen})
}

// doneAction is an action that ran under a key, and its result.
type doneAction struct {
	action Action
	view   ActionView
}

// claim returns the result of the action key when it ran already
// (seen), waiting for it while it runs; otherwise it marks the key as
// running, and the caller runs the action and settles the key. So a form
// submitted twice at once acts once. The error matches ErrBadAction when
// the key ran another action than a (a form edited after its
// confirmation), or is ctx's, when it ended while waiting.
func (s *Server) claim(ctx context.Context, key string, a Action) (ActionView, bool, error) {
	for {
		s.mu.Lock()
		if d, ok := s.done[key]; ok {
			s.mu.Unlock()
			if d.action != a {
				return ActionView{}, false, fmt.Errorf("%w: this confirmation ran another action (%s); confirm this one on its own page", ErrBadAction, d.action)
			}
			return d.view, true, nil
		}
		ch, running := s.flight[key]
		if !running {
			s.flight[key] = make(chan struct{})
			s.mu.Unlock()
			return ActionView{}, false, nil
		}
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ActionView{}, false, ctx.Err()
		}
	}
}

// settle ends the run of key, action a: its result v is kept for repeats
// (nil, an action that failed: a repeat runs it again).
func (s *Server) settle(key string, a Action, v *ActionView) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v != nil {
		s.done[key] = doneAction{a, *v}
		s.keys = append(s.keys, key)
		if len(s.keys) > maxKeys {
			delete(s.done, s.keys[0])
			s.keys = s.keys[1:]
		}
	}
	close(s.flight[key])
	delete(s.flight, key)
}

// actionOf reads an action from a query or a form.
func actionOf(q url.Values) (Action, error) {
	a := Action{Kind: q.Get("action"), Consumer: q.Get("consumer"), MessageID: q.Get("id"), OutboxID: q.Get("outbox_id"),
		DeadLetter: q.Get("dead_letter"), Position: q.Get("position"), Force: q.Get("force") == "true"}
	if d := q.Get("older_than"); d != "" {
		n, err := time.ParseDuration(d)
		if err != nil {
			return Action{}, fmt.Errorf("%w: older than %q: want a duration, as in 168h", ErrBadAction, d)
		}
		a.OlderThan = n
	}
	if t := q.Get("token"); t != "" {
		n, err := strconv.ParseInt(t, 10, 64)
		if err != nil {
			return Action{}, ErrBadAction
		}
		a.Token = n
	}
	return a, a.Check()
}

var errCSRF = errors.New("the form's CSRF token does not match: reload the page and confirm again")

// csrf returns the CSRF token of r's browser, setting the cookie that
// holds it when there is none (double-submit: the form must carry the
// cookie's value, which another site can neither read nor set).
func (s *Server) csrf(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie("idem_csrf"); err == nil && len(c.Value) == 64 {
		return c.Value
	}
	v := randomHex()
	http.SetCookie(w, &http.Cookie{Name: "idem_csrf", Value: v, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	return v
}

func (s *Server) csrfOK(r *http.Request) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return false
	}
	c, err := r.Cookie("idem_csrf")
	form := r.PostForm.Get("csrf")
	return err == nil && len(c.Value) == 64 && subtle.ConstantTimeCompare([]byte(c.Value), []byte(form)) == 1
}

func randomHex() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func wantsJSON(r *http.Request) bool {
	return len(r.URL.Path) > 5 && r.URL.Path[:5] == "/api/" || r.Header.Get("Accept") == "application/json"
}

// fail answers err: 400 for bad input, 404 for a missing record or an
// unknown consumer, 409 for the wrong state, 403 for CSRF, 501 for what
// the store cannot do, 500 otherwise, with PublicError's text (the full
// error goes to the log).
func (s *Server) fail(w http.ResponseWriter, r *http.Request, asJSON bool, err error) {
	code, msg := http.StatusInternalServerError, "the store failed; see the console's log"
	switch {
	case errors.Is(err, errCSRF):
		code, msg = http.StatusForbidden, err.Error()
	case errors.Is(err, idemdriver.ErrNotFound), errors.Is(err, ErrUnknownConsumer), errors.Is(err, ErrNoBroker),
		errors.Is(err, ErrNoDeadLetters), errors.Is(err, ErrNoDeadLetter):
		code, msg = http.StatusNotFound, err.Error()
	case errors.Is(err, idemdriver.ErrWrongState), errors.Is(err, ErrReplayDropped), errors.Is(err, idem.ErrPurgeInProgress):
		code, msg = http.StatusConflict, err.Error()
	case errors.Is(err, ErrNoOutbox):
		code, msg = http.StatusNotFound, err.Error()
	case errors.Is(err, idemdriver.ErrUnsupported):
		code, msg = http.StatusNotImplemented, err.Error()
	case errors.Is(err, ErrBadAction), errors.Is(err, idemdriver.ErrInvalidConfig), errors.Is(err, idemdriver.ErrInvalidConsumerName),
		errors.Is(err, idemdriver.ErrInvalidMessageID), errors.Is(err, idemdriver.ErrMissingMessageID):
		code, msg = http.StatusBadRequest, err.Error()
	case errors.Is(err, context.Canceled):
		return
	default:
		msg = PublicError(err, s.cfg.ShowPayloads)
		s.cfg.Logger.Error("console: store error", "path", r.URL.Path, "error", err.Error())
	}
	if asJSON {
		s.jsonError(w, code, msg)
		return
	}
	w.WriteHeader(code)
	s.render(w, r, "error", map[string]any{"Title": "Error", "Error": msg, "Code": code})
}

func (s *Server) jsonError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = WriteJSON(w, map[string]string{"error": msg})
}

// render writes the page name with data. A page whose data sets
// "Public" (the sign-in page, which anyone who reaches the console reads)
// does not name the store.
func (s *Server) render(w http.ResponseWriter, r *http.Request, name string, data map[string]any) {
	data["ReadOnly"], data["Page"] = s.cfg.ReadOnly, name
	if data["Public"] == nil {
		data["Where"] = s.cfg.Where
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := s.tmpl.ExecuteTemplate(w, name+".html", data); err != nil {
		s.cfg.Logger.Error("console: template", "page", name, "error", err.Error())
	}
}
