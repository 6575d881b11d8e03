// idem:unpublished — tests only; scripts/release never tags this module.
module github.com/idem-go/idem/cmd/idem/internal/promserve/dashboardtest

go 1.26.0

replace github.com/idem-go/idem => ../../../../..

replace github.com/idem-go/idem/cmd/idem => ../../..

replace github.com/idem-go/idem/idemotel => ../../../../../idemotel

replace github.com/idem-go/idem/idemhttp => ../../../../../idemhttp

replace github.com/idem-go/idem/store/idemsql => ../../../../../store/idemsql

replace github.com/idem-go/idem/store/idemredis => ../../../../../store/idemredis

replace github.com/idem-go/idem/store/idempgxv5 => ../../../../../store/idempgxv5

replace github.com/idem-go/idem/broker/idemnats => ../../../../../broker/idemnats

replace github.com/idem-go/idem/broker/idemkafka => ../../../../../broker/idemkafka

replace github.com/idem-go/idem/broker/idemamqp => ../../../../../broker/idemamqp

replace github.com/idem-go/idem/broker/idemredisstream => ../../../../../broker/idemredisstream

replace github.com/idem-go/idem/broker/idemgocdk => ../../../../../broker/idemgocdk

replace github.com/idem-go/idem/broker/brokertest => ../../../../../broker/brokertest

require (
	github.com/VictoriaMetrics/metricsql v0.87.3
	github.com/idem-go/idem v0.0.0
	github.com/idem-go/idem/cmd/idem v0.0.0-00010101000000-000000000000
	github.com/idem-go/idem/idemhttp v0.0.0
	github.com/idem-go/idem/idemotel v0.0.0
	github.com/prometheus/client_model v0.6.3
)

require (
	github.com/VictoriaMetrics/metrics v1.35.3 // indirect
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cenkalti/backoff/v5 v5.0.3 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/go-logr/logr v1.4.4 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/prometheus/client_golang v1.25.0 // indirect
	github.com/prometheus/common v0.72.0 // indirect
	github.com/prometheus/otlptranslator v1.0.0 // indirect
	github.com/prometheus/procfs v0.22.0 // indirect
	github.com/valyala/fastrand v1.1.0 // indirect
	github.com/valyala/histogram v1.2.0 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
	go.opentelemetry.io/otel v1.47.0 // indirect
	go.opentelemetry.io/otel/exporters/prometheus v0.69.0 // indirect
	go.opentelemetry.io/otel/log v1.47.0 // indirect
	go.opentelemetry.io/otel/metric v1.47.0 // indirect
	go.opentelemetry.io/otel/sdk v1.47.0 // indirect
	go.opentelemetry.io/otel/sdk/metric v1.47.0 // indirect
	go.opentelemetry.io/otel/trace v1.47.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)
