module github.com/idem-go/idem/interop

go 1.26.0

require (
	github.com/idem-go/idem v0.0.0
	github.com/idem-go/idem/idemhttp v0.0.0
	github.com/stripe/stripe-go/v85 v85.0.0
)

require (
	github.com/cenkalti/backoff/v5 v5.0.3 // indirect
	github.com/google/uuid v1.6.0 // indirect
)

replace github.com/idem-go/idem => ..

replace github.com/idem-go/idem/idemhttp => ../idemhttp

replace github.com/idem-go/idem/store/idemsql => ../store/idemsql

replace github.com/idem-go/idem/store/idemredis => ../store/idemredis

replace github.com/idem-go/idem/store/idempgxv5 => ../store/idempgxv5
