// Package gocdktest holds idemgocdk's tests that need more than the
// adapter itself (the broker conformance suite, database/sql stores, the
// Go CDK's drivers and Google's in-process Pub/Sub fake): a module of its
// own, so that these test-only dependencies stay out of idemgocdk's go.mod
// and out of its users' module graphs.
package gocdktest
