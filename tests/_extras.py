"""The optional packages some test modules need, and the README's install line that brings them all: for the skip
reasons those modules give and the line the run's header prints when one is missing (a module skipped at
collection counts as one skip however many tests it holds: say so where a reader looks)."""

from __future__ import annotations

import importlib.util

#: The README's set-up install line (tests/test_docs.py holds the README to it).
SET_UP_INSTALL = "pip install -e '.[test,celery,django,fastapi]'"

#: The framework integrations' packages, each its own extra; their tests are skipped without them.
INTEGRATIONS = ("celery", "django", "fastapi")


def skip_reason(package: str, extra: str) -> str:
    """Why a module needing ``package`` (from ``extra``) is skipped, and the line that runs it."""
    return f"{package} is not installed (the {extra} extra): {SET_UP_INSTALL} installs it"


def missing(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is None
    except (ImportError, ValueError):
        return True


def missing_integrations() -> list[str]:
    return [package for package in INTEGRATIONS if missing(package)]
