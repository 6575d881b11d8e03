package ownservice

import (
	"fmt"
	"net"
	"testing"
)

// TestFreePortBlock: the block is below the ephemeral range and every
// port of it can be bound.
func TestFreePortBlock(t *testing.T) {
	base, err := FreePortBlock(12)
	if err != nil {
		t.Fatal(err)
	}
	if base < 20000 || base+12 > 32768 {
		t.Fatalf("block %d-%d, want it within 20000-32767", base, base+11)
	}
	for p := base; p < base+12; p++ {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			t.Fatalf("port %d of the block: %v", p, err)
		}
		_ = l.Close()
	}
}
