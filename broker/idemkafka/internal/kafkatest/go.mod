// idem:unpublished — tests only; scripts/release never tags this module.
module github.com/idem-go/idem/broker/idemkafka/internal/kafkatest

go 1.26.0

replace github.com/idem-go/idem => ../../../..

replace github.com/idem-go/idem/broker/idemkafka => ../..

replace github.com/idem-go/idem/broker/brokertest => ../../../brokertest

replace github.com/idem-go/idem/store/idemsql => ../../../../store/idemsql

require (
	github.com/google/uuid v1.6.0
	github.com/idem-go/idem v0.0.0
	github.com/idem-go/idem/broker/brokertest v0.0.0
	github.com/idem-go/idem/broker/idemkafka v0.0.0-00010101000000-000000000000
	github.com/idem-go/idem/store/idemsql v0.0.0
	github.com/twmb/franz-go v1.22.3
	github.com/twmb/franz-go/pkg/kadm v1.20.0
	github.com/twmb/franz-go/pkg/kfake v0.0.0-20260918054303-01f206a7e32c
	modernc.org/sqlite v1.62.0
)

require (
	github.com/dustin/go-humanize v1.1.0 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/mattn/go-isatty v0.0.24 // indirect
	github.com/ncruces/go-strftime v1.1.0 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	github.com/remyoudompheng/bigfft v0.0.0-20230129092748-24d4a6f8daec // indirect
	github.com/twmb/franz-go/pkg/kmsg v1.15.1 // indirect
	golang.org/x/sys v0.49.0 // indirect
	modernc.org/libc v1.80.1 // indirect
	modernc.org/mathutil v1.7.1 // indirect
	modernc.org/memory v1.12.1 // indirect
)
