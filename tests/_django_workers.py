"""A management command guarded by ``LockedCommand``, run as ``manage.py`` runs one (``run_from_argv``), for the
two-process tests of ``tests/test_django.py``.

``python -m tests._django_workers [--lock-timeout S ...]``, with ``REDIS_URL`` and ``REGISTRY_KEY`` set: the command
prints ``running <time>``, then works until a line arrives on its stdin (the test says when), then prints
``done <time>``. At exit it prints to stderr whether the registry it used was closed by then (by
``hybridlock.contrib.django``'s exit handler).
"""

from __future__ import annotations

import atexit
import os
import sys
import time

import django
from django.conf import settings

used: list[object] = []


def _say_whether_closed() -> None:
    # Registered before hybridlock.contrib.django is imported, so it runs after that module's exit handler (last in,
    # first out).
    for registry in used:
        print(f"registry closed at exit: {registry.closed}", file=sys.stderr)  # type: ignore[attr-defined]


atexit.register(_say_whether_closed)

settings.configure(HYBRIDLOCK={"URL": os.environ["REDIS_URL"], "OPTIONS": {"registry_key": os.environ["REGISTRY_KEY"]}})
django.setup()

from django.core.management.base import BaseCommand  # noqa: E402 (after settings)

from hybridlock.contrib.django import LockedCommand, get_registry  # noqa: E402


class Command(LockedCommand, BaseCommand):
    help = "A nightly job that must never overlap itself."

    def handle(self, *args: object, **options: object) -> None:
        used.append(get_registry())
        self.stdout.write(f"running {time.time()!r}")
        self.stdout.flush()
        sys.stdin.readline()
        self.stdout.write(f"done {time.time()!r}")


if __name__ == "__main__":
    Command().run_from_argv(["manage.py", "nightly", *sys.argv[1:]])
