package idem_test

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idem-go/idem"
)

func TestValidateMessageID(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		id   string
		max  int
		want error // nil: valid
	}{
		{"one byte", "a", 0, nil},
		{"typical UUID", "0190a3f2-7c1e-7d3a-9b1e-3f2a1c9d8e7f", 0, nil},
		{"255 bytes", strings.Repeat("a", 255), 0, nil},
		{"255 bytes of 2-byte runes and one ASCII", strings.Repeat("é", 127) + "x", 0, nil},
		{"255 bytes of 3-byte runes", strings.Repeat("€", 85), 0, nil},
		{"4-byte runes", "\U0001F600", 0, nil},
		{"spaces inside and around", " a b ", 0, nil},
		{"real U+FFFD", "\ufffd", 0, nil},
		{"no-break space", "\u00a0", 0, nil},
		{"U+2028 line separator", "a\u2028b", 0, nil},
		{"printable ASCII", "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", 0, nil},
		{"custom max, at it", "abcd", 4, nil},
		{"max <= 0 means the default", strings.Repeat("a", 255), -1, nil},

		{"empty", "", 0, idem.ErrMissingMessageID},
		{"empty with a custom max", "", 4, idem.ErrMissingMessageID},
		{"256 bytes", strings.Repeat("a", 256), 0, idem.ErrInvalidMessageID},
		{"256 bytes of 2-byte runes", strings.Repeat("é", 128), 0, idem.ErrInvalidMessageID},
		{"custom max, over it", "abcde", 4, idem.ErrInvalidMessageID},
		{"NUL", "a\x00", 0, idem.ErrInvalidMessageID},
		{"newline", "a\nb", 0, idem.ErrInvalidMessageID},
		{"carriage return", "\r", 0, idem.ErrInvalidMessageID},
		{"tab", "\t", 0, idem.ErrInvalidMessageID},
		{"escape", "\x1b[0m", 0, idem.ErrInvalidMessageID},
		{"unit separator", "\x1f", 0, idem.ErrInvalidMessageID},
		{"DEL", "\x7f", 0, idem.ErrInvalidMessageID},
		{"C1 U+0080", "\u0080", 0, idem.ErrInvalidMessageID},
		{"C1 U+009F", "\u009f", 0, idem.ErrInvalidMessageID},
		{"invalid byte 0xff", "\xff", 0, idem.ErrInvalidMessageID},
		{"lone continuation byte", "a\x80", 0, idem.ErrInvalidMessageID},
		{"overlong slash", "\xc0\xaf", 0, idem.ErrInvalidMessageID},
		{"encoded surrogate", "\xed\xa0\x80", 0, idem.ErrInvalidMessageID},
		{"truncated 3-byte rune", "\xe2\x82", 0, idem.ErrInvalidMessageID},
		{"beyond U+10FFFF", "\xf4\x90\x80\x80", 0, idem.ErrInvalidMessageID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := idem.ValidateMessageID(tt.id, tt.max)
			switch {
			case tt.want == nil && err != nil:
				t.Errorf("ValidateMessageID(%q, %d) = %v, want nil", tt.id, tt.max, err)
			case tt.want != nil && !errors.Is(err, tt.want):
				t.Errorf("ValidateMessageID(%q, %d) = %v, want an error matching %v", tt.id, tt.max, err, tt.want)
			case tt.want == idem.ErrInvalidMessageID && errors.Is(err, idem.ErrMissingMessageID):
				t.Errorf("ValidateMessageID(%q, %d) = %v, which also matches ErrMissingMessageID", tt.id, tt.max, err)
			}
			if err != nil && !idem.IsPermanent(err) {
				t.Errorf("IsPermanent(%v) = false, want true", err)
			}
		})
	}
}

func TestValidateConsumerName(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"billing", "Billing", strings.Repeat("n", 255), "événements", "a b"} {
		if err := idem.ValidateConsumerName(name); err != nil {
			t.Errorf("ValidateConsumerName(%q) = %v, want nil", name, err)
		}
	}
	for _, name := range []string{"", strings.Repeat("n", 256), "a\x00", "a\n", "\xff", "\u0085"} {
		if err := idem.ValidateConsumerName(name); !errors.Is(err, idem.ErrInvalidConsumerName) {
			t.Errorf("ValidateConsumerName(%q) = %v, want an error matching ErrInvalidConsumerName", name, err)
		}
	}
}

// FuzzValidateMessageID checks that validation never panics, that it
// accepts exactly the IDs of 1 to 255 bytes of UTF-8 without control
// characters, and that its errors match the documented sentinels.
func FuzzValidateMessageID(f *testing.F) {
	for _, s := range []string{"", "a", "order-1", " a ", "é", "e\u0301", "\x00", "\n", "\x7f", "\u0085",
		"\xff", "\xc0\x80", "\xed\xa0\x80", "\ufffd", strings.Repeat("a", 255), strings.Repeat("a", 256)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		err := idem.ValidateMessageID(id, 0)
		valid := id != "" && len(id) <= idem.DefaultMaxIDLength && utf8.ValidString(id) &&
			!strings.ContainsFunc(id, func(r rune) bool { return r < 0x20 || (r >= 0x7f && r <= 0x9f) })
		switch {
		case valid && err != nil:
			t.Errorf("ValidateMessageID(%q) = %v, want nil", id, err)
		case !valid && err == nil:
			t.Errorf("ValidateMessageID(%q) accepted an ID that is empty, too long, not UTF-8 or holds a control character", id)
		case id == "" && !errors.Is(err, idem.ErrMissingMessageID):
			t.Errorf("ValidateMessageID(\"\") = %v, want ErrMissingMessageID", err)
		case id != "" && err != nil && !errors.Is(err, idem.ErrInvalidMessageID):
			t.Errorf("ValidateMessageID(%q) = %v, want an error matching ErrInvalidMessageID", id, err)
		}
	})
}
