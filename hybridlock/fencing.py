"""The resource side of fencing tokens.

A lease can end while its holder still works (a long GC pause, a frozen VM, a slow network): the lock then has a
new holder, and the old one does not know yet. No lock can prevent that; the resource can. Every fresh acquisition
mints a token greater than every earlier one for that key (``lock.fencing_token``), the holder passes it along with
each write, and the resource refuses a write whose token is lower than one it has already accepted.

For data kept in Redis, [fenced_set][hybridlock.fencing.fenced_set] does the check and the write in one script.
For a SQL database, keep the highest token in the row and make it part of the update's condition:

```sql
UPDATE accounts
   SET balance = :balance, fence_token = :token
 WHERE id = :id AND fence_token <= :token
```

An update that matches no row was fenced off: a newer holder has written already, so the stale holder must stop
(treat it as ``LockLostError``). ``tests/test_fencing.py`` runs this statement on SQLite.

Tokens are whole numbers from 0 to [MAX_TOKEN][hybridlock.fencing.MAX_TOKEN] (2^53 - 1): they fit a SQL
``BIGINT``, a JSON number and a JavaScript number exactly. The lock scripts never mint a larger one: a counter a
lock user set at or beyond it makes ``acquire`` raise ``FencingCounterError`` rather than repeat a token.
"""

from __future__ import annotations

from typing import Any

from ._protocol import scripts
from .backends.clients import client_family, server_name
from .backends.redis import ScriptRunner, translated_errors
from .errors import InvalidArgumentError

__all__ = ["MAX_TOKEN", "fenced_set"]

MAX_TOKEN = scripts.MAX_TOKEN
"""The largest fencing token: 2^53 - 1, the largest integer a Lua script (whose numbers are doubles) counts and
compares exactly. ``fenced_set`` refuses a token above it, and the lock scripts never mint one: a counter at or
above it makes ``acquire`` raise ``FencingCounterError``."""


def fenced_set(
    client: Any,
    key: str,
    value: str | bytes | int | float,
    token: int,
    *,
    fence_key: str | None = None,
    expire_after: float | None = None,
) -> bool:
    """Write ``value`` to ``key`` only if ``token`` is at least the highest token written there before.

    Returns True when written, False when a holder with a newer token has written already (the caller's lease
    has ended; it must not go on as if it held the lock). One round trip.

    The highest token is kept in ``fence_key`` (default: ``key + ":fence"``). On Redis Cluster both keys must
    share a slot: give ``key`` a hash tag, e.g. ``"{profile:42}"``. ``expire_after`` (seconds) sets a TTL on
    both keys.

    Raises ``InvalidArgumentError`` for a token that is not an int from 0 to ``MAX_TOKEN`` (the script compares
    in doubles, exact only up to there), and ``FencingCounterError`` when ``fence_key`` holds something that is
    not such a number (nothing is written then: a stale holder must not get through an inexact comparison).
    """
    if not isinstance(key, str) or not key:
        raise InvalidArgumentError("key must be a non-empty str")
    if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token <= MAX_TOKEN:
        raise InvalidArgumentError(
            f"token must be an int from 0 to 2**53 - 1 (a lock's fencing_token), not {token!r}", key=key
        )
    ttl_ms = 0
    if expire_after is not None:
        if isinstance(expire_after, bool) or not isinstance(expire_after, (int, float)) or not expire_after > 0:
            raise InvalidArgumentError(f"expire_after must be a positive number of seconds, not {expire_after!r}")
        ttl_ms = max(1, round(expire_after * 1000))
    family = client_family(client)
    server = server_name(client, family)
    fence = fence_key or f"{key}:fence"
    with translated_errors(key, server, "fenced_set", family):
        runner = ScriptRunner(client, family)
        written = runner.run(scripts.FENCED_SET, (key, fence), (token, value, ttl_ms))
    if isinstance(written, list):  # {OUT_OF_RANGE, the highest token's value}
        raise scripts.fencing_counter_error(
            written[1], key=key, counter=fence, server=server, operation="fenced_set", resource=True
        )
    return bool(written)
