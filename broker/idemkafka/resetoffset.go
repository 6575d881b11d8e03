package idemkafka

import "github.com/twmb/franz-go/pkg/kgo"

// checkResetOffset warns, once at the start of Run, when the client's
// kgo.ConsumeResetOffset is the end of the partition (NewOffset().AtEnd(),
// Kafka's auto.offset.reset=latest). When franz-go cannot find where a
// partition's log goes on after a leader change or lost data (it reports
// a kgo.ErrDataLoss) it resumes there: the records the consumer had not
// fetched yet are skipped and their offsets committed over, although
// their producers were acknowledged. docs/failover.md measures it.
// franz-go's default (a minute before the last record consumed) and
// AtStart re-read instead, which idem makes harmless.
func (c *Consumer) checkResetOffset() {
	off, ok := c.cl.OptValue(kgo.ConsumeResetOffset).(kgo.Offset)
	if !ok || off.EpochOffset().Offset != -1 { // -1: AtEnd
		return
	}
	c.log.Warn("idem: a crash or failover of the broker can lose acknowledged messages",
		"risk", "kgo.ConsumeResetOffset is the end of the partition: after a kgo.ErrDataLoss the consumer skips the records it had not fetched; use franz-go's default or NewOffset().AtStart()")
}
