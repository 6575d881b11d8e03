package connect

import (
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// tcpUserTimeout returns a net.Dialer Control function that sets
// TCP_USER_TIMEOUT to d on TCP connections.
func tcpUserTimeout(d time.Duration) func(network, address string, c syscall.RawConn) error {
	return func(network, address string, c syscall.RawConn) error {
		if !strings.HasPrefix(network, "tcp") {
			return nil
		}
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d.Milliseconds()))
		})
		if err != nil {
			return err
		}
		return serr
	}
}
