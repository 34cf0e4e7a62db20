"""Every Lua script hybridlock sends to a Redis or Valkey server, each with its contract.

Conventions for all scripts:

* Every key a script touches is passed in ``KEYS`` and all of them share one Redis Cluster hash slot (see
  ``hybridlock._core.names``). Pub/sub channel names go in ``ARGV``, never ``KEYS``.
* Durations are integer milliseconds.
* Any subset of a script's keys may be missing (evicted under any ``maxmemory`` policy, deleted by an operator,
  lost in a restart or failover) or hold a value of another type: every script reads a missing key as empty and a
  key of another type as missing (``_KEYS_LIB``), so partial state never turns into a script error. A queued owner
  whose expiry entry is gone counts as lapsed.
* Scripts are sent with EVALSHA and fall back to EVAL on NOSCRIPT, per client (``ScriptRunner`` in
  ``hybridlock.backends.redis``), so a server restart or ``SCRIPT FLUSH`` costs one extra round trip, not an error.

Fencing tokens
--------------
Every script that gives a lock to an owner mints its token with one ``mint`` (in ``_FENCE_LIB``): ``ACQUIRE``,
``ACQUIRE_MANY``, ``ACQUIRE_WRITE``, and the scripts that grant a plain lock to the head of its queue (``RELEASE``,
``CANCEL_WAIT``, ``KEEP_WAITING``; see "The queue of owners" below)::

    token = max(stored counter + 1, server clock in microseconds from TIME)

then store it in the lock's counter key with a TTL of the registry's ``fence_retention`` (refreshed at every
acquisition; ``hybridlock._core.config.FENCE_RETENTION``, a day, on one server or a cluster,
``QUORUM_FENCE_RETENTION``, a week, over a quorum). Every acquisition is one script run taking well over a
microsecond, so on one server the clock term alone already increases from one acquisition to the next; the counter
term keeps tokens increasing when the clock steps back.

What holds:

* On one server, tokens of a key strictly increase. While the counter exists, the ``+ 1`` term guarantees it
  whatever the clock does. When the counter is gone (expired ``fence_retention`` after the key's last
  acquisition, evicted, deleted, lost in a restart without persistence), the clock term is past every earlier
  token provided the server clock has not stepped back by more than the time since the key's last acquisition.
* Across a failover to a replica that missed the last writes (asynchronous replication), the new master's first
  token exceeds every token the lost master minted provided the two servers' clocks differ by less than the time
  between the old master's last acquisition and the new master's first. A failover takes seconds, so clocks kept
  in step by NTP (milliseconds apart) satisfy it.

What does not: a counter that only counted would be set back by as many acquisitions as the replica missed, so a
rightful new holder could get a token lower than a stale holder's; the clock term is what prevents that. Nothing
here keeps *exclusion* across a failover: a lease the replica never saw is gone, and a second owner may get the
lock while the first still believes it holds it. Fencing tokens are what lets the resource tell them apart.

The exact range
---------------
Lua numbers are doubles: they count every integer exactly only up to 2^53, past which ``+ 1`` is lost (the token
would repeat) and, past 2^63, the conversion of a reply to an integer overflows. So a token is a whole number from
0 to ``MAX_TOKEN`` (2^53 - 1, the largest a double counts exactly; the clock term reaches it in the year 2255).
A counter at or above ``MAX_TOKEN`` (an infinity too) has no next token that a script can count exactly; hybridlock
never writes one, so a lock user did (or, at 2^53 - 1, the counter is exhausted): ``mint`` refuses it, puts it back
as it was, and the script takes nothing and returns ``{-1, <the counter's value>}``; the client raises
``FencingCounterError`` naming the key. A counter that is not a number (NaN included) is read as missing, as
before: the clock term then carries the order. ``RAISE_FENCE`` refuses a counter at or above ``MAX_TOKEN`` the same
way, and ``FENCED_SET`` a resource's highest token that is above it or not a number.
"""

from __future__ import annotations

from typing import Any

from .._core.config import QUEUE_PLACE_KEEP_MS
from ..errors import FencingCounterError

# The longest default a counter key lives after its last acquisition (a quorum's, one week); each backend sends its
# registry's ``fence_retention`` (see the module docstring).
FENCE_COUNTER_TTL_MS = 7 * 24 * 3600 * 1000

#: The largest fencing token: 2^53 - 1, the largest integer a Lua number (a double) counts exactly (see "The exact
#: range" in the module docstring).
MAX_TOKEN = 2**53 - 1

#: The most permits a semaphore may have: an acquire looks at every permit slot (see ``ACQUIRE_PERMIT``).
MAX_PERMITS = 1024

#: The first element of the reply of a script that refused a fencing counter (or a resource's highest token) outside
#: the exact range: ``{-1, <the stored value>}`` (see "The exact range" above, and ``fencing_counter_error``).
OUT_OF_RANGE = -1


def fencing_counter_error(
    stored: Any, *, key: str | None, counter: str, server: str, operation: str, resource: bool = False
) -> FencingCounterError:
    """The error for a script's ``{OUT_OF_RANGE, stored}`` reply: ``counter`` (a key name) holds ``stored``;
    ``operation`` is what was refused ("acquire", "fencing write-back", ...). ``resource``: ``counter`` is a
    resource's highest token (``fenced_set``), not a lock's counter."""
    shown = stored.decode("utf-8", "replace") if isinstance(stored, bytes) else str(stored)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    if resource:
        what = f"the resource's highest-token key {counter!r} holds {shown!r}, which no token compares with exactly"
        repair = "Set it to the highest token written there (or delete it)"
    else:
        what = f"the fencing counter {counter!r} holds {shown!r}, from which no next token can be counted exactly"
        repair = (
            "Set it to the highest token your resources have seen (or delete it if none kept one above the server "
            "clock in microseconds)"
        )
    return FencingCounterError(
        f"{operation} refused: {what} (tokens are whole numbers up to 2**53 - 1, the largest a Lua script counts "
        f"exactly); nothing was taken or written. {repair}",
        key=key,
        server=server,
        counter=counter,
        value=shown,
    )


# Every script that reads a fencing counter or a resource's highest token compares it with MAX_TOKEN (see "The
# exact range" in the module docstring). A NaN compares false with everything, so it passes such a test and is then
# read as a value that is not a number.
_MAX_TOKEN_LIB = f"""
local MAX_TOKEN = {MAX_TOKEN}
"""

# How every script announces on a lock's channel: mode "publish", "spublish" (sharded pub/sub, for a cluster) or
# "" (nobody listens).
_ANNOUNCE_LIB = """
local function announce(mode, channel, message)
  if mode == 'publish' then
    redis.call('PUBLISH', channel, message)
  elseif mode == 'spublish' then
    redis.call('SPUBLISH', channel, message)
  end
end
"""

# Every key a script touches may be missing or, written by something other than hybridlock, of another type:
# eviction under any maxmemory policy, an operator's DEL or FLUSHALL, a restart without persistence, a failover.
# Scripts read a key that should hold a string with ``string_at`` (nil unless it is a string), and make sure a key
# that should be a sorted set is one, or absent, with ``zset_at`` before using it (a key of another type is not
# state we wrote, so it is dropped, as if evicted). A missing key then simply reads as empty. The queue's scripts do
# the same without the TYPE call on their hot paths: ``on_kind`` runs the command and drops the key only when the
# server answers WRONGTYPE (see "The queue of owners").
_KEYS_LIB = f"""
local PLACE_KEEP_MS = {QUEUE_PLACE_KEEP_MS}
local function string_at(key)
  local value = redis.pcall('GET', key)
  if type(value) == 'string' then
    return value
  end
  return nil
end
local function zset_at(key)
  local kind = redis.call('TYPE', key)['ok']
  if kind ~= 'zset' and kind ~= 'none' then
    redis.call('DEL', key)
  end
  return key
end
-- A place was just taken or kept until now + PLACE_KEEP_MS: the keys holding places must live that long. No place
-- in them lapses later than the one set last, so a plain PEXPIRE (no PTTL first) never cuts another place short.
local function keep_places(queue, expiries)
  redis.call('PEXPIRE', queue, PLACE_KEEP_MS)
  if expiries ~= queue then
    redis.call('PEXPIRE', expiries, PLACE_KEEP_MS)
  end
end
"""

# Fencing tokens, shared by ACQUIRE, ACQUIRE_MANY and ACQUIRE_WRITE; ``t`` is the script's ``TIME`` reply. A token is
# the larger of the stored counter plus one and the server clock in microseconds (see the module docstring), stored
# back with the counter's TTL. Lua 5.1 numbers are doubles: both terms stay at or below MAX_TOKEN (the clock reads
# ~1.8e15; a counter at or above it is refused), so the arithmetic is exact, and redis.call formats a number
# argument with %.17g, which writes such an integer out in full (tostring would not: it switches to exponent
# notation past 14 digits). A counter that is missing, not a string or not a number counts as 0 (the clock term
# then carries the order) and SET replaces it.
#
# One command in the common case: SET ... GET stores the clock term and returns the counter it replaced. Only when
# that counter was not below the clock (the clock stepped back, or two acquisitions fell in one microsecond) does a
# second SET store counter + 1 instead; the script is atomic, so nobody sees the value in between. SET ... GET
# refuses a key of another type (pcall returns a WRONGTYPE error): a plain SET then replaces it. Any other refusal
# (a server before 6.2 has no SET ... GET) is raised again, never taken for a missing counter: a token minted from
# the clock alone could repeat or go back.
#
# Returns the token, or nil and the counter's value when that value is at or above MAX_TOKEN (see "The exact range"
# in the module docstring): the counter is put back as it was (its TTL refreshed) and the caller must take nothing
# and return {-1, value}. Costs no command on the common path: one comparison of the value SET ... GET returned.
_FENCE_LIB = (
    _MAX_TOKEN_LIB
    + """
local function mint(fence, ttl, t)
  local clock = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local replaced = redis.pcall('SET', fence, clock, 'PX', ttl, 'GET')
  if type(replaced) == 'table' then
    if not string.find(tostring(replaced['err']), 'WRONGTYPE', 1, true) then
      redis.call('SET', fence, clock, 'PX', ttl, 'GET')  -- raises the same error again, as the script's error
    end
    redis.call('SET', fence, clock, 'PX', ttl)
    return clock
  end
  local stored = tonumber(replaced or '0') or 0
  if stored >= MAX_TOKEN then
    redis.call('SET', fence, replaced, 'PX', ttl)
    return nil, replaced
  end
  if stored >= clock then
    local token = math.floor(stored) + 1  -- (a fraction, which hybridlock never writes, is rounded down first)
    redis.call('SET', fence, token, 'PX', ttl)
    return token
  end
  return clock
end
"""
)

# The queue of owners waiting for a plain lock, shared by the scripts below. Two sorted sets of one slot:
# ``queue`` (place -> arrival, server ms) gives the order, ``expiries`` (place -> until when a waiter that refreshed
# it keeps it) lets a waiter that crashed or gave up without saying so drop out on its own. A place lives until
# ``PLACE_KEEP_MS`` after its arrival or after its last refresh (KEEP_WAITING), whichever is later, so taking a
# place costs one write, and only a wait longer than a second or so (the wait keeper's period) writes an expiry.
# While the queue is not empty a free lock goes to its head only: no herd of retries, and no owner waits behind
# newcomers.
#
# A place is named "<owner>" or "<owner>|<wait id>|<lease in ms>". The second kind is a single lock's wait, and is
# *granted* the lock: whoever frees the lock while that place heads the queue (a release, a wait given up, an attempt
# finding the lock free, a refresh) writes the waiter's owner id into the lock key itself, with a provisional lease
# that ends when the place would have lapsed (or after the waiter's own lease, if sooner), mints its fencing token,
# removes the place and pushes "<wait id>:<arrival>:<token>:<contended>" onto the waiter's grant box,
# ``<lock key>:grant:<owner>`` (a list in the lock's slot, read with BLPOP). ``arrival`` is the place's score: a
# wait whose place was granted, then lost (the lock key deleted before the grant was read) and taken again under the
# same name, tells the old grant from a new one by it. The waiter does not need an acquire of its own after the
# wake-up, and nothing but a write to a key of the lock's slot can grant it anything: a message on a channel never
# does. The first kind (an owner taking several locks at once, which must not be handed one of them while it waits
# for the others) is only woken, with "released:<owner>" on the lock's channel, and takes the lock itself. So the
# scripts that serve the queue (RELEASE, CANCEL_WAIT, KEEP_WAITING, and ACQUIRE finding the lock free) mint tokens
# too, as ACQUIRE does.
#
# Every process that waits for a key must run a release of this kind: an earlier one's scripts (whose queue places
# all have an expiry entry) drop a new place that has none yet, and only wake heads; the waiter then learns of
# releases at its registry's next refresh (within a second), never wrongly.
#
# The grant box is the one key a script touches without its name in KEYS: it is named after the head of the queue,
# which only the script knows. It shares the lock key's hash tag, so it lives in the same cluster slot.
#
# ``_QUEUE_FUNCS`` is the part of ``_QUEUE_LIB`` that only the slow paths need: ACQUIRE and RELEASE define it after
# their fast path (an uncontended lock with no queue), so that path does not even pay for creating its closures.
_QUEUE_FUNCS = """
-- Whether a lock key's value is ``owner``'s: its owner id (taken by an attempt of its own), or "<owner>|<token>"
-- (granted by a release: see grant).
local function ours(value, owner)
  return value == owner or (value ~= nil and string.sub(value, 1, #owner + 1) == owner .. '|')
end
local function ms_of(t)
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function now_ms()
  local t = redis.call('TIME')
  return ms_of(t), t
end
-- Run a command on a key that should be a sorted set (or a list, for a grant box): a key of another type is not
-- state we wrote, so it is dropped, as if evicted, and the command runs again on the now missing key. Any other
-- refusal (OOM under maxmemory with noeviction, an ACL) is raised again, as the script's error.
local function on_kind(command, key, ...)
  local reply = redis.pcall(command, key, ...)
  if type(reply) == 'table' and reply['err'] then
    if not string.find(tostring(reply['err']), 'WRONGTYPE', 1, true) then
      return redis.call(command, key, ...)
    end
    redis.call('DEL', key)
    reply = redis.call(command, key, ...)
  end
  return reply
end
-- The first two places of the queue with their arrivals: {place1, arrival1, place2, arrival2} (shorter if fewer).
local function first_places(queue)
  return on_kind('ZRANGE', queue, 0, 1, 'WITHSCORES')
end
-- When ``place`` lapses: PLACE_KEEP_MS after its arrival, or after its last refresh if that is later. (A key of
-- another type, read with pcall, holds no refresh.)
local function lapse_of(expiries, place, arrival, now)
  local lapse = arrival + PLACE_KEEP_MS
  local refreshed = tonumber(redis.pcall('ZSCORE', expiries, place))
  if refreshed and refreshed > lapse then
    lapse = refreshed
  end
  return lapse
end
-- The first live place in the queue, its arrival (as the server wrote it), its lapse, and whether another place
-- follows it; lapsed places found at the head are removed on the way, so they hold nobody up. ``firsts`` is a reply
-- of first_places, if one was read.
local function live_head(queue, expiries, now, firsts)
  firsts = firsts or first_places(queue)
  while firsts[1] do
    local lapse = lapse_of(expiries, firsts[1], tonumber(firsts[2]), now)
    if lapse > now then
      return firsts[1], firsts[2], lapse, firsts[3] ~= nil
    end
    redis.call('ZREM', queue, firsts[1])
    redis.pcall('ZREM', expiries, firsts[1])
    firsts = first_places(queue)
  end
  return nil
end
-- Push a grant message to a waiter's box, for as long as its lease (a grant unread by then means nothing). False
-- when the server refused the push (an ACL without LPUSH): nothing was granted.
local function push_grant(box, message, ttl)
  local pushed = redis.pcall('LPUSH', box, message)
  if type(pushed) == 'table' and pushed['err'] then
    if not string.find(tostring(pushed['err']), 'WRONGTYPE', 1, true) then
      return false
    end
    redis.call('DEL', box)
    redis.call('LPUSH', box, message)
  end
  redis.call('PEXPIRE', box, ttl)
  return true
end
-- Hand the free lock to ``place``, the live head of the queue (which arrived at ``arrival`` and lapses at ``lapse``),
-- if it is a single lock's wait ("<owner>|<wait id>|<lease in ms>"): the lock key becomes the waiter's tenancy,
-- "<owner>|<token>" (which its renewals and release compare: a grant to a stale place of an owner, one that a failover
-- to a lagging replica kept after the wait had been served, never revives a tenancy of that owner that was lost
-- meanwhile, which holds another value), with a provisional lease that ends when its place would have lapsed, or after
-- its own lease if that is sooner (the waiter knows a lower bound of both, and has the lease extended before then if it
-- holds the lock longer); its token is minted, its place removed, and "<wait id>:<arrival>:<token>:<contended>" pushed
-- to its box (``more``: other owners wait, or are about to). Returns whether it did; the caller then wakes a head it
-- did not grant. A counter out of range (see mint) grants nothing: the head is sent "<wait id>:<arrival>:refused:0", so
-- that its next attempt reports the counter.
local function grant(lock, fence, fence_ttl, queue, place, arrival, lapse, more, t, now)
  local grantee, wait_id, own = string.match(place, '^([^|]+)|([^|]+)|(%d+)$')
  if not grantee then
    return false
  end
  local lease = math.min(lapse - now, tonumber(own))
  local token = mint(fence, fence_ttl, t)
  -- %.0f writes an integral double out in full (tostring would switch to exponent notation past 14 digits).
  local granted = token and string.format('%.0f', token) or 'refused'
  local message = wait_id .. ':' .. arrival .. ':' .. granted .. ':' .. (more and 1 or 0)
  if not push_grant(lock .. ':grant:' .. grantee, message, lease) then
    return false
  end
  redis.call('ZREM', queue, place)
  if not token then
    return false
  end
  redis.call('SET', lock, grantee .. '|' .. granted, 'PX', lease)
  return true
end
-- The lock is to be free and owners queue for it: grant it to the live head, or wake that head ("released:<owner>")
-- if it takes the lock itself; with nobody live left, "released" tells everyone. Returns whether it granted the
-- lock (the lock key was overwritten); if not, the caller deletes the lock key if it still holds anything.
local function serve(lock, fence, fence_ttl, queue, expiries, mode, channel, t, now, firsts)
  local head, arrival, lapse, more = live_head(queue, expiries, now, firsts)
  if head and grant(lock, fence, fence_ttl, queue, head, arrival, lapse, more, t, now) then
    return true
  end
  announce(mode, channel, head and ('released:' .. head) or 'released')
  return false
end
-- Take our place at the back of the queue, or keep the one we have for PLACE_KEEP_MS more. Returns whether the
-- place is new (it was not in the queue).
local function enqueue(queue, expiries, place, now)
  local added = on_kind('ZADD', queue, 'NX', now, place) == 1
  if not added then
    on_kind('ZADD', expiries, now + PLACE_KEEP_MS, place)
    redis.call('PEXPIRE', expiries, PLACE_KEEP_MS)
  end
  -- No place lapses later than the one taken or kept last, so the key lives as long as any place in it.
  redis.call('PEXPIRE', queue, PLACE_KEEP_MS)
  return added
end
local function leave(queue, expiries, place)
  on_kind('ZREM', queue, place)
  redis.pcall('ZREM', expiries, place)
end
-- Why a lock is not ours to take now: nil if it is, else how long to wait in ms (-1: no expiry known, or not asked
-- for: ``with_ttl`` false). A lock key that is not a string holds no owner's lease: it counts as free (taking the
-- lock overwrites it). A free lock whose live head is another single lock's wait is granted to it here, so it does
-- not wait for a release that will not come (the lock became free by expiry, or by an operator's DEL); ``queuing``:
-- the caller queues behind it (the grant says others wait).
local function blocked_for(lock, holder, fence, fence_ttl, queue, expiries, owner, place, t, now, with_ttl, queuing)
  if holder and not ours(holder, owner) then
    if with_ttl then
      return redis.call('PTTL', lock)
    end
    return -1
  end
  if not holder then
    local head, arrival, lapse, more = live_head(queue, expiries, now)
    if head and head ~= place then
      grant(lock, fence, fence_ttl, queue, head, arrival, lapse, more or queuing, t, now)
      return lapse - now
    end
  end
  return nil
end
"""
_QUEUE_LIB = _ANNOUNCE_LIB + _KEYS_LIB + _FENCE_LIB + _QUEUE_FUNCS

ACQUIRE = (
    """
-- ACQUIRE: take the lock if it is free (and we are first in its queue, if it has one) or already ours, minting
-- a fencing token; else, if asked, take our place in the queue.
-- KEYS[1]  lock key              KEYS[2]  fencing counter key
-- KEYS[3]  queue (zset)          KEYS[4]  queue expiries (zset)
-- ARGV[1]  owner (client_id)     ARGV[2]  lease in ms ("0": no expiry)     ARGV[3]  counter TTL in ms
-- ARGV[4]  the lock's channel    ARGV[5]  "publish" | "spublish" | ""      ARGV[6]  "1": queue if refused
-- ARGV[7]  our place's name: "<owner>|<wait id>|<lease in ms>" to be granted the lock by whoever frees it, or ""
--          for "<owner>", to be woken and take it ourselves (see the queue above)
-- ARGV[8]  "" or our wait id: acquired, we push a grant of our own to our box too (the caller's BLPOP, pipelined
--          right after this script to wait for a grant if refused, then returns at once)
-- returns  token                 acquired, and nobody else queues: the new fencing token, a bare integer (the
--                                common case: no reply table to build, convert and parse)
--          {1, token, 1}         acquired; other owners wait in the queue
--          {0, wait_ms, arrival} refused: held by another owner (wait_ms = its remaining lease; -1 = no expiry,
--                                or others already queue: they are served first), or free but promised to the
--                                queue's head (wait_ms = until its place lapses; a head to be granted the lock is
--                                granted it now). With ARGV[6] = "1" we are also queued (KEEP_WAITING keeps the
--                                place while we wait): arrival = the server time (ms) our place was taken, as its
--                                grant will name it, or 0 when we kept the place we had. Taking a new place
--                                announces "wanted" on the channel (a holder passing the lock among its threads,
--                                or keeping it idle, lets go at its next release).
--          {-1, counter}         the fencing counter is at or above MAX_TOKEN (see mint): nothing taken, the
--                                counter left as it was (a place we hold in the queue stays: the caller leaves
--                                it)
-- A key that already holds our own client_id (or a tenancy of ours granted by a release, "<owner>|<token>") is taken
-- over: the caller holds the only local lock object for
-- this key in its registry, so such a key can only be left by our own earlier attempt whose reply was lost (a
-- client retry after a timeout), by a release that failed to reach the server, or by a grant to our wait that we
-- have not read yet (its box is emptied: the grant is superseded by this acquisition and its new token).
"""
    + _FENCE_LIB
    + """
local t = redis.call('TIME')
-- The common case first: nobody queues (no queue key at all) and the key does not exist: SET NX takes it, and we
-- mint a token. No pruning, no head to look for, no place to leave. (A lock key of another type fails SET NX and
-- is dealt with below, as missing.)
local nobody_queued = redis.call('EXISTS', KEYS[3]) == 0
if nobody_queued then
  local taken
  if ARGV[2] == '0' then
    taken = redis.call('SET', KEYS[1], ARGV[1], 'NX')
  else
    taken = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
  end
  if taken then
    local token, corrupt = mint(KEYS[2], ARGV[3], t)
    if not token then
      redis.call('DEL', KEYS[1])
      return {-1, corrupt}
    end
    if ARGV[8] ~= nil and ARGV[8] ~= '' then
      -- (The message push_grant sends, with no place: "<wait id>:0:<token>:0". A box of another type is replaced.)
      local box = KEYS[1] .. ':grant:' .. ARGV[1]
      local message = ARGV[8] .. ':0:' .. string.format('%.0f', token) .. ':0'
      if type(redis.pcall('LPUSH', box, message)) == 'table' then
        redis.call('DEL', box)
        redis.call('LPUSH', box, message)
      end
      redis.call('PEXPIRE', box, """
    + str(QUEUE_PLACE_KEEP_MS)
    + """)
    end
    return token
  end
end
"""
    + _ANNOUNCE_LIB
    + _KEYS_LIB
    + _QUEUE_FUNCS
    + """
local now = ms_of(t)
local place = ARGV[7]
if place == nil or place == '' then
  place = ARGV[1]
end
local held = string_at(KEYS[1])
local queuing = ARGV[6] == '1'
-- Behind other waiters, we are served in turn: the holder's lease end (for a holder that crashes) matters only to
-- the first of them (a refresh that finds the lock free serves the queue: see KEEP_WAITING).
local wait_ms = blocked_for(
  KEYS[1], held, KEYS[2], ARGV[3], KEYS[3], KEYS[4], ARGV[1], place, t, now, nobody_queued, queuing
)
if wait_ms then
  local arrival = 0
  if queuing and enqueue(KEYS[3], KEYS[4], place, now) then
    arrival = now
  end
  if arrival > 0 or nobody_queued then
    announce(ARGV[5], ARGV[4], 'wanted')
  end
  return {0, wait_ms, arrival}
end
local token, corrupt = mint(KEYS[2], ARGV[3], t)
if not token then
  if ours(string_at(KEYS[1]), ARGV[1]) then
    redis.call('DEL', KEYS[1])  -- an earlier attempt of ours left it (see below): we are not taking it now
  end
  return {-1, corrupt}
end
if ARGV[2] == '0' then
  redis.call('SET', KEYS[1], ARGV[1])
else
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
leave(KEYS[3], KEYS[4], place)
local box = KEYS[1] .. ':grant:' .. ARGV[1]
if ours(held, ARGV[1]) then
  redis.call('DEL', box)  -- a grant to us not yet read: superseded
end
local contended = redis.call('ZCARD', KEYS[3]) > 0
if ARGV[8] ~= nil and ARGV[8] ~= '' then
  push_grant(box, ARGV[8] .. ':0:' .. string.format('%.0f', token) .. ':' .. (contended and 1 or 0), PLACE_KEEP_MS)
end
if contended then
  return {1, token, 1}
end
return token
"""
)

ACQUIRE_MANY = (
    """
-- ACQUIRE_MANY: take several plain locks at once, all or nothing (callers make sure all KEYS share a slot).
-- KEYS     four per lock i (i = 1..n): lock key, fencing counter, queue, queue expiries (as for ACQUIRE)
-- ARGV[1]  owner (client_id)     ARGV[2]  lease in ms ("0": no expiry)     ARGV[3]  counter TTL in ms
-- ARGV[4]  "1": queue if refused ARGV[5]  "publish" | "spublish" | "" (how to announce)
-- ARGV[5+i]  lock i's channel
-- returns  {1, token_1, queued_1, ..., token_n, queued_n}   all taken (as ACQUIRE would return for each)
--          {0, wait_ms, i}       lock i is not ours to take (the first such): nothing was taken; we announce
--                                "wanted" on its channel, and with ARGV[4] = "1" we are queued for it (for
--                                PLACE_KEEP_MS, as ACQUIRE queues), under a place named "<owner>": woken when it
--                                is free, never granted it alone (we must not hold one lock while waiting for another)
--          {-1, counter, i}      lock i's fencing counter is at or above MAX_TOKEN (see mint): nothing was
--                                taken (the counters of the locks before it have moved on, which only uses up
--                                tokens)
"""
    + _QUEUE_LIB
    + """
local n = #KEYS / 4
local now, t = now_ms()
for i = 1, n do
  local lock, fence, queue, expiries = KEYS[4 * i - 3], KEYS[4 * i - 2], KEYS[4 * i - 1], KEYS[4 * i]
  local wait_ms = blocked_for(
    lock, string_at(lock), fence, ARGV[3], queue, expiries, ARGV[1], ARGV[1], t, now, true, ARGV[4] == '1'
  )
  if wait_ms then
    if ARGV[4] == '1' then
      enqueue(queue, expiries, ARGV[1], now)
    end
    announce(ARGV[5], ARGV[5 + i], 'wanted')
    return {0, wait_ms, i}
  end
end
-- Every token first, so that a counter at or above MAX_TOKEN is found before anything is taken.
local tokens = {}
for i = 1, n do
  local token, corrupt = mint(KEYS[4 * i - 2], ARGV[3], t)
  if not token then
    for j = 1, n do
      if ours(string_at(KEYS[4 * j - 3]), ARGV[1]) then
        redis.call('DEL', KEYS[4 * j - 3])  -- left by an earlier attempt of ours (see ACQUIRE): not taken now
      end
    end
    return {-1, corrupt, i}
  end
  tokens[i] = token
end
local result = {1}
for i = 1, n do
  local lock, queue, expiries = KEYS[4 * i - 3], KEYS[4 * i - 1], KEYS[4 * i]
  if ARGV[2] == '0' then
    redis.call('SET', lock, ARGV[1])
  else
    redis.call('SET', lock, ARGV[1], 'PX', ARGV[2])
  end
  result[#result + 1] = tokens[i]
  leave(queue, expiries, ARGV[1])
  result[#result + 1] = (redis.call('ZCARD', queue) > 0) and 1 or 0
end
return result
"""
)

RELEASE = (
    """
-- RELEASE: give the lock up if it is still ours: grant it to the head of its queue, or delete it.
-- KEYS[1]  lock key              KEYS[2]  queue (zset)          KEYS[3]  queue expiries (zset)
-- KEYS[4]  fencing counter key
-- ARGV[1]  owner (client_id)     ARGV[2]  wake-up channel
-- ARGV[3]  "publish" | "spublish" | "" (how to announce the release; "" = nobody listens)
-- ARGV[4]  counter TTL in ms (for the token of a grant)
-- ARGV[5]  (optional) the value the key holds while it is ours, if not ARGV[1]: "<owner>|<token>" for a tenancy
--          granted by a release (see grant)
-- ARGV[6]  (optional) a token: release only if the fencing counter still holds it, i.e. no tenancy of the key was
--          taken since ours (a lease given back after a renewal that came back too late: see ServerLease)
-- returns  1                     released: granted to the queue's live head if that is a single lock's wait (see
--                                the queue above), else deleted, the head woken ("released:<head owner>")
--          0                     not ours: the key is gone, another owner's or not a string (our lease had ended)
-- Nobody queues (no queue key): the key is deleted and nothing else is done. Every owner that waits for this lock
-- holds a place in its queue: a refused blocking ACQUIRE queues it in the same script, before it waits, and the
-- wait keeper keeps the place while it waits. Only a waiter whose place was lost (the queue key evicted or deleted,
-- or the place lapsed while its process stood still for PLACE_KEEP_MS) misses the release: it still comes back at
-- the holder's lease end it was told, or after WaitPolicy.notified_cap, and queues afresh.
-- (A key of another type makes GET fail: pcall returns an error table, which is not our owner id either.)
-- (A tenancy is only ever one of ARGV[1]'s: "<owner>|<token>".)
local tenancy = ARGV[5]
if tenancy == nil or string.sub(tenancy, 1, #ARGV[1] + 1) ~= ARGV[1] .. '|' then
  tenancy = ARGV[1]
end
if redis.pcall('GET', KEYS[1]) ~= tenancy then
  return 0
end
if ARGV[6] ~= nil and ARGV[6] ~= '' and redis.pcall('GET', KEYS[4]) ~= ARGV[6] then
  return 0
end
local firsts = redis.pcall('ZRANGE', KEYS[2], 0, 1, 'WITHSCORES')
if firsts['err'] or not firsts[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
"""
    + _ANNOUNCE_LIB
    + _KEYS_LIB
    + _FENCE_LIB
    + _QUEUE_FUNCS
    + """
local now, t = now_ms()
if not serve(KEYS[1], KEYS[4], ARGV[4], KEYS[2], KEYS[3], ARGV[3], ARGV[2], t, now, firsts) then
  redis.call('DEL', KEYS[1])
end
return 1
"""
)

CANCEL_WAIT = (
    """
-- CANCEL_WAIT: we stopped waiting for a lock (timed out, interrupted); leave its queue, and if the lock is free,
-- serve the new head so that our place does not hold anyone up. If our place had been granted the lock meanwhile
-- (the grant still unread, or read by a wait that was interrupted), give it back: serve the next head, or free it.
-- KEYS[1]  lock key              KEYS[2]  queue (zset)          KEYS[3]  queue expiries (zset)
-- KEYS[4]  fencing counter key
-- ARGV[1]  owner (client_id)     ARGV[2]  channel               ARGV[3]  "publish" | "spublish" | ""
-- ARGV[4]  counter TTL in ms     ARGV[5]  our place's name ("" for "<owner>")
-- returns  1 if we were queued; 2 if the lock had been granted to us and is given back now; else 0
"""
    + _QUEUE_LIB
    + """
local now, t = now_ms()
local place = ARGV[5]
if place == nil or place == '' then
  place = ARGV[1]
end
if on_kind('ZREM', KEYS[2], place) == 1 then
  redis.pcall('ZREM', KEYS[3], place)
  if not string_at(KEYS[1]) then
    serve(KEYS[1], KEYS[4], ARGV[4], KEYS[2], KEYS[3], ARGV[3], ARGV[2], t, now)
  end
  return 1
end
if place ~= ARGV[1] and ours(string_at(KEYS[1]), ARGV[1]) then
  -- Our wait's place is gone and the lock holds our owner id: the caller holds the only local lock object of this
  -- key in its registry and it is waiting, not holding, so this can only be a grant to us.
  redis.call('DEL', KEYS[1] .. ':grant:' .. ARGV[1])
  if not serve(KEYS[1], KEYS[4], ARGV[4], KEYS[2], KEYS[3], ARGV[3], ARGV[2], t, now) then
    redis.call('DEL', KEYS[1])
  end
  return 2
end
return 0
"""
)

KEEP_WAITING = (
    """
-- KEEP_WAITING: we still wait; keep each of our places for PLACE_KEEP_MS more (see LockBackend.keep_waiting), and
-- serve a plain lock found free (its holder's lease ran out, or its key was deleted): its live head is granted it or
-- woken, so that waiters told of no lease end do not wait for a release that will not come.
-- KEYS     four per place i (i = 1..n, all in one slot): the queue and its expiries of a plain lock (zsets:
--          place -> arrival, place -> refreshed lapse, in server ms), its lock key and fencing counter; or four times
--          the waiting writers of a read-write lock (a zset: owner -> lapse; nothing to serve there)
-- ARGV[1]  owner (client_id)     ARGV[2]  counter TTL in ms     ARGV[3]  "publish" | "spublish" | ""
-- ARGV[3+2i-1]  place i's name ("" for "<owner>")               ARGV[3+2i]  lock i's channel
-- returns  {r1, ..., rn}         ri = 1 kept; 0 not ours any more (we left, it lapsed, or we took or were granted
--                                the lock), and not brought back: our next attempt queues afresh
"""
    + _QUEUE_LIB
    + """
local now, t = now_ms()
local result = {}
for i = 1, #KEYS / 4 do
  local queue, expiries, lock, fence = KEYS[4 * i - 3], KEYS[4 * i - 2], KEYS[4 * i - 1], KEYS[4 * i]
  local place = ARGV[2 + 2 * i]
  if place == nil or place == '' then
    place = ARGV[1]
  end
  result[i] = 0
  if queue == expiries then
    -- A waiting writer: the set holds its lapse.
    local lapse = tonumber(on_kind('ZSCORE', queue, place))
    if lapse and lapse > now then
      redis.call('ZADD', queue, now + PLACE_KEEP_MS, place)
      redis.call('PEXPIRE', queue, PLACE_KEEP_MS)
      result[i] = 1
    end
  else
    local arrival = tonumber(on_kind('ZSCORE', queue, place))
    if arrival and lapse_of(expiries, place, arrival, now) > now then
      on_kind('ZADD', expiries, now + PLACE_KEEP_MS, place)
      -- Refreshes lapsed by now belong to places granted, left or lapsed: drop them.
      redis.call('ZREMRANGEBYSCORE', expiries, '-inf', now)
      keep_places(queue, expiries)
      result[i] = 1
      if not string_at(lock) then
        serve(lock, fence, ARGV[2], queue, expiries, ARGV[3], ARGV[3 + 2 * i], t, now)
      end
    end
  end
end
return result
"""
)

EXTEND_GRANT = """
-- EXTEND_GRANT: pipelined right after a waiter's pop of its grant box, in the same round trip: a lock granted to this
-- owner by a release holds a provisional lease (see grant); extend it to the owner's own lease, so that a granted
-- holder has the lease expire_after promises as its acquire returns, with no round trip of its own. Runs whether
-- or not the pop found a grant: on a key that holds no grant to this owner it does nothing.
-- KEYS[1]  lock key              ARGV[1]  owner (client_id)     ARGV[2]  lease in ms
-- returns  the value extended ("<owner>|<token>": the caller checks it is the grant it popped), or false
local value = redis.pcall('GET', KEYS[1])
if type(value) == 'string' and string.sub(value, 1, #ARGV[1] + 1) == ARGV[1] .. '|' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return value
end
return false
"""

RENEW = """
-- RENEW: reset the lease of every given hold that is still ours, and keep alive what must outlive them.
-- KEYS[1..n]  lock keys (one cluster slot per call): a plain lock or a write hold (a string whose value is the
--             owner), or the readers of a read-write lock (a sorted set: owner -> expiry in server ms)
-- KEYS[n+1..] keys to keep (the configs of the semaphores whose permits are among KEYS[1..n]): each one that exists
--             is given ARGV[4] ms to live if it has less (never cut short; none is created)
-- ARGV[1]     owner (client_id)   ARGV[2]  new lease in ms
-- ARGV[3]     n (absent: every key is a lock key)                       ARGV[4]  the kept keys' TTL in ms
-- ARGV[5..4+n] (optional) the value each lock key holds while it is ours, "" for ARGV[1]: a lock granted by a
--             release holds "<owner>|<token>" (see grant), a permit slot its tenancy ("<owner>|<wait id>", see
--             ACQUIRE_PERMIT); only that tenancy is renewed, not a later grant of the key to the same owner
-- returns     {r1, ..., rn}       ri = 1 renewed, 0 lost (gone, expired or another owner's or tenancy's)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
local n = tonumber(ARGV[3]) or #KEYS
local result = {}
for i = 1, n do
  local key = KEYS[i]
  result[i] = 0
  local kind = redis.call('TYPE', key)['ok']
  if kind == 'string' then
    local ours = ARGV[4 + i]
    if not ours or string.sub(ours, 1, #ARGV[1] + 1) ~= ARGV[1] .. '|' then  -- (a tenancy is only ever ARGV[1]'s)
      ours = ARGV[1]
    end
    if redis.call('GET', key) == ours then
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
if n < #KEYS then
  local keep = tonumber(ARGV[4])
  for i = n + 1, #KEYS do
    if redis.call('PTTL', KEYS[i]) < keep then  -- (-1, no expiry, gets one, as ACQUIRE_PERMIT gives it; -2: gone)
      redis.call('PEXPIRE', KEYS[i], keep)
    end
  end
end
return result
"""

# The read-write lock. Reader holds live in a sorted set scored by their own expiry (server ms), so a crashed
# reader's hold ends with its own lease, not with a TTL the other readers keep extending. Writers that wait are
# recorded in another sorted set; while it holds anyone, new readers wait behind them (writer preference).
_RW_PRELUDE = (
    _KEYS_LIB
    + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', zset_at(KEYS[2]), '-inf', now)
redis.call('ZREMRANGEBYSCORE', zset_at(KEYS[3]), '-inf', now)
"""
)

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
local writer = string_at(KEYS[1])
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
-- ARGV[4]  channel               ARGV[5]  "publish" | "spublish" | ""      ARGV[6]  "1": wait if refused
-- returns  {1, token}            acquired, with a new fencing token
--          {0, wait_ms}          blocked by a writer or by readers (our own included: no upgrade). With
--                                ARGV[6] = "1" we are recorded as a waiting writer for PLACE_KEEP_MS (renewed
--                                by each attempt and by KEEP_WAITING while we wait), which holds back new
--                                readers, and announce it on the channel
--          {-1, counter}         the fencing counter is at or above MAX_TOKEN (see mint): nothing taken (a wish
--                                to write we left stays: the caller cancels it)
"""
    + _ANNOUNCE_LIB
    + _RW_PRELUDE
    + _FENCE_LIB
    + """
local writer = string_at(KEYS[1])
local wait_ms = nil
if writer and writer ~= ARGV[1] then
  wait_ms = redis.call('PTTL', KEYS[1])
elseif redis.call('ZCARD', KEYS[2]) > 0 then
  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  wait_ms = tonumber(first[2]) - now
end
if wait_ms then
  if ARGV[6] == '1' then
    redis.call('ZADD', KEYS[3], now + PLACE_KEEP_MS, ARGV[1])
    keep_places(KEYS[3], KEYS[3])
    announce(ARGV[5], ARGV[4], 'wanted')
  end
  return {0, wait_ms}
end
local token, corrupt = mint(KEYS[4], ARGV[3], t)
if not token then
  return {-1, corrupt}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[1])
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
    + _ANNOUNCE_LIB
    + _RW_PRELUDE
    + """
if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then
  return 0
end
if redis.call('ZCARD', KEYS[2]) == 0 then
  announce(ARGV[3], ARGV[2], 'released')
end
return 1
"""
)

RELEASE_WRITE = (
    """
-- RELEASE_WRITE: give back our write hold; wake readers and writers alike.
-- KEYS[1]  writer key
-- ARGV[1]  owner (client_id)     ARGV[2]  channel              ARGV[3]  "publish" | "spublish" | ""
-- returns  1                     released
--          0                     not ours any more: the lease was lost
"""
    + _ANNOUNCE_LIB
    + _KEYS_LIB
    + """
if string_at(KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
announce(ARGV[3], ARGV[2], 'released')
return 1
"""
)

CANCEL_WRITE_WAIT = (
    """
-- CANCEL_WRITE_WAIT: a writer gave up waiting; stop holding back readers on its behalf.
-- KEYS[1]  waiting writers (zset)
-- ARGV[1]  owner (client_id)     ARGV[2]  channel              ARGV[3]  "publish" | "spublish" | ""
-- returns  1 if we were waiting, else 0
"""
    + _ANNOUNCE_LIB
    + _KEYS_LIB
    + """
if redis.call('ZREM', zset_at(KEYS[1]), ARGV[1]) == 0 then
  return 0
end
announce(ARGV[3], ARGV[2], 'released')
return 1
"""
)

READ_HELD = (
    """
-- READ_HELD: whether any owner holds a live read hold (a query: it changes nothing).
-- KEYS[1]  readers (zset)
-- returns  1 if some read hold has not expired, else 0 (a missing key, or one of another type, holds none)
"""
    + """
if redis.call('TYPE', KEYS[1])['ok'] ~= 'zset' then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if #redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'LIMIT', 0, 1) > 0 then
  return 1
end
return 0
"""
)

FENCED_SET = (
    """
-- FENCED_SET: write a value only if the writer's fencing token is not older than any seen for the resource.
-- KEYS[1]  the data key          KEYS[2]  the resource's high-water-mark key (same slot)
-- ARGV[1]  the writer's token (a whole number from 0 to MAX_TOKEN: the caller checks)
-- ARGV[2]  the value             ARGV[3]  TTL of both keys in ms ("0": none)
-- returns  1                     written; the high-water mark is now ARGV[1]
--          0                     rejected: a newer token has written before (a stale holder)
--          {-1, mark}            the high-water mark is not a whole number from 0 to MAX_TOKEN (mark: its value,
--                                or "(a <type>)" for a key of another type): it cannot be compared exactly, so
--                                nothing is written
"""
    + _MAX_TOKEN_LIB
    + """
local stored = redis.pcall('GET', KEYS[2])
if type(stored) == 'table' then
  return {-1, '(a ' .. redis.call('TYPE', KEYS[2])['ok'] .. ')'}
end
local highest = tonumber(stored or '0')
if not highest or highest ~= highest or highest > MAX_TOKEN then
  return {-1, stored}
end
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
)

PING = """
-- PING: what a lock's first script needs of the server, without touching any lock (LockRegistry.ping): scripting
-- (EVALSHA, EVAL on NOSCRIPT), the server clock (TIME), and SET with PX and GET, as every token's mint uses it
-- (Redis 6.2+, Valkey), as the registry's user (its ACL), on a master (a replica refuses the write).
-- KEYS[1]  a probe key of the registry's namespace (``<registry_key>:ping``; no lock key is one: they all hold a
--          "{"), which it leaves gone
-- returns  1
redis.call('TIME')
redis.call('SET', KEYS[1], '1', 'PX', 1000, 'GET')
redis.call('DEL', KEYS[1])
return 1
"""

RAISE_FENCE = (
    """
-- RAISE_FENCE: raise a lock's fencing counter to a token minted elsewhere (the write-back of a quorum acquire,
-- see hybridlock._core.quorum); never lowers it.
-- KEYS[1]  fencing counter key
-- ARGV[1]  the token (at most MAX_TOKEN)                    ARGV[2]  counter TTL in ms
-- returns  1                     the counter is now at least ARGV[1]
--          {-1, counter}         the counter is at or above MAX_TOKEN (mint refuses it too): left
--                                alone; this server will mint no token for the key until someone repairs it
"""
    + _KEYS_LIB
    + _MAX_TOKEN_LIB
    + """
local value = string_at(KEYS[1])
local stored = tonumber(value or '0') or 0
if stored >= MAX_TOKEN then
  return {-1, value}
end
local token = tonumber(ARGV[1])
if stored < token then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[2])  -- every counter keeps the same TTL from its last use
end
return 1
"""
)

KEEP_FOR = """
-- KEEP_FOR: end our hold of a plain lock but keep its key taken for a while (run_once's at_least_for): compare-and-set
-- on our owner id, then the key holds the marker instead of our id (so that our own next ACQUIRE, which takes over
-- a key holding our id, is refused like anyone's) and expires in ARGV[3] ms, sooner or later than our lease would
-- have. Nobody is granted or woken: the key ends by its expiry, which waiters are told of and KEEP_WAITING serves.
-- KEYS[1]  lock key
-- ARGV[1]  owner (client_id)     ARGV[2]  marker (the value kept: "<owner>:ran")     ARGV[3]  ms to keep it (> 0)
-- ARGV[4]  (optional) the value the key holds while it is ours, if not ARGV[1] (see RELEASE)
-- returns  1                     kept: the key holds the marker and expires in ARGV[3] ms
--          0                     not ours: the key is gone, another owner's or not a string (our lease had ended)
-- (A key of another type makes GET fail: pcall returns an error table, which is not our owner id either.)
local tenancy = ARGV[4]
if tenancy == nil or string.sub(tenancy, 1, #ARGV[1] + 1) ~= ARGV[1] .. '|' then
  tenancy = ARGV[1]
end
if redis.pcall('GET', KEYS[1]) ~= tenancy then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
"""


# Semaphores (``registry.obtain_semaphore``; names in ``hybridlock._core.names``). Each permit is a slot key
# ``<prefix><i>`` holding its holder's client_id with the holder's lease as TTL, exactly as a plain lock key: the
# renewer renews it with RENEW like any other, a holder that dies lets it expire, and an operator's DEL (or an
# eviction) of it is found lost at the next renewal. The hash ``config`` keeps the limit and the span (the slots to
# look at), for the counter's TTL after each attempt or SET_PERMITS, and RENEW gives it as long again with each
# renewal of a permit (it is among RENEW's kept keys): a limit lasts while permits are held under it. The slot keys
# are the one exception, with the grant box, to "every key in KEYS": which slots exist is known only to the script;
# they share the config's hash tag, so they live in its cluster slot. An acquire looks at every slot of the span: its
# cost grows with the number of permits (at most ``MAX_PERMITS``).
#
# A cluster slot being migrated splits these keys between two masters, and a script on either one would read the
# permit slots left on the other as free: two holders of one permit (the new master, asked with ASKING, answers a
# single-key read of a key it does not have yet as "none"). So every semaphore script that reads or writes permit
# slots begins with ``_MIGRATION_PROBE``: a two-key EXISTS of keys of the slot that never exist. On a stable slot it
# answers 0; on a slot being migrated each master stops the script there, before it has read or written anything
# (the old one with "Script attempted to access a non local key", the new one because a command of several keys is
# not served there while some are missing), and the client runs it again until the slot has moved
# (backends/cluster.py). Renewals need no probe: they touch only keys they declare, which the server checks first.
_MIGRATION_PROBE = """
redis.call('EXISTS', KEYS[1] .. ':migrating:1', KEYS[1] .. ':migrating:2')
"""
_SEMAPHORE_LIB = f"""
local MAX_PERMITS = {MAX_PERMITS}
-- The limit and span in the config hash, or the caller's ``permits`` when none is stored (a new semaphore, or a
-- config evicted or deleted: whoever asks next sets it again). A config of another type, or a limit that is not a
-- whole number from 1 to MAX_PERMITS, is not state we wrote: replaced.
local function limits(config, permits, ttl)
  local kind = redis.call('TYPE', config)['ok']
  if kind ~= 'hash' and kind ~= 'none' then
    redis.call('DEL', config)
  end
  local limit = tonumber(redis.call('HGET', config, 'limit'))
  if not limit or limit < 1 or limit > MAX_PERMITS or limit ~= math.floor(limit) then
    limit = tonumber(permits)
    redis.call('HSET', config, 'limit', limit)
  end
  local span = tonumber(redis.call('HGET', config, 'span'))
  if not span or span < limit or span > MAX_PERMITS or span ~= math.floor(span) then
    span = limit
    redis.call('HSET', config, 'span', span)
  end
  redis.call('PEXPIRE', config, ttl)
  return limit, span
end
-- Hold permit ``slot`` for the acquire tagged ``tag`` ("<owner>|<wait id>": the tenancy, which the release, the
-- hand-over and a retried request compare, and whose owner part RENEW compares), for ``lease`` ms ("0": no expiry).
local function hold_slot(slot, tag, lease)
  if lease == '0' then
    redis.call('SET', slot, tag)
  else
    redis.call('SET', slot, tag, 'PX', lease)
  end
end
"""

# What the acquire and the hand-over both do (after _KEYS_LIB, for string_at): look at every permit slot, and drop
# the lapsed places of the queue.
_PERMIT_SLOTS_LIB = """
-- Look at every slot of the span (``prefix`` .. 0 to span - 1); a slot key that is not a string is not state we
-- wrote: dropped, as if evicted. Returns how many are held, the first free one below ``limit`` and not in ``skip``,
-- the soonest end of a held lease in ms (-1: none known), the last held one (-1: none), and the first held under
-- ``tag`` and not in ``skip`` (nil without a tag; see ACQUIRE_PERMIT on retried requests).
local function scan_slots(prefix, span, limit, skip, tag)
  local held, free, soonest, last, ours = 0, nil, -1, -1, nil
  for i = 0, span - 1 do
    local slot = prefix .. i
    local ttl = redis.call('PTTL', slot)
    local holder = nil
    if ttl ~= -2 then
      holder = string_at(slot)
      if not holder then
        redis.call('DEL', slot)
        ttl = -2
      end
    end
    if ttl == -2 then
      if not free and i < limit and not skip[tostring(i)] then
        free = i
      end
    else
      held = held + 1
      last = i
      if ttl >= 0 and (soonest < 0 or ttl < soonest) then
        soonest = ttl
      end
      if tag and holder == tag and not ours and not skip[tostring(i)] then
        ours = i
      end
    end
  end
  return held, free, soonest, last, ours
end
-- Lapsed places leave the queue. Places are written to both sets at once, so a queue whose expiries are gone
-- (evicted, deleted) holds places nobody can tell alive: it is dropped, and its waiters queue again at their next
-- attempt.
local function prune_queue(queue, expiries, now)
  if redis.call('EXISTS', expiries) == 0 then
    redis.call('DEL', queue)
  else
    for _, gone in ipairs(redis.call('ZRANGEBYSCORE', expiries, '-inf', now)) do
      redis.call('ZREM', queue, gone)
      redis.call('ZREM', expiries, gone)
    end
  end
end
"""

ACQUIRE_PERMIT = (
    """
-- ACQUIRE_PERMIT: take a free permit slot if fewer than the limit are held and no earlier waiter is owed it,
-- minting a fencing token; else, if asked, take (or keep) a place in the semaphore's queue.
-- KEYS[1]  the semaphore's config (hash: limit, span)      KEYS[2]  fencing counter key
-- KEYS[3]  queue (zset: place -> arrival, server ms)       KEYS[4]  queue expiries (zset: place -> lapse)
-- ARGV[1]  owner (client_id)     ARGV[2]  lease in ms ("0": no expiry)     ARGV[3]  counter TTL in ms (the config
--          lives as long)        ARGV[4]  the limit to store if none is    ARGV[5]  the slot keys' prefix
-- ARGV[6]  our place in the queue ("<owner>|<wait id>"), or "" not to queue (a non-blocking attempt)
-- ARGV[7]  this acquire's tag ("<owner>|<wait id>"): the value of the slot it is granted (the tenancy: the release
--          compares it, and an acquire cut off in flight gives back what it was granted under it,
--          GIVE_BACK_ATTEMPT); an acquire whose tag was given up already (``<prefix>cancelled:<tag>`` exists) takes
--          nothing
-- ARGV[8..] slots not to take: those this owner still has a holder for (a permit whose lease ran out but whose
--          holder has not released it yet must not be taken again under the same client_id)
-- returns  {1, slot, token}      acquired slot ``slot`` (our place, if any, is left); also a slot of ours this
--                                acquire was granted already, under its tag (see below), with a new token
--          {0, wait_ms}          refused: the limit is reached, or the free permits are owed to the waiters queued
--                                before us (wait_ms = the soonest end of a held permit's lease; -1 = none known).
--                                With a place, we are queued (at the back if new), for PLACE_KEEP_MS from now
--          {-1, counter}         the fencing counter is at or above MAX_TOKEN: nothing taken
--          {0, -2}               this acquire was given up (GIVE_BACK_ATTEMPT ran first): nothing taken
-- Fairness: with R permits free, only the first R live places of the queue may take one; an attempt without a
-- place counts as behind them all. A place lapses PLACE_KEEP_MS after the attempt that took or kept it (a waiter
-- attempts again well within that), so a waiter that died or gave up holds nobody up for long.
-- A slot key that is not a string is not state we wrote: dropped, as if evicted. Slots at or past the limit (a
-- limit lowered while they were held) are not given out again; they count until released or expired, and the span
-- shrinks back to the limit once none is held.
-- A slot that holds this acquire's tag (not one to skip) was granted to this acquire by a run
-- whose reply was lost (the client retries a request whose connection dropped): that slot is returned again, with
-- a new token and its lease started again, rather than a second one taken and the first left held by nobody. A tag
-- names one acquire, and an acquire granted a slot it learns of attempts no more.
"""
    + _KEYS_LIB
    + _FENCE_LIB
    + _SEMAPHORE_LIB
    + _PERMIT_SLOTS_LIB
    + _MIGRATION_PROBE
    + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('EXISTS', ARGV[5] .. 'cancelled:' .. ARGV[7]) == 1 then
  return {0, -2}
end
local limit, span = limits(KEYS[1], ARGV[4], ARGV[3])
local skip = {}
for i = 8, #ARGV do
  skip[ARGV[i]] = true
end
local held, free, soonest, last, granted = scan_slots(ARGV[5], span, limit, skip, ARGV[7])
if span > limit and last < span - 1 then
  redis.call('HSET', KEYS[1], 'span', math.max(limit, last + 1))
end
local queue, expiries, place = zset_at(KEYS[3]), zset_at(KEYS[4]), ARGV[6]
prune_queue(queue, expiries, now)
local rank = place ~= '' and redis.call('ZRANK', queue, place) or nil
if not rank then
  rank = redis.call('ZCARD', queue)
end
if granted then
  free = granted
elseif held >= limit or not free or rank >= limit - held then
  if place ~= '' then
    redis.call('ZADD', queue, 'NX', now, place)
    redis.call('ZADD', expiries, now + PLACE_KEEP_MS, place)
    keep_places(queue, expiries)
  end
  return {0, soonest}
end
local token, counter = mint(KEYS[2], ARGV[3], t)
if not token then
  if granted then  -- (the caller holds nothing: the slot granted before is given back)
    redis.call('DEL', ARGV[5] .. granted)
  end
  return {-1, counter}
end
if place ~= '' then
  redis.call('ZREM', queue, place)
  redis.call('ZREM', expiries, place)
end
hold_slot(ARGV[5] .. free, ARGV[7], ARGV[2])
return {1, free, string.format('%.0f', token)}
"""
)

LEAVE_PERMIT_QUEUE = (
    """
-- LEAVE_PERMIT_QUEUE: a waiter gives up its place in a semaphore's queue; the waiters behind it may now be owed a
-- free permit, so they are woken.
-- KEYS[1]  queue (zset)          KEYS[2]  queue expiries (zset)
-- ARGV[1]  the place             ARGV[2]  the semaphore's channel          ARGV[3]  "publish" | "spublish" | ""
-- returns  1 left; 0 the place was not there
"""
    + _ANNOUNCE_LIB
    + """
local left = redis.pcall('ZREM', KEYS[1], ARGV[1])
redis.pcall('ZREM', KEYS[2], ARGV[1])
if left == 1 then
  announce(ARGV[3], ARGV[2], 'released')
  return 1
end
return 0
"""
)

RELEASE_PERMIT = (
    """
-- RELEASE_PERMIT: give back a permit slot if it still holds our tenancy, and wake the waiters owed a free permit: with
-- R permits free, the owners of the first R live places of the semaphore's queue ("released:<owner>", once each), or
-- everyone ("released") when the queue has fewer live places than that, or its state cannot be read. A waiter woken in
-- vain (it gave up meanwhile) costs those behind it at most their refresh period: each waiter attempts again at least
-- that often.
-- KEYS[1]  the permit's slot key KEYS[2]  queue (zset)     KEYS[3]  queue expiries (zset)
-- KEYS[4]  the semaphore's config (hash: limit, span)
-- ARGV[1]  the permit's tag (the tenancy: "<owner>|<wait id>")              ARGV[2]  the semaphore's channel
-- ARGV[3]  "publish" | "spublish" | ""                                     ARGV[4]  the slot keys' prefix
-- returns  1 released; 0 the slot was gone or another tenancy's (the permit's lease had ended: lost). Another
--          tenancy of the same owner (a permit granted again to another task of ours after this one's lease ended)
--          is not released: it is that task's.
"""
    + _ANNOUNCE_LIB
    + _KEYS_LIB
    + _MIGRATION_PROBE
    + """
if string_at(KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
local limit = tonumber(redis.pcall('HGET', KEYS[4], 'limit'))
local span = tonumber(redis.pcall('HGET', KEYS[4], 'span'))
local places = redis.pcall('ZRANGE', KEYS[2], 0, -1)
if not limit or not span or span > 4096 or type(places) ~= 'table' or places['err'] then
  announce(ARGV[3], ARGV[2], 'released')
  return 1
end
local room = limit
for i = 0, span - 1 do
  if redis.call('EXISTS', ARGV[4] .. i) == 1 then
    room = room - 1
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local woken = {}
for _, place in ipairs(places) do
  if room <= 0 then
    return 1
  end
  local lapse = tonumber(redis.pcall('ZSCORE', KEYS[3], place))
  if lapse and lapse > now then
    local waiter = string.match(place, '^([^|]+)|')
    if not waiter then
      break
    end
    if not woken[waiter] then
      woken[waiter] = true
      announce(ARGV[3], ARGV[2], 'released:' .. waiter)
    end
    room = room - 1
  end
end
if room > 0 then
  announce(ARGV[3], ARGV[2], 'released')
end
return 1
"""
)

GIVE_BACK_ATTEMPT = (
    """
-- GIVE_BACK_ATTEMPT: an acquire was cut off while its attempt was in flight (cancelled; KeyboardInterrupt): give back
-- the permit granted to its tag, if any, waking the waiters; else mark the tag given up, so that the attempt, should
-- it reach the server later, takes nothing.
-- KEYS[1]  the semaphore's config (hash: limit, span)
-- ARGV[1]  owner (client_id; unused: the tag begins with it)               ARGV[2]  the slot keys' prefix
-- ARGV[3]  the acquire's tag
-- ARGV[4]  how long the mark lives, in ms (the lease: no attempt waits in flight longer than that)
-- ARGV[5]  the semaphore's channel                                         ARGV[6]  "publish" | "spublish" | ""
-- returns  1 a permit was given back; 0 none was granted to the tag (it is marked given up)
"""
    + _ANNOUNCE_LIB
    + _KEYS_LIB
    + _MIGRATION_PROBE
    + """
-- (A config gone, evicted or deleted, says no span: every slot there can be is looked at, or the permit granted to
-- the tag would be left held by nobody until its lease ends. Found by tests/test_semaphore_model.py.)
local span = tonumber(redis.pcall('HGET', KEYS[1], 'span')) or """
    + str(MAX_PERMITS)
    + """
for i = 0, math.min(span, """
    + str(MAX_PERMITS)
    + """) - 1 do
  local slot = ARGV[2] .. i
  if string_at(slot) == ARGV[3] then
    redis.call('DEL', slot)
    announce(ARGV[6], ARGV[5], 'released')
    return 1
  end
end
redis.call('SET', ARGV[2] .. 'cancelled:' .. ARGV[3], '1', 'PX', ARGV[4])
return 0
"""
)

SET_PERMITS = (
    """
-- SET_PERMITS: change a semaphore's limit. Raising it wakes the waiters; lowering it revokes nothing: permits held
-- past the new limit stay valid (and renewable) until released, and no new one is given out until fewer than the
-- new limit are held.
-- KEYS[1]  the semaphore's config (hash: limit, span)
-- ARGV[1]  the new limit         ARGV[2]  the config's TTL in ms           ARGV[3]  the channel
-- ARGV[4]  "publish" | "spublish" | ""
-- returns  the limit it replaced (0: none was stored)
"""
    + _ANNOUNCE_LIB
    + _SEMAPHORE_LIB
    + """
local kind = redis.call('TYPE', KEYS[1])['ok']
local old = 0
if kind == 'hash' then
  old = tonumber(redis.call('HGET', KEYS[1], 'limit')) or 0
end
local limit, span = limits(KEYS[1], ARGV[1], ARGV[2])
local new = tonumber(ARGV[1])
redis.call('HSET', KEYS[1], 'limit', new)
redis.call('HSET', KEYS[1], 'span', math.max(span, limit, new))
announce(ARGV[4], ARGV[3], 'released')
return old
"""
)

TRANSFER_PERMIT = (
    """
-- TRANSFER_PERMIT: give back a permit slot if it still holds our tenancy (as RELEASE_PERMIT) and, in the same step,
-- attempt
-- for the tasks of ours that wait for this semaphore, by ACQUIRE_PERMIT's own rule for each one's place and tag: with
-- R permits free, a waiter takes one only if its place is among the first R live places of the queue (a place not
-- in the queue counts as behind them all), never a slot in the skip list, never for a tag given up
-- (GIVE_BACK_ATTEMPT). The first waiter (in the order given) the rule admits takes the permit; the others' places
-- are neither taken nor kept (their own attempts do that). The waiters owed a permit still free afterwards are woken
-- as RELEASE_PERMIT wakes them: a permit handed over wakes nobody.
-- KEYS[1]  the permit's slot key KEYS[2]  the semaphore's config (hash: limit, span)   KEYS[3]  fencing counter key
-- KEYS[4]  queue (zset)          KEYS[5]  queue expiries (zset)
-- ARGV[1]  the permit's tag (the tenancy)                                 ARGV[2]  the semaphore's channel
-- ARGV[3]  "publish" | "spublish" | ""                                     ARGV[4]  the slot keys' prefix
-- ARGV[5]  lease in ms ("0": no expiry)                                    ARGV[6]  counter TTL in ms
-- ARGV[7]  the limit to store if none is                                   ARGV[8]  how many waiters (k)
-- ARGV[9..8+2k]  each waiter's place and tag, in turn                      ARGV[9+2k..] slots not to take (as
--          ACQUIRE_PERMIT's ARGV[8..])
-- returns  {0}                   the slot was gone or another tenancy's (lost): nothing released, nothing taken
--          {1, -1}               released; the waiter was not admitted (or the counter is out of range: its own
--                                attempt will say so)
--          {1, slot, token, i}   released, and slot ``slot`` taken for the i-th waiter (from 0) under its tag
-- A request run again by the client after its reply was lost (see ACQUIRE_PERMIT) finds what its first run did: our
-- slot released, and a slot (that one, or another) under a waiter's tag. That outcome is returned again, the
-- slot with a new token and its lease started again, rather than the released permit reported lost, or the
-- waiter's new permit released. A tag names one acquire, and a waiter attempted for makes no attempt of its own: a
-- slot of ours under its tag was taken by this request.
"""
    + _ANNOUNCE_LIB
    + _KEYS_LIB
    + _FENCE_LIB
    + _SEMAPHORE_LIB
    + _PERMIT_SLOTS_LIB
    + _MIGRATION_PROBE
    + """
local k = tonumber(ARGV[8])
local skip, asked = {}, {}
for i = 9 + 2 * k, #ARGV do
  skip[ARGV[i]] = true
end
for j = 0, k - 1 do
  asked[ARGV[10 + 2 * j]] = j
end
local again, to = nil, nil
if string_at(KEYS[1]) ~= ARGV[1] then
  -- (A config gone, evicted or deleted, says no span: every slot there can be is looked at.)
  local span = tonumber(redis.pcall('HGET', KEYS[2], 'span')) or MAX_PERMITS
  for i = 0, math.min(span, MAX_PERMITS) - 1 do
    if not skip[tostring(i)] then
      to = asked[string_at(ARGV[4] .. i) or '']
      if to then
        again = i
        break
      end
    end
  end
  if not again then
    return {0}
  end
end
local t = redis.call('TIME')
if again then
  local slot = ARGV[4] .. again
  local token = mint(KEYS[3], ARGV[6], t)
  if not token then  -- (the waiter's own attempt will say so)
    redis.call('DEL', slot)
    return {1, -1}
  end
  hold_slot(slot, ARGV[10 + 2 * to], ARGV[5])
  return {1, again, string.format('%.0f', token), to}
end
redis.call('DEL', KEYS[1])
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit, span = limits(KEYS[2], ARGV[7], ARGV[6])
local held, free = scan_slots(ARGV[4], span, limit, skip)
local queue, expiries = zset_at(KEYS[4]), zset_at(KEYS[5])
prune_queue(queue, expiries, now)
local room = limit - held
local granted = nil
for j = 0, k - 1 do
  if not free or room <= 0 then
    break
  end
  local place, tag = ARGV[9 + 2 * j], ARGV[10 + 2 * j]
  local rank = redis.call('ZRANK', queue, place)
  if not rank then
    rank = redis.call('ZCARD', queue)
  end
  if rank < room and redis.call('EXISTS', ARGV[4] .. 'cancelled:' .. tag) == 0 then
    local token = mint(KEYS[3], ARGV[6], t)
    if token then
      redis.call('ZREM', queue, place)
      redis.call('ZREM', expiries, place)
      hold_slot(ARGV[4] .. free, tag, ARGV[5])
      granted = {1, free, string.format('%.0f', token), j}
      room = room - 1
    end
    break
  end
end
if room > 0 then
  local places = redis.call('ZRANGE', queue, 0, room - 1)
  local woken = {}
  for _, waiting in ipairs(places) do
    local waiter = string.match(waiting, '^([^|]+)|')
    if waiter and not woken[waiter] then
      woken[waiter] = true
      announce(ARGV[3], ARGV[2], 'released:' .. waiter)
    end
  end
  if room > #places then
    announce(ARGV[3], ARGV[2], 'released')
  end
end
return granted or {1, -1}
"""
)
