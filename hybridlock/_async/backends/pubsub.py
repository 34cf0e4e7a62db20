"""Release notifications over Redis pub/sub: one subscriber connection and one listener per backend, run by
``AsyncWorker`` (a task on the asyncio side, a thread on the sync side).

Waiters never read a socket. Each opens a watch (:class:`AsyncReleaseWatch`) on its lock's channel (reference
counted: forty waiters on one key share one subscription) and waits on a condition that the listener signals when
a release message arrives.

Failure modes
-------------
* SUBSCRIBE is refused (an ACL, a renamed command) or the connection breaks (``CLIENT KILL``, a restart, a
  network fault): the listener marks the subscription down (watch epoch ``None``), wakes every waiter so each
  retries at once and then falls back to jittered backoff bounded by the holder's lease, and re-subscribes with
  growing pauses. When the subscription is confirmed again the epoch has changed (every new connection, ours or
  one redis-py made behind our back, bumps it), so waiters retry their acquire once more before trusting
  notifications again: no release that happened meanwhile is missed.
* A published message is lost in transit: a waiter still wakes at the holder's lease end, or after
  ``WaitPolicy.notified_cap`` when the lease has no end.

Channels whose last watcher left are unsubscribed by the listener after ``_IDLE_UNSUBSCRIBE`` seconds (0.1), so
a key waited on again and again (two owners taking turns do so every few milliseconds) keeps its subscription and
does not churn SUBSCRIBE/UNSUBSCRIBE. Once no watch is open and the server has confirmed every UNSUBSCRIBE, the
listener closes its connection and ends: a program that waits for nothing has no listener and no subscriber
connection. The next watch starts both afresh.

Who sends what: a new watch sends its channel's SUBSCRIBE itself (at once, not at the listener's next turn), the
listener sends everything else. Decisions are made under the state guard and the commands sent after it (no
I/O under a guard), one at a time (``_sending``): a channel is only ever subscribed by a watch when it is not
already requested, and unsubscribed by the listener only when requested and idle, so two senders never race on
one channel; an UNSUBSCRIBE confirmed for a channel that is watched again is simply followed by a SUBSCRIBE.
"""

from __future__ import annotations

import contextlib
import logging
import types
from collections.abc import Callable
from functools import partial
from typing import Any

from redis.crc import key_slot

from .._compat import AsyncCondition, AsyncFifoMutex, AsyncWorker, cut_connection, monotonic, shielded
from .base import AsyncReleaseWatch

__all__ = ["Subscriber"]

logger = logging.getLogger("hybridlock.pubsub")

_IDLE_UNSUBSCRIBE = 0.1  # seconds a channel stays subscribed after its last watch closed
# The longest read: how soon the listener notices that channels fell idle (and aclose() that it must end).
_LISTEN_TIMEOUT = 0.1
_LISTEN_MIN = 0.005
_RECONNECT_INITIAL = 0.05
_RECONNECT_CAP = 2.0


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Subscriber:
    """Owns the pub/sub connection of one Redis backend (of one cluster node, with ``sharded``). Safe to share
    between the tasks of one loop (between threads, on the sync side).

    ``sharded``: listen with SSUBSCRIBE (Redis 7+ and Valkey sharded pub/sub, for a cluster node whose scripts
    announce with SPUBLISH) instead of SUBSCRIBE. The server then may end a subscription itself, when the channel's
    slot leaves the node (a migration, a failover): such a channel is given up here, its watches read as down (they
    back off and poll) and the next watch of it subscribes at the node that serves it now (``cluster``)."""

    def __init__(self, client: Any, sharded: bool = False) -> None:
        self._client = client
        self._sharded = sharded
        # The commands and the message kinds of the flavour of pub/sub in use.
        prefix = "s" if sharded else ""
        self._subscribe, self._unsubscribe = f"{prefix}subscribe", f"{prefix}unsubscribe"
        self._cond = AsyncCondition()  # guards the state below; notified whenever a watch may see a change
        self._refs: dict[str, int] = {}  # channel -> open watches
        self._released: dict[str, int] = {}  # channel -> releases announced to everyone (watches compare counts)
        # channel -> owner -> releases addressed to that owner, for owners with an open watch there only: anyone may
        # publish "released:<anything>", and names nobody here waits under must not grow our memory.
        self._addressed: dict[str, dict[str, int]] = {}
        self._owner_refs: dict[tuple[str, str], int] = {}  # (channel, owner) -> open watches
        self._wanted: dict[str, int] = {}  # channel -> "wanted" messages seen (another owner failed to acquire)
        self._idle_since: dict[str, float] = {}  # channel with no watch -> since when
        self._subscribed: set[str] = set()  # confirmed by the server
        self._requested: set[str] = set()  # SUBSCRIBE sent (or to be re-sent after reconnecting)
        self._unsubscribing: set[str] = set()  # UNSUBSCRIBE sent, not yet confirmed
        self._epoch = 0  # bumped whenever a connection is (re-)established
        self._up = False  # the connection works and has not failed since it was established
        self._failing = False  # the connection failed, and no new one has been made since
        self._pubsub: Any = None
        self._worker: AsyncWorker | None = None
        self._pause = _RECONNECT_INITIAL  # the listener's next pause after a failure
        # One (un)subscribe command on the wire at a time: the listener and new watches both send.
        self._sending = AsyncFifoMutex()
        self._stopped = False
        #: Times the connection was re-established after a failure (for tests and statistics).
        self.failures = 0
        #: Called (from the listener, without our guard) on every "wanted" for a watched channel.
        self.wanted_listeners: list[Callable[[], None]] = []

    # -- used by watches -------------------------------------------------------------------------------------------

    async def watch(self, channel: str, owner: str) -> _RedisWatch:
        with self._cond:
            self._refs[channel] = self._refs.get(channel, 0) + 1
            self._idle_since.pop(channel, None)
            self._released.setdefault(channel, 0)
            self._addressed.setdefault(channel, {}).setdefault(owner, 0)
            self._owner_refs[channel, owner] = self._owner_refs.get((channel, owner), 0) + 1
            self._wanted.setdefault(channel, 0)
            watch = _RedisWatch(self, channel, owner)
            self._start_locked()
            # While down, the listener subscribes every requested channel when it (re)connects.
            pubsub = self._pubsub if channel not in self._requested and self._up else None
            self._requested.add(channel)
        if pubsub is not None:
            try:
                # Shielded: a SUBSCRIBE cut in half would break the connection for every waiter.
                await shielded(partial(self._send, pubsub, self._subscribe, channel))
            except BaseException:
                watch.close()  # cancelled: the caller never gets the watch, so it cannot close it
                raise
        return watch

    def _unwatch(self, channel: str, owner: str) -> None:
        with self._cond:
            owner_left = self._owner_refs[channel, owner] - 1
            if owner_left:
                self._owner_refs[channel, owner] = owner_left
            else:
                del self._owner_refs[channel, owner]
                addressed = self._addressed.get(channel)
                if addressed is not None:
                    addressed.pop(owner, None)
            left = self._refs[channel] - 1
            if left:
                self._refs[channel] = left
            else:
                del self._refs[channel]
                self._idle_since[channel] = monotonic()

    def _channel_epoch(self, channel: str) -> int | None:
        # Called under the guard.
        return self._epoch if self._up and channel in self._subscribed else None

    # -- the connection ----------------------------------------------------------------------------------------------

    def _start_locked(self) -> None:
        # A listener that ended without retiring (its event loop was closed under it) is replaced too.
        if (self._worker is None or not self._worker.running) and not self._stopped:
            self._up = False
            self._worker = AsyncWorker(self._step, name="hybridlock-pubsub-listener")
            self._worker.start()

    async def _send(self, pubsub: Any, command: str, *channels: str) -> bool:
        """Send an (un)subscribe decided for ``pubsub``, if that is still the working connection: otherwise the
        listener's next (re)connection subscribes every requested channel anyway, and a PubSub we closed would
        quietly take a new connection from the pool. A failure marks the subscription down; the listener then
        notices on its next read and reconnects. Returns whether the command went out."""
        await self._sending.acquire()
        try:
            with self._cond:
                current = pubsub is self._pubsub and self._up
            if current:
                try:
                    await getattr(pubsub, command)(*channels)
                except Exception as exc:
                    with self._cond:
                        if pubsub is self._pubsub:
                            self._mark_down_locked(exc)
                    return False
            return current
        finally:
            self._sending.release()

    async def _close_pubsub(self, pubsub: Any) -> None:
        # After any send in progress on it (see _send), and never raising: it is being thrown away.
        await self._sending.acquire()
        try:
            with contextlib.suppress(Exception):
                await pubsub.aclose()
        finally:
            self._sending.release()

    def _mark_down_locked(self, exc: BaseException) -> None:
        if self._up:
            logger.info("hybridlock: pub/sub subscription lost (%s); waiters fall back to backoff", exc)
        self._up = False
        self._failing = True
        self._subscribed.clear()
        self._unsubscribing.clear()  # a new connection starts with none of them subscribed
        self._cond.notify_all()  # waiters retry now and back off until we are up again
        self._deaf_locked()

    def _deaf_locked(self) -> None:
        # Announcements made from now until the server confirms our subscriptions again go unheard: a lease kept
        # idle on the strength of them must be looked at again (its watch now counts as contended).
        for listener in self.wanted_listeners:
            listener()

    def _new_pubsub(self) -> Any:
        pubsub = self._client.pubsub()
        resubscribe = pubsub.on_connect

        # redis-py reconnects a broken pub/sub connection by itself (when its client retries) and re-subscribes
        # from its own records. Releases published in that gap were never delivered, so we must hear of every new
        # connection: it invalidates the confirmed subscriptions, and waiters retry once the server confirms them
        # again. The hook is set before the first command, when redis-py registers it with the connection.
        # redis-py keeps only a weak reference to a bound method, so the hook is bound to the PubSub object. (The
        # asyncio client awaits what the hook returns, the blocking one just calls it: each side's hook is right.)
        async def on_connect(_pubsub: Any, connection: Any) -> None:
            self._connection_made()
            await resubscribe(connection)

        pubsub.on_connect = types.MethodType(on_connect, pubsub)
        return pubsub

    def _connection_made(self) -> None:
        with self._cond:
            if self._up:  # a re-connection made by redis-py behind our back
                self.failures += 1
            self._epoch += 1
            self._subscribed.clear()
            self._cond.notify_all()
            self._deaf_locked()

    async def _connect(self) -> None:
        with self._cond:
            old, self._pubsub = self._pubsub, self._new_pubsub()
            pubsub = self._pubsub
            wanted = sorted(self._requested)
        if old is not None:
            await self._close_pubsub(old)
        if wanted:
            await getattr(pubsub, self._subscribe)(*wanted)
        else:
            # Open the connection now, so a failure shows here rather than on the first watch.
            await pubsub.ping()
        with self._cond:
            self._up = True
            self._failing = False
            # A new connection (redis-py made the first one without calling our hook): a watch that noted the
            # epoch before the connection went down must not find it unchanged now.
            self._epoch += 1
            # Channels asked for while we were connecting.
            missing = sorted(self._requested.difference(wanted))
        if missing:
            await self._send(pubsub, self._subscribe, *missing)

    async def _step(self) -> float | None:
        """One turn of the listener: (re)connect if needed, read one message or time out, drop idle channels.
        Returns the pause before the next turn (None: the listener ends)."""
        with self._cond:
            if self._stopped:
                return None  # aclose() closes the connection once we are gone
            retiring = not self._refs and (not self._requested or not self._up)
            if retiring:
                # Nobody watches and nothing is subscribed any more: end. A watch() from now on finds no listener
                # and starts a new one, on a new connection.
                pubsub = self._retire_locked()
            up = self._up
            timeout = self._listen_timeout_locked()
        if retiring:
            if pubsub is not None:
                await self._close_pubsub(pubsub)  # nobody else uses it any more: _send finds it is not ours
            return None
        try:
            if not up:
                await self._connect()
                self._pause = _RECONNECT_INITIAL
            message = await self._pubsub.get_message(timeout=timeout)
        except Exception as exc:  # any failure to connect or read means the same: down, retry later
            logger.debug("hybridlock: pub/sub connection failed: %r", exc)
            with self._cond:
                self._mark_down_locked(exc)
                self._drop_moved_locked(exc)
            pause, self._pause = self._pause, min(self._pause * 2, _RECONNECT_CAP)
            return pause
        if message is not None:
            await self._handle(message)
        await self._unsubscribe_idle()
        return 0.0

    def _drop_moved_locked(self, exc: BaseException) -> None:
        """A cluster node refused a subscription, its channel's slot being served elsewhere now (MOVED): stop asking
        this node for that slot's channels, or every reconnection would be refused again.
        Their watches poll until they end; later watches subscribe at the slot's new node (see ``cluster``)."""
        slot = getattr(exc, "slot_id", None)  # the client's MovedError (and AskError) says which slot
        if not self._sharded or not isinstance(slot, int):
            return
        self._requested.difference_update([ch for ch in self._requested if key_slot(ch.encode()) == slot])

    def _listen_timeout_locked(self) -> float:
        if not self._idle_since:
            return _LISTEN_TIMEOUT
        due = min(self._idle_since.values()) + _IDLE_UNSUBSCRIBE - monotonic()
        return min(_LISTEN_TIMEOUT, max(_LISTEN_MIN, due))

    def _retire_locked(self) -> Any:
        """The listener is ending for want of work: forget every channel; returns the connection to close."""
        pubsub, self._pubsub = self._pubsub, None
        self._worker = None
        self._up = False
        self._subscribed.clear()
        self._requested.clear()
        self._unsubscribing.clear()
        self._idle_since.clear()
        self._released.clear()
        self._addressed.clear()
        self._wanted.clear()
        return pubsub

    async def _handle(self, message: dict[str, Any]) -> None:
        kind = _text(message.get("type"))
        if self._sharded:
            kind = kind[1:] if kind in ("smessage", "ssubscribe", "sunsubscribe") else "other"
        channel = _text(message.get("channel"))
        if kind == "message" and _text(message.get("data")) == "wanted":
            # Another owner failed to acquire: only a holder passing the lock around (or keeping it idle) cares;
            # waiters are not woken. Listeners run outside our guard: they may take their own.
            with self._cond:
                if channel not in self._wanted:
                    return
                self._wanted[channel] += 1
            for listener in self.wanted_listeners:
                listener()
            return
        resubscribe = None
        with self._cond:
            if kind == "message":
                data = _text(message.get("data"))
                if channel not in self._released:
                    return
                if data.startswith("released:"):
                    # Addressed to the head of the lock's queue: only that owner's waiter needs to retry.
                    addressed = self._addressed[channel]
                    to = data[len("released:") :]
                    if to not in addressed:
                        return  # nobody here waits under that name
                    addressed[to] += 1
                else:
                    self._released[channel] += 1
            elif kind == "subscribe":
                self._subscribed.add(channel)
            elif kind == "unsubscribe":
                self._subscribed.discard(channel)
                ours = channel in self._unsubscribing
                self._unsubscribing.discard(channel)
                if self._sharded and not ours and channel in self._refs:
                    # Not asked for: the server ended it, as the channel's slot left this node. Subscribing again
                    # here would be refused (MOVED): give the channel up. Its watches see the subscription down and
                    # poll until they end; later watches subscribe where the slot is served now.
                    self._requested.discard(channel)
                elif channel in self._refs:
                    # Wanted again while the UNSUBSCRIBE was in flight.
                    resubscribe = self._pubsub
                else:
                    self._requested.discard(channel)
                    self._released.pop(channel, None)
                    self._addressed.pop(channel, None)
                    self._wanted.pop(channel, None)
            else:
                return
            self._cond.notify_all()
        if resubscribe is not None:
            await self._send(resubscribe, self._subscribe, channel)

    async def _unsubscribe_idle(self) -> None:
        with self._cond:
            if not self._idle_since:
                return
            cutoff = monotonic() - _IDLE_UNSUBSCRIBE
            idle = [ch for ch, since in self._idle_since.items() if since <= cutoff]
            for ch in idle:
                del self._idle_since[ch]
                # Not to be trusted from now on: a watcher arriving before the UNSUBSCRIBE is confirmed must wait
                # for the re-subscription (see _handle) before relying on notifications.
                self._subscribed.discard(ch)
            pubsub = self._pubsub if idle and self._up else None
            if pubsub is not None:
                self._unsubscribing.update(idle)
            if idle and not self._up:
                for ch in idle:
                    self._requested.discard(ch)
                    self._released.pop(ch, None)
                    self._addressed.pop(ch, None)
                    self._wanted.pop(ch, None)
        if pubsub is not None:
            await self._send(pubsub, self._unsubscribe, *idle)

    async def aclose(self) -> None:
        with self._cond:
            self._stopped = True
            self._up = False
            self._cond.notify_all()
            worker, pubsub = self._worker, self._pubsub
        # The listener may be reading for up to _LISTEN_TIMEOUT: cut its connection so that it notices now.
        if pubsub is not None:
            await cut_connection(pubsub)
        if worker is not None and await worker.stop(timeout=_LISTEN_TIMEOUT + 2.0):
            # The listener has ended: nobody reads the connection any more.
            with self._cond:
                pubsub, self._pubsub = self._pubsub, None
            if pubsub is not None:
                await self._close_pubsub(pubsub)

    def after_fork_in_child(self) -> None:
        # The listener and the parent's connection do not exist in the child; start afresh.
        self._cond = AsyncCondition()
        self._sending = AsyncFifoMutex()
        self._refs.clear()
        self._released.clear()
        self._addressed.clear()
        self._owner_refs.clear()
        self._wanted.clear()
        self._idle_since.clear()
        self._subscribed.clear()
        self._requested.clear()
        self._unsubscribing.clear()
        self._up = False
        self._pubsub = None
        self._worker = None


class _RedisWatch(AsyncReleaseWatch):
    def __init__(self, subscriber: Subscriber, channel: str, owner: str) -> None:
        # Called under the subscriber's guard.
        self._subscriber = subscriber
        self._channel = channel
        self._owner = owner
        self._seen = self._releases()
        self._wanted_seen = subscriber._wanted[channel]
        self._state = subscriber._channel_epoch(channel)
        # The confirmed subscription this watch has heard announcements through since it was made (None: none yet,
        # see heard()). Another one (a reconnection) means announcements may have gone unheard in between.
        self._heard_epoch = self._state
        self._closed = False
        self._poked = False  # (see poke)

    def _releases(self) -> tuple[int, int]:
        # Called under the subscriber's guard; a channel dropped meanwhile reads as unchanged.
        sub = self._subscriber
        everyone = sub._released.get(self._channel)
        if everyone is None:
            return self._seen
        return everyone, sub._addressed[self._channel].get(self._owner, 0)

    def epoch(self) -> int | None:
        with self._subscriber._cond:
            return self._subscriber._channel_epoch(self._channel)

    async def heard(self, timeout: float) -> bool:
        sub = self._subscriber

        def settled() -> bool:
            return sub._channel_epoch(self._channel) is not None or sub._failing or sub._stopped

        with sub._cond:
            await sub._cond.wait_for(settled, timeout)
            epoch = sub._channel_epoch(self._channel)
            if self._heard_epoch is None:
                self._heard_epoch = epoch
            return epoch is not None and epoch == self._heard_epoch

    def contended(self) -> bool:
        # Asked at every local hand-off, so no guard: one dict read is atomic, and a count that moved a moment ago
        # is seen at the next release. Until the server has confirmed our subscription, and from the moment it
        # breaks or is made again (a reconnection: announcements in between went unheard), count the lock as wanted,
        # so that it is neither kept idle nor passed on locally on the strength of a silence nobody listened to.
        sub = self._subscriber
        heard = self._heard_epoch
        if heard is None or not sub._up or sub._epoch != heard or self._channel not in sub._subscribed:
            return True
        return sub._wanted.get(self._channel, self._wanted_seen) != self._wanted_seen

    async def wait(self, timeout: float) -> bool:
        sub = self._subscriber

        def changed() -> bool:
            return (
                self._poked
                or self._releases() != self._seen
                or sub._channel_epoch(self._channel) != self._state
                or sub._stopped
            )

        with sub._cond:
            await sub._cond.wait_for(changed, timeout)
            woken = changed()
            self._seen = self._releases()
            self._state = sub._channel_epoch(self._channel)
            self._poked = False
            return woken

    pokes = True

    def poke(self) -> None:
        sub = self._subscriber
        with sub._cond:
            self._poked = True
            sub._cond.notify_all()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._subscriber._unwatch(self._channel, self._owner)
