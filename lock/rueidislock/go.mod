module github.com/onceguard/onceguard/lock/rueidislock

go 1.26.0

require github.com/onceguard/onceguard v0.0.0-00010101000000-000000000000

replace github.com/onceguard/onceguard => ../..

require (
	github.com/redis/go-redis/v9 v9.23.0
	github.com/redis/rueidis v1.0.79
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/net v0.59.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
)
