package idemhttp

import (
	"bufio"
	"crypto/sha256"
	"errors"
	"hash"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// recorder is the ResponseWriter a handler on the idempotency path gets.
// It records the final status, the headers and the body up to a cap, and
// defers sending the response until the handler returns, so that the
// response reaches the client only after it is recorded (or released).
// It starts streaming at once when the handler calls Flush or the body
// outgrows the cap; from then on every byte goes to the client as it is
// written, and recording continues up to the cap.
//
// A client that hangs up does not stop the recording: write errors to the
// client are remembered and the handler's writes still succeed, so the
// response is complete when the final write stores it.
//
// As net/http does, it refuses a body for 204 and 304
// (http.ErrBodyNotAllowed) and bytes past a declared Content-Length
// (http.ErrContentLength), so what is recorded is what the client gets;
// writes after the handler returned fail. Trailers the handler sets reach
// the client of the executing request; they are not recorded.
type recorder struct {
	w      http.ResponseWriter
	header http.Header // what the handler sees
	// pre is w's headers before the handler ran (outer middleware), kept
	// by keepPre before anything changes w's: until then they are w's
	// own (nil here), so a response recorded before it is sent costs no
	// copy.
	pre http.Header
	cap int64

	mu          sync.Mutex
	wroteHeader bool
	status      int
	snap        http.Header // header at WriteHeader
	buf         []byte      // recorded body, also the pending bytes while !streaming
	overflow    bool        // body outgrew cap: buf is dropped
	size        int64
	digest      hash.Hash // the body's SHA-256, from the overflow on (buf held all before)
	streaming   bool
	clientErr   error
	hijackTried bool
	declared    int64 // the Content-Length the handler set before WriteHeader, or -1
	sealed      bool  // the handler returned: its writes fail
	recorded    bool  // result was called: pre and snap are no longer read
}

// errHandlerReturned is what a write gets after the handler returned.
var errHandlerReturned = errors.New("idemhttp: write after the handler returned")

// seal makes the handler's later writes, flushes and WriteHeader calls
// fail or do nothing: what was recorded is what the client gets.
func (rc *recorder) seal() {
	rc.mu.Lock()
	rc.sealed = true
	rc.mu.Unlock()
}

func newRecorder(w http.ResponseWriter, maxBody int64) *recorder {
	return &recorder{w: w, header: cloneHeader(w.Header(), 8), cap: maxBody}
}

// cloneHeader is h.Clone() in a map made for at least room entries, so
// that a handler's usual few fields added to it do not grow it.
func cloneHeader(h http.Header, room int) http.Header {
	n := 0
	for _, vs := range h {
		n += len(vs)
	}
	all := make([]string, n)
	out := make(http.Header, max(len(h), room))
	for k, vs := range h {
		if vs == nil {
			out[k] = nil
			continue
		}
		n = copy(all, vs)
		out[k] = all[:n:n]
		all = all[n:]
	}
	return out
}

// keepPre copies w's headers as they were before the handler ran, before
// they are changed, unless the response was already recorded; rc.mu is
// held.
func (rc *recorder) keepPre() {
	if rc.pre == nil && !rc.recorded {
		rc.pre = rc.w.Header().Clone()
	}
}

// preHeader returns w's headers as they were before the handler ran;
// rc.mu is held.
func (rc *recorder) preHeader() http.Header {
	if rc.pre != nil {
		return rc.pre
	}
	return rc.w.Header()
}

// Header implements http.ResponseWriter.
func (rc *recorder) Header() http.Header { return rc.header }

// WriteHeader implements http.ResponseWriter. Informational statuses
// (1xx but 101) go to the client at once and are not recorded.
func (rc *recorder) WriteHeader(code int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.sealed {
		return
	}
	rc.writeHeader(code)
}

func (rc *recorder) writeHeader(code int) {
	if rc.wroteHeader {
		return
	}
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		rc.keepPre()
		replaceHeader(rc.w.Header(), rc.header, false)
		rc.w.WriteHeader(code)
		return
	}
	rc.wroteHeader = true
	rc.status = code
	rc.snap = rc.header.Clone()
	rc.declared = -1
	if cl := rc.snap.Get("Content-Length"); cl != "" {
		if n, err := strconv.ParseInt(cl, 10, 64); err == nil && n >= 0 {
			rc.declared = n
		}
	}
}

// Write implements http.ResponseWriter.
func (rc *recorder) Write(p []byte) (int, error) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.sealed {
		return 0, errHandlerReturned
	}
	if !rc.wroteHeader {
		rc.writeHeader(http.StatusOK)
	}
	if len(p) == 0 {
		return 0, nil
	}
	// As net/http does: no body for 1xx, 204 and 304, and nothing past a
	// declared Content-Length, so what is recorded is what the client gets.
	if rc.status == http.StatusNoContent || rc.status == http.StatusNotModified {
		return 0, http.ErrBodyNotAllowed
	}
	if rc.declared >= 0 && rc.size+int64(len(p)) > rc.declared {
		return 0, http.ErrContentLength
	}
	rc.size += int64(len(p))
	switch {
	case rc.overflow:
		rc.digest.Write(p)
	case int64(len(rc.buf))+int64(len(p)) <= rc.cap:
		rc.buf = append(rc.buf, p...)
		if rc.streaming {
			rc.send(p)
		}
		return len(p), nil
	default:
		if !rc.streaming {
			rc.startStreaming()
		}
		// Only a body past the cap needs its digest (a record that
		// cannot be replayed keeps it): hashed from here, from the
		// bytes held so far.
		rc.digest = sha256.New()
		rc.digest.Write(rc.buf)
		rc.digest.Write(p)
		rc.overflow = true
		rc.buf = nil
	}
	rc.send(p)
	return len(p), nil
}

// writeOwned is Write for a body its caller gives up (the Proxy's held
// upstream response): when it is the whole body so far and fits the
// cap, it becomes the recorded body with no copy.
func (rc *recorder) writeOwned(b []byte) (int, error) {
	rc.mu.Lock()
	if !rc.sealed && rc.wroteHeader && rc.buf == nil && rc.size == 0 && !rc.streaming &&
		rc.status != http.StatusNoContent && rc.status != http.StatusNotModified &&
		(rc.declared < 0 || int64(len(b)) <= rc.declared) && int64(len(b)) <= rc.cap {
		rc.buf = b
		rc.size = int64(len(b))
		rc.mu.Unlock()
		return len(b), nil
	}
	rc.mu.Unlock()
	return rc.Write(b)
}

// Flush implements http.Flusher: the response starts streaming.
func (rc *recorder) Flush() { _ = rc.FlushError() }

// FlushError is the Flush that http.ResponseController calls.
func (rc *recorder) FlushError() error {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.sealed {
		return errHandlerReturned
	}
	if !rc.wroteHeader {
		rc.writeHeader(http.StatusOK)
	}
	if !rc.streaming {
		rc.startStreaming()
	}
	if rc.clientErr != nil {
		return nil
	}
	if err := http.NewResponseController(rc.w).Flush(); err != nil {
		rc.clientErr = err
	}
	return nil
}

// Hijack refuses: a hijacked connection has no response to record. The
// attempt's key is released.
func (rc *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.hijackTried = true
	return nil, nil, ErrHijackNotSupported
}

// Unwrap returns the underlying ResponseWriter, for
// http.ResponseController's deadlines and full duplex.
func (rc *recorder) Unwrap() http.ResponseWriter { return rc.w }

// startStreaming sends the status, the headers and the pending body.
func (rc *recorder) startStreaming() {
	rc.streaming = true
	rc.sniff()
	rc.keepPre()
	// Once the response is recorded, the snapshot's value slices go to w
	// as they are: nothing reads them again to store them.
	replaceHeader(rc.w.Header(), rc.snap, rc.recorded)
	rc.w.WriteHeader(rc.status)
	rc.send(rc.buf)
}

// sniff sets Content-Type the way net/http would, from the first bytes,
// so that the client and every replay see the same value.
func (rc *recorder) sniff() {
	if _, ok := rc.snap["Content-Type"]; ok || len(rc.buf) == 0 || rc.snap.Get("Transfer-Encoding") != "" {
		return
	}
	rc.snap.Set("Content-Type", http.DetectContentType(rc.buf))
}

func (rc *recorder) send(p []byte) {
	if rc.clientErr != nil || len(p) == 0 {
		return
	}
	if _, err := rc.w.Write(p); err != nil {
		rc.clientErr = err
	}
}

// finish sends whatever the client has not had yet: the whole response
// when nothing was streamed.
func (rc *recorder) finish() {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if !rc.wroteHeader {
		rc.writeHeader(http.StatusOK)
	}
	if !rc.streaming {
		rc.startStreaming()
	}
	rc.sendTrailers()
}

// sendTrailers copies the trailers the handler set (the fields its
// Trailer header declared, and http.TrailerPrefix keys) to the client's
// header map, where net/http reads them once the handler returns. They
// reach the executing request's client only: trailers are not stored.
func (rc *recorder) sendTrailers() {
	dst := rc.w.Header()
	for _, v := range rc.snap.Values("Trailer") {
		for f := range strings.SplitSeq(v, ",") {
			f = http.CanonicalHeaderKey(strings.TrimSpace(f))
			if vs, ok := rc.header[f]; ok && f != "" {
				dst[f] = slices.Clone(vs)
			}
		}
	}
	for k, vs := range rc.header {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			dst[k] = slices.Clone(vs)
		}
	}
}

// started reports whether anything of the final response reached the
// client's connection.
func (rc *recorder) started() bool {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.streaming
}

// result returns the response to store; the lock must not be held.
func (rc *recorder) result(storeSetCookie bool) *storedResponse {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if !rc.wroteHeader {
		rc.writeHeader(http.StatusOK)
	}
	if !rc.streaming {
		rc.sniff()
	}
	rc.recorded = true
	sr := &storedResponse{
		status:     rc.status,
		header:     storableHeader(rc.snap, rc.preHeader(), storeSetCookie),
		replayable: !rc.overflow,
		size:       rc.size,
	}
	if sr.replayable {
		sr.body = rc.buf
	} else {
		copy(sr.digest[:], rc.digest.Sum(nil))
	}
	return sr
}

// replaceHeader makes dst's entries those of src: copies of its value
// slices, or src's own when share is set.
func replaceHeader(dst, src http.Header, share bool) {
	for k := range dst {
		if _, ok := src[k]; !ok {
			delete(dst, k)
		}
	}
	for k, vs := range src {
		if !share {
			vs = slices.Clone(vs)
		}
		dst[k] = vs
	}
}

// hopByHop are the headers that belong to one connection (RFC 9110 section
// 7.6.1), never stored.
var hopByHop = map[string]bool{
	"Connection":          true,
	"Keep-Alive":          true,
	"Proxy-Connection":    true,
	"Proxy-Authenticate":  true,
	"Proxy-Authorization": true,
	"Te":                  true,
	"Trailer":             true,
	"Transfer-Encoding":   true,
	"Upgrade":             true,
}

// storableHeader returns the headers of a response worth replaying: not
// hop-by-hop (nor named by Connection), not Date, Content-Length (set
// again on replay), Idempotent-Replayed or trailers, not Set-Cookie
// unless allowed, and not the headers outer middleware had set before the
// handler ran with the same values (they set them again on the replay).
// The values are h's own slices, not copies.
func storableHeader(h, pre http.Header, storeSetCookie bool) http.Header {
	drop := map[string]bool{}
	for _, v := range h.Values("Connection") {
		for f := range strings.SplitSeq(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				drop[http.CanonicalHeaderKey(f)] = true
			}
		}
	}
	out := make(http.Header, len(h))
	for k, vs := range h {
		ck := http.CanonicalHeaderKey(k)
		switch {
		case hopByHop[ck], drop[ck], ck == "Date", ck == "Content-Length", ck == HeaderReplayed,
			strings.HasPrefix(k, http.TrailerPrefix),
			ck == "Set-Cookie" && !storeSetCookie,
			len(vs) == 0, !validHeaderName(ck):
			continue
		}
		if slices.ContainsFunc(vs, func(v string) bool { return strings.ContainsAny(v, "\r\n\x00") }) {
			continue // net/http would not send it either
		}
		if pv, ok := pre[k]; ok && slices.Equal(pv, vs) {
			continue
		}
		if _, dup := out[ck]; dup {
			out[ck] = slices.Concat(out[ck], vs)
			continue
		}
		// Shared with h: the recorder's snapshot, which nothing changes
		// in place once the response is stored.
		out[ck] = vs
	}
	return out
}
