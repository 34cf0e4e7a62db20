"""Every Lua script hybridlock sends to a Redis or Valkey server, each with its contract.

Conventions for all scripts:

* Every key a script touches is passed in ``KEYS`` and all of them share one Redis Cluster hash slot (see
  ``hybridlock._keys``). Pub/sub channel names go in ``ARGV``, never ``KEYS``.
* Durations are integer milliseconds.
* Scripts are sent with EVALSHA and fall back to EVAL on NOSCRIPT, per client (``ScriptRunner`` in
  ``backends/redis.py``), so a server restart or ``SCRIPT FLUSH`` costs one extra round trip, not an error.

Fencing tokens
--------------
``ACQUIRE`` mints a token with ``INCR`` on the lock's counter key. The counter is kept for ``FENCE_COUNTER_TTL_MS``
after its last use and refreshed at every acquisition. When it has expired (or the server lost it), it is
re-seeded from the server clock in microseconds (``TIME``) before the ``INCR``. Tokens therefore keep increasing
across the counter's expiry: every earlier token is at most *earlier seed + number of acquisitions since*, each
acquisition is one script run taking well over a microsecond, so that sum stays below the clock reading at
re-seeding. The argument assumes the server clock does not step back by more than the counter's idle time (a day
at least) and that writes are not lost in a failover of an asynchronously replicated master.
"""

from __future__ import annotations

# Counter keys live this long after their last acquisition (one week); see the module docstring.
FENCE_COUNTER_TTL_MS = 7 * 24 * 3600 * 1000

ACQUIRE = """
-- ACQUIRE: take the lock if it is free or already ours, minting a fencing token; else record that we want it.
-- KEYS[1]  lock key              KEYS[2]  fencing counter key      KEYS[3]  set of owners waiting for the lock
-- ARGV[1]  owner (client_id)     ARGV[2]  lease in ms ("0": no expiry)     ARGV[3]  counter TTL in ms
-- ARGV[4]  the lock's channel    ARGV[5]  "publish" | "spublish" | "" (how to announce that we wait)
-- returns  {1, token, wanted}    acquired; token is the new fencing token; wanted = 1 if other owners are in
--                                the waiting set (they failed to get the lock and may still wait), else 0
--          {0, pttl}             held by another owner; pttl = its remaining lease in ms, -1 = no expiry.
--                                We are added to the waiting set (expiring with that lease) and announce it.
-- A key that already holds our own client_id is taken over: the caller holds the only local lock object for
-- this key in its registry, so such a key can only be left by our own earlier attempt whose reply was lost (a
-- client retry after a timeout) or by a release that failed to reach the server.
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then
  local pttl = redis.call('PTTL', KEYS[1])
  redis.call('SADD', KEYS[3], ARGV[1])
  redis.call('PEXPIRE', KEYS[3], math.max(pttl, 1000))
  if ARGV[5] == 'publish' then
    redis.call('PUBLISH', ARGV[4], 'wanted')
  elseif ARGV[5] == 'spublish' then
    redis.call('SPUBLISH', ARGV[4], 'wanted')
  end
  return {0, pttl}
end
if ARGV[2] == '0' then
  redis.call('SET', KEYS[1], ARGV[1])
else
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
if redis.call('EXISTS', KEYS[2]) == 0 then
  local now = redis.call('TIME')
  redis.call('SET', KEYS[2], now[1] .. string.format('%06d', tonumber(now[2])))
end
local token = redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('SREM', KEYS[3], ARGV[1])
local wanted = 0
if redis.call('SCARD', KEYS[3]) > 0 then
  wanted = 1
end
return {1, token, wanted}
"""

ACQUIRE_MANY = """
-- ACQUIRE_MANY: take several plain locks at once, all or nothing (callers make sure all KEYS share a slot).
-- KEYS     three per lock i (i = 1..n): KEYS[3i-2] lock key, KEYS[3i-1] fencing counter, KEYS[3i] waiting set
-- ARGV[1]  owner (client_id)     ARGV[2]  lease in ms ("0": no expiry)     ARGV[3]  counter TTL in ms
-- ARGV[3+i]  lock i's channel
-- returns  {1, token_1, wanted_1, ..., token_n, wanted_n}   all taken (as ACQUIRE would return for each)
--          {0, pttl, i}          lock i is another owner's (the first found): nothing was taken, we are recorded
--                                as waiting for lock i and announce it on its channel
local n = #KEYS / 3
for i = 1, n do
  local holder = redis.call('GET', KEYS[3 * i - 2])
  if holder and holder ~= ARGV[1] then
    local pttl = redis.call('PTTL', KEYS[3 * i - 2])
    redis.call('SADD', KEYS[3 * i], ARGV[1])
    redis.call('PEXPIRE', KEYS[3 * i], math.max(pttl, 1000))
    redis.call('PUBLISH', ARGV[3 + i], 'wanted')
    return {0, pttl, i}
  end
end
local result = {1}
local now = nil
for i = 1, n do
  local lock, fence, waiting = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  if ARGV[2] == '0' then
    redis.call('SET', lock, ARGV[1])
  else
    redis.call('SET', lock, ARGV[1], 'PX', ARGV[2])
  end
  if redis.call('EXISTS', fence) == 0 then
    now = now or redis.call('TIME')
    redis.call('SET', fence, now[1] .. string.format('%06d', tonumber(now[2])))
  end
  result[#result + 1] = redis.call('INCR', fence)
  redis.call('PEXPIRE', fence, ARGV[3])
  redis.call('SREM', waiting, ARGV[1])
  result[#result + 1] = (redis.call('SCARD', waiting) > 0) and 1 or 0
end
return result
"""

RELEASE = """
-- RELEASE: delete the lock only if it is still ours, then wake waiters.
-- KEYS[1]  lock key
-- ARGV[1]  owner (client_id)     ARGV[2]  wake-up channel
-- ARGV[3]  "publish" | "spublish" | "" (how to announce the release; "" = nobody listens)
-- returns  1                     released
--          0                     not ours: the key is gone or another owner's (our lease had ended)
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
if ARGV[3] == 'publish' then
  redis.call('PUBLISH', ARGV[2], 'released')
elseif ARGV[3] == 'spublish' then
  redis.call('SPUBLISH', ARGV[2], 'released')
end
return 1
"""

RENEW = """
-- RENEW: reset the lease of every given hold that is still ours.
-- KEYS[1..n]  lock keys (one cluster slot per call): a plain lock or a write hold (a string whose value is the
--             owner), or the readers of a read-write lock (a sorted set: owner -> expiry in server ms)
-- ARGV[1]     owner (client_id)   ARGV[2]  new lease in ms
-- returns     {r1, ..., rn}       ri = 1 renewed, 0 lost (gone, expired or another owner's)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
local result = {}
for i, key in ipairs(KEYS) do
  result[i] = 0
  local kind = redis.call('TYPE', key)['ok']
  if kind == 'string' then
    if redis.call('GET', key) == ARGV[1] then
      redis.call('PEXPIRE', key, ARGV[2])
      result[i] = 1
    end
  elseif kind == 'zset' then
    local expiry = redis.call('ZSCORE', key, ARGV[1])
    if expiry and tonumber(expiry) > now then
      redis.call('ZADD', key, now + lease, ARGV[1])
      if redis.call('PTTL', key) < lease then
        redis.call('PEXPIRE', key, lease)
      end
      result[i] = 1
    end
  end
end
return result
"""

# The read-write lock. Reader holds live in a sorted set scored by their own expiry (server ms), so a crashed
# reader's hold ends with its own lease, not with a TTL the other readers keep extending. Writers that wait are
# recorded in another sorted set; while it holds anyone, new readers wait behind them (writer preference).
_RW_PRELUDE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
"""

ACQUIRE_READ = (
    """
-- ACQUIRE_READ: add our read hold unless a writer holds the lock or other owners wait to write.
-- KEYS[1]  writer key            KEYS[2]  readers (zset)       KEYS[3]  waiting writers (zset)
-- ARGV[1]  owner (client_id)     ARGV[2]  lease in ms
-- returns  {1}                   acquired (a write hold of our own does not block: that is a downgrade)
--          {0, wait_ms}          blocked; wait_ms = until the writer's lease or the first waiting writer's wish
--                                ends, -1 = no expiry
"""
    + _RW_PRELUDE
    + """
local writer = redis.call('GET', KEYS[1])
if writer and writer ~= ARGV[1] then
  return {0, redis.call('PTTL', KEYS[1])}
end
if not writer then
  local waiting = redis.call('ZCARD', KEYS[3])
  if redis.call('ZSCORE', KEYS[3], ARGV[1]) then
    waiting = waiting - 1
  end
  if waiting > 0 then
    local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
    return {0, tonumber(first[2]) - now}
  end
end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return {1}
"""
)

ACQUIRE_WRITE = (
    """
-- ACQUIRE_WRITE: take the write hold if there is no other writer and no reader; else wait to write.
-- KEYS[1]  writer key            KEYS[2]  readers (zset)       KEYS[3]  waiting writers (zset)
-- KEYS[4]  fencing counter key
-- ARGV[1]  owner (client_id)     ARGV[2]  lease in ms          ARGV[3]  counter TTL in ms
-- ARGV[4]  channel               ARGV[5]  "publish" | "spublish" | ""
-- returns  {1, token}            acquired, with a new fencing token
--          {0, wait_ms}          blocked by a writer or by readers (our own included: no upgrade); we are
--                                recorded as a waiting writer for twice the lease (renewed by each attempt),
--                                which holds back new readers, and announce it on the channel
"""
    + _RW_PRELUDE
    + """
local writer = redis.call('GET', KEYS[1])
local wait_ms = nil
if writer and writer ~= ARGV[1] then
  wait_ms = redis.call('PTTL', KEYS[1])
elseif redis.call('ZCARD', KEYS[2]) > 0 then
  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  wait_ms = tonumber(first[2]) - now
end
if wait_ms then
  redis.call('ZADD', KEYS[3], now + 2 * tonumber(ARGV[2]), ARGV[1])
  redis.call('PEXPIRE', KEYS[3], 2 * tonumber(ARGV[2]))
  if ARGV[5] == 'publish' then
    redis.call('PUBLISH', ARGV[4], 'wanted')
  elseif ARGV[5] == 'spublish' then
    redis.call('SPUBLISH', ARGV[4], 'wanted')
  end
  return {0, wait_ms}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[1])
if redis.call('EXISTS', KEYS[4]) == 0 then
  redis.call('SET', KEYS[4], t[1] .. string.format('%06d', tonumber(t[2])))
end
local token = redis.call('INCR', KEYS[4])
redis.call('PEXPIRE', KEYS[4], ARGV[3])
return {1, token}
"""
)

RELEASE_READ = (
    """
-- RELEASE_READ: remove our read hold; when no reader is left, wake those waiting.
-- KEYS[1]  writer key (unused)   KEYS[2]  readers (zset)       KEYS[3]  waiting writers (zset)
-- ARGV[1]  owner (client_id)     ARGV[2]  channel              ARGV[3]  "publish" | "spublish" | ""
-- returns  1                     released
--          0                     our hold had expired or was gone: the lease was lost
"""
    + _RW_PRELUDE
    + """
if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then
  return 0
end
if redis.call('ZCARD', KEYS[2]) == 0 then
  if ARGV[3] == 'publish' then
    redis.call('PUBLISH', ARGV[2], 'released')
  elseif ARGV[3] == 'spublish' then
    redis.call('SPUBLISH', ARGV[2], 'released')
  end
end
return 1
"""
)

CANCEL_WRITE_WAIT = """
-- CANCEL_WRITE_WAIT: a writer gave up waiting; stop holding back readers on its behalf.
-- KEYS[1]  waiting writers (zset)
-- ARGV[1]  owner (client_id)     ARGV[2]  channel              ARGV[3]  "publish" | "spublish" | ""
-- returns  1 if we were waiting, else 0
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then
  return 0
end
if ARGV[3] == 'publish' then
  redis.call('PUBLISH', ARGV[2], 'released')
elseif ARGV[3] == 'spublish' then
  redis.call('SPUBLISH', ARGV[2], 'released')
end
return 1
"""

FENCED_SET = """
-- FENCED_SET: write a value only if the writer's fencing token is not older than any seen for the resource.
-- KEYS[1]  the data key          KEYS[2]  the resource's high-water-mark key (same slot)
-- ARGV[1]  the writer's token    ARGV[2]  the value   ARGV[3]  TTL of both keys in ms ("0": none)
-- returns  1                     written; the high-water mark is now ARGV[1]
--          0                     rejected: a newer token has written before (a stale holder)
local highest = tonumber(redis.call('GET', KEYS[2]) or '0')
local token = tonumber(ARGV[1])
if token < highest then
  return 0
end
if ARGV[3] == '0' then
  redis.call('SET', KEYS[2], ARGV[1])
  redis.call('SET', KEYS[1], ARGV[2])
else
  redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[3])
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
return 1
"""
