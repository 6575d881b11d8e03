// Package soaktest is idem's fault soak: one test, TestSoak, that runs
// several pipelines at once under a steady load for a given time while a
// scheduler, driven by a seed, injects faults at random, then drains and
// checks the whole history.
//
// The pipelines, each but memory-clock consumed by two processes in one
// consumer group (the test binary run again in a consumer role, so that
// it can be SIGKILLed):
//
//   - pg-nats: PostgreSQL through pgx (a private postgres-durable) and NATS
//     JetStream (a private nats-server), transactional mode; the handler
//     counts its effect in a table of the store's database and emits one
//     outbox message per effect under one of a few ordering keys, with a
//     per-key sequence number taken in the same transaction; the relay, in
//     the consumer's process, sends them back to JetStream.
//   - sqlite-kafka: SQLite (a file) and Kafka (franz-go's kfake, in the
//     test's process, which survives the consumer's kills),
//     transactional mode, the same counting effect.
//   - redis-lease: Redis (a private redis-server with an fsync'd
//     append-only file) as lease store and as Redis Streams broker, lease
//     mode; the effect is a call to a provider in the test's process that
//     deduplicates by idempotency key and counts every call, and the
//     consumer reports each completion with its fencing token.
//   - mariadb-amqp: MariaDB (a private mariadb, idemsql's MySQL dialect)
//     and RabbitMQ (a private rabbitmq, idemamqp), transactional.
//   - pgsql-gocdk: the same PostgreSQL through database/sql (idemsql, pgx's
//     stdlib driver) and the Go CDK (idemgocdk) over rabbitpubsub on the
//     same RabbitMQ, transactional.
//   - idem-consume: the sidecar, idem consume (built from cmd/idem), on
//     MariaDB in lease mode and JetStream, at most once, calling an HTTP
//     service in the test's process that counts calls by message ID.
//   - memory-clock: idem's memory store in the test's process, the one
//     store whose lease clock can be injected, in lease mode; every message
//     is delivered twice at once, and the clock-jump fault moves the
//     store's clock past the running leases.
//
// The faults: SIGKILL and restart of each consumer process and of the
// private PostgreSQL, nats-server, redis-server, MariaDB and RabbitMQ;
// kfake stopped and started again; stalled connections and answers cut
// on the way back (internal/faultproxy between the consumers and
// PostgreSQL, NATS, Redis, MariaDB and RabbitMQ); SQLite disk full (the
// consumer's connection gets PRAGMA max_page_count at the file's size,
// then back); the memory store's clock jumped forward. No other clock is
// moved: the other stores take their lease times from the server
// (PostgreSQL's now(), MariaDB's UTC_TIMESTAMP, Redis's TIME) or, for
// SQLite, from the consumer process's real-time clock, which nothing can
// offset for one Go process (docs/soak.md).
//
// The checks, with exact counts: every published message has exactly one
// effect (none twice: doubles; none missing: losses), nothing is left
// unacknowledged or dead-lettered, every outbox message reached the broker
// and, per ordering key, in the order of the key's sequence, and no lease
// was completed by a holder fenced by a later one (a completion whose
// token is lower than one the provider saw for that message).
//
// Flags: -soak.duration (2m), -soak.seed (0: a random one, printed),
// -soak.rate (messages per second per pipeline). The seed fixes the
// schedule of faults (kinds, targets, parameters and the waits between
// them); timings of the servers and processes are the machine's. The
// servers are private copies started by scripts/services or by the test
// (never the shared ones), which needs root: without it the test skips,
// or fails under IDEM_TEST_REQUIRE_ALL=1. docs/soak.md has the command
// for a long run and its figures.
//
// It is a module of its own so that its dependencies stay out of the
// published modules. It holds tests only; nothing here is idem's API.
package soaktest
