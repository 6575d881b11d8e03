package idemhttp

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/textproto"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// TestReadAnswer checks how much of an answer the Deliverer reads: none
// of an empty one, all of one whose Content-Length is within the limit,
// and at most the limit of one whose length is unknown or larger.
func TestReadAnswer(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		body   io.ReadCloser
		length int64
		want   string
	}{
		{"no body", http.NoBody, 0, ""},
		{"declared length", io.NopCloser(strings.NewReader("hello")), 5, "hello"},
		{"unknown length", io.NopCloser(strings.NewReader("hello")), -1, "hel"},
		{"longer than the limit", io.NopCloser(strings.NewReader("hello")), 5, "hel"},
		{"zero length not declared as NoBody", io.NopCloser(strings.NewReader("hi")), 0, "hi"},
	} {
		limit := int64(3)
		if c.name == "declared length" {
			limit = 5
		}
		got, err := readAnswer(&http.Response{Body: c.body, ContentLength: c.length}, limit)
		if err != nil || string(got) != c.want {
			t.Errorf("%s: %q, %v; want %q", c.name, got, err, c.want)
		}
	}
	// A body shorter than its declared length is an error, not a
	// truncated answer.
	if _, err := readAnswer(&http.Response{Body: io.NopCloser(strings.NewReader("hi")), ContentLength: 5}, 10); err == nil {
		t.Error("short body: no error")
	}
}

// TestEncodeAnswer checks that an answer's record is what json.Marshal
// makes of it, byte for byte, on the hand-written path (plain strings)
// and the fallback (strings json escapes), and that it decodes back.
func TestEncodeAnswer(t *testing.T) {
	t.Parallel()
	for _, a := range []answer{
		{},
		{Status: 200},
		{Status: 204, ContentType: "application/json"},
		{Status: 201, ContentType: "application/json; charset=utf-8", Body: []byte(`{"id":1}`)},
		{Status: 500, Body: []byte{0, 1, 2, 0xff, 0xfe}},
		{Status: 400, ContentType: "text/plain", Body: []byte("a")},
		{Unknown: "sent, and no complete answer came back: EOF"},
		{Unknown: `quoted "x" and \\ back`},
		{Unknown: "<html> & more"},
		{Status: 200, ContentType: "text/plain; é"},
		{Unknown: "line\nbreak\ttab"},
		{Status: -1, retryAfter: "5"},
	} {
		got := encodeAnswer(&a)
		want, err := json.Marshal(&a)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Body, want) || got.ContentType != answerContentType {
			t.Errorf("%+v: %s (%s); want %s (%s)", a, got.Body, got.ContentType, want, answerContentType)
		}
		if a.Status == 0 && a.Unknown == "" {
			continue // no delivery answer: decodeAnswer refuses it
		}
		back, err := decodeAnswer(got.ContentType, got.Body)
		if err != nil || back.Status != a.Status || back.ContentType != a.ContentType || !bytes.Equal(back.Body, a.Body) || back.Unknown != a.Unknown {
			t.Errorf("%+v: decoded %+v, %v", a, back, err)
		}
	}
}

// TestHeaderKey checks the request header name of a broker header: the
// canonical form of the prefixed name, the same from the cache, and
// right past the cache's size (which stays at maxHeaderKeys).
func TestHeaderKey(t *testing.T) {
	t.Parallel()
	d := &Deliverer{}
	for i := range maxHeaderKeys + 10 {
		name := "trace-id-" + strconv.Itoa(i)
		want := textproto.CanonicalMIMEHeaderKey(HeaderBrokerPrefix + name)
		for range 2 {
			if got := d.headerKey(name); got != want {
				t.Fatalf("%s: %q; want %q", name, got, want)
			}
		}
	}
	if n := len(*d.keys.Load()); n != maxHeaderKeys {
		t.Errorf("cache holds %d names; want %d", n, maxHeaderKeys)
	}
	if _, ok := (*d.keys.Load())["trace-id-0"]; !ok {
		t.Error("the first name seen is not cached")
	}
}

// TestFormatDeadline checks the Idem-Deadline value made from an
// instant's Unix milliseconds: what formatting the instant itself gives
// (RFC 3339, UTC, milliseconds, truncated).
func TestFormatDeadline(t *testing.T) {
	t.Parallel()
	for _, at := range []time.Time{
		time.Date(2026, 12, 6, 21, 3, 4, 999_999_999, time.UTC),
		time.Date(2026, 12, 6, 21, 3, 4, 1_000_000, time.FixedZone("X", 3600)),
		time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC),
	} {
		want := at.UTC().Format("2006-01-02T15:04:05.000Z07:00")
		if got := formatDeadline(at.UnixMilli()); got != want {
			t.Errorf("%v: %q; want %q", at, got, want)
		}
	}
}

// bodyType is a RoundTripper that records the type of each request's
// body and answers 204.
type bodyType struct{ got chan reflect.Type }

func (b bodyType) RoundTrip(r *http.Request) (*http.Response, error) {
	b.got <- reflect.TypeOf(r.Body)
	_, _ = io.Copy(io.Discard, r.Body)
	return &http.Response{StatusCode: http.StatusNoContent, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
}

// TestCallBodyInMemory checks that a call's body is a *bytes.Reader in
// io.NopCloser, as http.NewRequest makes it: net/http writes the headers
// and such a body together, while it flushes the headers alone before
// any other reader (one more write and packet per call).
func TestCallBodyInMemory(t *testing.T) {
	t.Parallel()
	lc, err := idem.NewLeaseConsumer(idem.NewMemoryStore(nil), idem.Config{Name: "body", Lease: time.Minute, PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	target, _ := url.Parse("http://service.test/messages")
	rt := bodyType{got: make(chan reflect.Type, 1)}
	d, err := NewDeliverer(lc, DelivererOptions{Target: target, Transport: rt, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	out, err := d.Process(t.Context(), idem.Message{ID: "m-1", Payload: []byte(`{"n":1}`)})
	if err != nil || out.Status != idem.Processed {
		t.Fatalf("Process: %v %v", out.Status, err)
	}
	if got, want := <-rt.got, reflect.TypeOf(io.NopCloser(&bytes.Reader{})); got != want {
		t.Errorf("request body %v; want %v", got, want)
	}
}
