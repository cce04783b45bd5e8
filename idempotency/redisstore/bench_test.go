package redisstore_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/redisstore"
	"github.com/onceguard/onceguard/internal/redistest"
	"github.com/onceguard/onceguard/token"
)

// roundTrips counts commands and pipelines sent to Redis: each is one
// round trip.
type roundTrips struct{ n atomic.Int64 }

func (c *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { c.n.Add(1); return next(ctx, cmd) }
}
func (c *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { c.n.Add(1); return next(ctx, cmds) }
}

// The middleware on Redis: latency per request and Redis round trips per
// request (rt/op), for a first use, a first use with a submit token, and a
// replay. go-redis runs EVALSHA, and EVAL only after NOSCRIPT, so after the
// first call each script costs one round trip.
func BenchmarkMiddlewareRedis(b *testing.B) {
	url := envRedis(b)
	opt, _ := redis.ParseURL(url)
	rdb := redis.NewClient(opt)
	b.Cleanup(func() { _ = rdb.Close() }) // after the prefix's cleanup below, which uses it
	rt := &roundTrips{}
	rdb.AddHook(rt)
	// Its keys (a record per first use, kept for the TTL) are deleted
	// when it ends: the shared Redis is not left with thousands.
	store := redisstore.New(rdb, &redisstore.Options{Prefix: redistest.Prefix(b, rdb, "bench-middleware")})
	tokens := token.New(store, nil)
	h := idempotency.Middleware(idempotency.Config{Store: store, Tokens: tokens, Purpose: "withdrawal",
		Principal: func(*http.Request) (string, error) { return "bench", nil }})(http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	send := func(key string) {
		r := httptest.NewRequest(http.MethodPost, "/withdrawals", strings.NewReader(`{"amount":"10.00"}`))
		r.Header.Set("Idempotency-Key", key)
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	send("warm-up") // loads the scripts
	run := func(name string, prepare func(i int) string) {
		b.Run(name, func(b *testing.B) {
			var trips int64
			n := 0
			for i := 0; b.Loop(); i++ {
				b.StopTimer()
				key := prepare(i)
				before := rt.n.Load()
				b.StartTimer()
				send(key)
				trips += rt.n.Load() - before
				n++
			}
			b.ReportMetric(float64(trips)/float64(n), "rt/op")
		})
	}
	run("first-use", func(i int) string { return "k-" + strconv.Itoa(i) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36) })
	run("first-use-token", func(i int) string {
		is, err := tokens.Issue(context.Background(), "bench", "withdrawal")
		if err != nil {
			b.Fatal(err)
		}
		return is.Token
	})
	send("replayed")
	run("replay", func(int) string { return "replayed" })
}

func envRedis(b *testing.B) string {
	v := os.Getenv("ONCEGUARD_TEST_REDIS")
	if v == "" {
		b.Skip("ONCEGUARD_TEST_REDIS not set")
	}
	return v
}
