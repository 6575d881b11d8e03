package idemredisstream

// Ready is closed once Run has created the group and started reading, for
// tests that must not go on before.
func (c *Consumer) Ready() <-chan struct{} { return c.ready }
