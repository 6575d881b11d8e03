package pgsqltest

import (
	"fmt"
	"strconv"
	"strings"
)

// ExecuteArgs is args (strings and int64s) as the argument list of
// EXECUTE of a prepared statement ("" for none): EXPLAIN EXECUTE plans
// the statement as the server runs it (plan_cache_mode), where EXPLAIN of
// the statement with parameters plans it for their values. It panics on
// an argument of another type.
func ExecuteArgs(args []any) string {
	if len(args) == 0 {
		return ""
	}
	out := make([]string, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case string:
			out[i] = "'" + strings.ReplaceAll(v, "'", "''") + "'"
		case int64:
			out[i] = strconv.FormatInt(v, 10)
		default:
			panic(fmt.Sprintf("pgsqltest: EXECUTE argument %d: %T", i, a))
		}
	}
	return "(" + strings.Join(out, ", ") + ")"
}
