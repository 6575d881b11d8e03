package idemhttp

import (
	"bytes"
	"testing"
)

// TestAppendMediaTypeMatchesCanonical: the allocation-free path for a
// plain lower-case media type writes the same fingerprint field as
// canonicalMediaType, so fingerprints recorded before it still match.
func TestAppendMediaTypeMatchesCanonical(t *testing.T) {
	for _, ct := range []string{
		"", " ", "application/json", " application/json ", "Application/JSON", "text/plain; charset=UTF-8",
		"application/vnd.api+json", "application/x-www-form-urlencoded", "application", "application/",
		"/json", "a/b/c", "text/plain;", "multipart/form-data; boundary=x", "application/json\t",
		"appl ication/json", "application/jsön", "*/*", "text/*",
	} {
		want := field(nil, canonicalMediaType(ct))
		if got := appendMediaType(nil, ct); !bytes.Equal(got, want) {
			t.Errorf("appendMediaType(%q) = %q, want %q", ct, got, want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { appendMediaType(make([]byte, 0, 64), "application/json") }); n > 1 {
		t.Errorf("appendMediaType of application/json: %v allocations, want at most the buffer's", n)
	}
}

// TestParseSFStringFastPath: a key without escapes is a slice of the
// header value; one with escapes is unescaped; both end at the closing
// quote.
func TestParseSFStringFastPath(t *testing.T) {
	for _, c := range []struct{ in, val, rest string }{
		{`"abc"`, "abc", ""},
		{`"abc";p=1`, "abc", ";p=1"},
		{`"a\"b"`, `a"b`, ""},
		{`"a\\b";x`, `a\b`, ";x"},
		{`""`, "", ""},
	} {
		val, rest, err := parseSFString(c.in)
		if err != nil || val != c.val || rest != c.rest {
			t.Errorf("parseSFString(%q) = %q, %q, %v; want %q, %q", c.in, val, rest, err, c.val, c.rest)
		}
	}
	for _, in := range []string{`"abc`, "\"a\x01b\"", `"a\xb"`, "\"é\""} {
		if _, _, err := parseSFString(in); err == nil {
			t.Errorf("parseSFString(%q): no error", in)
		}
	}
}
