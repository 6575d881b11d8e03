module github.com/idem-go/idem/idemgrpc

go 1.26.0

require (
	github.com/cenkalti/backoff/v5 v5.0.3
	github.com/google/uuid v1.6.0
	github.com/idem-go/idem v0.0.0
	github.com/idem-go/idem/idemhttp v0.0.0-00010101000000-000000000000
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261110000943-09e21b237f2c
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
)

require (
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.42.0 // indirect
)

replace github.com/idem-go/idem => ..

replace github.com/idem-go/idem/idemhttp => ../idemhttp
