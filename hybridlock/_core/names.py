"""How a lock key becomes server key names.

A lock ``key`` in a registry with ``registry_key`` ``R`` uses these names in the server::

    R:{key}            the lock itself (a string whose value is the owner's client_id; "<client_id>|<token>" for a
                       lock granted by a release, see ``scripts.grant``)
    R:{key}:fence      the fencing-token counter
    R:{key}:wake       the pub/sub channel a release publishes on
    R:{key}:queue      the owners waiting for the lock, in arrival order (a sorted set)
    R:{key}:queue-until  when each queued owner's wish lapses unless renewed by its next attempt (a sorted set)

and a read-write lock on ``key`` (``registry.obtain_read_write``) these, apart from the plain lock's::

    R:{key}:writer     the write hold (a string whose value is the writer's client_id)
    R:{key}:readers    the read holds (a sorted set: client_id -> when that reader's hold expires, server ms)
    R:{key}:writers    owners waiting to write (a sorted set: client_id -> when that wish expires); while it is
                       not empty, new readers wait behind them
    R:{key}:rw-wake    the channel releases publish on

The fencing counter ``R:{key}:fence`` is shared with the plain lock of the same key (it only ever increases).

and a semaphore on ``key`` (``registry.obtain_semaphore``) these, apart from the shared fencing counter::

    R:{key}:permits    a hash: "limit" (how many permits may be held), "span" (how many permit slots to look at:
                       at least the limit, more while holders of a larger limit drain); kept ``fence_retention``
                       after the last acquire attempt, ``set_permits`` or renewal of a permit
    R:{key}:permit:<i> permit slot i (0 <= i < span): a string whose value is the tenancy, the tag of the acquire
                       it was granted to ("<client_id>|<wait id>"), with the holder's lease as its TTL: the renewer
                       renews it as a plain lock key held under that value, the release and the hand-over compare
                       it, and an acquire cut off in flight gives back the slot of its tag
    R:{key}:permit:cancelled:<tag>  an acquire given up while in flight: it takes nothing should it come later
    R:{key}:sem-wake   the channel a permit's release publishes on
    R:{key}:sem-queue  the owners waiting for a permit, in arrival order (a sorted set)
    R:{key}:sem-queue-until  when each waiting owner's place lapses unless its next attempt keeps it (a sorted set)

Each owner (a registry in a process) may also describe itself, for operators (``hybridlock inspect``)::

    R:owner:<client_id>  a hash: "host", "pid", "started_at" (when the registry was made, Unix seconds), and one
                         field per lease it holds, named after the lease's server key (``R:{key}``,
                         ``R:{key}:writer``, ``R:{key}:readers``), whose value is JSON: the holding thread's or
                         task's name, when the tenancy was granted and its fencing token

It is written off the hot path, by the registry's renewer (``hybridlock._async.describer``), and lives a while
longer than the owner's leases. It shares no name with a lock: every lock name has ``{`` right after ``R:``.

Why this shape:

* Everything between the first ``{`` and the next ``}`` is the Redis Cluster hash tag, and every name above
  starts with the same ``R:{key`` prefix, so all the names of one lock hash to one slot (even when ``key`` itself
  contains ``}``: the tag then ends early, but at the same place in every name). One Lua script may therefore
  touch all of them on a cluster. A key may not *start* with ``}``: the tag would be empty, and Redis then hashes
  each name whole.
* ``R`` may not contain ``{`` or ``}``, so the first ``{`` marks where ``R`` ends: two different
  ``(registry_key, key)`` pairs can never produce the same lock name. No name's ending (``}``, ``}:fence``,
  ``}:wake``, ``}:queue``, ``}:queue-until``, ``}:writer``, ``}:readers``, ``}:writers``, ``}:rw-wake``,
  ``}:permits``, ``}:permit:<i>``, ``}:sem-wake``, ``}:sem-queue``, ``}:sem-queue-until``) is an ending of
  another, so a name of one lock never equals a name of another.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

from ..errors import InvalidArgumentError


@dataclass(frozen=True)
class LockNames:
    """The server names one lock uses; see the module docstring for the layout."""

    key: str
    lock: str
    fence: str
    channel: str
    queue: str
    queue_until: str
    #: What the lock key holds while it is the current tenancy's, where that is not the owner id alone: a lock
    #: granted by a release holds "<client_id>|<token>", a permit slot "<client_id>|<wait id>". Renewals and the
    #: release compare it, so a later grant of the key to the same owner is never taken for this tenancy.
    tenancy: str = ""


@dataclass(frozen=True)
class PermitNames(LockNames):
    """A semaphore's permit slot as the lease table and the renewer see it (``SemaphoreNames.permit``): a plain lock
    key (``lock``, the slot), and the semaphore's ``config``, which each renewal keeps alive too (its limit must
    outlive the permits held under it). ``tenancy`` is what the slot holds while it is this permit's (the tag of the
    acquire it was granted to, ``"<client_id>|<wait id>"``): a renewal renews that tenancy only."""

    config: str = ""


@dataclass(frozen=True)
class ReadWriteNames:
    """The server names of one read-write lock; ``read`` and ``write`` are the views the renewer uses."""

    key: str
    writer: str
    readers: str
    writers_waiting: str
    fence: str
    channel: str

    @property
    def write(self) -> LockNames:
        return LockNames(self.key, self.writer, self.fence, self.channel, self.writers_waiting, self.writers_waiting)

    @property
    def read(self) -> LockNames:
        return LockNames(self.key, self.readers, self.fence, self.channel, self.writers_waiting, self.writers_waiting)


@dataclass(frozen=True)
class SemaphoreNames:
    """The server names of one semaphore; ``slot(i)`` is the name of its permit slot ``i``."""

    key: str
    config: str
    fence: str
    channel: str
    slot_prefix: str
    queue: str
    queue_until: str

    def slot(self, index: int) -> str:
        return f"{self.slot_prefix}{index}"

    def permit(self, index: int, tenancy: str = "") -> PermitNames:
        """The view of permit slot ``index`` held under ``tenancy`` (its acquire's tag) the lease table and the
        renewer use: a plain lock key (the slot), and the semaphore's fence, channel, queue and config."""
        return PermitNames(
            self.key,
            self.slot(index),
            self.fence,
            self.channel,
            self.queue,
            self.queue_until,
            tenancy=tenancy,
            config=self.config,
        )

    @property
    def waiting(self) -> LockNames:
        """The view a waiter uses: ``channel`` is what it listens to; ``lock`` names the config."""
        return LockNames(self.key, self.config, self.fence, self.channel, self.queue, self.queue_until)


def _check_encodable(what: str, value: str) -> None:
    # Names go to the server as UTF-8; a lone surrogate ("\ud800") has no UTF-8 form and would otherwise fail
    # only at the first acquire, as a raw UnicodeEncodeError.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgumentError(f"{what} {value!r} cannot be encoded as UTF-8 ({exc.reason})") from None


def validate_registry_key(registry_key: object) -> str:
    if not isinstance(registry_key, str):
        raise InvalidArgumentError(f"registry_key must be a str, not {type(registry_key).__name__}")
    if not registry_key:
        raise InvalidArgumentError("registry_key must not be empty")
    _check_encodable("registry_key", registry_key)
    if "{" in registry_key or "}" in registry_key:
        raise InvalidArgumentError(
            f"registry_key {registry_key!r} must not contain '{{' or '}}': they delimit the lock key's hash tag"
        )
    return registry_key


def validate_key(key: object) -> str:
    if not isinstance(key, str):
        raise InvalidArgumentError(f"lock key must be a str, not {type(key).__name__}")
    if not key:
        raise InvalidArgumentError("lock key must not be empty")
    if key.startswith("}"):
        # "R:{}..." has an empty hash tag: Redis Cluster would hash each name whole and scatter one lock's names
        # over several slots.
        raise InvalidArgumentError(f"lock key {key!r} must not start with '}}' (it would empty the hash tag)")
    _check_encodable("lock key", key)
    return key


def validate_key_template(template: object) -> None:
    """Refuse a ``str.format`` key template whose own text makes every key it gives one ``validate_key`` refuses
    (a key with no placeholder that starts with ``}``, text with no UTF-8 form, ...), so that a decorator or
    dependency declared with it is refused when declared, not at every call. Each placeholder stands for a
    non-empty value here; what a call's values make of the key is checked at that call. A template that does not
    parse is left to the caller to report."""
    if not isinstance(template, str) or not template:
        raise InvalidArgumentError("the lock key template must be a non-empty str")
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError:
        return
    if all(field is None for _, field, _, _ in parsed):
        validate_key("".join(literal for literal, _, _, _ in parsed))
        return
    sample = "".join(literal + ("" if field is None else "x") for literal, field, _, _ in parsed)
    try:
        validate_key(sample)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"lock key template {template!r} gives no key a lock can have: {exc}") from None


def lock_names(registry_key: str, key: str) -> LockNames:
    base = f"{registry_key}:{{{key}}}"
    return LockNames(
        key=key,
        lock=base,
        fence=f"{base}:fence",
        channel=f"{base}:wake",
        queue=f"{base}:queue",
        queue_until=f"{base}:queue-until",
    )


def owner_key(registry_key: str, client_id: str) -> str:
    """The hash in which the owner ``client_id`` of registry ``registry_key`` describes itself."""
    return f"{registry_key}:owner:{client_id}"


def read_write_names(registry_key: str, key: str) -> ReadWriteNames:
    base = f"{registry_key}:{{{key}}}"
    return ReadWriteNames(
        key=key,
        writer=f"{base}:writer",
        readers=f"{base}:readers",
        writers_waiting=f"{base}:writers",
        fence=f"{base}:fence",
        channel=f"{base}:rw-wake",
    )


def semaphore_names(registry_key: str, key: str) -> SemaphoreNames:
    base = f"{registry_key}:{{{key}}}"
    return SemaphoreNames(
        key=key,
        config=f"{base}:permits",
        fence=f"{base}:fence",
        channel=f"{base}:sem-wake",
        slot_prefix=f"{base}:permit:",
        queue=f"{base}:sem-queue",
        queue_until=f"{base}:sem-queue-until",
    )
