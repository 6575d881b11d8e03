package secret

import (
	"strings"
	"testing"
)

// TestPrefixedPasswordKeywords: a password given as a query parameter or
// keyword whose name ends in "password" (sentinel_password, which
// go-redis reads from FailoverOptions only and refuses in a URL, so the
// refusal quotes the URL; auth_password; db_passwd) is masked as
// password= is, by a Set that was given it and by one that knows nothing.
func TestPrefixedPasswordKeywords(t *testing.T) {
	for _, tc := range []struct{ given, secret, text string }{
		{"redis-sentinel://h:26379/0?master_name=m&sentinel_password=S3ntinelPw9", "S3ntinelPw9",
			`bad URL: store "redis-sentinel://h:26379/0?master_name=m&sentinel_password=S3ntinelPw9": redis: unexpected option: sentinel_password`},
		{"redis-cluster://h:7000?auth_password=AuthPassw0rd1", "AuthPassw0rd1", `store "redis-cluster://h:7000?auth_password=AuthPassw0rd1"`},
		{"host=h DB_PASSWD=DbPassw0rd3 dbname=d", "DbPassw0rd3", "failed: DB_PASSWD=DbPassw0rd3"},
	} {
		secret := tc.secret
		var s Set
		s.AddText(tc.given)
		if got := s.Scrub(tc.text); strings.Contains(got, secret) {
			t.Errorf("AddText(%q); Scrub(%q) = %q keeps the password", tc.given, tc.text, got)
		}
		if got := (&Set{}).Scrub(tc.text); strings.Contains(got, secret) {
			t.Errorf("Scrub(%q) knowing nothing = %q keeps the password", tc.text, got)
		}
		if got := URL(tc.given); strings.Contains(got, secret) {
			t.Errorf("URL(%q) = %q keeps the password", tc.given, got)
		}
	}
}
