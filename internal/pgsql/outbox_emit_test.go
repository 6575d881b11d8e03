package pgsql

import (
	"strconv"
	"strings"
	"testing"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/sqlstore"
)

// An emit without headers leaves the headers column out (its default,
// '{}'): six parameters a row. With headers on any of its messages,
// every row has seven, "{}" for a message without. Quiet or not, the
// statement's rows are the same. A dialect without HeadersDefault always
// writes the column.
func TestEmitStatementHeaders(t *testing.T) {
	o := OutboxNativeArrays("t_outbox")
	rec := func(id string, h map[string]string) idemdriver.OutgoingRecord {
		return idemdriver.OutgoingRecord{ID: id, Consumer: "c", SourceID: "s", Destination: "d", Payload: []byte("p"), Headers: h}
	}
	for _, c := range []struct {
		name     string
		msgs     []idemdriver.OutgoingRecord
		headers  bool
		wantArgs int
	}{
		{"one without", []idemdriver.OutgoingRecord{rec("a", nil)}, false, 6},
		{"two without", []idemdriver.OutgoingRecord{rec("a", nil), rec("b", map[string]string{})}, false, 12},
		{"mixed", []idemdriver.OutgoingRecord{rec("a", nil), rec("b", map[string]string{"k": "v"})}, true, 14},
	} {
		for _, quiet := range []bool{false, true} {
			emit := o.EmitStatement
			if quiet {
				emit = o.EmitStatementQuiet
			}
			q, args, err := emit(&idemdriver.EmitParams{Consumer: "c", Messages: c.msgs})
			if err != nil {
				t.Fatal(err)
			}
			if len(args) != c.wantArgs || strings.Contains(q, "headers") != c.headers ||
				!strings.Contains(q, "$"+strconv.Itoa(c.wantArgs)+"::") || strings.Contains(q, "$"+strconv.Itoa(c.wantArgs+1)+"::") ||
				strings.Contains(q, "set_config") != quiet {
				t.Errorf("%s (quiet %v): %d arguments, statement %s; want %d, headers column %v", c.name, quiet, len(args), q, c.wantArgs, c.headers)
			}
			if c.headers && (args[6] != "{}" || args[13] != `{"k":"v"}`) {
				t.Errorf("%s: headers arguments %q and %q, want {} and {\"k\":\"v\"}", c.name, args[6], args[13])
			}
		}
	}
	d := outboxDialect("t_outbox")
	d.HeadersDefault = false
	q, args, err := sqlstore.NewOutbox(d).EmitStatement(&idemdriver.EmitParams{Consumer: "c", Messages: []idemdriver.OutgoingRecord{rec("a", nil)}})
	if err != nil || len(args) != 7 || args[6] != "{}" || !strings.Contains(q, "headers") {
		t.Errorf("without HeadersDefault: %v, %d arguments, statement %s; want 7, the last {}, and the headers column", err, len(args), q)
	}
}
