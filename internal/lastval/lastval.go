// Package lastval keeps the last value derived from a key, for values
// that every call of a hot path derives again from the same key (a
// consumer's name, its configured timeout): the derived value (a boxed
// argument, a formatted error, a built key) is made once and reused while
// the key stays the same, instead of costing an allocation per call.
package lastval

import "sync/atomic"

// Cache holds the last key given to Get and the value made from it. The
// zero Cache is empty and ready; a Cache is safe for concurrent use.
// Callers whose keys alternate only make their value again at each change.
type Cache[K comparable, V any] struct {
	last atomic.Pointer[entry[K, V]]
}

type entry[K comparable, V any] struct {
	key K
	val V
}

// Get returns the value made from key: the one kept when key is the last
// key given, else make(key), which it keeps. make must return the same
// value for the same key, and values must not be changed once returned
// (they are shared).
func (c *Cache[K, V]) Get(key K, make func(K) V) V {
	if e := c.last.Load(); e != nil && e.key == key {
		return e.val
	}
	e := &entry[K, V]{key: key, val: make(key)}
	c.last.Store(e)
	return e.val
}
