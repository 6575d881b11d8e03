package idemredisstream

import "time"

// Ready is closed once Run has created the group and started reading, for
// tests that must not go on before.
func (c *Consumer) Ready() <-chan struct{} { return c.ready }

// InFlightUntil is, for each entry in processing, when its keep-alive
// ends (zero: never).
func (c *Consumer) InFlightUntil() []time.Time {
	c.flightMu.Lock()
	defer c.flightMu.Unlock()
	out := make([]time.Time, 0, len(c.inFlight))
	for _, f := range c.inFlight {
		out = append(out, f.until)
	}
	return out
}
