package idemcli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// logFlags are --log-format and --log-level.
type logFlags struct{ format, level string }

// register adds --log-format and --log-level to fl; what names the thing
// logged once per line at info ("request", "message").
func (f *logFlags) register(fl *pflag.FlagSet, what string) {
	fl.StringVar(&f.format, "log-format", "text", "log format on stderr: text or json (one line per "+what+" at info; see Logging)")
	fl.StringVar(&f.level, "log-level", "info", "lowest level logged: debug, info, warn or error (warn: no "+what+" lines)")
}

// newLogger returns the slog.Logger of --log-format (text or json) and
// --log-level (debug, info, warn, error) writing to w; a bad value is a
// usage error.
func (f logFlags) newLogger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.level)); err != nil {
		return nil, usageError{fmt.Errorf("--log-level %q: want debug, info, warn or error", f.level)}
	}
	opts := &slog.HandlerOptions{Level: level}
	switch f.format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usageError{fmt.Errorf("--log-format %q: want text or json", f.format)}
}

// requestLog is what the idempotency middleware tells the request log
// about one request (through requestLogHook).
type requestLog struct {
	ev   idemhttp.ResponseEvent
	seen bool
}

type requestLogKey struct{}

// requestLogHook is an idemhttp.HookResponse that hands each request's
// ResponseEvent to the request log of its context.
type requestLogHook struct{}

func (requestLogHook) OnResponse(ctx context.Context, e idemhttp.ResponseEvent) {
	if rl, _ := ctx.Value(requestLogKey{}).(*requestLog); rl != nil {
		rl.ev, rl.seen = e, true
	}
}

// statusWriter records the status and the size of a response; Unwrap lets
// http.ResponseController reach the connection's Flush.
type statusWriter struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// logRequests logs one line at info per request served by next: method,
// path (without the query string, which may carry secrets), status,
// response bytes, duration, and for requests on the idempotency path the
// outcome (processed, duplicate, ...), whether it was a replay, the
// problem type of an answer of the middleware's own, and key_hash: the
// first 16 hex digits of the SHA-256 of the record ID (which is the hashed
// scope and the Idempotency-Key), so the lines of one key's retries can be
// matched without the key itself being logged. No header value (the
// Authorization scope, the key) and no body is ever logged.
func logRequests(logger *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !logger.Enabled(r.Context(), slog.LevelInfo) {
			next.ServeHTTP(w, r)
			return
		}
		start := time.Now()
		rl := &requestLog{}
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), requestLogKey{}, rl)))
		attrs := []slog.Attr{
			slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.Int("status", sw.status), slog.Int64("bytes", sw.bytes),
			slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000),
		}
		if rl.seen {
			attrs = append(attrs, slog.String("outcome", outcomeName(rl.ev)), slog.Bool("replayed", rl.ev.Replayed))
			if rl.ev.Problem != "" {
				attrs = append(attrs, slog.String("problem", rl.ev.Problem[strings.LastIndexAny(rl.ev.Problem, "/#:")+1:]))
			}
			if rl.ev.RecordID != "" {
				sum := sha256.Sum256([]byte(rl.ev.RecordID))
				attrs = append(attrs, slog.String("key_hash", hex.EncodeToString(sum[:8])))
			}
		}
		logger.LogAttrs(r.Context(), slog.LevelInfo, "request", attrs...)
	})
}

// outcomeName names the idempotency outcome of a request: the core's
// status (Processed, Duplicate, ...), or "Rejected" for one answered
// before its key reached the store.
func outcomeName(e idemhttp.ResponseEvent) string {
	if e.Outcome != 0 {
		return e.Outcome.String()
	}
	if e.Status >= 400 {
		return idem.Rejected.String()
	}
	return "none"
}
