"""The lock's decisions that need no I/O: how long to wait between remote attempts, and whether a release may
keep the server lease for another thread of this process.

A thread that finds the lock held by another process (or another registry) waits for the first of:

* a release notification, when the backend can deliver them (``ReleaseWatch``), or
* the end of the holder's lease, which the failed attempt reported (a crashed holder costs at most its lease), or
* a jittered, exponentially growing backoff when nothing can notify it (``spin``), or the subscription is down.

Only one thread per process and key ever runs this loop: the others wait on the key's local lock and cost the
server nothing.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["WaitPolicy", "may_keep_lease"]

# How long to wait past a reported lease end before re-trying: the server expires the key when its clock passes
# the deadline, so arriving a hair late saves one useless round trip.
_LEASE_END_MARGIN = 0.0005


@dataclass(frozen=True)
class WaitPolicy:
    """Delays between remote attempts.

    ``backoff_initial`` and ``backoff_cap`` bound the polling delay used without notifications (seconds);
    ``notified_cap`` bounds a wait that relies on a notification when the holder's lease has no end, so a lost
    notification costs at most that long.
    """

    backoff_initial: float = 0.002
    backoff_cap: float = 0.1
    notified_cap: float = 5.0

    def pause_after_spurious(self, wakeups: int, holder_ttl: float | None) -> float:
        """Seconds to sleep, deaf to notifications, after ``wakeups`` notified wake-ups in a row whose retry was
        refused (0 for none): the spin mode's backoff, never past the holder's lease end.

        A notification is a hint anyone who can publish on the channel can fake, so a flood of them must cost no
        more round trips than polling would. One refused retry after a genuine release (another owner got in first)
        costs a couple of milliseconds."""
        if wakeups <= 0:
            return 0.0
        return self.delay(wakeups - 1, holder_ttl, notified=False)

    def delay(self, attempt: int, holder_ttl: float | None, notified: bool) -> float:
        """Seconds to wait before attempt ``attempt + 1``, never past the holder's lease end."""
        if notified:
            delay = self.notified_cap
        else:
            ceiling = min(self.backoff_cap, self.backoff_initial * (2 ** min(attempt, 30)))
            # Full jitter over the upper half: waiters of several processes spread out instead of arriving together.
            delay = random.uniform(ceiling / 2, ceiling)
        if holder_ttl is not None:
            delay = min(delay, holder_ttl + _LEASE_END_MARGIN)
        return delay


def may_keep_lease(
    *,
    lost: bool,
    in_server: bool,
    contended: bool,
    passes: int,
    acquired_at: float | None,
    now: float,
    handoff_limit: int,
    handoff_window: float,
    contended_window: float = 0.0,
) -> bool:
    """Whether a final release may keep the server lease for a thread of this process waiting for the lock (or,
    when not ``contended``, with ``retain_for`` for whichever thread here asks next), as far as the tenancy's own
    state tells.

    Only while the lease is sound and the hand-off budget is not spent: at most ``handoff_limit`` passes and
    ``handoff_window`` seconds per tenancy. Once another owner is known to want the lock (``contended``), the
    window shrinks to ``contended_window`` (0: no pass at all): lock cohorting's bounded batch. A global hand-off
    costs a release, a wake-up and an acquire, several times a local pass; letting the local threads have a short
    batch first amortises it, and the bound on the batch (count and time from the grant) bounds how long the other
    owner waits. (The caller also asks its subscription whether another owner announced itself since.)"""
    if lost or not in_server or passes >= handoff_limit or acquired_at is None:
        return False
    window = min(contended_window, handoff_window) if contended else handoff_window
    return now - acquired_at < window
