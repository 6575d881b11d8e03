// Package secret keeps secrets out of everything the idem command prints.
//
// A [Set] holds the secrets of one run: the passwords found in the URLs
// and DSNs it was given ([Set.AddText]) and whole secret values such as a
// scope secret ([Set.AddSecret]). [Set.Scrub] replaces every form of them
// in a text with "xxxxx": the password as written, percent-decoded, and
// percent-encoded (upper- and lowercase hex, path, query and userinfo
// escaping), and the whole userinfo when the URL does not parse. Scrub
// also masks the password of any URL or MySQL DSN in the text, and any
// value given as password= (a libpq keyword/value string, a URL's query;
// also under a name ending in password or passwd, sentinel_password=),
// known or not, so third-party errors that repeat a URL the Set never saw
// are masked too. [Set.Writer] applies Scrub to every write (stdout, stderr,
// logs), and [Set.Err] to an error's text while errors.Is and errors.As
// still see the original.
//
// Secrets of fewer than [MinBareLen] bytes are masked only where they
// stand as a password (after ':' or '=', before '@', a quote, a space or
// the end): masking every occurrence of a short word would garble the
// output without protecting anything a guess would not find.
//
// [Normalize] re-encodes the userinfo of a URL whose password holds '/',
// '?', '#', '@' or a '%' that is not an escape, so drivers see the
// password the operator meant instead of cutting the URL in the middle of
// it (and printing the pieces).
package secret

import (
	"io"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
)

// Mask replaces a secret in scrubbed text.
const Mask = "xxxxx"

// MinBareLen is the length from which a secret is masked wherever it
// appears; shorter ones are masked where they stand as a password.
const MinBareLen = 5

// Set is the secrets of one run. The zero value is empty and ready; a Set
// is safe for concurrent use.
type Set struct {
	mu    sync.RWMutex
	forms map[string]bool
	short []*regexp.Regexp // context patterns of the short forms
	bare  []string         // long forms, longest first
}

// AddText adds the passwords of every URL (scheme://user:password@host)
// and MySQL DSN (user:password@tcp(host)/db) in s, as written and as
// every parser would read them. Text without credentials adds nothing.
func (s *Set) AddText(texts ...string) {
	for _, t := range texts {
		for _, p := range passwords(t) {
			s.add(p)
		}
	}
}

// AddSecret adds v as a whole (a key, a token), with its encoded forms.
func (s *Set) AddSecret(v string) { s.add(v) }

func (s *Set) add(secret string) {
	if secret == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.forms == nil {
		s.forms = map[string]bool{}
	}
	changed := false
	for _, f := range forms(secret) {
		if f == "" || s.forms[f] {
			continue
		}
		s.forms[f], changed = true, true
		if len(f) >= MinBareLen {
			s.bare = append(s.bare, f)
		} else {
			s.short = append(s.short, regexp.MustCompile(`([:=])`+regexp.QuoteMeta(f)+`(@|[\s"'&;,)]|$)`))
		}
	}
	if changed {
		slices.SortFunc(s.bare, func(a, b string) int { return len(b) - len(a) })
	}
}

// Scrub returns text with every known secret and every URL password masked.
func (s *Set) Scrub(text string) string {
	text = scrubURLs(text)
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, f := range s.bare {
		text = strings.ReplaceAll(text, f, Mask)
	}
	for _, re := range s.short {
		text = re.ReplaceAllString(text, "${1}"+Mask+"${2}")
	}
	return text
}

// Err returns err with its text scrubbed, or err itself when there was
// nothing to mask (and nil for nil). The result unwraps to err, so
// errors.Is and errors.As see through it; print the result, never the
// error it wraps.
func (s *Set) Err(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if clean := s.Scrub(msg); clean != msg {
		return &scrubbed{msg: clean, err: err}
	}
	return err
}

type scrubbed struct {
	msg string
	err error
}

func (e *scrubbed) Error() string { return e.msg }
func (e *scrubbed) Unwrap() error { return e.err }

// Writer returns a writer that scrubs each write before passing it to w.
// Every output of the idem command writes whole messages (a line, a log
// record, a table cell) in one call, so a secret is never split across
// two writes. It reports len(p) written on success.
func (s *Set) Writer(w io.Writer) io.Writer { return &writer{s: s, w: w} }

type writer struct {
	s *Set
	w io.Writer
}

func (w *writer) Write(p []byte) (int, error) {
	if _, err := io.WriteString(w.w, w.s.Scrub(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Error returns err with the passwords of urls, and of any URL in its own
// text, masked: for wrapping a third-party error at the call that was
// given the URL.
func Error(err error, urls ...string) error {
	var s Set
	s.AddText(urls...)
	return s.Err(err)
}

// URL returns raw with its password masked, for messages: the scheme, the
// user and the host stay readable. It works on URLs that do not parse.
func URL(raw string) string {
	var s Set
	s.AddText(raw)
	return s.Scrub(raw)
}

// Normalize returns raw with its userinfo percent-encoded when a URL
// parser would cut it: a password holding '/', '?', '#', or a '%' that is
// not an escape (Go's parser), or '@' (drivers that cut the userinfo at
// the first '@'; ':' parses already). The userinfo runs to the last '@'.
// A URL that every parser reads alike, or has no userinfo, is returned as
// it is.
func Normalize(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok || strings.ContainsAny(scheme, "/?#@ ") {
		return raw
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return raw
	}
	if u, err := url.Parse(raw); err == nil {
		cut := u.User == nil && (strings.Contains(u.Path, "@") || strings.Contains(u.Fragment, "@") ||
			(u.Path == "" && strings.Contains(u.RawQuery, "@")))
		if !cut {
			// Go's parser takes the userinfo to the authority's last
			// '@'; some drivers cut at the first one, and would dial a
			// piece of the password as the host. Encode the '@'.
			authority := rest
			if end := strings.IndexAny(rest, "/?#"); end >= 0 {
				authority = rest[:end]
			}
			if last := strings.LastIndex(authority, "@"); u.User != nil && strings.Contains(authority[:last], "@") {
				return scheme + "://" + u.User.String() + "@" + rest[last+1:]
			}
			return raw
		}
	}
	user, pass, hasPass := strings.Cut(rest[:at], ":")
	if strings.ContainsAny(user, "/?#") {
		return raw
	}
	ui := url.User(unescape(user))
	if hasPass {
		ui = url.UserPassword(unescape(user), unescape(pass))
	}
	return scheme + "://" + ui.String() + "@" + rest[at+1:]
}

// unescape decodes %XX escapes, or returns s as written when it holds a
// '%' that is not one.
func unescape(s string) string {
	if d, err := url.PathUnescape(s); err == nil {
		return d
	}
	return s
}

// passwords returns the passwords in text, in every reading: for a URL,
// what url.Parse finds and the userinfo up to the last '@' (which is what
// the operator meant when the password holds '/' or '#'), and that whole
// userinfo; for a DSN, what precedes the last '@'.
func passwords(text string) []string {
	var out []string
	for _, m := range keywordPassword.FindAllStringSubmatch(text, -1) {
		v := m[2]
		if len(v) >= 2 && (v[0] == '\'' || v[0] == '"') && v[len(v)-1] == v[0] {
			v = strings.ReplaceAll(v[1:len(v)-1], `\`+v[:1], v[:1])
		}
		out = append(out, v)
	}
	for _, field := range strings.Fields(text) {
		rest := field
		found := false
		for {
			i := strings.Index(rest, "://")
			if i < 0 {
				break
			}
			found = true
			tok := rest[i+3:]
			next := strings.Index(tok, "://")
			if next >= 0 {
				tok = tok[:next]
			}
			start := strings.LastIndexAny(rest[:i], `"'=,`) + 1
			if u, err := url.Parse(rest[start:i] + "://" + tok); err == nil && u.User != nil {
				if p, ok := u.User.Password(); ok {
					out = append(out, p)
				} else if natsSchemes[strings.ToLower(u.Scheme)] {
					out = append(out, u.User.Username()) // a token
				}
			}
			if at := strings.LastIndex(tok, "@"); at >= 0 {
				if _, pass, ok := strings.Cut(tok[:at], ":"); ok {
					out = append(out, pass, tok[:at])
				}
			}
			rest = rest[i+3:]
		}
		if found {
			continue
		}
		// A DSN (user:password@tcp(host)/db), maybe after a flag name.
		if at := strings.LastIndex(field, "@"); at > 0 {
			ui := field[:at]
			ui = ui[strings.LastIndexAny(ui, `"'=`)+1:]
			if _, pass, ok := strings.Cut(ui, ":"); ok {
				out = append(out, pass)
			}
		}
	}
	return out
}

// forms returns secret as written, decoded, and encoded in the ways URLs
// and logs encode it.
func forms(secret string) []string {
	seen := map[string]bool{}
	var out []string
	add := func(f string) {
		if f != "" && !seen[f] {
			seen[f] = true
			out = append(out, f)
		}
	}
	bases := []string{secret}
	if d, err := url.PathUnescape(secret); err == nil && d != secret {
		bases = append(bases, d)
	}
	if d, err := url.QueryUnescape(secret); err == nil && d != secret {
		bases = append(bases, d)
	}
	for _, b := range bases {
		add(b)
		for _, e := range []string{url.QueryEscape(b), url.PathEscape(b), strings.TrimPrefix(url.UserPassword("", b).String(), ":")} {
			add(e)
			add(lowerHex(e))
		}
	}
	return out
}

var hexEscape = regexp.MustCompile(`%[0-9A-F]{2}`)

func lowerHex(s string) string { return hexEscape.ReplaceAllStringFunc(s, strings.ToLower) }

// urlPassword finds the password of a URL in text: scheme://user: up to the
// last '@' before a space or a quote. dsnPassword finds that of a MySQL DSN.
var (
	// keywordPassword finds a password given as a keyword: in a libpq
	// keyword/value string (password=x, password='x y'), in a URL's query
	// (?password=x), in a driver's message; also under a name that ends
	// in password or passwd (sslpassword, sentinel_password, DB_PASSWD).
	keywordPassword = regexp.MustCompile(`(?i)\b(\w*pass(?:word|wd)\s*=\s*)('(?:[^'\\]|\\.)*'|"[^"]*"|[^\s&;,"')]+)`)
	// urlToken finds the token of a NATS URL (nats://TOKEN@host): a
	// userinfo of one part is a token there, not a user name.
	urlToken    = regexp.MustCompile("(?i)((?:nats|tls|ws|wss)://)[^\\s:@/\"'`<>]+@")
	urlPassword = regexp.MustCompile("([A-Za-z][A-Za-z0-9+.-]*://[^\\s:@/\"'`<>]*:)[^\\s\"'`<>]*@")
	dsnPassword = regexp.MustCompile("([^\\s:@/\"'`=(]+:)[^\\s\"'`]*?@((?:tcp|unix)\\()")
)

// scrubURLs masks the passwords and tokens the patterns above find. Each
// pattern runs only on text holding what it cannot match without (a
// cheap scan first): most text scrubbed is a log line with none of them,
// and a command that logs a line per request or message should not run
// four regular expressions over each.
func scrubURLs(text string) string {
	if containsWordFold(text) {
		text = keywordPassword.ReplaceAllString(text, "${1}"+Mask)
	}
	if strings.Contains(text, "://") {
		text = urlPassword.ReplaceAllStringFunc(text, func(m string) string {
			sub := urlPassword.FindStringSubmatch(m)
			if placeholders[m[len(sub[1]):len(m)-1]] {
				return m // usage text: amqp://USER:PASS@HOST/
			}
			return sub[1] + Mask + "@"
		})
		text = urlToken.ReplaceAllString(text, "${1}"+Mask+"@")
	}
	if strings.Contains(text, "@tcp(") || strings.Contains(text, "@unix(") {
		text = dsnPassword.ReplaceAllString(text, "${1}"+Mask+"@${2}")
	}
	return text
}

// containsWordFold reports whether text holds "word" or "wd" in any
// case: what keywordPassword's case-insensitive "password" or "passwd"
// needs. Their letters fold to ASCII only (unlike k and s), so an ASCII
// scan decides.
func containsWordFold(text string) bool {
	for i := 0; i+2 <= len(text); i++ {
		if text[i]|0x20 != 'w' {
			continue
		}
		switch text[i+1] | 0x20 {
		case 'd':
			return true
		case 'o':
			if i+4 <= len(text) && text[i+2]|0x20 == 'r' && text[i+3]|0x20 == 'd' {
				return true
			}
		}
	}
	return false
}

// natsSchemes are the schemes of NATS URLs, whose one-part userinfo is a
// token.
var natsSchemes = map[string]bool{"nats": true, "tls": true, "ws": true, "wss": true}

// placeholders are the passwords of the URLs in the command's own usage
// texts, which Scrub leaves readable. A Set masks them still where they
// are a secret it was given.
var placeholders = map[string]bool{"PASS": true, "PASSWORD": true}
