package idemamqp

// Ready is closed once the Consumer has started consuming (its first
// basic.consume-ok), for tests that must not publish before.
func (c *Consumer) Ready() <-chan struct{} { return c.ready }
