package idemhttp

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
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
