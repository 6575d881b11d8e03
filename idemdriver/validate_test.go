package idemdriver

import (
	"math"
	"strings"
	"testing"
)

// TestValidateStepPrefixAsTheLongestStep holds validateStepPrefix to the
// verdict and the error text of ValidateStepName on the longest step the
// prefix makes (PrefixStep with math.MaxInt64), which it checks without
// building that name.
func TestValidateStepPrefixAsTheLongestStep(t *testing.T) {
	longest := MaxStepNameLength - maxTokenDigits
	for _, prefix := range []string{
		"run:", "idemhttp:deliver:run:", strings.Repeat("p", longest), strings.Repeat("p", longest+1),
		strings.Repeat("é", 200), "bad\x01prefix:", "del\x7f", "c1\u0085", "cut\xe2\x82", "\xff", "ok\uFFFD",
	} {
		want := ValidateStepName(PrefixStep(prefix, math.MaxInt64))
		got := validateStepPrefix(prefix)
		if (got == nil) != (want == nil) || (got != nil && got.Error() != want.Error()) {
			t.Errorf("prefix %q: validateStepPrefix = %v, want %v", prefix, got, want)
		}
	}
	if err := validateStepPrefix(strings.Repeat("p", longest)); err != nil {
		t.Errorf("a prefix of %d bytes: %v, want nil (its longest step is %d bytes)", longest, err, MaxStepNameLength)
	}
	if err := validateStepPrefix(strings.Repeat("p", longest+1)); err == nil {
		t.Errorf("a prefix of %d bytes: nil, want an error", longest+1)
	}
}
