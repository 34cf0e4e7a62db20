"""Running the documentation's examples, and the suite's worker programs, as a user would: a fresh interpreter with
this checkout first on its path and warnings as errors (a warning an example draws is a fault of the documentation:
an unclosed client's ResourceWarning, a ClientSettingsWarning)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["ROOT", "checkout_env", "run_program"]

ROOT = Path(__file__).resolve().parent.parent


def checkout_env(*, warnings: str | None = "error", **variables: str) -> dict[str, str]:
    """This process's environment with this checkout first on ``PYTHONPATH``, ``PYTHONWARNINGS`` set to
    ``warnings`` (None: left as it is), and ``variables`` (``REDIS_URL=...``) set."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        **variables,
    }
    if warnings is not None:
        env["PYTHONWARNINGS"] = warnings
    return env


def run_program(program: str, env: dict[str, str], timeout: float = 90) -> str:
    """Run ``program`` (Python source) in a fresh interpreter; its standard output, once it exited 0 (else the
    assertion shows the end of both outputs)."""
    run = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return run.stdout
