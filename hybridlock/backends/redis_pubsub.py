"""Release notifications over Redis pub/sub: one subscriber connection and one listener thread per backend.

Waiting threads never touch a socket. Each opens a :class:`ReleaseWatch` on its lock's channel (reference
counted: forty threads waiting on one key share one subscription) and waits on a condition variable that the
listener thread signals when a release message arrives.

Failure modes
-------------
* SUBSCRIBE is refused (an ACL, a renamed command) or the connection breaks (``CLIENT KILL``, a restart, a
  network fault): the listener marks the subscription down (watch epoch ``None``), wakes every waiter so each
  retries at once and then falls back to jittered backoff bounded by the holder's lease, and re-subscribes with
  growing pauses. When the subscription is confirmed again the epoch changes, so waiters retry their acquire once
  more before trusting notifications again: no release that happened meanwhile is missed.
* A published message is lost in transit: a waiter still wakes at the holder's lease end, or after
  ``WaitPolicy.notified_cap`` when the lease has no end.

Channels whose last watcher left are unsubscribed by the listener after ``_IDLE_UNSUBSCRIBE`` seconds (0.1), so
a key waited on again and again (two owners taking turns do so every few milliseconds) keeps its subscription and
does not churn SUBSCRIBE/UNSUBSCRIBE. Once no watch is open and the server has confirmed every UNSUBSCRIBE, the
listener closes its connection and ends: a program that waits for nothing has no listener thread and no
subscriber connection. The next watch starts both afresh.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import types
from collections.abc import Callable
from typing import Any

from .base import ReleaseWatch

__all__ = ["Subscriber"]

logger = logging.getLogger("hybridlock")

_IDLE_UNSUBSCRIBE = 0.1  # seconds a channel stays subscribed after its last watch closed
# The longest read: how soon the listener notices that channels fell idle (and close() that it must end).
_LISTEN_TIMEOUT = 0.1
_LISTEN_MIN = 0.005
_RECONNECT_INITIAL = 0.05
_RECONNECT_CAP = 2.0


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Subscriber:
    """Owns the pub/sub connection of one Redis backend. Thread-safe."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._cond = threading.Condition(threading.Lock())
        self._refs: dict[str, int] = {}  # channel -> open watches
        self._released: dict[str, int] = {}  # channel -> releases announced to everyone (watches compare counts)
        self._addressed: dict[str, dict[str, int]] = {}  # channel -> owner -> releases addressed to that owner
        self._wanted: dict[str, int] = {}  # channel -> "wanted" messages seen (another owner failed to acquire)
        self._idle_since: dict[str, float] = {}  # channel with no watch -> since when
        self._subscribed: set[str] = set()  # confirmed by the server
        self._requested: set[str] = set()  # SUBSCRIBE sent (or to be re-sent after reconnecting)
        self._epoch = 0  # bumped whenever the connection is (re-)established
        self._up = False  # the connection works and has not failed since it was established
        self._pubsub: Any = None
        self._thread: threading.Thread | None = None
        self._stopped = False
        #: Times the connection was re-established after a failure (for tests and statistics).
        self.failures = 0
        #: Called (from the listener thread, without our lock) on every "wanted" for a watched channel.
        self.wanted_listeners: list[Callable[[], None]] = []

    # -- used by watches -------------------------------------------------------------------------------------------

    def watch(self, channel: str, owner: str) -> _RedisWatch:
        with self._cond:
            self._refs[channel] = self._refs.get(channel, 0) + 1
            self._idle_since.pop(channel, None)
            self._released.setdefault(channel, 0)
            self._addressed.setdefault(channel, {})
            self._wanted.setdefault(channel, 0)
            watch = _RedisWatch(self, channel, owner)
            if channel not in self._requested and self._up:
                self._send_locked("subscribe", channel)
            self._requested.add(channel)
            self._start_locked()
            return watch

    def _unwatch(self, channel: str) -> None:
        with self._cond:
            left = self._refs[channel] - 1
            if left:
                self._refs[channel] = left
            else:
                del self._refs[channel]
                self._idle_since[channel] = time.monotonic()

    def _channel_epoch(self, channel: str) -> int | None:
        # Called with the condition held.
        return self._epoch if self._up and channel in self._subscribed else None

    # -- the connection ----------------------------------------------------------------------------------------------

    def _start_locked(self) -> None:
        if self._thread is None and not self._stopped:
            self._thread = threading.Thread(target=self._run, name="hybridlock-pubsub-listener", daemon=True)
            self._thread.start()

    def _send_locked(self, command: str, *channels: str) -> None:
        # redis-py lets one thread send (un)subscribe commands while another reads messages. A failure here is
        # left for the listener to notice on its next read.
        try:
            getattr(self._pubsub, command)(*channels)
        except Exception as exc:
            self._mark_down_locked(exc)

    def _mark_down_locked(self, exc: BaseException) -> None:
        if self._up:
            logger.info("hybridlock: pub/sub subscription lost (%s); waiters fall back to backoff", exc)
        self._up = False
        self._subscribed.clear()
        self._cond.notify_all()  # waiters retry now and back off until we are up again

    def _new_pubsub(self) -> Any:
        pubsub = self._client.pubsub()
        resubscribe = pubsub.on_connect

        # redis-py reconnects a broken pub/sub connection by itself (when its client retries) and re-subscribes
        # from its own records. Releases published in that gap were never delivered, so we must hear of every new
        # connection: it invalidates the confirmed subscriptions, and waiters retry once the server confirms them
        # again. The hook is set before the first command, when redis-py registers it with the connection.
        # redis-py keeps only a weak reference to a bound method, so the hook is bound to the PubSub object.
        def on_connect(_pubsub: Any, connection: Any) -> None:
            self._connection_made()
            resubscribe(connection)

        pubsub.on_connect = types.MethodType(on_connect, pubsub)
        return pubsub

    def _connection_made(self) -> None:
        with self._cond:
            if self._up:  # a re-connection made by redis-py behind our back
                self.failures += 1
            self._epoch += 1
            self._subscribed.clear()
            self._cond.notify_all()

    def _connect(self) -> None:
        with self._cond:
            old, self._pubsub = self._pubsub, self._new_pubsub()
            wanted = sorted(self._requested)
        if old is not None:
            with contextlib.suppress(Exception):
                old.close()
        if wanted:
            self._pubsub.subscribe(*wanted)
        else:
            # Open the connection now, so a failure shows here rather than on the first watch.
            self._pubsub.ping()
        with self._cond:
            self._up = True
            # Channels asked for while we were connecting.
            missing = sorted(self._requested.difference(wanted))
            if missing:
                self._send_locked("subscribe", *missing)

    def _run(self) -> None:
        pause = _RECONNECT_INITIAL
        while True:
            with self._cond:
                if self._stopped:
                    break
                if not self._refs and (not self._requested or not self._up):
                    # Nobody watches and nothing is subscribed any more: end. A watch() from now on finds no thread
                    # and starts a new one, on a new connection.
                    self._retire_locked()
                    return
                up = self._up
                timeout = self._listen_timeout_locked()
            try:
                if not up:
                    self._connect()
                    pause = _RECONNECT_INITIAL
                message = self._pubsub.get_message(timeout=timeout)
            except Exception as exc:  # any failure to connect or read means the same: down, retry later
                logger.debug("hybridlock: pub/sub connection failed: %r", exc)
                with self._cond:
                    self._mark_down_locked(exc)
                    self._cond.wait(pause)
                pause = min(pause * 2, _RECONNECT_CAP)
                continue
            if message is not None:
                self._handle(message)
            self._unsubscribe_idle()
        with contextlib.suppress(Exception):
            if self._pubsub is not None:
                self._pubsub.close()

    def _listen_timeout_locked(self) -> float:
        if not self._idle_since:
            return _LISTEN_TIMEOUT
        due = min(self._idle_since.values()) + _IDLE_UNSUBSCRIBE - time.monotonic()
        return min(_LISTEN_TIMEOUT, max(_LISTEN_MIN, due))

    def _retire_locked(self) -> None:
        """The listener is ending for want of work: forget every channel and close the connection."""
        pubsub, self._pubsub = self._pubsub, None
        self._thread = None
        self._up = False
        self._subscribed.clear()
        self._requested.clear()
        self._idle_since.clear()
        self._released.clear()
        self._addressed.clear()
        self._wanted.clear()
        if pubsub is not None:
            # Under our lock, but it only closes a socket nobody else uses any more (watch() sends only while up).
            with contextlib.suppress(Exception):
                pubsub.close()

    def _handle(self, message: dict[str, Any]) -> None:
        kind = _text(message.get("type"))
        channel = _text(message.get("channel"))
        if kind == "message" and _text(message.get("data")) == "wanted":
            # Another owner failed to acquire: only a holder passing the lock around (or keeping it idle) cares;
            # waiters are not woken. Listeners run outside our lock: they may take their own.
            with self._cond:
                if channel not in self._wanted:
                    return
                self._wanted[channel] += 1
            for listener in self.wanted_listeners:
                listener()
            return
        with self._cond:
            if kind == "message":
                data = _text(message.get("data"))
                if channel not in self._released:
                    return
                if data.startswith("released:"):
                    # Addressed to the head of the lock's queue: only that owner's waiter needs to retry.
                    addressed = self._addressed[channel]
                    to = data[len("released:") :]
                    addressed[to] = addressed.get(to, 0) + 1
                else:
                    self._released[channel] += 1
            elif kind == "subscribe":
                self._subscribed.add(channel)
            elif kind == "unsubscribe":
                self._subscribed.discard(channel)
                if channel in self._refs:
                    # Wanted again while the UNSUBSCRIBE was in flight.
                    self._send_locked("subscribe", channel)
                else:
                    self._requested.discard(channel)
                    self._released.pop(channel, None)
                    self._addressed.pop(channel, None)
                    self._wanted.pop(channel, None)
            else:
                return
            self._cond.notify_all()

    def _unsubscribe_idle(self) -> None:
        with self._cond:
            if not self._idle_since:
                return
            cutoff = time.monotonic() - _IDLE_UNSUBSCRIBE
            idle = [ch for ch, since in self._idle_since.items() if since <= cutoff]
            for ch in idle:
                del self._idle_since[ch]
                # Not to be trusted from now on: a watcher arriving before the UNSUBSCRIBE is confirmed must wait
                # for the re-subscription (see _handle) before relying on notifications.
                self._subscribed.discard(ch)
            if idle and self._up:
                self._send_locked("unsubscribe", *idle)
            elif idle:
                for ch in idle:
                    self._requested.discard(ch)
                    self._released.pop(ch, None)
                    self._addressed.pop(ch, None)
                    self._wanted.pop(ch, None)

    def close(self) -> None:
        with self._cond:
            self._stopped = True
            self._up = False
            self._cond.notify_all()
            thread, pubsub = self._thread, self._pubsub
        # The listener may be blocked reading for up to _LISTEN_TIMEOUT: cut its connection so that it notices now.
        connection = getattr(pubsub, "connection", None)
        if connection is not None:
            with contextlib.suppress(Exception):
                connection.disconnect()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=_LISTEN_TIMEOUT + 2.0)

    def after_fork_in_child(self) -> None:
        # The listener thread and the parent's connection do not exist in the child; start afresh.
        self._cond = threading.Condition(threading.Lock())
        self._refs.clear()
        self._released.clear()
        self._addressed.clear()
        self._wanted.clear()
        self._idle_since.clear()
        self._subscribed.clear()
        self._requested.clear()
        self._up = False
        self._pubsub = None
        self._thread = None


class _RedisWatch(ReleaseWatch):
    def __init__(self, subscriber: Subscriber, channel: str, owner: str) -> None:
        # Called with the subscriber's condition held.
        self._subscriber = subscriber
        self._channel = channel
        self._owner = owner
        self._seen = self._releases()
        self._wanted_seen = subscriber._wanted[channel]
        self._state = subscriber._channel_epoch(channel)
        self._closed = False

    def _releases(self) -> tuple[int, int]:
        # Called with the subscriber's condition held; a channel dropped meanwhile reads as unchanged.
        sub = self._subscriber
        everyone = sub._released.get(self._channel)
        if everyone is None:
            return self._seen
        return everyone, sub._addressed[self._channel].get(self._owner, 0)

    def epoch(self) -> int | None:
        with self._subscriber._cond:
            return self._subscriber._channel_epoch(self._channel)

    def contended(self) -> bool:
        # Asked at every local hand-off, so no condition lock: one dict read is atomic, and a count that moved a
        # moment ago is seen at the next release.
        return self._subscriber._wanted.get(self._channel, self._wanted_seen) != self._wanted_seen

    def wait(self, timeout: float) -> bool:
        sub = self._subscriber

        def changed() -> bool:
            return self._releases() != self._seen or sub._channel_epoch(self._channel) != self._state or sub._stopped

        with sub._cond:
            sub._cond.wait_for(changed, timeout)
            woken = changed()
            self._seen = self._releases()
            self._state = sub._channel_epoch(self._channel)
            return woken

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._subscriber._unwatch(self._channel)
