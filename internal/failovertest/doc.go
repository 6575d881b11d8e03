// Package failovertest measures what a failover of a replicated store does
// to idem's guarantee: a PostgreSQL primary with a streaming standby
// (asynchronous, and synchronous with synchronous_commit on and
// remote_apply) and Redis with a replica and Sentinel (with and without
// idemredis's WaitReplicas), and what a broker failing over does: a
// JetStream stream leader's death on a three-node cluster with R3 streams
// (Debian's nats-server and the current release), a quorum queue leader's
// on a three-node RabbitMQ cluster, and partition leaders moved on kfake,
// franz-go's in-process Kafka. Each test starts its own copy of the
// servers with scripts/services (postgres-ha, redis-ha, nats-ha,
// rabbitmq-ha), in a state directory and on ports of its own, drives a steady
// load of messages with stable IDs through idem with a counting effect,
// SIGKILLs the primary (master) mid-load and lets the standby take over,
// several times, and counts per configuration the effects that ran twice,
// the messages lost (acknowledged, with no effect) and the time to
// recover. docs/failover.md holds the figures.
//
// The tests need root (scripts/services starts the daemons as their
// users): without it they skip, or fail under IDEM_TEST_REQUIRE_ALL=1.
// IDEM_FAILOVER_ROUNDS (5) and IDEM_FAILOVER_MESSAGES (300) set the
// failovers per configuration and the messages per failover; the Kafka,
// current nats-server and RabbitMQ rows make 2 unless IDEM_FAILOVER_ROUNDS
// is set.
//
// The Redis Cluster rows (redis-cluster: three masters with a replica
// each, a master SIGKILLed and its replica taking over) and the HTTP
// proxy's (idemhttp's Proxy on redis-ha and on redis-cluster, clients
// retrying POSTs with Idempotency-Key to an upstream that counts them) run
// 2 failovers per configuration, and the proxy with its default lease
// only, unless IDEM_FAILOVER_FULL=1, which runs IDEM_FAILOVER_ROUNDS of
// them and the proxy with a 2 s lease too. IDEM_FAILOVER_KEEP=DIR keeps,
// for each round of the proxy rows, every key's history (keys.tsv) and, on
// Sentinel, the servers' logs, under DIR/<test>/round-N.
//
// It is a module of its own so that its dependencies stay out of the
// stores' modules. It holds tests only; nothing here is idem's API.
package failovertest
