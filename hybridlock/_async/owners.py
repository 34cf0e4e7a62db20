"""Holds whose holder is gone: a thread that ended, or a task that finished, still holding a lock.

Nothing can release such a hold any more: a lock is released by its holder, and the holder is gone (a thread that
forgot its ``finally``, died of an exception it did not catch, or a task that returned past its ``release``).
Renewed for ever, it would keep every other owner out until the process exits, and every other thread here queued
behind it for as long. So the registry's worker (the renewer, ``renewer.py``) looks at the holders of every lease at
each round (every ``expire_after / 3``; every second in a registry without leases, ``LocalLockRegistry``):

* a hold none of whose holders here is still there is *abandoned*: it is no longer renewed, a warning names the
  key, the holder and where it took the lock (logged once), and ``statistics()`` (``abandoned``) and
  ``hybridlock inspect`` show it;
* it ends when its lease runs out, as a crashed process's would: at its ``valid_until`` the worker releases it in
  the server (the key is due to expire by then; the release wakes the owners waiting for it) and here, where the
  next thread (or task) queued for the local lock takes it afresh: a new tenancy, with a new fencing token, won in
  the server like any other owner's. A registry without leases has nothing to run out: the hold ends at once.

Other owners thus get the lock within about ``expire_after`` plus a renewal period of the holder's end, and threads
of this process no sooner than they do (they wait in the server queue with everyone else). A reader thread that
ends holding its part of a read hold that other reader threads here still share is dropped from it (with the same
warning); the read hold goes on with them.

What is not detected: a holder that is still there but will never release (it waits for ever, or lost the lock
object); a thread started outside ``threading`` that calls into Python once per job with a fresh thread state
(each call is a new thread to Python, and to hybridlock). A lease kept idle by ``retain_for``, or passed between
threads here, has no holder at that moment, and is not abandoned.

Where a lock was taken: each holder's first (not reentrant) acquire records the code object and the instruction
of the first frame outside hybridlock, a few attribute reads and no stack capture; it becomes ``file:line`` only
when shown.
"""

from __future__ import annotations

import logging
import os
import sys
from types import FrameType
from typing import TYPE_CHECKING

from ._compat import OWNER_ENDED, OWNER_KIND, owner_name
from .roles import Site

if TYPE_CHECKING:
    from .roles import HeldLease, PieceContext

__all__ = ["Site", "caller_frame", "caller_site", "site_text", "watch_owner"]

logger = logging.getLogger("hybridlock.lock")


def caller_frame() -> FrameType | None:
    """The frame that called the function calling this (a few attribute reads; None when there is none: a function
    called straight from C, as by ``_thread.start_new_thread(lock.acquire, ())``)."""
    try:
        return sys._getframe(2)
    except ValueError:
        return None


def caller_site(frame: FrameType | None) -> Site:
    """Where the code that called into hybridlock from ``frame`` is: ``frame``, or the first frame above it outside
    the package (and outside the standard library's ``threading`` and ``contextlib``, which only pass a ``with`` on:
    ``Condition``, ``ExitStack``). None when that is asyncio's own (a task whose coroutine is the acquire itself:
    nothing of the caller is left)."""
    while frame is not None:
        code = frame.f_code
        place = _places.get(code.co_filename) or _place_of(code.co_filename)
        if place == _OUTSIDE:  # (at once, in the common case: called from the program's own code)
            return code, frame.f_lasti
        if place == _ASYNCIO:
            return None
        frame = frame.f_back
    return None


# Where a source file is, by the name its code objects give it (as imported: __file__ may be spelled otherwise).
_OUTSIDE, _PACKAGE, _ASYNCIO = 1, 2, 3
_PACKAGE_DIR = os.path.dirname(os.path.dirname(caller_site.__code__.co_filename)) + os.sep
_STDLIB = os.path.dirname(os.__file__)
_ASYNCIO_DIR = os.path.join(_STDLIB, "asyncio") + os.sep
_PASSING_ON = {os.path.join(_STDLIB, "threading.py"), os.path.join(_STDLIB, "contextlib.py")}
_places: dict[str, int] = {}  # file name -> place: a few hundred entries at most (the files that call locks)


def _place_of(filename: str) -> int:
    place = _OUTSIDE
    if filename.startswith(_PACKAGE_DIR) or filename in _PASSING_ON:
        place = _PACKAGE
    elif filename.startswith(_ASYNCIO_DIR):
        place = _ASYNCIO
    _places[filename] = place
    return place


def site_text(site: Site) -> str | None:
    """``file:line`` of a ``Site`` (None for none)."""
    if site is None:
        return None
    code, offset = site
    line = next((line for start, end, line in code.co_lines() if start <= offset < end and line), None)
    return f"{code.co_filename}:{line or code.co_firstlineno}"


async def watch_owner(lease: HeldLease, context: PieceContext, now: float) -> bool:
    """Look at ``lease``'s holders here (from the registry's worker, at ``now``): report holders that are gone
    (once), and end an abandoned hold whose lease has run out. Returns whether the hold is abandoned (and so must
    not be renewed)."""
    if not lease._abandoned:
        gone = lease._find_abandoned()
        if gone:
            _report(lease, context, gone)
        if not lease._abandoned:
            return False
    until = lease._valid_until
    if context.config.lease is None or until is None or until <= now:
        try:
            await lease._end_abandoned()
        except Exception:
            # Never stop the worker: the hold is tried again at the next round.
            logger.exception("hybridlock: could not end the abandoned hold of %r", lease.key)
    return True


def _report(lease: HeldLease, context: PieceContext, gone: list[tuple[object, Site]]) -> None:
    kind = getattr(lease, "kind", "lock")
    what = "lock" if kind == "lock" else f"{kind} lock"
    config = context.config
    holder = OWNER_KIND
    if not lease._abandoned:
        fate = "its part of the read hold is dropped; the other readers here keep it"
    elif config.lease is None:
        fate = "the lock is released now (this registry's locks have no lease to run out)"
    else:
        fate = (
            f"its lease is no longer renewed and ends within {config.lease:g} s, as if its process had crashed; "
            f"{holder}s here waiting for it take it afresh then"
        )
    ended = OWNER_ENDED
    for owner, site in gone:
        name = owner_name(owner)
        logger.warning(
            "hybridlock: the %s %s %s still holding the %s %r (registry %r on %s), taken at %s: %s. "
            "Release locks in a with statement or a finally block.",
            holder,
            repr(name) if name is not None else repr(owner),
            ended,
            what,
            lease.key,
            config.registry_key,
            context.server,
            site_text(site) or "an unknown place",
            fate,
        )
