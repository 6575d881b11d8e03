// Package testhook lets idemkafka's tests in the kafkatest module (which
// sit in a module of their own, so that kfake, kadm and the stores they
// run on stay out of idemkafka's go.mod) reach what idemkafka keeps from
// its users. Being internal, it is importable only from under
// broker/idemkafka.
package testhook

// Crash makes a Consumer (an *idemkafka.Consumer, passed as any because
// this package cannot import idemkafka) behave as a killed process: from
// then on nothing is committed or dead-lettered, handlers in flight are
// canceled, and Run returns without waiting for them to be settled.
// idemkafka sets it when it is initialised; it panics for any other type.
var Crash func(consumer any)

// SetOnRevoke sets, in a Config (an *idemkafka.Config), a function called
// with the partitions of each revocation as it begins, before the Consumer
// waits for their records in flight. idemkafka sets it when it is
// initialised; it panics for any other type.
var SetOnRevoke func(cfg any, f func(partitions map[string][]int32))
