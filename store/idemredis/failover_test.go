package idemredis_test

import (
	"testing"

	"github.com/idem-go/idem/store/idemredis"
)

// TestFailoverRisk: the test Redis has no replica, so no risk; the count
// of replicas is read from INFO replication's text (internal/failovertest
// checks the warning on a real master with a replica).
func TestFailoverRisk(t *testing.T) {
	t.Parallel()
	store, err := idemredis.New(newClient(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	risk, err := store.FailoverRisk(t.Context())
	if err != nil || risk != "" {
		t.Errorf("no replica: risk %q, %v; want none", risk, err)
	}
	n, err := idemredis.ConnectedReplicas("# Replication\r\nrole:master\r\nconnected_slaves:2\r\nslave0:ip=127.0.0.1\r\n")
	if err != nil || n != 2 {
		t.Errorf("connected_slaves:2 read as %d, %v", n, err)
	}
	if _, err := idemredis.ConnectedReplicas("role:master\r\n"); err == nil {
		t.Error("INFO without connected_slaves: no error")
	}
}
