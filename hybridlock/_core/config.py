"""A registry's settings, checked once, and the lease arithmetic every lock kind shares: pure, no clock reads.

Every duration a caller gives (``expire_after``, ``max_hold``, the hand-off windows, ``retain_for``, a
``timeout``) is checked here and nowhere else, with one message shape, so a bad value fails the same way whichever
call it reached. Times come in as ``now``/``start`` arguments (``time.monotonic()`` values read by the caller).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Literal, overload

from ..errors import InvalidArgumentError, TimeoutOverflowError
from .names import validate_registry_key
from .policy import WaitPolicy

__all__ = [
    "CLOCK_RATE_MARGIN",
    "FENCE_RETENTION",
    "LONG_LEASE",
    "MAX_SECONDS",
    "MIN_LEASE",
    "QUEUE_PLACE_KEEP_MS",
    "QUORUM_FENCE_RETENTION",
    "LockType",
    "RegistryConfig",
    "ReplicaConfirmation",
    "grant_valid_until",
    "lease_drift",
    "checked_fence_retention",
    "fence_retention_ms",
    "long_lease_note",
    "validate_seconds",
    "validate_timeout",
]

#: The longest duration any option or timeout may have: ``threading.TIMEOUT_MAX``, the longest wait Python's
#: threads accept (about 292 years on Linux and macOS, 49 days on Windows), written out so this module reads no
#: threading state (``tests/test_layers.py`` checks the two agree). Leases, renewal periods and deadlines are all
#: waited on, and the server takes this many milliseconds (and twice as many) without overflow.
MAX_SECONDS = 4294967.0 if sys.platform == "win32" else 9223372036.0

#: The shortest lease ``expire_after`` accepts. A lease is renewed every third of itself, so a shorter one would
#: be lost whenever a renewal round trip is a few milliseconds late.
MIN_LEASE = 0.1

#: How long an owner's place in a lock's server queue (or its record as a waiting writer of a read-write lock) is
#: kept after it was last taken or refreshed, in milliseconds. A live waiter refreshes its places about every
#: second (``LockBackend.keep_waiting``, from the registry's wait keeper), so they last as long as it waits; the
#: place of a waiter that crashed or lost its server lapses within this time, and then holds nobody up. Short,
#: because a lapsed place that still heads the queue keeps a free lock from everyone until it lapses; long
#: enough that a refresh delayed by one slow round trip does not lose the place.
QUEUE_PLACE_KEEP_MS = 3000

#: A lease this long or longer (seconds) was probably given in milliseconds, as Spring's ``RedisLockRegistry``
#: takes it (``expireAfter=30000``): the registries warn (``LongLeaseWarning``). About 17 minutes: a lease is
#: renewed while held, so its length is how long a crashed holder keeps everyone out, and few want that for long.
LONG_LEASE = 1000.0

LockType = Literal["pubsub", "spin"]

#: ``fence_retention``'s default on one server (Sentinel-managed or not) and on a cluster, in seconds: a day. How long
#: a lock's fencing counter (``<lock key>:fence``) is kept after its last acquisition. There a token is
#: ``max(counter + 1, server clock in µs)``: the clock alone keeps tokens increasing, and the counter only carries
#: them past a server clock that stepped back (by less than the time since the key's last acquisition, or it is
#: gone), so a day covers any step a clock kept by NTP takes, at a seventh of the memory a week cost (about 120-170
#: bytes per key: docs/tuning.md).
FENCE_RETENTION = 24 * 3600.0

#: ``fence_retention``'s default over a quorum: a week. There the counters carry tokens in normal operation (the
#: write-back raises every server's counter to the highest token minted, which may come from a server whose clock
#: runs ahead), and a counter gone is a lost counter (``_core.quorum``, "Lost counters"): harmless only once its
#: server's clock has passed the token, more than twice the clock skew after it was minted.
QUORUM_FENCE_RETENTION = 7 * 24 * 3600.0


def fence_retention_ms(retention: float) -> int:
    """A fencing counter's retention in seconds as the server takes it (a ``PX``): whole milliseconds."""
    return max(1, round(retention * 1000))


def checked_fence_retention(value: object, lease: float | None, default: float) -> float:
    """Validate ``fence_retention`` (None: ``default``, or the lease if that is longer).

    It must be at least the lease (``expire_after``). The counter is what keeps a key's next token above the ones
    already handed out when the clock term cannot (a server clock stepped back; over a quorum, a token written back
    from a faster clock): once it is gone, tokens rest on the clock alone. A counter that ended before the lease it
    fenced could send the next token below one that its holder may still use, on a clock step or a skew shorter than
    one lease, which the rest of the design (the drift margin, the quorum's delayed-restart rule) counts as small."""
    if value is None:
        return default if lease is None else max(default, lease)
    retention = validate_seconds("fence_retention", value)
    if lease is not None and retention < lease:
        raise InvalidArgumentError(
            f"fence_retention must be at least expire_after ({lease:g} s), not {value!r}: a fencing counter that "
            "ends before the lease it fenced could let the next token go below one still held"
        )
    return retention


def long_lease_note(name: str, lease: float) -> str | None:
    """What to say about a lease of ``lease`` seconds given as ``name`` (an option, a command-line flag) when it
    looks like milliseconds (``LONG_LEASE`` or more); None when it does not."""
    if not LONG_LEASE <= lease < math.inf:
        return None
    hours = lease / 3600
    length = f"{lease / 60:.1f} min" if hours < 1 else f"{hours:.1f} h" if hours < 48 else f"{hours / 24:.1f} days"
    return (
        f"{name} is in seconds: {lease:g} s is {length} (did you mean {lease / 1000:g} s? Spring's RedisLockRegistry "
        "takes milliseconds). A holder that crashes keeps every other owner out that long"
    )


def lease_drift(lease: float) -> float:
    """The margin ``valid_until`` keeps before a lease of ``lease`` seconds ends: clocks of two machines drift
    apart, and a lease is counted from when the request was *sent*; 1% of the lease plus 2 ms, the margin the
    Redlock analysis uses."""
    return lease * 0.01 + 0.002


#: How much longer than the server's clock says a time span may last by ours: the drift margin's rate (1 %), for spans
#: measured by the server (a blocking pop's timeout) and counted on our clock.
CLOCK_RATE_MARGIN = 0.01


def grant_valid_until(kept_at: float, unread_since: float, lease: float, place_keep: float) -> float:
    """Until when a lease granted to our place in a lock's queue (a direct grant, see ``_async.waiting``) is certainly
    ours, on our ``monotonic()`` clock: the server ended it when the place would have lapsed, ``place_keep`` seconds
    after the last request that took or kept the place (sent at ``kept_at``), or ``lease`` seconds after the grant if
    that is sooner. The grant came after that request, and after ``unread_since``, until when a look at our box saw
    no grant. Each bound counts from when its request was sent, less its drift margin (as ``valid_until`` does)."""
    granted_after = max(kept_at, unread_since)
    return min(kept_at + place_keep - lease_drift(place_keep), granted_after + lease - lease_drift(lease))


def lease_ms(lease: float) -> int:
    """A lease in seconds as the server takes it: whole milliseconds, at least one."""
    return max(1, round(lease * 1000))


@overload
def validate_seconds(name: str, value: object, *, allow_zero: bool = ..., minimum: float = ...) -> float: ...
@overload
def validate_seconds(
    name: str, value: object, *, allow_none: Literal[True], allow_zero: bool = ..., minimum: float = ...
) -> float | None: ...
def validate_seconds(
    name: str, value: object, *, allow_none: bool = False, allow_zero: bool = False, minimum: float = 0.0
) -> float | None:
    """Check an option given in seconds: a finite number, positive (or 0 with ``allow_zero``, None with
    ``allow_none``), at least ``minimum`` and at most ``MAX_SECONDS``."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentError(f"{name} must be a number of seconds, not {type(value).__name__}")
    if not (value >= 0 if allow_zero else value > 0) or value == float("inf"):
        kind = "non-negative" if allow_zero else "positive"
        raise InvalidArgumentError(f"{name} must be a {kind}, finite number of seconds, not {value!r}")
    if value > MAX_SECONDS:
        raise InvalidArgumentError(
            f"{name} must be at most {MAX_SECONDS:g} seconds (threading.TIMEOUT_MAX), not {value!r}"
        )
    if value < minimum and not (allow_zero and value == 0):
        raise InvalidArgumentError(f"{name} must be at least {minimum:g} seconds, not {value!r}")
    return float(value)


def validate_timeout(blocking: object, timeout: object) -> float | None:
    """Check ``acquire``'s arguments as ``threading.Lock.acquire`` does; return the timeout (None: forever)."""
    if blocking is True and timeout == -1 and type(timeout) is int:
        return None  # the defaults, on every `with lock:`
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise InvalidArgumentError(f"timeout must be a number of seconds, not {type(timeout).__name__}")
    if math.isnan(timeout):
        raise InvalidArgumentError("timeout must not be NaN")
    if not blocking:
        if timeout != -1:
            raise InvalidArgumentError("can't specify a timeout for a non-blocking call")
        return 0.0
    if timeout == -1 or timeout == math.inf:
        return None
    if timeout < 0:
        raise InvalidArgumentError("timeout value must be a non-negative number or -1")
    if timeout > MAX_SECONDS:
        # An OverflowError too, as threading.Lock.acquire raises for the same timeout.
        raise TimeoutOverflowError(
            f"timeout must be at most {MAX_SECONDS:g} seconds (threading.TIMEOUT_MAX) or -1, not {timeout!r}"
        )
    return float(timeout)


#: ``confirm_timeout``'s default: long enough for a replica on a LAN to acknowledge, short enough that an acquire
#: refused for want of replicas fails fast. Capped at a sixth of the lease, so a renewal round fits its period.
DEFAULT_CONFIRM_TIMEOUT = 0.5


@dataclass(frozen=True)
class ReplicaConfirmation:
    """How an acquire or a renewal is confirmed before it counts: ``WAIT replicas timeout_ms`` (that many replicas
    acknowledged the write), or with ``fsync`` ``WAITAOF 1 replicas timeout_ms`` (the master and that many replicas
    wrote it to their append-only file and fsynced it)."""

    replicas: int
    timeout: float
    fsync: bool = False

    @property
    def timeout_ms(self) -> int:
        """The ``WAIT`` timeout: whole milliseconds, at least one (``WAIT n 0`` would wait for ever)."""
        return max(1, round(self.timeout * 1000))

    def command(self) -> tuple[str | int, ...]:
        """The command sent right after the write, on the same connection."""
        if self.fsync:
            return ("WAITAOF", 1, self.replicas, self.timeout_ms)
        return ("WAIT", self.replicas, self.timeout_ms)

    def outcome(self, reply: object) -> tuple[bool, int, str]:
        """Read the command's reply: (confirmed, how many replicas acknowledged, what happened, for a message)."""
        if self.fsync:
            local, replicas = (int(part) for part in reply)  # type: ignore[attr-defined]
            confirmed = local >= 1 and replicas >= self.replicas
            where = "" if local >= 1 else ", and not the master,"
            return (
                confirmed,
                replicas,
                (
                    f"{replicas} of {self.replicas} replicas{where} fsynced it to their AOF within {self.timeout:g} s "
                    "(WAITAOF)"
                ),
            )
        replicas = int(reply)  # type: ignore[call-overload]
        return (
            replicas >= self.replicas,
            replicas,
            (f"{replicas} of {self.replicas} replicas acknowledged within {self.timeout:g} s (WAIT)"),
        )

    @classmethod
    def checked(
        cls, replicas: object, timeout: object, lease: float | None, fsync: object = False
    ) -> ReplicaConfirmation | None:
        """Validate ``confirm_replicas``, ``confirm_timeout`` and ``confirm_fsync``; None when confirmation is off
        (0 replicas, no fsync).

        The timeout must fit in a renewal period (a third of the lease): a renewal that waits longer for its
        replicas than the period would let the lease run out while it waits."""
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise InvalidArgumentError(f"confirm_replicas must be a non-negative int, not {replicas!r}")
        if not isinstance(fsync, bool):
            raise InvalidArgumentError(f"confirm_fsync must be True or False, not {fsync!r}")
        if timeout is not None:
            timeout = validate_seconds("confirm_timeout", timeout)
        if not replicas and not fsync:
            return None
        if lease is None:
            raise InvalidArgumentError("replica confirmation needs a lease in a server (a registry with expire_after)")
        period = lease / 3
        if timeout is None:
            timeout = min(DEFAULT_CONFIRM_TIMEOUT, lease / 6)
        elif timeout >= period:
            raise InvalidArgumentError(
                f"confirm_timeout must be shorter than a renewal period (expire_after / 3 = {period:g} s), "
                f"not {timeout!r}"
            )
        return cls(replicas, float(timeout), fsync)


@dataclass(frozen=True)
class RegistryConfig:
    """Every setting of one registry, checked (build it with :meth:`checked`).

    ``lease`` is None for a registry whose locks never expire (``LocalLockRegistry``): ``lease_ms`` is then None
    too, and every caller that sends a lease must say what it does without one.
    """

    registry_key: str
    lease: float | None
    lock_type: LockType
    auto_renew: bool
    max_hold: float | None
    handoff_limit: int  # 0 when local hand-off is off (either budget at 0)
    handoff_window: float
    # How long a tenancy may keep passing the lock among local threads once another owner is known to wait
    # (never longer than handoff_window; 0: not at all). See policy.may_keep_lease.
    handoff_contended_window: float
    handoff_barge_window: float
    retain_for: float
    wait_policy: WaitPolicy = field(default_factory=WaitPolicy)
    #: Replica confirmation of acquires and renewals (``confirm_replicas``); None when off.
    confirmation: ReplicaConfirmation | None = None
    #: How long a lock's fencing counter is kept after its last acquisition, in seconds (``fence_retention``).
    fence_retention: float = FENCE_RETENTION
    #: Whether ``fence_retention`` was given (a registry given a backend object refuses it: the backend has its own).
    fence_retention_given: bool = False

    @classmethod
    def checked(
        cls,
        registry_key: object,
        expire_after: object,
        *,
        lock_type: object = "pubsub",
        auto_renew: bool = True,
        max_hold: object = None,
        handoff_limit: object = 64,
        handoff_window: object = 0.05,
        handoff_contended_window: object = 0.02,
        handoff_barge_window: object = 0.002,
        retain_for: object = 0.0,
        confirm_replicas: object = 0,
        confirm_timeout: object = None,
        confirm_fsync: object = False,
        fence_retention: object = None,
        default_fence_retention: float = FENCE_RETENTION,
        never_expires: bool = False,
    ) -> RegistryConfig:
        """Validate the registry's options (``InvalidArgumentError`` naming the option on the first bad one).
        ``never_expires``: the locks have no lease at all (``expire_after`` is then only checked).
        ``default_fence_retention``: the topology's default (``FENCE_RETENTION``, ``QUORUM_FENCE_RETENTION``)."""
        key = validate_registry_key(registry_key)
        lease = validate_seconds("expire_after", expire_after, minimum=MIN_LEASE)
        if lock_type not in ("pubsub", "spin"):
            raise InvalidArgumentError(f"lock_type must be 'pubsub' or 'spin', not {lock_type!r}")
        hold = validate_seconds("max_hold", max_hold, allow_none=True)
        if isinstance(handoff_limit, bool) or not isinstance(handoff_limit, int) or handoff_limit < 0:
            raise InvalidArgumentError(f"handoff_limit must be a non-negative int, not {handoff_limit!r}")
        window = validate_seconds("handoff_window", handoff_window, allow_zero=True)
        contended_window = validate_seconds("handoff_contended_window", handoff_contended_window, allow_zero=True)
        barge = validate_seconds("handoff_barge_window", handoff_barge_window, allow_zero=True)
        retain = validate_seconds("retain_for", retain_for, allow_zero=True)
        limit = handoff_limit if window > 0 else 0  # either bound at 0 switches local hand-off off
        if retain and not limit:
            raise InvalidArgumentError(
                "retain_for needs local hand-off: a retained lease is handed to the next thread here, within the "
                "hand-off budget (handoff_limit and handoff_window must be above 0)"
            )
        confirmation = ReplicaConfirmation.checked(
            confirm_replicas, confirm_timeout, None if never_expires else lease, confirm_fsync
        )
        retention = checked_fence_retention(fence_retention, None if never_expires else lease, default_fence_retention)
        return cls(
            registry_key=key,
            lease=None if never_expires else lease,
            lock_type=lock_type,  # checked above
            auto_renew=auto_renew and not never_expires,
            max_hold=hold,
            handoff_limit=limit,
            handoff_window=window,
            handoff_contended_window=min(contended_window, window),
            handoff_barge_window=barge,
            retain_for=retain,
            confirmation=confirmation,
            fence_retention=retention,
            fence_retention_given=fence_retention is not None,
        )

    @property
    def expire_after(self) -> float:
        """The lease in seconds (``inf`` for locks that never expire)."""
        return math.inf if self.lease is None else self.lease

    @property
    def lease_ms(self) -> int | None:
        """The lease as the server takes it (None: no expiry)."""
        return None if self.lease is None else lease_ms(self.lease)

    @property
    def fence_retention_ms(self) -> int:
        """``fence_retention`` as the server takes it."""
        return fence_retention_ms(self.fence_retention)

    @property
    def renew_period(self) -> float:
        """Seconds between renewal rounds: a third of the lease, so one late or failed round loses nothing."""
        return self.expire_after / 3

    def valid_until(self, start: float, lease: float | None = None) -> float:
        """Until when a lease taken or renewed at ``start`` is certainly ours: ``start`` plus the lease (this
        registry's, or ``lease`` for one renewed by hand) minus the drift margin; ``inf`` with no expiry.

        A ``lease`` longer than the registry's counts as the registry's: a renewal round or an acquire attempt of
        ours still on its way (sent before, its reply lost or not yet in) may reach the server after it and set
        the registry's lease from then on, so the longer one is not certainly what the server keeps."""
        if self.lease is None:
            return math.inf
        lease = self.lease if lease is None else min(lease, self.lease)
        return start + lease - lease_drift(lease)
