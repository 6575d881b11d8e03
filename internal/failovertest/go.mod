module github.com/idem-go/idem/internal/failovertest

go 1.26.0

replace github.com/idem-go/idem => ../..

replace github.com/idem-go/idem/store/idempgxv5 => ../../store/idempgxv5

replace github.com/idem-go/idem/store/idemredis => ../../store/idemredis

require (
	github.com/idem-go/idem v0.0.0
	github.com/idem-go/idem/store/idempgxv5 v0.0.0
	github.com/idem-go/idem/store/idemredis v0.0.0-00010101000000-000000000000
	github.com/jackc/pgx/v5 v5.13.0
	github.com/redis/go-redis/v9 v9.23.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)
