package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/redisstore"
	"github.com/onceguard/onceguard/idempotency/storetest"
	"github.com/onceguard/onceguard/internal/redistest"
	"github.com/onceguard/onceguard/token"
)

func TestStore(t *testing.T) {
	rdb := redistest.Shared(t)
	prefix := redistest.Prefix(t, rdb, "storetest") // its keys are deleted when the test ends
	storetest.Run(t, func(*testing.T) idemstore.FullStore {
		return redisstore.New(rdb, &redisstore.Options{Prefix: prefix})
	})
}

func TestStoreCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node Redis Cluster")
	}
	c := redistest.StartCluster(t, 3)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = rdb.Close() })
	storetest.Run(t, func(*testing.T) idemstore.FullStore { return redisstore.New(rdb, nil) })
}

// Every key the store writes expires on its own: a token that is never
// used is gone from Redis at its expiry, not kept forever.
func TestTokenKeyExpires(t *testing.T) {
	rdb := redistest.Shared(t)
	prefix := redistest.Prefix(t, rdb, "storetest")
	s := redisstore.New(rdb, &redisstore.Options{Prefix: prefix})
	ctx := t.Context()
	if err := s.PutToken(ctx, token.Record{Hash: "h", Subject: "u", Purpose: "p", ExpiresAt: time.Now().Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	ttl, err := rdb.PTTL(ctx, prefix+"tok:{h}").Result()
	if err != nil || ttl <= 0 || ttl > time.Minute {
		t.Errorf("PTTL of an issued token = %v, %v; want its minute", ttl, err)
	}
	_ = rdb.Del(ctx, prefix+"tok:{h}")
}

// beforeBegin is a go-redis hook that runs fn once, just before the
// client's first script call on key (the record's: Begin's own script,
// after its token was bound).
type beforeBegin struct {
	key  string
	fn   func()
	done bool
}

func (h *beforeBegin) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *beforeBegin) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *beforeBegin) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); !h.done && len(a) > 3 && (cmd.Name() == "evalsha" || cmd.Name() == "eval") && a[3] == h.key {
			h.done = true
			h.fn()
		}
		return next(ctx, cmd)
	}
}

// A request is abandoned (its 5xx frees its key and its token) after a
// retry of it bound the token and before that retry created its record:
// the retry's record must keep the token bound, so that no other request
// can use it once more. Before the binding named its holder, the abandon
// unbound the token from under the retry.
func TestAbandonKeepsARetrysToken(t *testing.T) {
	rdb := redistest.Shared(t)
	prefix := redistest.Prefix(t, rdb, "storetest")
	ctx := t.Context()
	for _, signed := range []bool{false, true} {
		name := map[bool]string{false: "stored", true: "signed"}[signed]
		t.Run(name, func(t *testing.T) {
			s := redisstore.New(rdb, &redisstore.Options{Prefix: prefix})
			now := time.Now()
			hash := "h-" + name
			if !signed {
				if err := s.PutToken(ctx, token.Record{Hash: hash, Subject: "u", Purpose: "p", ExpiresAt: now.Add(time.Minute)}); err != nil {
					t.Fatal(err)
				}
			}
			claim := func(scope string) *idemstore.TokenClaim {
				return &idemstore.TokenClaim{Hash: hash, Subject: "u", Purpose: "p", Scope: scope, Signed: signed}
			}
			req := func(id, scope string) idemstore.BeginRequest {
				return idemstore.BeginRequest{ID: id, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Token: claim(scope), Now: now}
			}
			id := "rec-" + name
			first, err := s.Begin(ctx, req(id, "S"))
			if err != nil || first.Outcome != idemstore.Started {
				t.Fatalf("first Begin = %+v, %v; want started", first, err)
			}
			// The retry's client abandons the first request between the
			// retry's binding and its record.
			retryClient := redis.NewClient(rdb.Options())
			t.Cleanup(func() { _ = retryClient.Close() })
			hook := &beforeBegin{key: prefix + "rec:{" + id + "}", fn: func() {
				if err := s.Abandon(ctx, id, first.Lease); err != nil {
					t.Errorf("Abandon of the first request: %v", err)
				}
			}}
			retryClient.AddHook(hook)
			retry, err := redisstore.New(retryClient, &redisstore.Options{Prefix: prefix}).Begin(ctx, req(id, "S"))
			if !hook.done {
				t.Fatal("the hook did not run: the test did not interleave")
			}
			if err != nil || retry.Outcome != idemstore.Started {
				t.Fatalf("the retry's Begin = %+v, %v; want started (the first's record abandoned)", retry, err)
			}
			other, err := s.Begin(ctx, req("rec-other-"+name, "S2"))
			if !errors.Is(err, token.ErrUsed) {
				t.Errorf("Begin in another scope with the token the retry's record holds = %+v, %v; want token.ErrUsed", other, err)
			}
			// The retry abandoned in turn frees the token: it was its own.
			if err := s.Abandon(ctx, id, retry.Lease); err != nil {
				t.Fatal(err)
			}
			if other, err := s.Begin(ctx, req("rec-other-"+name, "S2")); err != nil || other.Outcome != idemstore.Started {
				t.Errorf("Begin in another scope after the retry's abandon = %+v, %v; want started (the token freed)", other, err)
			}
		})
	}
}

// When a retry found the first request's record in progress (its binding
// of the token passed the holder to it) and the first request is then
// abandoned, the token stays bound to that request's scope, as after a
// crash between binding and record: a retry of the request goes through,
// another scope is refused.
func TestAbandonAfterRetryInProgress(t *testing.T) {
	rdb := redistest.Shared(t)
	prefix := redistest.Prefix(t, rdb, "storetest")
	ctx := t.Context()
	s := redisstore.New(rdb, &redisstore.Options{Prefix: prefix})
	now := time.Now()
	if err := s.PutToken(ctx, token.Record{Hash: "h", Subject: "u", Purpose: "p", ExpiresAt: now.Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	req := func(id, scope string) idemstore.BeginRequest {
		return idemstore.BeginRequest{ID: id, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Now: now,
			Token: &idemstore.TokenClaim{Hash: "h", Subject: "u", Purpose: "p", Scope: scope}}
	}
	first, err := s.Begin(ctx, req("rec", "S"))
	if err != nil || first.Outcome != idemstore.Started {
		t.Fatalf("first Begin = %+v, %v; want started", first, err)
	}
	if retry, err := s.Begin(ctx, req("rec", "S")); err != nil || retry.Outcome != idemstore.InProgress {
		t.Fatalf("the retry's Begin = %+v, %v; want in progress", retry, err)
	}
	if err := s.Abandon(ctx, "rec", first.Lease); err != nil {
		t.Fatal(err)
	}
	if other, err := s.Begin(ctx, req("rec-other", "S2")); !errors.Is(err, token.ErrUsed) {
		t.Errorf("Begin in another scope = %+v, %v; want token.ErrUsed (the token stays with its request)", other, err)
	}
	if again, err := s.Begin(ctx, req("rec", "S")); err != nil || again.Outcome != idemstore.Started {
		t.Errorf("a retry of the request after the abandon = %+v, %v; want started", again, err)
	}
}
