// idem:unpublished — tests only; scripts/release never tags this module.
module github.com/idem-go/idem/cmd/idem/internal/console/browsertest

go 1.26.0

replace github.com/idem-go/idem => ../../../../..

replace github.com/idem-go/idem/cmd/idem => ../../..

replace github.com/idem-go/idem/store/idemsql => ../../../../../store/idemsql

require (
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/chromedp/cdproto v0.160.1 // indirect
	github.com/go-json-experiment/json v0.0.0-20260213210345-44df1a37e875 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/prometheus/client_golang v1.25.0 // indirect
	github.com/prometheus/client_model v0.6.3 // indirect
	github.com/prometheus/common v0.72.0 // indirect
	github.com/prometheus/procfs v0.22.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace github.com/idem-go/idem/store/idemredis => ../../../../../store/idemredis

replace github.com/idem-go/idem/idemotel => ../../../../../idemotel

replace github.com/idem-go/idem/idemhttp => ../../../../../idemhttp

replace github.com/idem-go/idem/store/idempgxv5 => ../../../../../store/idempgxv5

replace github.com/idem-go/idem/broker/idemnats => ../../../../../broker/idemnats

replace github.com/idem-go/idem/broker/idemkafka => ../../../../../broker/idemkafka

replace github.com/idem-go/idem/broker/idemamqp => ../../../../../broker/idemamqp

replace github.com/idem-go/idem/broker/idemredisstream => ../../../../../broker/idemredisstream

replace github.com/idem-go/idem/broker/brokertest => ../../../../../broker/brokertest

require (
	github.com/chromedp/chromedp v0.23.1
	github.com/idem-go/idem v0.0.0
	github.com/idem-go/idem/broker/idemredisstream v0.0.0
	github.com/idem-go/idem/cmd/idem v0.0.0
	github.com/idem-go/idem/store/idemsql v0.0.0
	github.com/jackc/pgx/v5 v5.13.0
	github.com/redis/go-redis/v9 v9.23.0
)
