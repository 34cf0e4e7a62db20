"""The ``backend`` fixture of the behavioural suite: each test runs once per backend (see ``helpers.Backend``)."""

from __future__ import annotations

import pytest

from .helpers import BACKENDS, Backend


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Backend:
    if request.param == "redis":
        request.getfixturevalue("redis_client")  # flushes the session's server
        return Backend("redis", request.getfixturevalue("server").url)
    if request.param == "sentinel-confirmed":
        # Every acquire and renewal confirmed by both replicas (WAIT 2).
        return Backend("sentinel-confirmed", request.getfixturevalue("sentinel_url"), confirm_replicas=2)
    if request.param == "cluster":
        return Backend("cluster", request.getfixturevalue("cluster_url"))
    return Backend(request.param)
