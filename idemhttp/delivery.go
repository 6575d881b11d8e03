package idemhttp

import (
	"context"
	"net/http"
	"strings"

	"github.com/idem-go/idem"
)

// httpHeader is an idem.HeaderCarrier over a request's headers.
type httpHeader http.Header

func (h httpHeader) Get(key string) string { return http.Header(h).Get(key) }

func (h httpHeader) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}

// withRequestDelivery returns r's context carrying an idem.Delivery with
// the request's headers (no System: a request went through no broker), so
// that a tracing hook continues the caller's trace context (traceparent)
// when the server itself is not traced.
func withRequestDelivery(r *http.Request) context.Context {
	return idem.WithDelivery(r.Context(), idem.Delivery{Header: httpHeader(r.Header)})
}

// route is the path part of a ServeMux pattern ("POST example.com/a/{id}"
// gives "/a/{id}"), "" for none.
func route(pattern string) string {
	if i := strings.IndexByte(pattern, '/'); i >= 0 {
		return pattern[i:]
	}
	return ""
}
