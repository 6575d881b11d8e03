// idem:unpublished — tests only; scripts/release never tags this module.
module github.com/idem-go/idem/idemgrpc/internal/grpctest

go 1.26.0

replace github.com/idem-go/idem => ../../..

replace github.com/idem-go/idem/idemgrpc => ../..

replace github.com/idem-go/idem/idemhttp => ../../../idemhttp

replace github.com/idem-go/idem/store/idemsql => ../../../store/idemsql

replace github.com/idem-go/idem/store/idempgxv5 => ../../../store/idempgxv5

replace github.com/idem-go/idem/store/idemredis => ../../../store/idemredis

require (
	github.com/go-sql-driver/mysql v1.10.1
	github.com/idem-go/idem v0.0.0
	github.com/idem-go/idem/idemgrpc v0.0.0
	github.com/idem-go/idem/idemhttp v0.0.0
	github.com/idem-go/idem/store/idempgxv5 v0.0.0
	github.com/idem-go/idem/store/idemredis v0.0.0
	github.com/idem-go/idem/store/idemsql v0.0.0
	github.com/jackc/pgx/v5 v5.13.0
	github.com/redis/go-redis/v9 v9.23.0
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261110000943-09e21b237f2c
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
	modernc.org/sqlite v1.62.0
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/cenkalti/backoff/v5 v5.0.3 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/dustin/go-humanize v1.1.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/mattn/go-isatty v0.0.24 // indirect
	github.com/ncruces/go-strftime v1.1.0 // indirect
	github.com/remyoudompheng/bigfft v0.0.0-20230129092748-24d4a6f8daec // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	modernc.org/libc v1.80.1 // indirect
	modernc.org/mathutil v1.7.1 // indirect
	modernc.org/memory v1.12.1 // indirect
)
