"""An acquire interrupted between the server's grant and the local hold, on threads: the exception a signal handler
raises there (``KeyboardInterrupt``, Celery's ``SoftTimeLimitExceeded`` at a soft time limit) reaches the caller,
and the lease is given back at once, not left held by nobody for ``expire_after`` (issue 33's review: a soft time
limit landing there would orphan the lease). The exception is raised at that point by patching the step that
records the hold: before it records anything, and after it recorded the tenancy.
"""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = [pytest.mark.server, pytest.mark.timeout(60)]


class SoftTimeLimitExceeded(Exception):  # noqa: N818 - Celery's name
    """What Celery's soft time limit raises in the worker, from a signal handler."""


@pytest.mark.parametrize("where", ["before the hold is recorded", "after the tenancy is recorded"])
@pytest.mark.parametrize("error", [KeyboardInterrupt, SoftTimeLimitExceeded])
def test_an_acquire_interrupted_as_the_server_grants_it_gives_the_lease_back(
    make_registry: Any, redis_client: Any, where: str, error: type[BaseException]
) -> None:
    registry = make_registry(expire_after=30.0)
    other = make_registry(expire_after=30.0)
    lock = registry.obtain("interrupted")
    start_tenancy = lock._start_tenancy

    def interrupted_start(*args: Any) -> None:
        del lock._start_tenancy  # (once)
        if where == "before the hold is recorded":
            raise error
        start_tenancy(*args)
        raise error

    lock._start_tenancy = interrupted_start  # type: ignore[method-assign]
    with pytest.raises(error):
        lock.acquire()
    assert not redis_client.exists(lock._names.lock), "the lease was left held by nobody"
    assert other.obtain("interrupted").acquire(blocking=False), "another owner could not take the lock"
    other.obtain("interrupted").release()
    assert lock.acquire(timeout=5), "the lock was left unusable here"
    assert not lock.lost
    lock.release()
