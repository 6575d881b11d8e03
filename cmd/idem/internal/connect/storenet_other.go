//go:build !linux

package connect

import (
	"syscall"
	"time"
)

// tcpUserTimeout returns nil: TCP_USER_TIMEOUT is Linux's; elsewhere the
// keepalive settings alone apply.
func tcpUserTimeout(time.Duration) func(network, address string, c syscall.RawConn) error {
	return nil
}
