"""The workloads. Each takes a contender id and the server URL, and returns one result row for the tables.

One module per group of workloads, as ``--only`` chooses them and the results show them: ``core`` (1-5: the plain
lock against its peers), ``handoff`` (6-8: the local hand-off between threads of one process; 10: the take-over
between two owners), ``rw`` (9: a read-mostly load on a read-write lock), ``aio`` (11-14: the asyncio API) and
``prefork`` (15-17: N processes of one thread or task each on one key, where every hand-over goes through the
cross-process wake-up path). What they share is in ``base`` (settings, the ``Workload`` record, result rows) and
``contention`` (threads and processes cycling on one key).

Every critical section increments a shared counter non-atomically (``measure.Counter``: GET then SET in Redis;
``measure.LocalCounter``: a Python int read, ``time.sleep(0)``, written back), and every workload checks at the end
that the counter equals the number of cycles run (of writes, in the read-mostly one): a lock that ever let two
holders in loses increments, and the run fails. Every loop is bounded both in count and in time.

Processes are started with the ``spawn`` method: each child builds its own client (and registry) from the URL, as
a separate program would, and nothing is inherited from the harness's threads.
"""

from __future__ import annotations

import re

from . import aio, core, handoff, prefork, rw
from .base import FULL, QUICK, Settings, Workload
from .prefork import PREFORK_PROCESSES

__all__ = ["FULL", "METRICS", "PREFORK_PROCESSES", "QUICK", "WORKLOADS", "Settings", "Workload"]


def _number(workload: Workload) -> tuple[int, str]:
    """The workload's number in the tables (``"3b. ..."`` -> ``(3, "b")``)."""
    match = re.match(r"(\d+)(\w*)\. ", workload.title)
    assert match is not None, workload.title
    return int(match[1]), match[2]


#: Every workload, in the tables' order: by number, which interleaves the groups (10, the take-over, is a hand-off
#: workload that comes after 9, the read-mostly one).
WORKLOADS = tuple(
    sorted((*core.WORKLOADS, *handoff.WORKLOADS, *rw.WORKLOADS, *aio.WORKLOADS, *prefork.WORKLOADS), key=_number)
)

METRICS = {w.name: w.metrics for w in WORKLOADS}
