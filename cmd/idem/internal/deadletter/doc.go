// Package deadletter reads the dead letters idem's broker adapters wrote,
// without consuming them, and republishes one to its source: the
// console.DeadLetters of `idem console --broker` and `idem replay`.
//
//   - JetStream (JetStream): a dead-letter subject's stream, read by
//     sequence (a stream get, which leaves every message in place); a
//     replay is published with the message ID in Nats-Msg-Id, and a copy
//     the stream's duplicate window would drop is refused before, and
//     detected after (the publish ack's Duplicate flag).
//   - Redis Streams (RedisStreams): the dead-letter stream, read with
//     XREVRANGE and XRANGE; a replay is an XADD of the original's fields.
//   - RabbitMQ and the Go CDK's queues cannot be browsed: reading a
//     message takes it off the queue (a get and a requeue moves it to the
//     back and marks it redelivered), so Unbrowsable refuses, saying so.
//     Kafka's dead-letter topics could be read from the start by a client
//     of no group; that is not done yet, and Unbrowsable says so too.
package deadletter
