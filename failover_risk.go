package idem

import (
	"context"

	"github.com/idem-go/idem/idemdriver"
)

// warnFailoverRisk logs one warning when the store can tell that its
// server's settings let a crash or a failover lose acknowledged writes
// (an [idemdriver.FailoverRiskReporter]); it is asked once, when the
// consumer starts. A store that cannot answer is logged at debug: the
// consumer works either way.
func (c *core) warnFailoverRisk(ctx context.Context) {
	r, ok := c.store.(idemdriver.FailoverRiskReporter)
	if !ok {
		return
	}
	cctx, cancel := detachedCallCtx(ctx, c.storeTimeout())
	risk, err := r.FailoverRisk(cctx)
	cancel()
	switch {
	case err != nil:
		c.cfg.Logger.Debug("idem: could not read the store's replication settings", "consumer", c.cfg.Name, "err", err)
	case risk != "":
		c.cfg.Logger.Warn("idem: a crash or failover of the store can lose acknowledged messages", "consumer", c.cfg.Name, "risk", risk)
	}
}
