package scenariotest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// handProxy is BenchmarkProxy's hand-written idempotent reverse proxy on
// Redis ("hand-proxy"): what a careful programmer would write by hand for
// the guarantee idemhttp's proxy gives a new key and a replay, and
// nothing else. A keyed request costs one script before it is forwarded
// (handProxyAcquire: a fenced lease whose acquisition also records that
// the request may be forwarded, so a takeover after a crash answers that
// the outcome is unknown instead of forwarding again) and one after
// (handProxyComplete: the response stored under the lease's token, the
// key scored in a retention index by the server's clock). The key is
// scoped by the SHA-256 of the Authorization header, the request
// fingerprinted by method, path and body, the response held until it is
// stored (status, header, body), and the upstream called on a context
// detached from the client's and bounded. It has no renewals (its lease
// is the upstream timeout), no hooks, no logs, no metrics, no streaming
// of large responses and no classification of upstream failures (one
// answers 502 and keeps the key until its lease ends): those are what
// idemhttp adds beyond the measured path.
type handProxy struct {
	c      redis.UniversalClient
	prefix string
	rp     *httputil.ReverseProxy
}

// handProxyLease is the hand-written proxy's lease and upstream timeout.
const handProxyLease = 60 * time.Second

// handProxyAcquire: KEYS record; ARGV fingerprint, lease (ms). Answers the
// stored response (a string) to a replay, -2 for a key used with another
// request, -1 while another attempt holds the lease, -3 when an earlier
// attempt was forwarded and never stored a response, and otherwise the
// new token, saved with the lease and the run mark.
//
// handProxyComplete: KEYS record, retention index; ARGV token, response,
// record ID. Stores the response when token still holds the key and no
// response is stored: 1; otherwise 0.
var (
	handProxyAcquire = redis.NewScript(`
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local r = redis.call('HMGET', KEYS[1], 'token', 'until', 'fp', 'result', 'run')
if r[1] then
	if r[3] ~= ARGV[1] then return -2 end
	if r[4] then return r[4] end
	if tonumber(r[2]) > now then return -1 end
	if r[5] then return -3 end
end
local token = (tonumber(r[1]) or 0) + 1
redis.call('HSET', KEYS[1], 'token', token, 'until', now + ARGV[2], 'fp', ARGV[1], 'run', token)
return token
`)
	handProxyComplete = redis.NewScript(`
local r = redis.call('HMGET', KEYS[1], 'token', 'result')
if r[1] ~= ARGV[1] or r[2] then return 0 end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('ZADD', KEYS[2], now, ARGV[3])
redis.call('HSET', KEYS[1], 'result', ARGV[2], 'until', now)
return 1
`)
)

func newHandProxy(c redis.UniversalClient, prefix string, upstream *url.URL) http.Handler {
	rp := httputil.NewSingleHostReverseProxy(upstream)
	rp.Transport = &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 256, IdleConnTimeout: 1500 * time.Millisecond}
	return &handProxy{c: c, prefix: prefix, rp: rp}
}

// heldResponse is the hand-written proxy's response writer: it keeps the
// upstream's response until it is stored.
type heldResponse struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (h *heldResponse) Header() http.Header { return h.header }
func (h *heldResponse) WriteHeader(code int) {
	if h.status == 0 {
		h.status = code
	}
}

func (h *heldResponse) Write(b []byte) (int, error) {
	if h.status == 0 {
		h.status = http.StatusOK
	}
	return h.body.Write(b)
}

// encode writes the response as "status\nName: value\n...\n\nbody".
func (h *heldResponse) encode() string {
	var b strings.Builder
	b.WriteString(strconv.Itoa(h.status))
	b.WriteByte('\n')
	for k, vs := range h.header {
		for _, v := range vs {
			b.WriteString(k)
			b.WriteString(": ")
			b.WriteString(v)
			b.WriteByte('\n')
		}
	}
	b.WriteByte('\n')
	b.Write(h.body.Bytes())
	return b.String()
}

// writeStored answers with a response encode wrote.
func writeStored(w http.ResponseWriter, stored string) {
	head, body, _ := strings.Cut(stored, "\n\n")
	status, fields, _ := strings.Cut(head, "\n")
	for line := range strings.SplitSeq(fields, "\n") {
		if k, v, ok := strings.Cut(line, ": "); ok {
			w.Header().Add(k, v)
		}
	}
	code, _ := strconv.Atoi(status)
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(code)
	_, _ = io.WriteString(w, body)
}

func (p *handProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	if key == "" || r.Method != http.MethodPost {
		p.rp.ServeHTTP(w, r)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	scope := sha256.Sum256([]byte(r.Header.Get("Authorization")))
	fp := sha256.New()
	io.WriteString(fp, r.Method+" "+r.URL.Path+"\n")
	fp.Write(body)
	id := hex.EncodeToString(scope[:16]) + ":" + key
	rec := p.prefix + "{" + id + "}"
	ctx := r.Context()
	v, err := handProxyAcquire.Run(ctx, p.c, []string{rec}, fp.Sum(nil), handProxyLease.Milliseconds()).Result()
	if err != nil {
		http.Error(w, "store unavailable", http.StatusServiceUnavailable)
		return
	}
	switch v := v.(type) {
	case string:
		writeStored(w, v)
		return
	case int64:
		switch {
		case v == -1:
			http.Error(w, "in progress", http.StatusConflict)
			return
		case v == -2:
			http.Error(w, "key reused", http.StatusUnprocessableEntity)
			return
		case v < 0:
			http.Error(w, "outcome unknown", http.StatusBadGateway)
			return
		}
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), handProxyLease)
		defer cancel()
		out := r.WithContext(fctx)
		out.Body, out.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		held := &heldResponse{header: http.Header{}}
		p.rp.ServeHTTP(held, out)
		stored := held.encode()
		n, err := handProxyComplete.Run(fctx, p.c, []string{rec, p.prefix + "done"}, v, stored, id).Int64()
		if err != nil || n != 1 {
			http.Error(w, "response not stored", http.StatusServiceUnavailable)
			return
		}
		writeStored(w, stored)
	}
}
