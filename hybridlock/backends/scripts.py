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
-- RENEW: reset the lease of every given lock that is still ours.
-- KEYS[1..n]  lock keys (one cluster slot per call)
-- ARGV[1]     owner (client_id)   ARGV[2]  new lease in ms
-- returns     {r1, ..., rn}       ri = 1 renewed, 0 lost (gone or another owner's)
local result = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then
    redis.call('PEXPIRE', key, ARGV[2])
    result[i] = 1
  else
    result[i] = 0
  end
end
return result
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
