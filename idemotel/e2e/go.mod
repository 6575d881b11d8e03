// idem:unpublished — tests only; scripts/release never tags this module.
module github.com/idem-go/idem/idemotel/e2e

go 1.26.0

require (
	github.com/idem-go/idem v0.0.0
	github.com/idem-go/idem/broker/idemamqp v0.0.0
	github.com/idem-go/idem/broker/idemkafka v0.0.0
	github.com/idem-go/idem/broker/idemnats v0.0.0
	github.com/idem-go/idem/broker/idemredisstream v0.0.0
	github.com/idem-go/idem/idemotel v0.0.0
	github.com/nats-io/nats-server/v2 v2.15.3
	github.com/nats-io/nats.go v1.55.0
	github.com/rabbitmq/amqp091-go v1.16.0
	github.com/redis/go-redis/v9 v9.23.0
	github.com/twmb/franz-go v1.22.3
	github.com/twmb/franz-go/pkg/kfake v0.0.0-20260918054303-01f206a7e32c
	go.opentelemetry.io/otel v1.47.0
	go.opentelemetry.io/otel/sdk v1.47.0
	go.opentelemetry.io/otel/trace v1.47.0
)

require (
	github.com/antithesishq/antithesis-sdk-go v0.9.0-default-no-op // indirect
	github.com/cenkalti/backoff/v5 v5.0.3 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/go-logr/logr v1.4.4 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	github.com/google/go-tpm v0.9.8 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/idem-go/idem/idemhttp v0.0.0 // indirect
	github.com/klauspost/compress v1.20.4 // indirect
	github.com/minio/highwayhash v1.0.4 // indirect
	github.com/nats-io/jwt/v2 v2.8.3 // indirect
	github.com/nats-io/nkeys v0.4.17 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	github.com/twmb/franz-go/pkg/kmsg v1.15.1 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
	go.opentelemetry.io/otel/log v1.47.0 // indirect
	go.opentelemetry.io/otel/metric v1.47.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/crypto v0.58.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
	golang.org/x/time v0.16.0 // indirect
)

replace github.com/idem-go/idem => ../..

replace github.com/idem-go/idem/idemhttp => ../../idemhttp

replace github.com/idem-go/idem/idemotel => ..

replace github.com/idem-go/idem/broker/idemamqp => ../../broker/idemamqp

replace github.com/idem-go/idem/broker/idemkafka => ../../broker/idemkafka

replace github.com/idem-go/idem/broker/idemnats => ../../broker/idemnats

replace github.com/idem-go/idem/broker/idemredisstream => ../../broker/idemredisstream

replace github.com/idem-go/idem/broker/brokertest => ../../broker/brokertest

replace github.com/idem-go/idem/store/idemsql => ../../store/idemsql

replace github.com/idem-go/idem/store/idempgxv5 => ../../store/idempgxv5

replace github.com/idem-go/idem/store/idemredis => ../../store/idemredis
