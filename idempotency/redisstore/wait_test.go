package redisstore_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/redisstore"
	"github.com/onceguard/onceguard/internal/leakcheck"
	"github.com/onceguard/onceguard/internal/redistest"
)

// A hundred retries waiting (Options.Wait) for one key's first request
// are all woken by its completion and replay its answer, the handler ran
// once, and once they are answered no subscription, connection or
// goroutine is left. The waiters share one subscription, so one
// connection (on a server of its own, so that the counts are this
// test's).
func TestWaitManyWaiters(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a redis-server")
	}
	srv := redistest.StartServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := t.Context()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	clients := func() int {
		info, err := rdb.Info(ctx, "clients").Result()
		if err != nil {
			t.Fatal(err)
		}
		_, rest, _ := strings.Cut(info, "connected_clients:")
		n := 0
		for _, c := range rest {
			if c < '0' || c > '9' {
				break
			}
			n = n*10 + int(c-'0')
		}
		return n
	}
	subscribers := func() int {
		chans, err := rdb.PubSubChannels(ctx, "*").Result()
		if err != nil || len(chans) == 0 {
			return 0
		}
		m, err := rdb.PubSubNumSub(ctx, chans...).Result()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, c := range m {
			n += int(c)
		}
		return n
	}
	ignore := leakcheck.IgnoreCurrent()
	baseClients, baseG := clients(), runtime.NumGoroutine()

	store := &counted{Store: redisstore.New(rdb, nil)}
	release, started := make(chan struct{}), make(chan struct{})
	var runs atomic.Int32
	h := idempotency.Middleware(idempotency.Config{Store: store, Wait: 5 * time.Minute})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		close(started)
		<-release
		w.WriteHeader(201)
		_, _ = w.Write([]byte("paid"))
	}))
	key := "many-waiters"
	send := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{}`))
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- send() }()
	<-started
	const n = 100
	answers := make(chan *httptest.ResponseRecorder, n)
	for range n {
		go func() { answers <- send() }()
	}
	// Each waiter asks twice before it sleeps: its Begin, and one look
	// once its Watch is subscribed.
	deadline := time.Now().Add(60 * time.Second)
	for store.inProgress.Load() < 2*n && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := store.inProgress.Load(); got < 2*n {
		t.Fatalf("%d Begins found the key in flight; want %d, two per waiter", got, 2*n)
	}
	if got := subscribers(); got != 1 {
		t.Errorf("%d subscriptions for %d waiters on one key; want 1, shared", got, n)
	}
	if got := clients() - baseClients; got > 25 {
		t.Errorf("%d connections more for %d waiters; want the pool's few and one for pub/sub", got, n)
	}
	t.Logf("%d waiters: %d subscriptions, %d connections more, %d goroutines more (%d are the requests)",
		n, subscribers(), clients()-baseClients, runtime.NumGoroutine()-baseG, n+1)
	close(release)
	if w := <-first; w.Code != 201 {
		t.Fatalf("first: %d", w.Code)
	}
	for range n {
		select {
		case w := <-answers:
			if w.Code != 201 || w.Body.String() != "paid" || w.Header().Get("Idempotent-Replayed") != "true" {
				t.Errorf("waiter: %d %q %v; want the replay", w.Code, w.Body, w.Header())
			}
		case <-time.After(60 * time.Second):
			t.Fatal("a waiter was not answered within 60 s of the first answer")
		}
	}
	if runs.Load() != 1 {
		t.Errorf("%d runs; want 1", runs.Load())
	}
	deadline = time.Now().Add(30 * time.Second)
	for subscribers() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := subscribers(); got != 0 {
		t.Errorf("%d subscriptions left after every waiter was answered", got)
	}
	if err := leakcheck.Find(ignore, leakcheck.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial")); err != nil {
		t.Error(err)
	}
	t.Logf("after: %d connections more than before", clients()-baseClients)
}

// counted counts the Begins that found the key in flight.
type counted struct {
	*redisstore.Store
	inProgress atomic.Int32
}

func (c *counted) Begin(ctx context.Context, r idemstore.BeginRequest) (idemstore.BeginResult, error) {
	res, err := c.Store.Begin(ctx, r)
	if err == nil && res.Outcome == idemstore.InProgress {
		c.inProgress.Add(1)
	}
	return res, err
}
