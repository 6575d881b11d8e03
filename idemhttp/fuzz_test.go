package idemhttp

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// FuzzParseKey checks the key parser on any header value: it never panics,
// accepts only 1 to 255 bytes of printable ASCII, is never more lenient in
// strict mode, and decodes the sf-string form of any key it accepts back
// to the same key.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{
		`"8e03978e-40d5-43e8-bc93-6894a57f9324"`, `abc-123`, `""`, `   `, `"a", "b"`, `"abc";v=1`,
		`"abc";a=?1;b=:aGk=:;c=1.5;d=tok/x;e=@-12;f=%"x"`, `"a\"b\\c"`, `"\x"`, `"unterminated`,
		`"a";`, `"a";V=1`, `"a" ;x`, "\t\"k\"\t", `a,b`, `a"b`, "\x7f", `"` + strings.Repeat("k", 256) + `"`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		strictKey, strictErr := ParseKey([]string{v}, true, 0)
		key, err := ParseKey([]string{v}, false, 0)
		if strictErr == nil && (err != nil || key != strictKey) {
			t.Fatalf("strict accepted %q as %q but lenient gave %q, %v", v, strictKey, key, err)
		}
		if err != nil {
			if !errors.Is(err, ErrKeyInvalid) || errors.Is(err, ErrKeyMissing) {
				t.Fatalf("error %v for %q does not match ErrKeyInvalid only", err, v)
			}
			return
		}
		if len(key) < 1 || len(key) > DefaultMaxKeyLength || strings.Trim(key, " ") == "" {
			t.Fatalf("accepted key %q of %d bytes", key, len(key))
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x20 || key[i] > 0x7e {
				t.Fatalf("accepted byte 0x%02x in %q", key[i], key)
			}
		}
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
		back, err := ParseKey([]string{quoted}, true, 0)
		if err != nil || back != key {
			t.Fatalf("sf-string %s of accepted key %q parses as %q, %v", quoted, key, back, err)
		}
		if _, err := ParseKey([]string{v, v}, false, 0); !errors.Is(err, ErrKeyInvalid) {
			t.Fatalf("two field lines accepted: %v", err)
		}
	})
}

// FuzzFingerprint checks the fingerprint on any request: deterministic,
// 32 bytes, equal for the spooled and the direct computation, insensitive
// to the order of query parameters of different names, and sensitive to
// the body, the method and the path.
func FuzzFingerprint(f *testing.F) {
	f.Add("POST", "/x", "a=1&b=2", "application/json", []byte(`{"a":1}`), false)
	f.Add("PATCH", "/x/%2F/y", "q=%zz", "text/plain; charset=UTF-8", []byte("hello"), true)
	f.Add("POST", "/", "", "", []byte{}, true)
	f.Add("POST", "/a b", "x=1&x=2&y", "multipart/form-data; boundary=zz", []byte{0xff, 0}, false)
	f.Add("POST", "/j", "", "application/merge-patch+json", []byte(`{ "b":2, "a":1 }`), true)
	f.Fuzz(func(t *testing.T, method, path, query, ct string, body []byte, canonical bool) {
		if method == "" || strings.ContainsAny(method, " \t\r\n") {
			return
		}
		u := &url.URL{Path: "/" + strings.TrimPrefix(path, "/"), RawQuery: query}
		r := &http.Request{Method: method, URL: u, Header: http.Header{}}
		if ct != "" {
			r.Header.Set("Content-Type", ct)
		}
		fp1, err := Fingerprint(r, bytes.NewReader(body), canonical)
		if err != nil {
			t.Fatal(err)
		}
		fp2, _ := Fingerprint(r, bytes.NewReader(body), canonical)
		if len(fp1) != 32 || !bytes.Equal(fp1, fp2) {
			t.Fatalf("fingerprints %x, %x", fp1, fp2)
		}
		if !canonical {
			// Without a length, with the right one, and with a short
			// one; kept in memory (up to 64 bytes) or spilled to a file.
			for _, hint := range []int64{-1, int64(len(body)), int64(len(body) / 2)} {
				for _, mem := range []int64{8, 64} {
					sp, err := spoolBody(bytes.NewReader(body), hint, 1<<30, mem, t.TempDir())
					if err != nil {
						t.Fatal(err)
					}
					if got := fingerprint(r, sp.sum[:], bodyRaw); !bytes.Equal(got, fp1) {
						t.Fatalf("hint %d, memory %d: spooled fingerprint %x, direct %x", hint, mem, got, fp1)
					}
					back, err := io.ReadAll(sp.reader())
					if err != nil || !bytes.Equal(back, body) || sp.size != int64(len(body)) {
						t.Fatalf("hint %d, memory %d: spooled %d bytes %q (%v), want %q", hint, mem, sp.size, back, err, body)
					}
					sp.close()
				}
			}
		}
		other, _ := Fingerprint(r, bytes.NewReader(append(append([]byte{}, body...), 'x')), false)
		raw, _ := Fingerprint(r, bytes.NewReader(body), false)
		if bytes.Equal(other, raw) {
			t.Fatal("a longer body has the same fingerprint")
		}
		r2 := *r
		r2.Method = method + "X"
		if m, _ := Fingerprint(&r2, bytes.NewReader(body), canonical); bytes.Equal(m, fp1) {
			t.Fatal("another method has the same fingerprint")
		}
		r3 := *r
		r3.URL = &url.URL{Path: u.Path + "z", RawQuery: query}
		if p, _ := Fingerprint(&r3, bytes.NewReader(body), canonical); bytes.Equal(p, fp1) {
			t.Fatal("another path has the same fingerprint")
		}
		if vals, err := url.ParseQuery(query); err == nil && len(vals) > 1 {
			// Reversed order of names, each name's values kept in order.
			var parts []string
			for _, kv := range strings.Split(query, "&") {
				parts = append([]string{kv}, parts...)
			}
			rev := strings.Join(parts, "&")
			// Only when every name has one value: the values of one name
			// keep their order in the fingerprint.
			rv, err := url.ParseQuery(rev)
			same := err == nil && len(rv) == len(vals)
			for k, vs := range vals {
				if !same || len(vs) != 1 || len(rv[k]) != 1 || rv[k][0] != vs[0] {
					same = false
				}
			}
			if same {
				r4 := *r
				r4.URL = &url.URL{Path: u.Path, RawQuery: rev}
				if q, _ := Fingerprint(&r4, bytes.NewReader(body), canonical); !bytes.Equal(q, fp1) {
					t.Fatalf("query %q and %q have different fingerprints", query, rev)
				}
			}
		}
	})
}

// FuzzDecodeRecord checks that any stored bytes decode or fail with
// errCorrupt, never panic, and that a decoded record survives an encode
// and decode unchanged (byte equality would be too strict: the decoder
// accepts overlong varints).
func FuzzDecodeRecord(f *testing.F) {
	f.Add(encodeRecord(&storedResponse{created: time.Unix(1, 2), status: 201, replayable: true,
		header: http.Header{"Location": {"/x/1"}, "Link": {"a", "b"}}, body: []byte(`{"id":1}`)}))
	f.Add(encodeRecord(&storedResponse{created: time.Unix(0, 0), status: 200, size: 1 << 40, digest: [32]byte{1}}))
	// Over smallRecordBytes: names and values decoded one string each.
	f.Add(encodeRecord(&storedResponse{created: time.Unix(3, 4), status: 200, replayable: true,
		header: http.Header{"X-Big": {strings.Repeat("v", smallRecordBytes)}}, body: []byte("b")}))
	f.Add([]byte{1, 1})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		sr, err := decodeRecord(recordContentType, b)
		if err != nil {
			if !errors.Is(err, errCorrupt) {
				t.Fatalf("error %v does not match errCorrupt", err)
			}
			return
		}
		again := encodeRecord(sr)
		sr2, err := decodeRecord(recordContentType, again)
		if err != nil || !bytes.Equal(encodeRecord(sr2), again) || sr2.status != sr.status || !bytes.Equal(sr2.body, sr.body) {
			t.Fatalf("re-encoding of %x: %x, %v", b, again, err)
		}
	})
}

// TestRecordRoundTrip checks the encoding of a replayable and a
// not-replayable response, and that another content type is refused.
func TestRecordRoundTrip(t *testing.T) {
	t.Parallel()
	in := &storedResponse{created: time.Unix(100, 5), status: 402, replayable: true,
		header: http.Header{"Set-Cookie": {"a=1", "b=2"}, "Content-Type": {"application/json"}}, body: []byte{0, 0xff}}
	out, err := decodeRecord(recordContentType, encodeRecord(in))
	if err != nil || out.status != 402 || !bytes.Equal(out.body, in.body) || !out.created.Equal(in.created) ||
		strings.Join(out.header.Values("Set-Cookie"), ",") != "a=1,b=2" {
		t.Fatalf("round trip: %+v, %v", out, err)
	}
	if _, err := decodeRecord("application/json", encodeRecord(in)); !errors.Is(err, errCorrupt) {
		t.Fatalf("foreign content type: %v", err)
	}
}
