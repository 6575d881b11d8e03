package idem_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/idem-go/idem"
)

// TestJSONFingerprintSame is the equal half of the canonical-JSON matrix:
// payloads that mean the same JSON value share one fingerprint.
func TestJSONFingerprintSame(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		a, b string
	}{
		{"top-level key order", `{"a":1,"b":2}`, `{"b":2,"a":1}`},
		{"nested key order", `{"a":1,"b":{"c":2,"d":3}}`, `{"b":{"d":3,"c":2},"a":1}`},
		{"key order in objects inside arrays", `[{"x":1,"y":2}]`, `[{"y":2,"x":1}]`},
		{"whitespace", `{"a":[1,2],"b":null}`, " {\n\t\"a\" : [ 1 , 2 ] ,\r\n \"b\" : null } "},
		{"trailing newline", `{"a":1}`, "{\"a\":1}\n"},
		{"escaped vs literal é", `"\u00e9"`, `"é"`},
		{"escaped vs literal in a key", `{"\u00e9":1}`, `{"é":1}`},
		{"escaped slash", `"a\/b"`, `"a/b"`},
		{"escaped ASCII letter", `"\u0041"`, `"A"`},
		{"escaped surrogate pair vs literal", `"\ud83d\ude00"`, `"😀"`},
		{"1 vs 1.0", `1`, `1.0`},
		{"1 vs 1e0", `1`, `1e0`},
		{"1 vs 1E+0", `1`, `1E+0`},
		{"1 vs 10e-1", `1`, `10e-1`},
		{"1 vs 0.1e1", `1`, `0.1e1`},
		{"100 vs 1e2", `100`, `1e2`},
		{"1.50 vs 1.5", `1.50`, `1.5`},
		{"-0 vs 0", `-0`, `0`},
		{"0 vs 0.0", `0`, `0.0`},
		{"-0.0e5 vs 0", `-0.0e5`, `0`},
		{"0e999999999999999999999 vs 0", `0e999999999999999999999`, `0`},
		{"-1.0 vs -1", `-1.0`, `-1`},
		{"huge exponent spellings", `10e2147483647`, `1e2147483648`},
		{"big integer spellings", `9007199254740993`, `9007199254740993.000`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fa, err := idem.JSONFingerprint([]byte(tt.a))
			if err != nil {
				t.Fatalf("JSONFingerprint(%q): %v", tt.a, err)
			}
			fb, err := idem.JSONFingerprint([]byte(tt.b))
			if err != nil {
				t.Fatalf("JSONFingerprint(%q): %v", tt.b, err)
			}
			if !bytes.Equal(fa, fb) {
				ca, _ := idem.CanonicalJSON([]byte(tt.a))
				cb, _ := idem.CanonicalJSON([]byte(tt.b))
				t.Errorf("fingerprints of %q and %q differ; canonical forms %q and %q", tt.a, tt.b, ca, cb)
			}
		})
	}
}

// TestJSONFingerprintDifferent is the other half: payloads that mean
// different things have different fingerprints.
func TestJSONFingerprintDifferent(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		a, b string
	}{
		{"changed value", `{"a":1,"b":{"c":2,"d":3}}`, `{"a":2,"b":{"c":2,"d":3}}`},
		{"array order", `[1,2]`, `[2,1]`},
		{"array order of objects", `[{"a":1},{"b":2}]`, `[{"b":2},{"a":1}]`},
		{"integers above 2^53", `9007199254740993`, `9007199254740992`},
		{"integers above 2^64", `18446744073709551617`, `18446744073709551616`},
		{"decimals past float64 precision", `0.10000000000000000001`, `0.1`},
		{"number vs string", `1`, `"1"`},
		{"null vs missing", `{"a":null}`, `{}`},
		{"false vs 0", `false`, `0`},
		{"empty array vs empty object", `[]`, `{}`},
		{"NFC vs NFD", `"\u00e9"`, `"e\u0301"`},
		{"case", `"A"`, `"a"`},
		{"key case", `{"a":1}`, `{"A":1}`},
		{"nesting", `[[1]]`, `[1]`},
		{"1e2 vs 1e-2", `1e2`, `1e-2`},
		{"negative", `-1`, `1`},
		{"whitespace inside a string", `"a b"`, `"ab"`},
		{"string vs its escape spelled as text", `"\n"`, `"\\n"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fa, err := idem.JSONFingerprint([]byte(tt.a))
			if err != nil {
				t.Fatalf("JSONFingerprint(%q): %v", tt.a, err)
			}
			fb, err := idem.JSONFingerprint([]byte(tt.b))
			if err != nil {
				t.Fatalf("JSONFingerprint(%q): %v", tt.b, err)
			}
			if bytes.Equal(fa, fb) {
				t.Errorf("fingerprints of %q and %q are equal", tt.a, tt.b)
			}
		})
	}
}

// TestJSONFingerprintInvalid: payloads that are not exactly one valid
// JSON value, or whose meaning depends on the parser, are refused with
// ErrInvalidPayload.
func TestJSONFingerprintInvalid(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, payload string }{
		{"empty", ""},
		{"only whitespace", " \n"},
		{"truncated", `{"a":`},
		{"not JSON", `hello`},
		{"duplicate key", `{"a":1,"a":2}`},
		{"duplicate key, same value", `{"a":1,"a":1}`},
		{"duplicate nested key", `{"x":{"a":1,"a":2}}`},
		{"duplicate key spelled with an escape", `{"é":1,"\u00e9":2}`},
		{"two values", `{} {}`},
		{"trailing garbage", `{}x`},
		{"trailing comma", `[1,]`},
		{"invalid UTF-8 in a string", "\"\xff\""},
		{"invalid UTF-8 outside strings", "[1]\xff"},
		{"single quotes", `{'a':1}`},
		{"NaN", `NaN`},
		{"leading zero", `01`},
		{"unescaped control character", "\"a\x01\""},
		{"exponent beyond the bound", `1e9999999999999999999`},
		{"nesting too deep", strings.Repeat("[", 10001) + strings.Repeat("]", 10001)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if fp, err := idem.JSONFingerprint([]byte(tt.payload)); !errors.Is(err, idem.ErrInvalidPayload) {
				t.Errorf("JSONFingerprint(%.40q) = %x, %v; want an error matching ErrInvalidPayload", tt.payload, fp, err)
			}
		})
	}
	// Deep but within the bound is fine.
	deep := strings.Repeat("[", 10000) + strings.Repeat("]", 10000)
	if _, err := idem.JSONFingerprint([]byte(deep)); err != nil {
		t.Errorf("JSONFingerprint of 10000 nested arrays: %v, want nil", err)
	}
}

func TestCanonicalJSON(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{`{"b":1,"a":[true,false,null]}`, `{"a":[true,false,null],"b":1}`},
		{`{"é":1,"z":2,"a":3}`, `{"a":3,"z":2,"é":1}`}, // UTF-8 byte order
		{`1.0`, `1`},
		{`1.50`, `15e-1`},
		{`100`, `1e2`},
		{`-0.0`, `0`},
		{`0.001`, `1e-3`},
		{`"\u0001\"\\\/"`, `"\u0001\"\\/"`},
		{`"\u2028"`, "\"\u2028\""},
		{` [ ] `, `[]`},
	}
	for _, tt := range tests {
		got, err := idem.CanonicalJSON([]byte(tt.in))
		if err != nil || string(got) != tt.want {
			t.Errorf("CanonicalJSON(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

func TestSHA256Fingerprint(t *testing.T) {
	t.Parallel()
	a, _ := idem.SHA256Fingerprint([]byte(`{"a":1,"b":2}`))
	b, _ := idem.SHA256Fingerprint([]byte(`{"b":2,"a":1}`))
	if len(a) != 32 || bytes.Equal(a, b) {
		t.Errorf("SHA256Fingerprint: %x and %x; want 32 bytes each, different for different bytes", a, b)
	}
	n, _ := idem.SHA256Fingerprint(nil)
	e, _ := idem.SHA256Fingerprint([]byte{})
	if !bytes.Equal(n, e) {
		t.Errorf("SHA256Fingerprint: nil and empty payloads differ")
	}
}

// FuzzCanonicalJSON checks that canonicalisation never panics, that its
// output is valid JSON in canonical form already (canonical(canonical(x))
// == canonical(x)), and that it accepts only valid JSON.
func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{
		`{"a":1,"b":{"c":2,"d":3}}`, `{"b":{"d":3,"c":2},"a":1}`, `[1,2]`, `"\u00e9"`, `"é"`, `1`, `1.0`, `1e0`,
		`-0`, `0`, `9007199254740993`, `{"a":1,"a":2}`, "{}\n", `10e2147483647`, `0.1e-2147483648`,
		`[{"x":[{"y":null}]}]`, `"\ud800"`, `"\u0000"`, `1E-7`, `-12.3400e+5`, `true`, `{"":""}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		c1, err := idem.CanonicalJSON(payload)
		if err != nil {
			if !errors.Is(err, idem.ErrInvalidPayload) {
				t.Fatalf("CanonicalJSON(%q) error %v does not match ErrInvalidPayload", payload, err)
			}
			return
		}
		if !json.Valid(payload) {
			t.Fatalf("CanonicalJSON accepted invalid JSON %q", payload)
		}
		if !json.Valid(c1) {
			t.Fatalf("CanonicalJSON(%q) = %q, which is not valid JSON", payload, c1)
		}
		c2, err := idem.CanonicalJSON(c1)
		if err != nil {
			t.Fatalf("CanonicalJSON(%q) = %q, which it then refuses: %v", payload, c1, err)
		}
		if !bytes.Equal(c1, c2) {
			t.Fatalf("CanonicalJSON is not idempotent: %q -> %q -> %q", payload, c1, c2)
		}
	})
}

func TestJSONFingerprintSurrogates(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{`"\ud800"`, `"\udfff"`, `["a\ud83d"]`, `{"k":"\ud83d\u0041"}`, `"\ud83d\ud83d\ude00"`} {
		if _, err := idem.JSONFingerprint([]byte(bad)); !errors.Is(err, idem.ErrInvalidPayload) {
			t.Errorf("JSONFingerprint(%s) = %v, want ErrInvalidPayload (unpaired surrogate)", bad, err)
		}
	}
	pair, err1 := idem.JSONFingerprint([]byte(`"\ud83d\ude00"`))
	raw, err2 := idem.JSONFingerprint([]byte(`"😀"`))
	if err1 != nil || err2 != nil || string(pair) != string(raw) {
		t.Errorf("a surrogate pair must equal the character it encodes: %v %v", err1, err2)
	}
	if _, err := idem.JSONFingerprint([]byte(`"\\ud800"`)); err != nil {
		t.Errorf(`an escaped backslash before "ud800" is not an escape: %v`, err)
	}
}
