package failovertest

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/idem-go/idem/internal/ownservice"
)

// primaryPIDFile returns the pid file of s's primary: on postgres-ha the
// node without standby.signal whose postmaster.pid exists, on redis-ha
// the node on masterPort (the master the Sentinel names).
func primaryPIDFile(s *ownservice.Service, masterPort int) (string, error) {
	for i, n := range []string{"node1", "node2"} {
		switch s.Name {
		case "postgres-ha":
			data := filepath.Join(s.Dir, "postgres-ha", n, "data")
			if _, err := os.Stat(filepath.Join(data, "standby.signal")); err == nil {
				continue
			}
			if _, err := os.Stat(filepath.Join(data, "postmaster.pid")); err == nil {
				return filepath.Join(data, "postmaster.pid"), nil
			}
		case "redis-ha":
			if s.Port([]string{"IDEM_REDIS_HA_PORT", "IDEM_REDIS_HA_PORT2"}[i]) == masterPort {
				return filepath.Join(s.Dir, "redis-ha", n, "redis.pid"), nil
			}
		}
	}
	return "", fmt.Errorf("%s: no primary found under %s", s.Name, s.Dir)
}
