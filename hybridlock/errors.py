"""The hybridlock error tree.

Every exception the library raises on purpose derives from [HybridLockError][hybridlock.errors.HybridLockError].
Each child also derives from the standard exception a caller would already catch for that kind of failure
(``RuntimeError`` for misuse and lost locks, ``TimeoutError`` for a wait that ran out, ``ConnectionError`` for an
unreachable server, ``ValueError``/``TypeError`` for bad arguments), so code written against ``threading`` keeps
working.

Each error carries the lock ``key`` and the ``server`` address (where they apply) as attributes, includes them
in its message, and survives pickling (so it can cross a ``multiprocessing`` boundary intact).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AuthenticationFailedError",
    "BackendUnavailableError",
    "ClientSettingsWarning",
    "EventLoopBlockedError",
    "FencingCounterError",
    "EventLoopMismatchError",
    "HybridLockError",
    "HybridLockWarning",
    "InvalidArgumentError",
    "LockLostError",
    "LockNotOwnedError",
    "LockTimeoutError",
    "LockUpgradeError",
    "LocksHeldAtCloseWarning",
    "LongLeaseWarning",
    "RegistryClosedError",
    "ReplicationNotConfirmedError",
    "TimeoutOverflowError",
]


class HybridLockError(Exception):
    """Root of every error hybridlock raises.

    Attributes:
        message: what went wrong, without the key and the server that ``str(error)`` adds.
        key: the lock key the error is about, or ``None``.
        server: the address of the server involved (``"redis://127.0.0.1:6379/0"``, ``"memory"``), or ``None``.
    """

    def __init__(self, message: str, *, key: str | None = None, server: str | None = None) -> None:
        self.message = message
        self.key = key
        self.server = server
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.key is not None:
            where.append(f"key={self.key!r}")
        if self.server is not None:
            where.append(f"server={self.server}")
        return f"{self.message} ({', '.join(where)})" if where else self.message

    def __reduce__(self) -> tuple[Any, ...]:
        # The default reduce would call cls(*self.args) and lose the keyword-only fields.
        return (_rebuild, (type(self), self.message, self.key, self.server))


def _rebuild(cls: type[HybridLockError], message: str, key: str | None, server: str | None) -> HybridLockError:
    return cls(message, key=key, server=server)


class InvalidArgumentError(HybridLockError, ValueError, TypeError):
    """A caller passed a bad value or type: an empty key, a negative timeout, ``expire_after <= 0``, ...

    It is both a ``ValueError`` (as ``threading`` raises for bad timeouts) and a ``TypeError`` (for wrong types),
    so either ``except`` clause a caller already has catches it.
    """


class TimeoutOverflowError(InvalidArgumentError, OverflowError):
    """A timeout too large for the platform to wait (above ``threading.TIMEOUT_MAX``).

    An ``OverflowError``, as ``threading.Lock.acquire`` raises for the same timeout, and an
    ``InvalidArgumentError`` like every other rejected argument.
    """


class LockNotOwnedError(HybridLockError, RuntimeError):
    """``release()`` by a thread that does not hold the lock (``threading.RLock`` raises ``RuntimeError`` too); on the
    asyncio side also an ``acquire()`` run as a task of its own (``asyncio.wait_for`` before Python 3.12,
    ``create_task``), whose hold would belong to nobody once it returned: refused before anything is taken."""


class LockUpgradeError(HybridLockError, RuntimeError):
    """A thread holding a read lock asked for the write lock. Refused at once: two readers upgrading together
    would wait for each other forever. Release the read lock first (or take the write lock from the start)."""


class LockLostError(HybridLockError, RuntimeError):
    """The lock's lease in the server ended (it expired, or the key was deleted or taken) while it was held.

    Another holder may have entered the critical section in the meantime, so data the lock guarded may have been
    changed by someone else. The local lock has been released all the same when this is raised from ``release()``.

    ``release()`` of a lease already known lost raises this whatever the server says: when the server cannot be
    reached to take the lease back, its ``BackendUnavailableError`` is this error's ``__cause__``.
    """


class LockTimeoutError(HybridLockError, TimeoutError):
    """A wait for a lock ran out of time where the API promises the lock or an exception: ``with lock(timeout=5):``
    (``async with`` too), ``with lock.acquire(timeout=5):`` on the thread side, ``synchronized`` and
    ``execute_locked``. The message says how long the wait was; nothing is left held."""


class BackendUnavailableError(HybridLockError, ConnectionError):
    """The lock server could not be reached, or did not answer in time.

    The operation did not take the lock: an ``acquire`` that raises this has released the local lock, and a
    ``release`` that raises this has released the local lock (the server key then ends with its lease). A
    ``release`` raises this only for a lease not known lost; one known lost raises ``LockLostError`` instead.
    """


class AuthenticationFailedError(BackendUnavailableError):
    """The server refused to log the client in (a wrong or missing password, an unknown or disabled user), or, for a
    Sentinel-managed service, the sentinels did. ``user`` is the user the client logged in as (``"default"`` when it
    named none; None when a credential provider chose it); the message says who refused it and how to give the
    password (in the URL, or to the client), never the password itself.

    A ``BackendUnavailableError`` (and so a ``ConnectionError``, as the client library's own authentication error
    is), with the same promise: nothing was taken, and the local lock is released. Unlike an unreachable server it
    does not go away by itself: the settings must change."""

    def __init__(
        self, message: str, *, key: str | None = None, server: str | None = None, user: str | None = None
    ) -> None:
        self.user = user
        super().__init__(message, key=key, server=server)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_authentication, (self.message, self.key, self.server, self.user))


def _rebuild_authentication(
    message: str, key: str | None, server: str | None, user: str | None
) -> AuthenticationFailedError:
    return AuthenticationFailedError(message, key=key, server=server, user=user)


class ReplicationNotConfirmedError(BackendUnavailableError):
    """The server took the lock (or renewed it) but fewer replicas than the registry's ``confirm_replicas``
    acknowledged the write within ``confirm_timeout`` (``WAIT``), so a failover could lose it.

    From ``acquire`` the lease has already been given back (the lock is not held, here or in the server) and the
    local lock released; from a renewal the lease counts as not renewed (its ``valid_until`` stays where it was,
    and it is reported lost if no renewal is confirmed before then). A ``BackendUnavailableError`` (and so a
    ``ConnectionError``): the lock service cannot give its guarantee right now. ``acknowledged`` is how many
    replicas did, ``required`` how many were asked for. For a renewal, ``renewed`` is the server's own answer per
    lease asked about (False: the lease had already ended there, so it is lost whatever the replicas say); None
    otherwise, and after unpickling.
    """

    def __init__(
        self,
        message: str,
        *,
        key: str | None = None,
        server: str | None = None,
        acknowledged: int = 0,
        required: int = 0,
    ) -> None:
        self.acknowledged = acknowledged
        self.required = required
        self.renewed: list[bool] | None = None
        super().__init__(message, key=key, server=server)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_replication, (self.message, self.key, self.server, self.acknowledged, self.required))


def _rebuild_replication(
    message: str, key: str | None, server: str | None, acknowledged: int, required: int
) -> ReplicationNotConfirmedError:
    return ReplicationNotConfirmedError(message, key=key, server=server, acknowledged=acknowledged, required=required)


class FencingCounterError(HybridLockError, RuntimeError):
    """A fencing counter in the server holds a number that tokens cannot be counted from exactly: at or above
    2^53 - 1 (``hybridlock.fencing.MAX_TOKEN``, the largest integer a Lua script counts exactly). hybridlock never
    mints such a token; someone with access to the keys wrote it (or, at exactly 2^53 - 1, the counter is used up).
    The next token would repeat the last one, so nothing is taken: ``acquire`` raises this (the local lock
    released, the counter left as it was) instead of returning a token that is not greater than every earlier
    one. From ``fenced_set``: the resource's highest-token key holds a number above 2^53 - 1, or something that
    is not a number, so no token compares with it exactly, and nothing is written.

    Repair by hand: set the counter to the highest token any resource has seen (or delete it if no resource kept a
    token above the server clock in microseconds; tokens then start again from the clock). Over a quorum a server
    whose counter is like this counts as failed for that key, so the others go on while they are a majority.

    ``counter`` is the name of the key that holds the value and ``value`` the value as stored (both None when not
    known, and after unpickling only what was given)."""

    def __init__(
        self,
        message: str,
        *,
        key: str | None = None,
        server: str | None = None,
        counter: str | None = None,
        value: str | None = None,
    ) -> None:
        self.counter = counter
        self.value = value
        super().__init__(message, key=key, server=server)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_fencing, (self.message, self.key, self.server, self.counter, self.value))


def _rebuild_fencing(
    message: str, key: str | None, server: str | None, counter: str | None, value: str | None
) -> FencingCounterError:
    return FencingCounterError(message, key=key, server=server, counter=counter, value=value)


class RegistryClosedError(HybridLockError, RuntimeError):
    """The registry (or a lock obtained from it) was used after ``close()``."""


class EventLoopBlockedError(HybridLockError, RuntimeError):
    """A thread lock was called from a running asyncio event loop: it would stall the loop, and every task of the
    loop would count as its one owning thread. Use ``AsyncLockRegistry`` there."""


class EventLoopMismatchError(HybridLockError, RuntimeError):
    """An asyncio registry (or a lock from it) was used from an event loop other than its own.

    A registry belongs to the event loop it is first used in: its connections, background tasks and waits live
    there, and ``asyncio.run()`` makes a new loop each time (closing the old one). Make one registry per event
    loop: create it inside the coroutine that ``asyncio.run()`` runs (``async with AsyncLockRegistry(...) as
    registry:``), not at import time. A ``RuntimeError``, as asyncio raises for its own objects used across
    loops."""


class HybridLockWarning(UserWarning):
    """Root of every warning hybridlock gives: ``warnings.filterwarnings("ignore", category=HybridLockWarning)``
    silences them all (each has its own class to silence it alone)."""


class LocksHeldAtCloseWarning(HybridLockWarning):
    """A registry was closed while threads (or tasks) of it still held locks.

    Closing does not release them: a holder still inside its critical section would otherwise share the lock with
    the next owner. Each stays held, here and in the server, until its holder releases it (the release is still
    sent to the server) or its lease ends, which nothing renews any more: after that another owner may take the
    lock while the holder still runs. Release locks before closing their registry."""


class LongLeaseWarning(HybridLockWarning):
    """``expire_after`` is so long (1000 s or more) that it was probably meant in milliseconds, as Spring's
    ``RedisLockRegistry`` takes it: ``expire_after`` is in seconds, and a lease of 30000 s would keep every other
    owner out for 8.3 hours after a holder crashes. A lease that long on purpose: silence this class with
    ``warnings.filterwarnings("ignore", category=hybridlock.LongLeaseWarning)``."""


class ClientSettingsWarning(HybridLockWarning):
    """A client passed to ``LockRegistry`` cannot keep ``acquire``'s timeout promise: it has no
    ``socket_timeout`` or ``socket_connect_timeout`` (a hung server then blocks a call for ever), or it retries a
    failed command several times (each retry adds up to a socket timeout and a backoff). Not an error: the locks
    work, but a call may wait far past its timeout. A client made from a URL never draws it."""
