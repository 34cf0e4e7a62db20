"""The Celery app that tests/test_celery.py starts workers on (``celery -A tests._celery_app worker``).

Broker, results and the locks share the server named by ``HYBRIDLOCK_CELERY_URL`` (databases 1, 2 and 0); the tasks
keep their bookkeeping in database 3: ``levels:<name>`` lists how many runs of ``name`` were running as each run
started (the invariant: never above 1 for a single-instance task, never above the permits for a limited one),
``pid:<name>`` the worker process of the latest run (to kill it), ``ran:<name>`` how many runs did the work. A run
with ``hold`` -1 holds on until the test pushes to ``go:<name>``.

Run as ``celery beat`` with ``HYBRIDLOCK_CELERY_BEAT=<run>:<queue>``, the app has one schedule entry, ``beat_tick``
every ``BEAT_EVERY`` seconds of the wall clock, sent to ``queue``; the beat lists each copy it sent, with its
occurrence, in ``sent:<run>``.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime

import redis
from celery import Celery, signals
from celery.schedules import schedstate, schedule

from hybridlock.contrib.celery import CeleryLocks

URL = os.environ["HYBRIDLOCK_CELERY_URL"]
BASE = URL.rsplit("/", 1)[0]
EXPIRE_AFTER = float(os.environ.get("HYBRIDLOCK_CELERY_EXPIRE_AFTER", "2"))

app = Celery("hybridlock_celery_tests", broker=f"{BASE}/1", backend=f"{BASE}/2")
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
locks = CeleryLocks(app, URL, expire_after=EXPIRE_AFTER)
book = redis.Redis.from_url(f"{BASE}/3")


@signals.worker_ready.connect
def _ready(sender: object, **kwargs: object) -> None:
    book.set(f"ready:{getattr(sender, 'hostname', '?')}", 1)


def _run(name: str, hold: float) -> int:
    book.set(f"pid:{name}", os.getpid())
    book.rpush(f"levels:{name}", book.incr(f"running:{name}"))
    try:
        if hold < 0:  # until the test says go (a push on go:<name>), 30 s at most
            book.blpop([f"go:{name}"], timeout=30)
        else:
            time.sleep(hold)
        book.incr(f"ran:{name}")
    finally:
        book.decr(f"running:{name}")
    return os.getpid()


@app.task
@locks.single_instance("exclusive:{name}")
def exclusive(name: str, hold: float) -> int:
    return _run(name, hold)


@app.task(bind=True)
@locks.single_instance("exclusive:{name}", on_busy="wait", timeout=30)
def exclusive_wait(self: object, name: str, hold: float) -> int:
    return _run(name, hold)


@app.task(bind=True)
@locks.single_instance("exclusive:{name}", on_busy="retry", retry_after=0.05, max_retries=1000)
def exclusive_retry(self: object, name: str, hold: float) -> int:
    return _run(name, hold)


@app.task(bind=True, max_retries=5)
@locks.single_instance("exclusive:{name}")
def exclusive_then_retry(self: object, name: str) -> int:
    if book.incr(f"tries:{name}") < 3:
        raise self.retry(countdown=0.05)  # type: ignore[attr-defined]
    return _run(name, 0)


@app.task
@locks.single_instance("exclusive:{name}")
def exclusive_fails(name: str) -> None:
    _run(name, 0)
    raise ValueError(f"{name} failed")


@app.task(time_limit=1)
@locks.single_instance("exclusive:{name}")
def hard_limited(name: str) -> int:
    return _run(name, 60)


@app.task
@locks.runs_once("nightly:{day}", at_least_for=3)
def nightly(day: str, hold: float) -> int:
    return _run(f"nightly:{day}", hold)


@app.task
@locks.limit("limited:{name}", permits=2, timeout=30)
def limited(name: str, hold: float) -> int:
    return _run(name, hold)


#: The beat test's schedule: seconds between occurrences. The replicas' copies of one occurrence go out within
#: milliseconds of each other; at_least_for, half of it, keeps the key well past them and frees it well before the next.
BEAT_EVERY = 3.0


class every_aligned(schedule):  # noqa: N801 - named as Celery's own schedules are (crontab, solar)
    """Due at each multiple of ``run_every`` of the wall clock, on every beat replica alike, as ``crontab`` is at
    the top of each minute (an interval ``schedule`` counts from each beat's start, so replicas drift apart)."""

    def is_due(self, last_run_at: datetime) -> schedstate:
        every, now = self.run_every.total_seconds(), time.time()
        last = self.maybe_make_aware(last_run_at).timestamp()
        return schedstate(now // every > last // every, every - now % every)


@app.task
@locks.runs_once("beat:{run}", at_least_for=BEAT_EVERY / 2)
def beat_tick(run: str) -> int:
    return _run(f"beat:{run}", 0)


if "HYBRIDLOCK_CELERY_BEAT" in os.environ:  # a beat process of the beat test
    _beat_run, _beat_queue = os.environ["HYBRIDLOCK_CELERY_BEAT"].split(":")
    app.conf.beat_schedule = {
        "tick": {
            "task": beat_tick.name,
            "schedule": every_aligned(BEAT_EVERY),
            "args": (_beat_run,),
            "options": {"queue": _beat_queue},
        }
    }

    @signals.after_task_publish.connect
    def _sent(sender: object, headers: dict[str, object], **kwargs: object) -> None:
        occurrence = int(time.time() // BEAT_EVERY)
        book.rpush(f"sent:{_beat_run}", json.dumps([headers["id"], occurrence, _beat_queue]))
