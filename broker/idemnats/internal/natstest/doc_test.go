// Package natstest holds idemnats's tests that need more than the adapter
// itself (an in-process nats-server, the broker conformance suite,
// database/sql stores): a module of its own, so that these test-only
// dependencies stay out of idemnats's go.mod and out of its users' module
// graphs.
package natstest
