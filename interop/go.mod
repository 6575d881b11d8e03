// idem:unpublished — tests only; scripts/release never tags this module.
module github.com/idem-go/idem/interop

go 1.26.0

require (
	github.com/idem-go/idem v0.0.0
	github.com/idem-go/idem/idemhttp v0.0.0
	github.com/stripe/stripe-go/v85 v85.0.0
	github.com/twmb/franz-go/pkg/kfake v0.0.0-20260918054303-01f206a7e32c
)

require (
	github.com/cenkalti/backoff/v5 v5.0.3 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	github.com/twmb/franz-go v1.22.3 // indirect
	github.com/twmb/franz-go/pkg/kmsg v1.15.1 // indirect
)

replace github.com/idem-go/idem => ..

replace github.com/idem-go/idem/idemhttp => ../idemhttp

replace github.com/idem-go/idem/store/idemsql => ../store/idemsql

replace github.com/idem-go/idem/store/idemredis => ../store/idemredis

replace github.com/idem-go/idem/store/idempgxv5 => ../store/idempgxv5
