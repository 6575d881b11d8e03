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
//   - Kafka (Kafka): the dead-letter topic, read by a client of no
//     consumer group from offsets below each partition's end (nothing
//     committed); a replay produces the original's key, value and headers
//     to the source topic.
//   - RabbitMQ and the Go CDK's queues cannot be browsed: reading a
//     message takes it off the queue (a get and a requeue moves it to the
//     back and marks it redelivered), so Unbrowsable refuses, saying so.
package deadletter
