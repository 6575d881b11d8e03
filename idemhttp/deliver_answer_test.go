package idemhttp

import (
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
