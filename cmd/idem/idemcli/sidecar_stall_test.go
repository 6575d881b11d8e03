package idemcli

import (
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/faultproxy"
	"github.com/idem-go/idem/internal/testenv"
)

// TestSidecarNATSStalledConnection: a NATS connection of `idem consume`
// that stops answering without closing (a black hole: a half-open TCP
// connection) is given up and made again within seconds, not after
// nats.go's default two unanswered pings two minutes apart. The fault
// soak found both sidecars of its idem-consume pipeline stalled for more
// than five minutes behind such a connection, JetStream's missed pull
// heartbeats aside.
func TestSidecarNATSStalledConnection(t *testing.T) {
	t.Parallel()
	proxy := faultproxy.New(t, startNATS(t, "idem", "pw"))
	b, err := openSidecarBroker(t.Context(), "nats://idem:pw@"+proxy.Addr(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	nc := b.(*natsSidecar).nc
	if n := proxy.Stall(); n != 1 {
		t.Fatalf("%d connections stalled, want 1", n)
	}
	testenv.Eventually(t, 30*time.Second, "the stalled connection replaced", func() bool {
		return nc.Stats().Reconnects > 0 && nc.IsConnected()
	}, func() string { return fmt.Sprintf("status %v, %d reconnects", nc.Status(), nc.Stats().Reconnects) })
}
