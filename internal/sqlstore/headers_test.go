package sqlstore

import (
	"maps"
	"testing"
)

// TestDecodeHeaders: the headers column as any program may write it; "{}"
// (what most rows hold) and anything but a JSON object are no headers.
func TestDecodeHeaders(t *testing.T) {
	for _, c := range []struct {
		in   string
		want map[string]string
	}{
		{"{}", nil},
		{"", nil},
		{"[]", nil},
		{"null", nil},
		{`{"a":"b","n":1,"o":{"x":true}}`, map[string]string{"a": "b", "n": "1", "o": `{"x":true}`}},
	} {
		if got := DecodeHeaders(c.in); !maps.Equal(got, c.want) || (got == nil) != (c.want == nil) {
			t.Errorf("DecodeHeaders(%q) = %v, want %v", c.in, got, c.want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { DecodeHeaders("{}") }); n != 0 {
		t.Errorf("DecodeHeaders(\"{}\") allocates %v times, want none", n)
	}
}
