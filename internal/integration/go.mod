module github.com/onceguard/onceguard/internal/integration

go 1.26.0

require github.com/onceguard/onceguard v0.0.0-00010101000000-000000000000

replace github.com/onceguard/onceguard => ../..

require github.com/onceguard/onceguard/internal/dbtest v0.0.0-00010101000000-000000000000

replace github.com/onceguard/onceguard/internal/dbtest => ../dbtest

require (
	github.com/anishathalye/porcupine v1.3.1
	github.com/redis/go-redis/v9 v9.23.0
	modernc.org/sqlite v1.62.0
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/dustin/go-humanize v1.1.0 // indirect
	github.com/go-sql-driver/mysql v1.10.1 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/klauspost/compress v1.20.0 // indirect
	github.com/mattn/go-isatty v0.0.24 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	github.com/ncruces/go-strftime v1.1.0 // indirect
	github.com/remyoudompheng/bigfft v0.0.0-20230129092748-24d4a6f8daec // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/crypto v0.57.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	modernc.org/libc v1.80.1 // indirect
	modernc.org/mathutil v1.7.1 // indirect
	modernc.org/memory v1.12.1 // indirect
)

require (
	github.com/jackc/pgx/v5 v5.13.0
	github.com/nats-io/nats.go v1.55.0
	github.com/onceguard/onceguard/natsjs v0.0.0-00010101000000-000000000000
)

replace github.com/onceguard/onceguard/natsjs => ../../natsjs
