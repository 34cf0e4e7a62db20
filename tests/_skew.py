"""Servers whose wall clock runs ahead of (or behind) the machine's, for tests of fencing tokens under clock skew.

A token is the server clock in microseconds when the counter is behind it, so skew between the servers of a
quorum is what sends a token above what another server would mint. A small shared object, compiled with gcc at
test time into a temporary directory and loaded into one ``redis-server`` (or ``valkey-server``) with
``LD_PRELOAD``, shifts ``CLOCK_REALTIME`` (``clock_gettime``, ``gettimeofday``, ``time``) by
``HYBRIDLOCK_CLOCK_SKEW_US`` microseconds; the monotonic clock, which leases are counted with, is left alone (as NTP
leaves it). libfaketime would do the same, but is not installed everywhere and crashes some jemalloc builds.

The ``clock_shim`` fixture (``tests/conftest.py``, built once per session) skips the test, saying why, only when gcc
is absent or cannot build the shim; CI has gcc.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import redis

from hybridlock.testing import EmbeddedServer

__all__ = ["build_clock_shim", "server_clock_us", "skewed_server"]

_SOURCE = r"""
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long offset_us(void) {
    static long long cached = 0;
    static int known = 0;
    if (!known) {
        const char *text = getenv("HYBRIDLOCK_CLOCK_SKEW_US");
        cached = text ? atoll(text) : 0;
        known = 1;
    }
    return cached;
}

int clock_gettime(clockid_t clock, struct timespec *now) {
    /* The system call itself: the C library's own clock_gettime is the symbol this one replaces. */
    int failed = syscall(SYS_clock_gettime, clock, now);
    if (!failed && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) {
        long long ns = (long long)now->tv_sec * 1000000000LL + now->tv_nsec + offset_us() * 1000LL;
        now->tv_sec = ns / 1000000000LL;
        now->tv_nsec = ns % 1000000000LL;
    }
    return failed;
}

int gettimeofday(struct timeval *now, void *zone) {
    struct timespec exact;
    int failed = clock_gettime(CLOCK_REALTIME, &exact);
    if (!failed && now) {
        now->tv_sec = exact.tv_sec;
        now->tv_usec = exact.tv_nsec / 1000;
    }
    (void)zone;
    return failed;
}

time_t time(time_t *out) {
    struct timespec exact;
    clock_gettime(CLOCK_REALTIME, &exact);
    if (out) {
        *out = exact.tv_sec;
    }
    return exact.tv_sec;
}
"""


def build_clock_shim(directory: Path) -> str:
    """Compile the shim into ``directory``; returns its path. Skips the calling test when gcc is missing or fails
    (the ``clock_shim`` fixture in ``tests/conftest.py`` calls this once per session)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed: the clock-skew shim for the servers cannot be built")
    source, shim = directory / "skew.c", directory / "libskew.so"
    source.write_text(_SOURCE)
    built = subprocess.run(
        [gcc, "-shared", "-fPIC", "-O2", "-o", str(shim), str(source)], capture_output=True, text=True, timeout=60
    )
    if built.returncode != 0:
        pytest.skip(f"gcc could not build the clock-skew shim: {built.stderr.strip()[:500]}")
    return str(shim)


def skewed_server(shim: str, skew: float) -> EmbeddedServer:
    """A started server whose wall clock runs ``skew`` seconds ahead of this machine's (behind, if negative).

    ``EmbeddedServer`` passes this process's environment on, so the variables are set for the start only (tests run
    one at a time; nothing else starts a process meanwhile)."""
    names = ("LD_PRELOAD", "HYBRIDLOCK_CLOCK_SKEW_US")
    saved = {name: os.environ.get(name) for name in names}
    os.environ["LD_PRELOAD"] = shim
    os.environ["HYBRIDLOCK_CLOCK_SKEW_US"] = str(round(skew * 1_000_000))
    try:
        server = EmbeddedServer().start()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    try:
        ahead = server_clock_us(server) / 1e6 - time.time()
        if abs(ahead - skew) > 2.0:
            raise AssertionError(f"the clock shim did not take: the server is {ahead:.1f} s ahead, not {skew} s")
    except BaseException:
        server.stop()
        raise
    return server


def server_clock_us(server: EmbeddedServer) -> int:
    """The server's wall clock (``TIME``) in microseconds: what its next token would be from a lower counter."""
    with redis.Redis(port=server.port) as client:
        seconds, micros = client.time()
    return seconds * 1_000_000 + micros
