module github.com/idem-go/idem/idemhttp

go 1.26.0

require github.com/idem-go/idem v0.0.0

require (
	github.com/cenkalti/backoff/v5 v5.0.3
	github.com/google/uuid v1.6.0
)

replace github.com/idem-go/idem => ..
