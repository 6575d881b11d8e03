package idemkafka

import "github.com/idem-go/idem/broker/idemkafka/internal/testhook"

// The hooks the tests in the kafkatest module use (see package testhook).
func init() {
	testhook.Crash = func(c any) { c.(*Consumer).crash() }
	testhook.SetOnRevoke = func(cfg any, f func(partitions map[string][]int32)) { cfg.(*Config).testOnRevoke = f }
}
