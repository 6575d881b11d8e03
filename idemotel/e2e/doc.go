// Package e2e holds tests only: one trace from a producer's publish to the
// handler's effects across each real broker (NATS JetStream in process,
// Kafka on kfake, RabbitMQ and Redis Streams from IDEM_TEST_AMQP_URL and
// IDEM_TEST_REDIS_URL), through the broker adapters' header seam
// (idem.Delivery, idem.HeaderInjector) and idemotel's propagation. It is a
// module of its own so that neither idemotel nor the adapters carry the
// brokers and clients among their requirements.
package e2e
