package sqlstore

// Reads returns the statements of the operator's reads, by the name of
// the read: "consumers" (Consumers), "list" (ListRecords), "listFailed"
// (ListRecords of failed records, WithFailedIndex), "inspect"
// (Inspect), "steps" (Steps), "failures" (OutboxFailures), "failed" and
// "failedOf" (ListFailedOutgoing without and with an error text), and
// "backlog" (OutboxBacklog). Their parameters are those the methods pass
// (see the fields of Ops). For tests and tools that look at their plans.
func (ops *Ops) Reads() map[string]string {
	return map[string]string{
		"consumers":  ops.consumers,
		"list":       ops.list,
		"listFailed": ops.listFailed,
		"inspect":    ops.inspect,
		"steps":      ops.steps,
		"failures":   ops.failures,
		"failed":     ops.failed,
		"failedOf":   ops.failedOf,
		"backlog":    ops.outbox.stats,
	}
}
