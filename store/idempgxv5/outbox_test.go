package idempgxv5_test

import (
	"testing"

	"github.com/idem-go/idem/idemtest"
	"github.com/jackc/pgx/v5"
)

// TestOutboxConformance runs idem's outbox conformance suite on pgx, each
// case on its own pool and tables: a Relay's Run here listens for the
// outbox table's notifications (idemdriver.OutboxNotifier).
func TestOutboxConformance(t *testing.T) {
	testURL(t)
	idemtest.RunOutbox(t, harness(pgx.QueryExecModeCacheStatement))
}
