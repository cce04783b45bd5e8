// Package redisscript holds what the Redis lock backends (lock/redislock on
// go-redis, lock/rueidislock on rueidis) share on the wire: the names of a
// lock's keys and channel, and the Lua scripts with the value encoding they
// imply. Both backends use exactly these, so processes using either one on
// the same Redis exclude each other, and their fences keep increasing
// across them. Changing anything here changes the protocol between
// processes.
package redisscript

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"time"

	"github.com/onceguard/onceguard/lock"
)

// DefaultPrefix starts every Redis key and channel name unless configured.
const DefaultPrefix = "onceguard:lock:"

// DefaultFenceRetention is how long a key's fence record lives unless
// configured.
const DefaultFenceRetention = 24 * time.Hour

// ConfirmTimeout bounds SUBSCRIBE and UNSUBSCRIBE when no Timeout is
// configured: without a subscription, a waiter polls.
const ConfirmTimeout = time.Second

// GiveBackTimeout is the least time a backend gives the release of a lock
// it took but could not fence.
const GiveBackTimeout = 3 * time.Second

// Suffixes of a lock's Redis names: for a lock key L (see AppendName), its
// fence is L + FenceSuffix, its waiter queue L + QueueSuffix, the waiters'
// deadlines L + DeadlinesSuffix and its channel L + WakeSuffix.
const (
	FenceSuffix     = ":fence"
	QueueSuffix     = ":q"
	DeadlinesSuffix = ":qx"   // QueueSuffix is a prefix of it
	WakeSuffix      = ":wake" // the scripts derive the channel from the lock key too
)

// AppendName appends to dst the Redis name of key's lock under prefix with
// suffix appended, and returns it with the length of the lock's own key,
// "P{K}" for prefix P and tag K, which starts it. Keys containing '{' or
// '}' are hashed (SHA-256) into "P#{hex}" so that the hash tag stays
// intact: every name of one lock is in one Cluster slot.
func AppendName(dst []byte, prefix, key, suffix string) ([]byte, int) {
	start := len(dst)
	dst = append(dst, prefix...)
	if strings.IndexByte(key, '{') >= 0 || strings.IndexByte(key, '}') >= 0 {
		sum := sha256.Sum256([]byte(key))
		dst = append(dst, "#{"...)
		dst = hex.AppendEncode(dst, sum[:])
	} else {
		dst = append(dst, '{')
		dst = append(dst, key...)
	}
	dst = append(dst, '}')
	n := len(dst) - start
	return append(dst, suffix...), n
}

// Name returns the Redis name of key's lock under prefix with suffix
// appended.
func Name(prefix, key, suffix string) string {
	name, _ := NameAndLock(prefix, key, suffix)
	return name
}

// NameAndLock returns what AppendName appends, as a string made with one
// allocation, and the length of the lock's own key that starts it.
func NameAndLock(prefix, key, suffix string) (string, int) {
	var sb strings.Builder
	hashed := strings.IndexByte(key, '{') >= 0 || strings.IndexByte(key, '}') >= 0
	if hashed {
		sb.Grow(len(prefix) + 2 + 2*sha256.Size + 1 + len(suffix))
		sum := sha256.Sum256([]byte(key))
		var hx [2 * sha256.Size]byte
		hex.Encode(hx[:], sum[:])
		sb.WriteString(prefix)
		sb.WriteString("#{")
		sb.Write(hx[:])
	} else {
		sb.Grow(len(prefix) + 1 + len(key) + 1 + len(suffix))
		sb.WriteString(prefix)
		sb.WriteByte('{')
		sb.WriteString(key)
	}
	sb.WriteByte('}')
	n := sb.Len()
	sb.WriteString(suffix)
	return sb.String(), n
}

// Every script touches only the keys of one lock, all hash-tagged with the
// lock's name, so each runs on one Cluster slot. The acquire script gets
// all four (release and leave the ones they use: the lock, the queue and
// the deadlines; refresh the lock; raise and reseed the fence):
//
//	KEYS[1] the lock, with PX ttl. Its value is the owner token; the owner
//	        token + "\n" when waiters are queued; "\n" + a waiter's token
//	        when the lock is free but reserved for that waiter, the first
//	        in line, which release woke.
//	KEYS[2] the fence: the last fencing token, kept FenceRetention
//	KEYS[3] the waiter queue: a sorted set of owner tokens by arrival (µs)
//	KEYS[4] the waiters' deadlines: a hash owner -> ms; a waiter that stops
//	        renewing its place is dropped when it reaches the head
//
// The common paths are as short as Redis allows, because script overhead
// per redis.call is what bounds throughput under pipelining: acquire of a
// free lock is SET NX PX, TIME, SET GET (a blocked caller's adds a ZREM,
// to leave the line it may be in); release with nobody waiting is GET,
// DEL. Time comes from the server's TIME, never from the client.
// Needs Redis 6.2 or later (SET ... GET, KEEPTTL).
//
// A try (not a blocked waiter, counter fences) is no script but two plain
// commands sent back to back on one connection: SET lock owner NX PX ttl,
// then INCR of the fence. The INCR runs after the SET and before its
// sender can release, so a later holder's INCR is always larger; when the
// INCR returned less than ReseedBelow, the fence key was just created (or
// a reseed that should have followed its creation failed), and Reseed
// raises it to the server's clock.

// handover: the lock at KEYS[1] is being given up and waiters are
// queued; KEYS[2] and KEYS[3] are the waiter queue and the waiters'
// deadlines (release and leave get only these three keys). Drops waiters
// whose place expired, then reserves the lock for the first live one and
// wakes it by publishing its token on the lock's channel, KEYS[1] ..
// ":wake", or deletes the lock when nobody is left.
const handover = `
local t = redis.call('TIME')
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local h = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
local exp = 0
while h do
  exp = tonumber(redis.call('HGET', KEYS[3], h) or '0')
  if exp > ms then break end
  redis.call('ZREM', KEYS[2], h)
  redis.call('HDEL', KEYS[3], h)
  h = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
end
if h then
  redis.call('SET', KEYS[1], '\n' .. h, 'PX', string.format('%.0f', exp - ms))
  redis.call('PUBLISH', KEYS[1] .. ':wake', h)
else
  redis.call('DEL', KEYS[1])
end
`

// Acquire: ARGV owner, ttl ms, fence retention ms, wait ms (0: not a
// waiter). Returns the fence (> 0) when the lock was taken, else
// -1 - the holder's remaining ms.
//
// A free lock goes to the caller, and so does a lock reserved for the
// caller (it was first in line when the lock was released); anything else
// is held, and a blocked caller (wait > 0) joins or renews its place in
// line and marks the lock as having waiters. A queued caller that finds
// the lock free (its holder's TTL ran out, or a reservation's did) takes
// it and leaves the line, marking the lock when others are still in it:
// a place left behind, its deadline renewed a moment before, would be the
// first handed the lock at the next release, and nobody would claim it
// until that deadline passed, up to WaitTTL a handover, for as long as the
// lock had waiters (after a Redis black hole healed: TestChaos/
// redis-blackhole's 503 busy).
//
// The fence is max(last + 1, server time in µs): strictly increasing per
// key, and still increasing after Redis lost the key.
const Acquire = `
local won = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
if not won then
  local v = redis.call('GET', KEYS[1])
  if v == '\n' .. ARGV[1] then
    redis.call('ZREM', KEYS[3], ARGV[1])
    redis.call('HDEL', KEYS[4], ARGV[1])
    local mark = ''
    if redis.call('ZCARD', KEYS[3]) > 0 then mark = '\n' end
    redis.call('SET', KEYS[1], ARGV[1] .. mark, 'PX', ARGV[2])
  elseif v == ARGV[1] or v == ARGV[1] .. '\n' then
    -- Already ours: an earlier run of this very acquire (owner tokens are
    -- random per acquire) took it and its reply was lost; a client that
    -- runs the script again gets the lock, with a new fence.
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  else
    local wait = tonumber(ARGV[4])
    if wait > 0 then
      local t = redis.call('TIME')
      local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      redis.call('ZADD', KEYS[3], 'NX', string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2])), ARGV[1])
      redis.call('HSET', KEYS[4], ARGV[1], string.format('%.0f', ms + wait))
      redis.call('PEXPIRE', KEYS[3], 2 * wait)
      redis.call('PEXPIRE', KEYS[4], 2 * wait)
      if v and string.byte(v, 1) ~= 10 and string.byte(v, -1) ~= 10 then
        redis.call('SET', KEYS[1], v .. '\n', 'KEEPTTL')
      end
    end
    return -1 - math.max(redis.call('PTTL', KEYS[1]), 0)
  end
elseif tonumber(ARGV[4]) > 0 and redis.call('ZREM', KEYS[3], ARGV[1]) == 1 then
  redis.call('HDEL', KEYS[4], ARGV[1])
  if redis.call('ZCARD', KEYS[3]) > 0 then
    redis.call('SET', KEYS[1], ARGV[1] .. '\n', 'KEEPTTL')
  end
end
local t = redis.call('TIME')
local f = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = redis.call('SET', KEYS[2], string.format('%.0f', f), 'PX', ARGV[3], 'GET')
if last and tonumber(last) >= f then
  f = tonumber(last) + 1
  redis.call('SET', KEYS[2], string.format('%.0f', f), 'PX', ARGV[3])
end
return f
`

// Release: KEYS lock, queue, deadlines; ARGV owner. Returns 1
// released, 0 expired (nobody holds it), -1 held by another owner. With
// waiters queued it hands the lock over to the first of them.
const Release = `
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
elseif v == ARGV[1] .. '\n' then
` + handover + `
  return 1
elseif v and string.byte(v, 1) ~= 10 then
  return -1
end
return 0
`

// Refresh: ARGV owner, ttl ms. Returns 1, 0 or -1 like Release.
const Refresh = `
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] or v == ARGV[1] .. '\n' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
elseif v and string.byte(v, 1) ~= 10 then
  return -1
end
return 0
`

// Leave: KEYS lock, queue, deadlines; ARGV owner. Drops a waiter that
// gave up; if the lock was reserved for it, hands it to the next waiter.
const Leave = `
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
if redis.call('GET', KEYS[1]) == '\n' .. ARGV[1] then
` + handover + `
end
return 1
`

// Raise: KEYS[1] the fence; ARGV floor, fence retention ms. Raises the
// last fence to at least floor, so the next acquire returns more.
const Raise = `
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
if cur < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
return 1
`

// ReseedBelow: a try whose INCR of the fence returns less than this runs
// Reseed. A seeded fence is the server's clock in µs or more (about 2^50
// today), so a smaller one was counted up from a key that was created and
// never seeded: first use, FenceRetention since the last seed, Redis lost
// its data, or the reseed after any of those failed (the connection broke
// right after a restart). Without the last case in the rule, that key
// would go on counting from 1, with no expiry, below every fence it gave
// before. 2^40 µs is 1970-01-13: a server whose clock is before that
// reseeds on every try, which is slower, not wrong.
const ReseedBelow = 1 << 40

// Reseed: KEYS[1] the fence; ARGV fence retention ms. Runs while the
// caller holds the lock, after its INCR found an unseeded fence key (see
// ReseedBelow): returns a
// new fence, raised to the server's clock in µs, and gives the key its
// expiry.
const Reseed = `
local t = redis.call('TIME')
local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local f = redis.call('INCR', KEYS[1])
if f < us then
  f = us
  redis.call('SET', KEYS[1], string.format('%.0f', f), 'PX', ARGV[1])
elseif redis.call('PTTL', KEYS[1]) < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return f
`

// Outcome is what a reply of the release and refresh scripts means: 1
// done (nil), 0 the lock expired and nobody holds it (lock.ErrExpired),
// -1 another owner holds it (lock.ErrNotHeld). ok is false for any other
// reply.
func Outcome(n int64) (err error, ok bool) {
	switch n {
	case 1:
		return nil, true
	case 0:
		return lock.ErrExpired, true
	case -1:
		return lock.ErrNotHeld, true
	}
	return nil, false
}

// NotNow reports whether a Redis error reply means "not now" rather than
// "wrong" (loading, failing over, a busy script, ...): the server cannot
// answer at the moment, so a fallback may take over.
func NotNow(reply string) bool {
	for _, p := range []string{"LOADING", "CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "READONLY", "BUSY"} {
		if strings.HasPrefix(reply, p) {
			return true
		}
	}
	return false
}
