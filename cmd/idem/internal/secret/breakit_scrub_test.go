package secret

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// TestBreakWordFoldIsASCII: containsWordFold scans ASCII only, which is
// right only if no rune other than w, o, r, d (either case) matches them
// under keywordPassword's (?i): checked over every rune's case-folding
// orbit, and by the pattern itself on each such rune in place of each
// letter.
func TestBreakWordFoldIsASCII(t *testing.T) {
	for _, c := range "wordWORD" {
		for r := unicode.SimpleFold(c); r != c; r = unicode.SimpleFold(r) {
			if r >= utf8.RuneSelf {
				t.Errorf("%q folds to %q (U+%04X): containsWordFold's ASCII scan misses it", c, r, r)
			}
		}
	}
	// The runes outside ASCII that fold to an ASCII letter (K, long s):
	// none may stand in for a letter the scan looks for.
	var odd []rune
	for c := 'A'; c <= 'z'; c++ {
		for r := unicode.SimpleFold(c); r != c; r = unicode.SimpleFold(r) {
			if r >= utf8.RuneSelf {
				odd = append(odd, r)
			}
		}
	}
	if len(odd) == 0 {
		t.Fatal("no rune outside ASCII folds to an ASCII letter: the check checks nothing")
	}
	for _, r := range odd {
		for _, base := range []string{"password=x", "passwd=x"} {
			for i := len("pass"); i < strings.Index(base, "="); i++ {
				text := base[:i] + string(r) + base[i+1:]
				if keywordPassword.MatchString(text) && !containsWordFold(text) {
					t.Errorf("%q (U+%04X for %q) matches keywordPassword but the pre-scan skips it", text, r, base[i])
				}
			}
		}
	}
}

// FuzzBreakScrubURLsSkips: on any text, the pre-scans of scrubURLs never
// change what is masked (scrubURLsEvery runs every pattern on every text).
func FuzzBreakScrubURLsSkips(f *testing.F) {
	for _, s := range []string{
		"postgres://u:p@h/d", "nats://tok@h", "u:p@tcp(h:3306)/d", "u:p@unix(/s)/d",
		"PassWord = 'a b'", "db_PASSWD=x", "natſ://tok@h", "x://:@", "pass\u212Aword=1",
		"a@tcp(b) c://d:e@f password=g&h", "\xff://u:p@h", "WD", "wor", "passwor\nd=x",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		if got, want := scrubURLs(text), scrubURLsEvery(text); got != want {
			t.Errorf("scrubURLs(%q) = %q, want %q", text, got, want)
		}
	})
}
