"""What travels for a direct grant (see ``scripts``, "The queue of owners"): the name of a waiter's place in a queue,
its box, and the grant message the scripts push there. Pure: names in, names out.

A single lock's wait holds a place named ``<owner>|<wait id>|<lease in ms>``; whoever frees the lock while it heads
the queue pushes ``<wait id>:<arrival>:<token>:<contended>`` to the owner's box, ``<lock key>:grant:<owner>``
(``refused`` in place of the token when no token could be minted; arrival 0 for a grant an acquire pushed to
itself).
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["GrantMessage", "box_of", "owner_of_place", "place_name", "read_grant", "wait_id_of"]

_SEPARATOR = "|"


def place_name(owner: str, wait_id: str, lease_ms: int) -> str:
    """The queue place of one wait of ``owner`` that asks to be granted the lock (for a lease of ``lease_ms``)."""
    return f"{owner}{_SEPARATOR}{wait_id}{_SEPARATOR}{lease_ms}"


def wait_id_of(place: str) -> str:
    """The wait id in a place named by ``place_name``."""
    return place.split(_SEPARATOR)[1]


def owner_of_place(place: str) -> str:
    """The owner a queue place belongs to (a place of either kind: ``<owner>`` or ``place_name``'s)."""
    return place.partition(_SEPARATOR)[0]


def box_of(lock_key: str, owner: str) -> str:
    """The list in which ``owner`` is handed the grants of the lock ``lock_key``: in the lock's cluster slot (it
    extends the lock key, hash tag included)."""
    return f"{lock_key}:grant:{owner}"


class GrantMessage(NamedTuple):
    """A grant read from a box, for the wait it names."""

    #: The token minted for the grant; None when the server could not mint one (its counter is out of range).
    token: int | None
    #: Other owners wait for the lock.
    contended: bool


def read_grant(message: str, wait_id: str, arrival: int | None) -> GrantMessage | None:
    """The grant ``message`` (a box's entry) makes to the wait ``wait_id`` whose place was taken at ``arrival`` (the
    server's time, as the queueing attempt reported it); None when it is not one: malformed, for another wait, for an
    earlier place of this wait, or for a place whose arrival we do not know (``arrival`` None)."""
    parts = message.split(":")
    if len(parts) != 4 or parts[0] != wait_id:
        return None
    granted_arrival, token, contended = parts[1:]
    if arrival is None or granted_arrival != str(arrival):
        return None
    if token == "refused":
        return GrantMessage(None, False)
    if not token.isdigit():
        return None
    return GrantMessage(int(token), contended == "1")
