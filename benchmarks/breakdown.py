"""Where the time of one cross-process hand-off goes, against the round-trip floor.

    python -m benchmarks.breakdown                                   # hybridlock and python-redis-lock
    python -m benchmarks.breakdown --contenders hybridlock --handoffs 200 --json /tmp/breakdown.json

Workload 4's set-up, with a timeline: process A holds the lock while process B waits in ``acquire()``; after a
random 20-120 ms A releases. Both processes give their contender a client whose connections note, on the
system-wide monotonic clock, each request they write and each reply (or pub/sub message) they read, with the
thread that did it (``TracingConnection``, given through redis-py's ``connection_class``: the two child processes
set ``contenders.client_connection_class`` to it before making their session; nothing inside a lock library is
touched or patched). From those notes each hand-off is cut into:

* **release**: A calls ``release()`` -> A has written the request whose reply is the last its thread reads inside
  the call (the release's), and **release round trip**: that request written -> its reply read;
* **notify**: that reply -> B has read the wake-up: the first reply B's process reads after A's call began to a
  request sent before it, i.e. a pub/sub message, or the reply to a blocking command (``BLPOP``) B was waiting
  in (whichever thread reads it). Negative when B reads it before A reads its own reply;
* **wake**: the wake-up read -> B's acquiring thread has written the request that got it the lock (the last reply
  that thread reads inside ``acquire()`` is that request's);
* **acquire round trip**: that request written -> its reply read. When the lock came with the wake-up itself (the
  last reply is to a request sent before the release, as when a release hands the lock to a waiter blocked in
  ``BLPOP``), wake and acquire round trip are 0: no round trip after the wake-up;
* **finish**: that reply -> ``acquire()`` returns;

plus the **total** (A calls ``release()`` -> B's ``acquire()`` returns), the requests B's acquiring thread wrote
after the wake-up, and the **round-trip floor**: a ``PING`` on B's lock client, timed around ``client.ping()``
(5 after each hand-off): what one round trip through redis-py costs on this machine at this moment. The columns
are medians over the hand-offs (each split's own median: they need not add up to the total's); a lock that polls
has no wake-up, so its notify and wake are empty. Its own module, not part of ``benchmarks.run``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import random
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, ClassVar

if __package__ in (None, ""):  # run as a script: python benchmarks/breakdown.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from benchmarks import contenders
from benchmarks.contenders import CONTENDERS, CountingConnection, contender_available, make_session
from benchmarks.measure import Counter, percentile
from benchmarks.run import _load
from benchmarks.workloads.base import _SLACK, FULL, Settings, _collect, _cycle, _reap, _recv
from hybridlock.testing.server import EmbeddedServer, ServerNotFoundError

#: Hand-offs at the start left out of the numbers: connections, scripts and subscriptions being set up.
WARMUP = 3
PINGS = 5

# A note: (kind "send" or "read", monotonic time, connection id, thread id, detail). A send's detail is the
# command's name; a read's is when its connection last wrote a request (the request this is the reply to, or, for
# a pub/sub message, the last command on that connection).
Note = tuple[str, float, int, int, Any]


class TracingConnection(CountingConnection):
    """A counting connection that also notes each request written and each reply read, in ``notes`` of this
    process (None: not tracing), the handshake left out."""

    notes: ClassVar[list[Note] | None] = None
    _sent_at = 0.0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        super().send_packed_command(command, check_health)
        now = time.monotonic()  # written to the socket now
        if not self._handshaking:
            self._sent_at = now
            if TracingConnection.notes is not None:
                TracingConnection.notes.append(("send", now, id(self), threading.get_ident(), _command_name(command)))

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        response = super().read_response(*args, **kwargs)
        if not self._handshaking and TracingConnection.notes is not None:
            TracingConnection.notes.append(("read", time.monotonic(), id(self), threading.get_ident(), self._sent_at))
        return response


def _command_name(packed: Any) -> str:
    head = packed if isinstance(packed, (bytes, bytearray, str)) else packed[0]
    head = head.encode() if isinstance(head, str) else bytes(head)
    parts = head.split(b"\r\n", 3)  # b"*3", b"$7", b"EVALSHA", ...
    return parts[2].decode(errors="replace").upper() if len(parts) > 2 else "?"


def _trace() -> list[Note]:
    """Trace the connections of the contenders' clients made from now on in this process."""
    contenders.client_connection_class = TracingConnection
    TracingConnection.notes = []
    return TracingConnection.notes


def _side(index: int, contender_id: str, url: str, settings: dict[str, Any], results: Any, play: Any) -> None:
    """One process of the pair (0: the holder, 1: the waiter): a traced session, a warm-up cycle, its ``play``."""
    s = Settings(**settings)
    notes = _trace()
    session = None
    try:
        session = make_session(contender_id, url, s.lease)
        lock = session.lock("breakdown")
        counter = Counter(url, f"bench-counter:breakdown:{contender_id}", reset=False)
        _cycle(lock, counter.increment)
        results.put(("ready", index, 1))
        play(s, session, lock, counter, notes)
    except BaseException:
        results.put(("error", index, traceback.format_exc(limit=6)))
    finally:
        if session is not None:
            session.close()


def _holder(contender_id: str, url: str, settings: dict[str, Any], conn: Any, results: Any) -> None:
    def play(s: Settings, session: Any, lock: Any, counter: Counter, notes: list[Note]) -> None:
        timeout = s.hold_max_s + _SLACK
        if _recv(conn, timeout) != "ready":
            raise RuntimeError("hand-off protocol out of step")
        rng = random.Random(12345)
        me = threading.get_ident()
        handoffs = []
        for _ in range(WARMUP + s.handoffs):
            lock.acquire()
            try:
                counter.increment()
                conn.send("held")
                if _recv(conn, timeout) != "waiting":
                    raise RuntimeError("hand-off protocol out of step")
                time.sleep(rng.uniform(s.hold_min_s, s.hold_max_s))
                notes.clear()
                called = time.monotonic()
            finally:
                lock.release()
            mine = [n for n in notes if n[3] == me]
            waiter = _recv(conn, timeout)
            handoffs.append({"called": called, "holder": mine, **waiter})
        results.put(("round", 0, 0, {"handoffs": handoffs[WARMUP:]}))
        conn.send("done")

    _side(0, contender_id, url, settings, results, play)


def _waiter(contender_id: str, url: str, settings: dict[str, Any], conn: Any, results: Any) -> None:
    def play(s: Settings, session: Any, lock: Any, counter: Counter, notes: list[Note]) -> None:
        conn.send("ready")
        client = getattr(session, "client", None)
        while _recv(conn, 4 * (s.hold_max_s + _SLACK)) != "done":
            notes.clear()
            conn.send("waiting")
            lock.acquire()
            acquired = time.monotonic()
            seen = list(notes)
            try:
                counter.increment()
            finally:
                lock.release()
            pings = []
            for _ in range(PINGS if client is not None else 0):
                t0 = time.monotonic()
                client.ping()
                pings.append(time.monotonic() - t0)
            conn.send({"acquired": acquired, "waiter": seen, "thread": threading.get_ident(), "pings": pings})

    _side(1, contender_id, url, settings, results, play)


SPLITS = ("release", "release_rt", "notify", "wake", "acquire_rt", "finish", "total", "floor")


def splits(handoff: dict[str, Any]) -> dict[str, float | None]:
    """One hand-off's timeline cut into ``SPLITS`` (seconds; None where the notes do not show that step), and the
    requests the waiter's acquiring thread wrote after its wake-up."""
    called, acquired = handoff["called"], handoff["acquired"]
    holder_reads = [n for n in handoff["holder"] if n[0] == "read"]
    reply, release_sent = (holder_reads[-1][1], holder_reads[-1][4]) if holder_reads else (None, None)
    waiter = handoff["waiter"]
    wakeups = [n[1] for n in waiter if n[0] == "read" and n[1] >= called and n[4] < called and n[1] <= acquired]
    wake = min(wakeups, default=None)
    mine = [n for n in waiter if n[3] == handoff["thread"] and n[1] <= acquired]
    last_read = next((n for n in reversed(mine) if n[0] == "read"), None)
    sent = last_read[4] if last_read is not None and (wake is None or last_read[4] > wake) else None
    out: dict[str, float | None] = {
        "release": None if release_sent is None else release_sent - called,
        "release_rt": None if reply is None or release_sent is None else reply - release_sent,
        "notify": None if reply is None or wake is None else wake - reply,
        "wake": None if wake is None or sent is None else sent - wake,
        "acquire_rt": None if sent is None or last_read is None else last_read[1] - sent,
        "finish": None if last_read is None else acquired - last_read[1],
        "total": acquired - called,
        "floor": statistics.median(handoff["pings"]) if handoff["pings"] else None,
    }
    if wake is not None:
        out["trips_after_wake"] = sum(1 for n in mine if n[0] == "send" and n[1] > wake)
        if last_read is not None and last_read[4] <= wake:
            out["wake"] = out["acquire_rt"] = 0.0  # the lock came with the wake-up: no round trip after it
    return out


def run_contender(contender_id: str, url: str, settings: Settings) -> dict[str, Any]:
    """The hand-offs of one contender, each cut into its splits; the errors seen."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    holder_end, waiter_end = context.Pipe()
    children = [
        context.Process(
            target=target, args=(contender_id, url, dataclasses.asdict(settings), end, results), daemon=True
        )
        for target, end in ((_holder, holder_end), (_waiter, waiter_end))
    ]
    errors: list[str] = []
    handoffs: list[dict[str, Any]] = []
    try:
        for child in children:
            child.start()
        _collect(results, "ready", 2, _SLACK, errors)
        if not errors:
            per_round = (WARMUP + settings.handoffs) * (settings.hold_max_s + 1.0) + _SLACK
            got = _collect(results, "round", 1, per_round, errors)
            handoffs = got[0][3]["handoffs"] if got else []
    finally:
        _reap(children, 10 if not errors else 1)
        results.close()
    return {"handoffs": [splits(h) for h in handoffs], "errors": errors}


def summary(row: dict[str, Any]) -> dict[str, float | None]:
    """Medians of each split over the hand-offs that show it (µs), the total's p90, and total ÷ floor."""
    out: dict[str, float | None] = {}
    for key in SPLITS:
        values = [h[key] for h in row["handoffs"] if h.get(key) is not None]
        out[key] = statistics.median(values) * 1e6 if values else None
    totals = [h["total"] for h in row["handoffs"]]
    out["total_p90"] = percentile(totals, 0.9) * 1e6 if totals else None
    out["total_over_floor"] = out["total"] / out["floor"] if out["total"] and out["floor"] else None
    trips = [h["trips_after_wake"] for h in row["handoffs"] if "trips_after_wake" in h]
    out["trips_after_wake"] = statistics.median(trips) if trips else None
    out["wakeups_seen"] = len(trips)
    return out


COLUMNS = (
    ("release", "release() call -> request written (µs)", 0),
    ("release_rt", "release round trip (µs)", 0),
    ("notify", "-> waiter reads the wake-up (µs)", 0),
    ("wake", "-> acquire request written (µs)", 0),
    ("acquire_rt", "acquire round trip (µs)", 0),
    ("finish", "reply -> acquire() returns (µs)", 0),
    ("total", "hand-off (µs)", 0),
    ("total_p90", "hand-off p90 (µs)", 0),
    ("floor", "PING round trip (µs)", 0),
    ("total_over_floor", "hand-off ÷ PING", 1),
    ("trips_after_wake", "requests after the wake-up", 1),
)


def markdown(rows: dict[str, dict[str, Any]], meta: dict[str, Any]) -> str:
    def cell(value: float | None, digits: int) -> str:
        return "n/a" if value is None else f"{value:,.{digits}f}"

    lines = [
        f"Hand-off timeline, medians of {meta['handoffs']} hand-offs per lock ({meta['date']}, {meta['server']}, load "
        f"average {meta['load_start']} at the start, {meta['load_end']} at the end)",
        "",
        "| lock | " + " | ".join(label for _, label, _ in COLUMNS) + " |",
        "|---|" + "---:|" * len(COLUMNS),
    ]
    for cid, row in rows.items():
        s = row["summary"]
        flag = " ⚠" if row["errors"] else ""
        cells = [cell(s.get(key), digits) for key, _, digits in COLUMNS]
        lines.append(f"| {CONTENDERS[cid].title}{flag} | " + " | ".join(cells) + " |")
    for cid, row in rows.items():
        seen = row["summary"]["wakeups_seen"]
        if seen < len(row["handoffs"]):
            lines.append(f"\n- {cid}: a wake-up message was seen in {seen} of {len(row['handoffs'])} hand-offs.")
        for error in row["errors"]:
            lines.append(f"\n- **{cid} failed**: {error.strip().splitlines()[-1]}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contenders", default="hybridlock,python-redis-lock", help="comma-separated, sync ones")
    parser.add_argument("--handoffs", type=int, default=60, help="hand-offs measured per lock (default: %(default)s)")
    parser.add_argument("--json", type=Path, help="also write every hand-off's splits here")
    args = parser.parse_args(argv)
    chosen = [c.strip() for c in args.contenders.split(",") if c.strip()]
    for cid in chosen:
        cls = CONTENDERS.get(cid)
        if cls is None or cls.is_async or not cls.uses_server or cls.shared:
            parser.error(f"{cid}: not a thread contender with a server lock ({', '.join(CONTENDERS)})")
    if not 1 <= args.handoffs <= 10_000:
        parser.error("--handoffs must be between 1 and 10,000")
    settings = dataclasses.replace(FULL, rounds=1, handoffs=args.handoffs)
    try:
        server = EmbeddedServer().start()
    except (ServerNotFoundError, RuntimeError) as exc:
        print(f"cannot start a server: {exc}", file=sys.stderr)
        return 2
    rows: dict[str, dict[str, Any]] = {}
    meta: dict[str, Any] = {"handoffs": args.handoffs, "load_start": _load()}
    try:
        admin = redis.Redis.from_url(server.url)
        info = admin.info("server")
        meta["server"] = f"redis-server {info.get('redis_version')}"
        meta["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        for cid in chosen:
            ok, detail = contender_available(cid)
            if not ok:
                print(f"note: skipping {cid}: {detail}", file=sys.stderr)
                continue
            admin.flushall()
            print(f"[breakdown] {cid} ...", file=sys.stderr, flush=True)
            row = run_contender(cid, server.url, settings)
            row["summary"] = summary(row)
            rows[cid] = row
        admin.close()
    finally:
        server.stop()
    meta["load_end"] = _load()
    print(markdown(rows, meta))
    if args.json is not None:
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    return 1 if any(row["errors"] for row in rows.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
