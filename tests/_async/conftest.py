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
    if request.param == "quorum":
        kind = getattr(request.node, "callspec", None) and request.node.callspec.params.get("kind")
        if getattr(kind, "name", None) in ("read", "write") or "read" in request.node.originalname:
            pytest.skip("read-write locks are refused over a quorum (test_quorum.py checks the refusal)")
        return Backend("quorum", request.getfixturevalue("quorum_urls"))
    return Backend(request.param)
