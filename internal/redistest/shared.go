package redistest

import (
	"context"
	"crypto/rand"
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

// Prefix returns a key prefix unique to this run, starting with name, and
// deletes every key under it (SCAN + UNLINK) when t ends. It never touches
// any other key: fit for the shared server.
func Prefix(t testing.TB, rdb *redis.Client, name string) string {
	prefix := name + "-" + rand.Text() + ":"
	t.Cleanup(func() {
		ctx := context.Background()
		iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if err := iter.Err(); err != nil {
			t.Error(err)
		}
		for len(keys) > 0 {
			n := min(len(keys), 500)
			if err := rdb.Unlink(ctx, keys[:n]...).Err(); err != nil {
				t.Error(err)
			}
			keys = keys[n:]
		}
	})
	return prefix
}
