package redisstore_test

import (
	"context"
	"errors"
	"strings"
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

// before is a go-redis hook that runs fn once, just before the client's
// first script call whose arguments match (say, Begin's record script,
// after its token was bound).
type before struct {
	match func(args []any) bool
	fn    func()
	done  bool
}

func (h *before) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *before) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *before) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !h.done && (cmd.Name() == "evalsha" || cmd.Name() == "eval") && h.match(cmd.Args()) {
			h.done = true
			h.fn()
		}
		return next(ctx, cmd)
	}
}

// onKey matches a script call on key (its first key).
func onKey(key string) func([]any) bool {
	return func(a []any) bool { return len(a) > 3 && a[3] == key }
}

// tokenRig is a store with one token (stored or signed) and a way to make
// Begin requests with it in any scope, and a second store on a client of
// its own whose script calls a hook can interleave with.
type tokenRig struct {
	t      *testing.T
	s      *redisstore.Store
	rdb    *redis.Client
	prefix string
	hash   string
	signed bool
	now    time.Time
}

func newTokenRig(t *testing.T, signed bool) *tokenRig {
	rdb := redistest.Shared(t)
	g := &tokenRig{t: t, rdb: rdb, prefix: redistest.Prefix(t, rdb, "storetest"), hash: "h", signed: signed, now: time.Now()}
	g.s = redisstore.New(rdb, &redisstore.Options{Prefix: g.prefix})
	if !signed {
		if err := g.s.PutToken(t.Context(), token.Record{Hash: g.hash, Subject: "u", Purpose: "p", ExpiresAt: g.now.Add(time.Minute)}); err != nil {
			t.Fatal(err)
		}
	}
	return g
}

// onLeave matches the script call by which a request that created no
// record leaves the token's binding.
func (g *tokenRig) onLeave() func([]any) bool {
	return func(a []any) bool { return len(a) > 7 && a[3] == g.prefix+"tok:{"+g.hash+"}" && a[len(a)-1] == "leave" }
}

func (g *tokenRig) req(id, scope string) idemstore.BeginRequest {
	return idemstore.BeginRequest{ID: id, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Now: g.now,
		Token: &idemstore.TokenClaim{Hash: g.hash, Subject: "u", Purpose: "p", Scope: scope, Signed: g.signed}}
}

// hooked returns a store on a client of its own that runs fn just before
// its first script call matching match, and a check that fails the test
// when fn has not run (the test did not interleave).
func (g *tokenRig) hooked(match func([]any) bool, fn func()) (*redisstore.Store, func()) {
	c := redis.NewClient(g.rdb.Options())
	g.t.Cleanup(func() { _ = c.Close() })
	h := &before{match: match, fn: fn}
	c.AddHook(h)
	interleaved := func() {
		g.t.Helper()
		if !h.done {
			g.t.Fatal("the hook did not run: the test did not interleave")
		}
	}
	return redisstore.New(c, &redisstore.Options{Prefix: g.prefix}), interleaved
}

func (g *tokenRig) begin(s *redisstore.Store, id, scope string, want idemstore.Outcome) idemstore.BeginResult {
	g.t.Helper()
	res, err := s.Begin(g.t.Context(), g.req(id, scope))
	if err != nil || res.Outcome != want {
		g.t.Fatalf("Begin of %s in %s = %+v, %v; want outcome %v", id, scope, res, err, want)
	}
	return res
}

func (g *tokenRig) abandon(id, lease string) {
	g.t.Helper()
	if err := g.s.Abandon(g.t.Context(), id, lease); err != nil {
		g.t.Errorf("Abandon of %s: %v", id, err)
	}
}

// usedElsewhere checks whether the token is refused in another scope, as
// want says (a Begin there that starts is abandoned again).
func (g *tokenRig) usedElsewhere(want bool, why string) {
	g.t.Helper()
	res, err := g.s.Begin(g.t.Context(), g.req("rec-elsewhere", "S2"))
	switch {
	case want && !errors.Is(err, token.ErrUsed):
		g.t.Errorf("Begin in another scope = %+v, %v; want token.ErrUsed: %s", res, err, why)
	case !want && (err != nil || res.Outcome != idemstore.Started):
		g.t.Errorf("Begin in another scope = %+v, %v; want started: %s", res, err, why)
	case !want:
		g.abandon("rec-elsewhere", res.Lease)
	}
}

func eachToken(t *testing.T, f func(t *testing.T, g *tokenRig)) {
	for _, signed := range []bool{false, true} {
		t.Run(map[bool]string{false: "stored", true: "signed"}[signed], func(t *testing.T) { f(t, newTokenRig(t, signed)) })
	}
}

// A request is abandoned (its 5xx frees its key and its token) after a
// retry of it bound the token and before that retry created its record:
// the retry's record must keep the token bound, so that no other request
// can use it once more. Before the binding counted its requests, the
// abandon unbound the token from under the retry.
func TestAbandonKeepsARetrysToken(t *testing.T) {
	eachToken(t, func(t *testing.T, g *tokenRig) {
		first := g.begin(g.s, "rec", "S", idemstore.Started)
		retryStore, interleaved := g.hooked(onKey(g.prefix+"rec:{rec}"), func() { g.abandon("rec", first.Lease) })
		retry := g.begin(retryStore, "rec", "S", idemstore.Started) // the first's record abandoned in between
		interleaved()
		g.usedElsewhere(true, "the retry's record holds it")
		g.abandon("rec", retry.Lease)
		g.usedElsewhere(false, "the retry's record, the last, was abandoned too")
	})
}

// The same with the binds the other way round: a request C binds the
// token and is slow to create its record; a retry A binds it after C,
// creates the record, and is abandoned; then C creates its record. A
// binding that named only the request that bound it last lost C's.
func TestAbandonKeepsAnEarlierBindersToken(t *testing.T) {
	eachToken(t, func(t *testing.T, g *tokenRig) {
		slow, interleaved := g.hooked(onKey(g.prefix+"rec:{rec}"), func() {
			a := g.begin(g.s, "rec", "S", idemstore.Started)
			g.abandon("rec", a.Lease)
		})
		c := g.begin(slow, "rec", "S", idemstore.Started)
		interleaved()
		g.usedElsewhere(true, "the slow request's record holds it")
		g.abandon("rec", c.Lease)
		g.usedElsewhere(false, "every record with it was abandoned")
	})
}

// A retry that finds the first request's record in progress created
// nothing: when the first is then abandoned, the token is free again (as
// memstore and sqlstore free it), also when the abandon comes between the
// retry's answer and its leaving the binding's count.
func TestAbandonAfterRetryInProgress(t *testing.T) {
	eachToken(t, func(t *testing.T, g *tokenRig) {
		first := g.begin(g.s, "rec", "S", idemstore.Started)
		g.begin(g.s, "rec", "S", idemstore.InProgress)
		g.abandon("rec", first.Lease)
		g.usedElsewhere(false, "the only record with it was abandoned")
	})
	eachToken(t, func(t *testing.T, g *tokenRig) {
		first := g.begin(g.s, "rec", "S", idemstore.Started)
		retryStore, interleaved := g.hooked(g.onLeave(), func() { g.abandon("rec", first.Lease) })
		g.begin(retryStore, "rec", "S", idemstore.InProgress)
		interleaved()
		g.usedElsewhere(false, "the first's record was abandoned, and the retry created none")
		g.begin(g.s, "rec", "S", idemstore.Started) // and a retry of the request still goes through
	})
	// The retry's caller gone (its deadline, a client that hung up) by the
	// time it leaves: it leaves all the same.
	eachToken(t, func(t *testing.T, g *tokenRig) {
		first := g.begin(g.s, "rec", "S", idemstore.Started)
		ctx, cancel := context.WithCancel(t.Context())
		retryStore, interleaved := g.hooked(g.onLeave(), func() { cancel(); g.abandon("rec", first.Lease) })
		if res, err := retryStore.Begin(ctx, g.req("rec", "S")); err != nil || res.Outcome != idemstore.InProgress {
			t.Fatalf("the retry's Begin = %+v, %v; want in progress", res, err)
		}
		interleaved()
		g.usedElsewhere(false, "the first's record was abandoned, and the retry, whose caller had gone, created none")
	})
}

// A binding written before bindings counted their requests (no count in
// it) whose record is in flight: a retry that finds the record in progress
// and leaves must not free the token under it, and the record's abandon
// frees it as before.
func TestUpgradedBindingKeepsItsToken(t *testing.T) {
	eachToken(t, func(t *testing.T, g *tokenRig) {
		first := g.begin(g.s, "rec", "S", idemstore.Started)
		// What the earlier scripts wrote: the scope, no count.
		tok := g.prefix + "tok:{h}"
		fields, err := g.rdb.HKeys(t.Context(), tok).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fields {
			if f == "pending" || strings.HasPrefix(f, "p:") {
				g.rdb.HDel(t.Context(), tok, f)
			}
		}
		g.begin(g.s, "rec", "S", idemstore.InProgress)
		g.usedElsewhere(true, "the earlier request's record is in flight")
		g.abandon("rec", first.Lease)
		g.usedElsewhere(false, "its record was abandoned")
	})
}
