module github.com/idem-go/idem/broker/idemamqp

go 1.26.0

require (
	github.com/cenkalti/backoff/v5 v5.0.3
	github.com/google/uuid v1.6.0
	github.com/idem-go/idem v0.0.0
	github.com/idem-go/idem/broker/brokertest v0.0.0
	github.com/idem-go/idem/store/idemsql v0.0.0
	github.com/rabbitmq/amqp091-go v1.16.0
	modernc.org/sqlite v1.62.0
)

require (
	github.com/dustin/go-humanize v1.1.0 // indirect
	github.com/mattn/go-isatty v0.0.24 // indirect
	github.com/ncruces/go-strftime v1.1.0 // indirect
	github.com/remyoudompheng/bigfft v0.0.0-20230129092748-24d4a6f8daec // indirect
	golang.org/x/sys v0.49.0 // indirect
	modernc.org/libc v1.80.1 // indirect
	modernc.org/mathutil v1.7.1 // indirect
	modernc.org/memory v1.12.1 // indirect
)

replace (
	github.com/idem-go/idem => ../..
	github.com/idem-go/idem/broker/brokertest => ../brokertest
	github.com/idem-go/idem/store/idemsql => ../../store/idemsql
)
