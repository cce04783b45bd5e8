package redisstore_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/redisstore"
	"github.com/onceguard/onceguard/internal/redistest"
)

// A stored header is replayed as it was sent, byte for byte, as memstore
// does: a value with bytes that are not UTF-8 (obs-text, say a Latin-1
// filename), which net/http sends as they are.
func TestReplayHeaderBytes(t *testing.T) {
	rdb := redistest.Shared(t)
	prefix := redistest.Prefix(t, rdb, "review")
	s := redisstore.New(rdb, &redisstore.Options{Prefix: prefix})
	ctx, now := t.Context(), time.Now()
	req := idemstore.BeginRequest{ID: "review-hdr", Fingerprint: "fp", Lease: time.Minute, TTL: time.Minute, Now: now}
	res, err := s.Begin(ctx, req)
	if err != nil || res.Outcome != idemstore.Started {
		t.Fatalf("Begin = %+v, %v", res, err)
	}
	want := "attachment; filename=\"caf\xe9.txt\""
	if err := s.Complete(ctx, req.ID, res.Lease, idemstore.Response{Status: 200, Header: http.Header{"Content-Disposition": {want}}, Body: []byte("x")}, now); err != nil {
		t.Fatal(err)
	}
	res, err = s.Begin(ctx, req)
	if err != nil || res.Outcome != idemstore.Replay {
		t.Fatalf("Begin = %+v, %v", res, err)
	}
	if got := res.Record.Response.Header.Get("Content-Disposition"); got != want {
		t.Errorf("replayed header = %q; want %q as stored", got, want)
	}
}

// A Redis that cannot take the request (every connection busy: the
// client's pool timed out waiting) is a store that could not answer:
// ErrUnavailable, as the Store interface and Do promise, so that a
// consumer redelivers instead of treating it as a poison message.
func TestPoolTimeoutIsUnavailable(t *testing.T) {
	url := os.Getenv("ONCEGUARD_TEST_REDIS")
	if url == "" {
		t.Skip("ONCEGUARD_TEST_REDIS not set")
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	opt.PoolSize, opt.MinIdleConns, opt.PoolTimeout, opt.MaxRetries = 1, 0, 50*time.Millisecond, -1
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	held := make(chan struct{})
	go func() { // holds the only connection for a second
		close(held)
		_ = rdb.BLPop(context.Background(), time.Second, "review:pooltimeout:"+strconv.FormatInt(time.Now().UnixNano(), 10)).Err()
	}()
	<-held
	time.Sleep(100 * time.Millisecond)
	s := redisstore.New(rdb, &redisstore.Options{Prefix: "review:pool:"})
	_, err = s.Begin(t.Context(), idemstore.BeginRequest{ID: "x", Fingerprint: "fp", Lease: time.Minute, TTL: time.Minute, Now: time.Now()})
	if !errors.Is(err, idempotency.ErrUnavailable) {
		t.Errorf("Begin with no connection to be had = %v; want an error matching ErrUnavailable", err)
	}
}
