"""Reading a test server's command statistics."""

from __future__ import annotations

from typing import Any


def script_runs(client: Any) -> int:
    """Lua scripts the server ran (EVALSHA and EVAL), not counting refused ones: an EVALSHA that met a cold script
    cache (NOSCRIPT, after another test's ``SCRIPT FLUSH``) is followed by the EVAL that ran it, and counts once."""
    stats = client.info("commandstats")
    return sum(
        stats.get(name, {}).get("calls", 0) - stats.get(name, {}).get("failed_calls", 0)
        for name in ("cmdstat_evalsha", "cmdstat_eval")
    )
