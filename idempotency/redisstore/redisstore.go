// Package redisstore keeps idempotency records, submit tokens and the
// repeat-submit window in Redis (single node, Sentinel or Cluster), on the
// caller's go-redis client.
//
// It needs Lua numbers to hold millisecond timestamps exactly, which they
// do (doubles, up to 2^53).
//
// Every operation is one Lua script on one key, so it runs on one Cluster
// slot. Round trips: a first use is Begin plus Complete (two; a submit
// token adds one, to bind it), a replay is one Begin (a token adds one), a
// window claim one; under a token, an answer in progress or with another
// body adds one more, to leave the binding's count (below).
//
// A token is bound before its key's record is created, in a separate
// step (the two keys can live on different Cluster slots), so the binding
// counts the requests that bound it and may still create or hold a record
// (their leases: each Begin draws its lease before it binds). An
// abandoned record (a 5xx frees its key and token) frees its token only
// when no other such request is left; otherwise the last of them to leave
// frees it: a request that found the record in progress or with another
// body leaves at once, one whose record completes never does. So a retry
// of the same request that bound the token and creates its record after
// an abandon keeps it bound, in either order of the two binds. A crash
// between binding and creating (or a holder whose expired lease another
// request took over) stays counted: the token stays bound to its
// request's scope with no record, a retry of the same request goes
// through, and the token cannot be used for anything else, exactly as
// after a completed request. Records and tokens expire with Redis key
// expiry: nothing to prune.
//
// A Redis without persistence forgets records and tokens on restart: keep
// them in the application's database (package sqlstore) when a restart
// must not forget them, as the reference service does.
package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/token"
)

// Options configure a Store. A nil *Options means all defaults.
type Options struct {
	// Prefix starts every key. Default: "onceguard:idem:".
	Prefix string
}

// Store implements idemstore.FullStore on Redis. It is safe for
// concurrent use.
type Store struct {
	rdb    redis.UniversalClient
	prefix string
	hub    hub // Watch's
}

var (
	_ idemstore.FullStore        = (*Store)(nil)
	_ idemstore.SignedTokenStore = (*Store)(nil)
)

// New returns a Store on rdb. It does not dial.
func New(rdb redis.UniversalClient, opts *Options) *Store {
	s := &Store{rdb: rdb, prefix: "onceguard:idem:"}
	if opts != nil && opts.Prefix != "" {
		s.prefix = opts.Prefix
	}
	return s
}

func (s *Store) recKey(id string) string   { return s.prefix + "rec:{" + id + "}" }
func (s *Store) tokKey(hash string) string { return s.prefix + "tok:{" + hash + "}" }
func (s *Store) winKey(id string) string   { return s.prefix + "win:{" + id + "}" }

func ms(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }

var (
	// beginLua: KEYS[1] the record; ARGV fingerprint, lease, lease until
	// ms, now ms, ttl ms, token hash, existing only ("1": create none).
	// Returns {outcome, ...}: 1 started, 2 replay (status, header, body),
	// 3 in progress, 4 mismatch, 5 started by taking over an expired
	// lease, 6 none to answer (existing only). Times are the caller's
	// clock (as in every store); Redis key expiry only cleans up.
	beginLua = redis.NewScript(`
local r = redis.call('HMGET', KEYS[1], 'fp', 'state', 'until', 'status', 'header', 'body', 'exp')
if not r[1] or tonumber(r[7]) <= tonumber(ARGV[4]) then
  if ARGV[7] == '1' then return {6} end
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'fp', ARGV[1], 'state', '1', 'lease', ARGV[2], 'until', ARGV[3], 'token', ARGV[6],
    'exp', tonumber(ARGV[4]) + tonumber(ARGV[5]))
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  return {1}
end
if r[1] ~= ARGV[1] then return {4} end
if r[2] == '2' then return {2, r[4], r[5], r[6], r[7]} end
if tonumber(r[3]) > tonumber(ARGV[4]) then return {3} end
redis.call('HSET', KEYS[1], 'lease', ARGV[2], 'until', ARGV[3])
return {5}
`)
	// completeLua: KEYS[1] the record; ARGV lease, status, header, body.
	// It tells Watch's subscribers (the record's key is the channel).
	completeLua = redis.NewScript(`
local r = redis.call('HMGET', KEYS[1], 'state', 'lease')
if r[1] ~= '1' or r[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'state', '2', 'status', ARGV[2], 'header', ARGV[3], 'body', ARGV[4])
redis.call('HDEL', KEYS[1], 'lease', 'until')
redis.call('PUBLISH', KEYS[1], '2')
return 1
`)
	// abandonLua: KEYS[1] the record; ARGV lease. Deletes it and returns
	// its token hash ("" for none), or false when the lease lost it.
	abandonLua = redis.NewScript(`
local r = redis.call('HMGET', KEYS[1], 'state', 'lease', 'token')
if r[1] ~= '1' or r[2] ~= ARGV[1] then return false end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', KEYS[1], '0')
return r[3] or ''
`)
	// bindLua: KEYS[1] the token; ARGV subject, purpose, scope, now ms,
	// keep ms (how long a bound token is kept), lease (of the request
	// binding it, counted until it leaves; "" for none). Returns 1 bound
	// now, 0 already bound to scope, or an error reason: unknown,
	// foreign, purpose, used, expired.
	bindLua = redis.NewScript(`
local r = redis.call('HMGET', KEYS[1], 'subject', 'purpose', 'expires', 'scope')
if not r[1] then return 'unknown' end
if r[1] ~= ARGV[1] then return 'foreign' end
if r[2] ~= ARGV[2] then return 'purpose' end
local bound = 1
if r[4] and r[4] ~= '' then
  if r[4] ~= ARGV[3] then return 'used' end
  bound = 0
else
  if tonumber(r[3]) <= tonumber(ARGV[4]) then return 'expired' end
  redis.call('HSET', KEYS[1], 'scope', ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
end
if ARGV[6] ~= '' and redis.call('HSETNX', KEYS[1], 'p:' .. ARGV[6], '1') == 1 then
  redis.call('HINCRBY', KEYS[1], 'pending', 1)
end
return bound
`)
	// bindSignedLua: KEYS[1] the signed token's binding; ARGV scope, keep
	// ms, lease (as bindLua's). Returns 1 bound now, 0 already bound to
	// scope, or 'used'.
	bindSignedLua = redis.NewScript(`
local s = redis.call('HGET', KEYS[1], 'scope')
local bound = 1
if s and s ~= '' then
  if s ~= ARGV[1] then return 'used' end
  bound = 0
else
  redis.call('HSET', KEYS[1], 'scope', ARGV[1])
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if redis.call('HSETNX', KEYS[1], 'p:' .. ARGV[3], '1') == 1 then
  redis.call('HINCRBY', KEYS[1], 'pending', 1)
end
return bound
`)
	// unbindLua: KEYS[1] the token; ARGV scope ("" for any), now ms,
	// lease ("" for none), mode. Mode "abandon": the lease's record was
	// abandoned; it leaves the count, and the token is unbound only when
	// no counted request is left (else it is marked for the last one to
	// leave). Mode "leave": the lease's request created no record; it
	// leaves the count, and unbinds the token when it was the last one
	// after such an abandon. Mode "": unbind. A signed token's binding (no
	// expiry of its own) is deleted; a stored token's is kept, unbound,
	// until the token's own expiry. Returns 1 unbound, else 0.
	unbindLua = redis.NewScript(`
local r = redis.call('HMGET', KEYS[1], 'scope', 'expires')
if not r[1] or r[1] == '' or (ARGV[1] ~= '' and r[1] ~= ARGV[1]) then return 0 end
if ARGV[4] ~= '' then
  local left = tonumber(redis.call('HGET', KEYS[1], 'pending') or '0')
  if ARGV[3] ~= '' and redis.call('HDEL', KEYS[1], 'p:' .. ARGV[3]) == 1 then
    left = redis.call('HINCRBY', KEYS[1], 'pending', -1)
  elseif ARGV[4] == 'leave' then
    return 0
  end
  if left > 0 then
    if ARGV[4] == 'abandon' then redis.call('HSET', KEYS[1], 'orphan', '1') end
    return 0
  end
  if ARGV[4] == 'leave' and redis.call('HGET', KEYS[1], 'orphan') ~= '1' then return 0 end
end
if not r[2] then
  redis.call('DEL', KEYS[1])
  return 1
end
local f = redis.call('HKEYS', KEYS[1])
for i = 1, #f do
  if string.sub(f[i], 1, 2) == 'p:' or f[i] == 'pending' or f[i] == 'orphan' then redis.call('HDEL', KEYS[1], f[i]) end
end
redis.call('HSET', KEYS[1], 'scope', '')
redis.call('PEXPIRE', KEYS[1], math.max(tonumber(r[2]) - tonumber(ARGV[2]), 1))
return 1
`)
	// claimLua: KEYS[1] the window entry, "expires ms|owner"; ARGV owner,
	// now ms, window ms, the owner's record. Returns 0 when claimed (or
	// already the record's, then passed to owner), else the ms left, at
	// most the window (a caller whose now is before the winner's sees more).
	claimLua = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v then
  local sep = string.find(v, '|', 1, true)
  local exp = tonumber(string.sub(v, 1, sep - 1))
  if exp > tonumber(ARGV[2]) then
    local o = string.sub(v, sep + 1)
    if o == ARGV[1] then return 0 end
    if o == ARGV[4] or string.sub(o, 1, #ARGV[4] + 1) == ARGV[4] .. '/' then
      redis.call('SET', KEYS[1], exp .. '|' .. ARGV[1], 'PX', exp - tonumber(ARGV[2]))
      return 0
    end
    return math.min(exp - tonumber(ARGV[2]), tonumber(ARGV[3]))
  end
end
redis.call('SET', KEYS[1], (tonumber(ARGV[2]) + tonumber(ARGV[3])) .. '|' .. ARGV[1], 'PX', ARGV[3])
return 0
`)
	// freeLua: KEYS[1] the window entry; ARGV owner.
	freeLua = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, string.find(v, '|', 1, true) + 1) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`)
)

// Begin implements idemstore.Store.
func (s *Store) Begin(ctx context.Context, r idemstore.BeginRequest) (idemstore.BeginResult, error) {
	tokenHash, existingOnly, lease := "", "0", newLease()
	if t := r.Token; t != nil {
		// Bind first (see the package doc); a record that exists already
		// was created with this token in this scope, so binding succeeds.
		// An expired signed token binds nothing: it may only answer the
		// record it created.
		var err error
		switch {
		case t.Signed && t.Expired:
			existingOnly = "1"
		case t.Signed:
			err = s.bindSigned(ctx, t, lease, r.Now, r.Now.Add(r.TTL))
		default:
			_, err = s.bind(ctx, t.Hash, t.Subject, t.Purpose, t.Scope, lease, r.Now, r.Now.Add(r.TTL))
		}
		if err != nil {
			return idemstore.BeginResult{}, err
		}
		tokenHash = t.Hash
	}
	res, err := beginLua.Run(ctx, s.rdb, []string{s.recKey(r.ID)},
		r.Fingerprint, lease, ms(r.Now.Add(r.Lease)), ms(r.Now), max(r.TTL.Milliseconds(), 1), tokenHash, existingOnly).Slice()
	if err != nil {
		return idemstore.BeginResult{}, wrap("begin", err)
	}
	outcome, _ := res[0].(int64)
	if (outcome == 3 || outcome == 4) && tokenHash != "" && existingOnly == "0" {
		// This request bound the token and created no record: it leaves the
		// binding's count (and frees the token if it was the last one left
		// after an abandon), also when its caller has gone (a deadline, a
		// client that hung up), as Abandon does. A failure leaves it counted,
		// the token bound to this scope, as after a crash: the answer stands.
		_ = unbindLua.Run(context.WithoutCancel(ctx), s.rdb, []string{s.tokKey(tokenHash)}, "", ms(r.Now), lease, "leave").Err()
	}
	rec := &idemstore.Record{ID: r.ID, Fingerprint: r.Fingerprint}
	switch outcome {
	case 6:
		return idemstore.BeginResult{}, token.ErrExpired
	case 1:
		return idemstore.BeginResult{Outcome: idemstore.Started, Lease: lease}, nil
	case 5:
		return idemstore.BeginResult{Outcome: idemstore.Started, Lease: lease, Recovered: true}, nil
	case 3:
		rec.State = idemstore.InFlight
		return idemstore.BeginResult{Outcome: idemstore.InProgress, Record: rec}, nil
	case 4:
		return idemstore.BeginResult{Outcome: idemstore.Mismatch, Record: rec}, nil
	case 2:
		resp := &idemstore.Response{}
		st, _ := res[1].(string)
		resp.Status, _ = strconv.Atoi(st)
		if h, _ := res[2].(string); h != "" {
			var err error
			if resp.Header, err = idemstore.UnmarshalHeader(h); err != nil {
				return idemstore.BeginResult{}, fmt.Errorf("redisstore: stored header of %s: %w", r.ID, err)
			}
		}
		b, _ := res[3].(string)
		resp.Body = []byte(b)
		rec.State, rec.Response = idemstore.Completed, resp
		if len(res) > 4 {
			if e, _ := res[4].(string); e != "" {
				if n, err := strconv.ParseInt(e, 10, 64); err == nil {
					rec.ExpiresAt = time.UnixMilli(n)
				}
			}
		}
		return idemstore.BeginResult{Outcome: idemstore.Replay, Record: rec}, nil
	}
	return idemstore.BeginResult{}, fmt.Errorf("redisstore: begin: unexpected reply %v", res)
}

// Complete implements idemstore.Store.
func (s *Store) Complete(ctx context.Context, id, lease string, resp idemstore.Response, _ time.Time) error {
	header, err := idemstore.MarshalHeader(resp.Header) // byte for byte, not UTF-8 only as JSON's strings
	if err != nil {
		return err
	}
	n, err := completeLua.Run(ctx, s.rdb, []string{s.recKey(id)}, lease, resp.Status, header, resp.Body).Int()
	if err != nil {
		return wrap("complete", err)
	}
	if n == 0 {
		return idempotency.ErrLeaseLost
	}
	return nil
}

// Abandon implements idemstore.Store.
func (s *Store) Abandon(ctx context.Context, id, lease string) error {
	tok, err := abandonLua.Run(ctx, s.rdb, []string{s.recKey(id)}, lease).Text()
	if errors.Is(err, redis.Nil) {
		return idempotency.ErrLeaseLost
	} else if err != nil {
		return wrap("abandon", err)
	}
	if tok != "" {
		// Only when no other request that bound the token may still create or
		// hold a record with it (see the package doc).
		if err := unbindLua.Run(ctx, s.rdb, []string{s.tokKey(tok)}, "", ms(time.Now()), lease, "abandon").Err(); err != nil {
			return wrap("abandon", err)
		}
	}
	return nil
}

// ClaimWindow implements idemstore.WindowStore: one script.
func (s *Store) ClaimWindow(ctx context.Context, id, owner string, window time.Duration, now time.Time) (time.Duration, error) {
	left, err := claimLua.Run(ctx, s.rdb, []string{s.winKey(id)}, owner, ms(now), max(window.Milliseconds(), 1), idemstore.WindowRecord(owner)).Int64()
	if err != nil {
		return 0, wrap("claim window", err)
	}
	return time.Duration(left) * time.Millisecond, nil
}

// FreeWindow implements idemstore.WindowStore.
func (s *Store) FreeWindow(ctx context.Context, id, owner string) error {
	return wrap("free window", freeLua.Run(ctx, s.rdb, []string{s.winKey(id)}, owner).Err())
}

// PutToken implements token.Store.
func (s *Store) PutToken(ctx context.Context, r token.Record) error {
	key := s.tokKey(r.Hash)
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, key, "subject", r.Subject, "purpose", r.Purpose, "expires", r.ExpiresAt.UnixMilli(), "scope", r.Scope)
		p.PExpireAt(ctx, key, r.ExpiresAt)
		return nil
	})
	return wrap("put token", err)
}

// GetToken implements token.Store.
func (s *Store) GetToken(ctx context.Context, hash string) (token.Record, error) {
	v, err := s.rdb.HMGet(ctx, s.tokKey(hash), "subject", "purpose", "expires", "scope").Result()
	if err != nil {
		return token.Record{}, wrap("get token", err)
	}
	if v[0] == nil {
		return token.Record{}, token.ErrUnknown
	}
	r := token.Record{Hash: hash}
	r.Subject, _ = v[0].(string)
	r.Purpose, _ = v[1].(string)
	exp, _ := v[2].(string)
	n, _ := strconv.ParseInt(exp, 10, 64)
	r.ExpiresAt = time.UnixMilli(n)
	r.Scope, _ = v[3].(string)
	return r, nil
}

// BindToken implements token.Store. A token bound on its own is kept 24h.
func (s *Store) BindToken(ctx context.Context, hash, subject, purpose, scope string, now time.Time) (bool, error) {
	return s.bind(ctx, hash, subject, purpose, scope, "", now, now.Add(token.BoundTTL))
}

// bind binds a stored token to scope until keep, counting lease (a
// request's, or "" for none) among those that may create a record with it.
func (s *Store) bind(ctx context.Context, hash, subject, purpose, scope, lease string, now, keep time.Time) (bool, error) {
	res, err := bindLua.Run(ctx, s.rdb, []string{s.tokKey(hash)}, subject, purpose, scope, ms(now), max(keep.Sub(now).Milliseconds(), 1), lease).Result()
	if err != nil {
		return false, wrap("bind token", err)
	}
	switch v := res.(type) {
	case int64:
		return v == 1, nil
	case string:
		switch v {
		case "unknown":
			return false, token.ErrUnknown
		case "foreign":
			return false, token.ErrForeign
		case "purpose":
			return false, token.ErrPurpose
		case "used":
			return false, token.ErrUsed
		case "expired":
			return false, token.ErrExpired
		}
	}
	return false, fmt.Errorf("redisstore: bind token: unexpected reply %v", res)
}

// BindsSignedTokens implements idemstore.SignedTokenStore: a signed
// token, which has no record of its own, is bound to the scope of the
// first key's record it creates (a key of its own, kept as long as that
// record), before the record is created, as a stored token is.
func (s *Store) BindsSignedTokens() {}

// bindSigned binds the signed token of c to its scope until keep,
// counting lease as bind does: token.ErrUsed when another scope holds it.
func (s *Store) bindSigned(ctx context.Context, c *idemstore.TokenClaim, lease string, now, keep time.Time) error {
	res, err := bindSignedLua.Run(ctx, s.rdb, []string{s.tokKey(c.Hash)}, c.Scope, max(keep.Sub(now).Milliseconds(), 1), lease).Result()
	if err != nil {
		return wrap("bind token", err)
	}
	if res == "used" {
		return token.ErrUsed
	}
	return nil
}

// UnbindToken implements token.Store.
func (s *Store) UnbindToken(ctx context.Context, hash, scope string) error {
	if scope == "" {
		return nil
	}
	return wrap("unbind token", unbindLua.Run(ctx, s.rdb, []string{s.tokKey(hash)}, scope, ms(time.Now()), "", "").Err())
}

func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	var nerr net.Error
	if errors.As(err, &nerr) || errors.Is(err, redis.ErrClosed) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrPoolExhausted) ||
		strings.Contains(err.Error(), "connection refused") || strings.Contains(err.Error(), "EOF") {
		return fmt.Errorf("redisstore: %s: %w: %w", op, idempotency.ErrUnavailable, err)
	}
	// A server that cannot serve now: restarting, a replica after a
	// failover, a cluster without a quorum, out of client slots.
	for _, p := range []string{"LOADING ", "READONLY ", "MASTERDOWN ", "CLUSTERDOWN ", "TRYAGAIN ", "ERR max number of clients"} {
		if strings.HasPrefix(err.Error(), p) {
			return fmt.Errorf("redisstore: %s: %w: %w", op, idempotency.ErrUnavailable, err)
		}
	}
	return fmt.Errorf("redisstore: %s: %w", op, err)
}

func newLease() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (Go 1.24+)
	return base64.RawURLEncoding.EncodeToString(b[:])
}
