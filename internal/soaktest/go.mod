// idem:unpublished — tests only; scripts/release never tags this module.
// idem:test-alongside — a fault soak of servers and consumers of its own: scripts/test runs it beside the other modules.
module github.com/idem-go/idem/internal/soaktest

go 1.26.0

replace github.com/idem-go/idem => ../..

replace github.com/idem-go/idem/store/idempgxv5 => ../../store/idempgxv5

replace github.com/idem-go/idem/store/idemredis => ../../store/idemredis

replace github.com/idem-go/idem/store/idemsql => ../../store/idemsql

replace github.com/idem-go/idem/broker/idemnats => ../../broker/idemnats

replace github.com/idem-go/idem/broker/idemkafka => ../../broker/idemkafka

replace github.com/idem-go/idem/broker/idemredisstream => ../../broker/idemredisstream

replace github.com/idem-go/idem/broker/brokertest => ../../broker/brokertest

require (
	github.com/idem-go/idem v0.0.0
	github.com/idem-go/idem/broker/idemkafka v0.0.0
	github.com/idem-go/idem/broker/idemnats v0.0.0
	github.com/idem-go/idem/broker/idemredisstream v0.0.0
	github.com/idem-go/idem/store/idempgxv5 v0.0.0
	github.com/idem-go/idem/store/idemredis v0.0.0
	github.com/idem-go/idem/store/idemsql v0.0.0
	github.com/jackc/pgx/v5 v5.13.0
	github.com/nats-io/nats.go v1.55.0
	github.com/redis/go-redis/v9 v9.23.0
	github.com/twmb/franz-go v1.22.3
	github.com/twmb/franz-go/pkg/kadm v1.20.0
	github.com/twmb/franz-go/pkg/kfake v0.0.0-20260918054303-01f206a7e32c
	modernc.org/sqlite v1.62.0
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/cenkalti/backoff/v5 v5.0.3 // indirect
	github.com/go-logr/logr v1.4.4 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	github.com/googleapis/gax-go/v2 v2.27.0 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
	go.opentelemetry.io/otel v1.47.0 // indirect
	go.opentelemetry.io/otel/log v1.47.0 // indirect
	go.opentelemetry.io/otel/metric v1.47.0 // indirect
	go.opentelemetry.io/otel/sdk v1.47.0 // indirect
	go.opentelemetry.io/otel/sdk/metric v1.47.0 // indirect
	go.opentelemetry.io/otel/trace v1.47.0 // indirect
	golang.org/x/net v0.61.0 // indirect
	golang.org/x/xerrors v0.0.0-20240903120638-7835f813f4da // indirect
	google.golang.org/api v0.308.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261019180522-ce908d29299b // indirect
	google.golang.org/grpc v1.84.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/dustin/go-humanize v1.1.0 // indirect
	github.com/go-sql-driver/mysql v1.10.1
	github.com/google/uuid v1.6.0 // indirect
	github.com/idem-go/idem/broker/idemamqp v0.0.0
	github.com/idem-go/idem/broker/idemgocdk v0.0.0
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/klauspost/compress v1.20.4 // indirect
	github.com/mattn/go-isatty v0.0.24 // indirect
	github.com/nats-io/nkeys v0.4.17 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	github.com/ncruces/go-strftime v1.1.0 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	github.com/rabbitmq/amqp091-go v1.16.0
	github.com/remyoudompheng/bigfft v0.0.0-20230129092748-24d4a6f8daec // indirect
	github.com/twmb/franz-go/pkg/kmsg v1.15.1 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	gocloud.dev v0.49.0
	gocloud.dev/pubsub/rabbitpubsub v0.49.0
	golang.org/x/crypto v0.58.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	modernc.org/libc v1.80.1 // indirect
	modernc.org/mathutil v1.7.1 // indirect
	modernc.org/memory v1.12.1 // indirect
)

replace github.com/idem-go/idem/broker/idemamqp => ../../broker/idemamqp

replace github.com/idem-go/idem/broker/idemgocdk => ../../broker/idemgocdk
