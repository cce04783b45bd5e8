package redislock

import (
	"crypto/sha1"
	"encoding/hex"
)

// Every script touches only the keys of one lock, all hash-tagged with the
// lock's name, so each runs on one Cluster slot:
//
//	KEYS[1] the lock: owner token, PX ttl
//	KEYS[2] the fence: the last fencing token, kept FenceRetention
//	KEYS[3] the waiter queue: a sorted set of owner tokens by arrival (µs)
//	KEYS[4] the waiters' deadlines: a hash owner -> ms; a waiter that stops
//	        renewing its place is dropped when it reaches the head
//
// Time comes from the server's TIME, never from the client's clock.

// headLua defines now/nowms and head(): the first live waiter, dropping dead
// ones on the way.
const headLua = `
local t = redis.call('TIME')
local nowus = tonumber(t[1]) * 1000000 + tonumber(t[2])
local nowms = math.floor(nowus / 1000)
local function head()
  while true do
    local h = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
    if not h then return nil end
    if tonumber(redis.call('HGET', KEYS[4], h) or '0') > nowms then return h end
    redis.call('ZREM', KEYS[3], h)
    redis.call('HDEL', KEYS[4], h)
  end
end
`

// acquireLua: ARGV owner, ttl ms, fence retention ms, wait ms (0: not a
// waiter). Returns {1, fence} or {0, pttl}.
//
// The lock goes to the caller only if it is free and no live waiter is
// ahead; a blocked caller (wait > 0) joins or renews its place in line.
// The fence is max(last + 1, server time in µs): strictly increasing per
// key, and still increasing after the fence key expired or Redis lost it.
const acquireLua = headLua + `
local h = head()
if (not h or h == ARGV[1]) and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if h then
    redis.call('ZREM', KEYS[3], h)
    redis.call('HDEL', KEYS[4], h)
  end
  local f = nowus
  local last = tonumber(redis.call('GET', KEYS[2]) or '0')
  if f <= last then f = last + 1 end
  redis.call('SET', KEYS[2], string.format('%.0f', f), 'PX', ARGV[3])
  return {1, f}
end
local wait = tonumber(ARGV[4])
if wait > 0 then
  redis.call('ZADD', KEYS[3], 'NX', nowus, ARGV[1])
  redis.call('HSET', KEYS[4], ARGV[1], string.format('%.0f', nowms + wait))
  redis.call('PEXPIRE', KEYS[3], 2 * wait)
  redis.call('PEXPIRE', KEYS[4], 2 * wait)
end
return {0, redis.call('PTTL', KEYS[1])}
`

// releaseLua: ARGV owner, channel. Returns 1 released, 0 expired (nobody
// holds it), -1 held by another owner. Wakes the first waiter by
// publishing its owner token.
const releaseLua = headLua + `
local v = redis.call('GET', KEYS[1])
local r = 0
if v == ARGV[1] then
  redis.call('DEL', KEYS[1])
  r = 1
elseif v then
  return -1
end
local h = head()
if h then redis.call('PUBLISH', ARGV[2], h) end
return r
`

// refreshLua: ARGV owner, ttl ms. Returns 1, 0 or -1 like releaseLua.
const refreshLua = `
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
elseif v then
  return -1
end
return 0
`

// leaveLua: ARGV owner, channel. Drops a waiter that gave up and, if the
// lock is free, wakes the next one.
const leaveLua = headLua + `
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 0 then
  local h = head()
  if h then redis.call('PUBLISH', ARGV[2], h) end
end
return 1
`

// raiseLua: KEYS[1] the fence; ARGV floor, fence retention ms. Raises the
// last fence to at least floor, so the next acquire returns more.
const raiseLua = `
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
if cur < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
return 1
`

type script struct {
	src, sha string
}

func newScript(src string) *script {
	sum := sha1.Sum([]byte(src))
	return &script{src: src, sha: hex.EncodeToString(sum[:])}
}

var (
	scriptAcquire = newScript(acquireLua)
	scriptRelease = newScript(releaseLua)
	scriptRefresh = newScript(refreshLua)
	scriptLeave   = newScript(leaveLua)
	scriptRaise   = newScript(raiseLua)
)
