package operate_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/idem-go/idem"
)

// idem failed prints an error text as it reads, quotes and all, on one
// line of the table: newlines, tabs and escapes become spaces; --json
// keeps the text as it is.
func TestFailedTablePrintsErrorsReadably(t *testing.T) {
	store := idem.NewMemoryStore(nil)
	c := payments(t, store)
	text := "upstream said \"card declined\"\nline two\tcol\x1b[31m"
	_, _ = c.Process(t.Context(), idem.Message{ID: "pay-1", Payload: []byte("x")}, func(context.Context, *idem.Attempt) (idem.Result, error) {
		return idem.Result{}, errors.New(text)
	})

	out, err := run(t, store, "failed", "--store", "mem:", "--consumer", "payments")
	if err != nil {
		t.Fatalf("failed: %v %s", err, out)
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("failed prints %d lines, want a header and one row:\n%s", len(lines), out)
	}
	if want := `upstream said "card declined" line two col [31m`; !strings.HasSuffix(lines[1], want) {
		t.Errorf("row %q, want it to end with %q", lines[1], want)
	}
	if strings.Contains(out, `\"`) || strings.Contains(out, `\n`) || strings.ContainsAny(out, "\t\x1b") {
		t.Errorf("table output escapes or keeps control characters: %q", out)
	}

	// A long text is cut at 200 bytes, between characters.
	_, _ = c.Process(t.Context(), idem.Message{ID: "pay-2", Payload: []byte("x")}, func(context.Context, *idem.Attempt) (idem.Result, error) {
		return idem.Result{}, errors.New("x" + strings.Repeat("é", 150))
	})
	out, _ = run(t, store, "failed", "--store", "mem:", "--consumer", "payments")
	if want := " x" + strings.Repeat("é", 99) + "...\n"; !strings.Contains(out, want) {
		t.Errorf("long error not cut at 199 bytes:\n%s", out)
	}

	out, err = run(t, store, "failed", "--store", "mem:", "--consumer", "payments", "--json")
	if err != nil || !strings.Contains(out, `"upstream said \"card declined\"\nline two\tcol\u001b[31m"`) {
		t.Errorf("failed --json: %v %s", err, out)
	}
}
