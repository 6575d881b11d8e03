package idemhttp_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/idem-go/idem/idemhttp"
)

// TestProblemTypesAreDocumented: every problem type this package declares
// (a constant ProblemTypeBase + "name") has its own section "## name" in
// docs/problems.md, the page its URI points at, and that page documents no
// other type.
func TestProblemTypesAreDocumented(t *testing.T) {
	t.Parallel()
	if !strings.HasSuffix(idemhttp.ProblemTypeBase, "/docs/problems.md#") {
		t.Fatalf("ProblemTypeBase %q does not point at docs/problems.md", idemhttp.ProblemTypeBase)
	}
	decl := regexp.MustCompile(`= ProblemTypeBase \+ "([a-z-]+)"`)
	var declared []string
	for _, f := range []string{"problem.go", "proxy.go"} {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range decl.FindAllStringSubmatch(string(src), -1) {
			declared = append(declared, m[1])
		}
	}
	doc, err := os.ReadFile("../docs/problems.md")
	if err != nil {
		t.Fatal(err)
	}
	var sections []string
	for _, m := range regexp.MustCompile(`(?m)^## ([a-z-]+)$`).FindAllStringSubmatch(string(doc), -1) {
		sections = append(sections, m[1])
	}
	slices.Sort(declared)
	slices.Sort(sections)
	if len(declared) < 16 || !slices.Equal(declared, sections) {
		t.Errorf("declared problem types %v, documented %v", declared, sections)
	}
}
