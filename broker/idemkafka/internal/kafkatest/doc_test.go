// Package kafkatest holds idemkafka's tests that need more than the adapter
// itself (franz-go's in-process kfake cluster and kadm, the broker
// conformance suite, idemsql on SQLite): a module of its own, so that these
// test-only dependencies stay out of idemkafka's go.mod and out of its
// users' module graphs.
package kafkatest
