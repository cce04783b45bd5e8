package redistest

import (
	"context"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
)

// Shared returns a client on the Redis named by ONCEGUARD_TEST_REDIS, or
// skips the test when it is unset. The test must use keys of its own: the
// server is shared with other tests and never flushed.
func Shared(t testing.TB) *redis.Client {
	t.Helper()
	url := os.Getenv("ONCEGUARD_TEST_REDIS")
	if url == "" {
		t.Skip("ONCEGUARD_TEST_REDIS not set (e.g. redis://127.0.0.1:6379/0); skipping the integration test")
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatalf("ParseURL(%q) = %v", url, err)
	}
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("PING %s = %v; want PONG", url, err)
	}
	return rdb
}
