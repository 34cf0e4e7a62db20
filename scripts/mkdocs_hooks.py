"""MkDocs hooks for the documentation site (``mkdocs.yml`` names this file under ``hooks``).

The benchmark charts live beside their data in ``benchmarks/results/`` (the benchmark runner writes them there).
Rather than keep a second copy under ``docs/``, which would go stale at the next run, the build serves every chart
found there as ``benchmarks/<path under results>``: ``benchmarks/results/latest.png`` becomes
``benchmarks/latest.png`` and ``benchmarks/results/asyncio/latest.png`` ``benchmarks/asyncio/latest.png``, so a
page links them like any other file and a strict build fails when a linked chart is missing.

The per-workload charts (``benchmarks/results/charts/<workload>.png``, and ``asyncio/charts/`` for an asyncio run)
come and go with the runs that wrote them, so a page does not name them one by one: a line
``<!-- workload-charts: charts -->`` is replaced by a gallery of the charts present in that folder (and a sentence
saying there are none yet when there are none). Only files that exist are ever linked.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"

# The workloads in benchmarks/README.md's order, with the titles it gives them; a chart of a workload not listed
# here still shows, after these, under its file name.
WORKLOADS = {
    "uncontended": "1. Uncontended: one thread, acquire + release",
    "threads": "2. One process, 8 threads, one key",
    "processes": "3. Four processes x 2 threads, one key",
    "many-keys": "3b. A worker pool: one process, 64 threads, 1,000 keys",
    "handoff": "4. Hand-off between two processes",
    "scale": "5. Scale: 10,000 held locks",
    "handoff-inproc": "6. Local hand-off, in-process critical section",
    "handoff-redis": "7. Local hand-off, two Redis commands inside",
    "handoff-procs": "8. Local hand-off, four processes x 2 threads",
    "read-mostly": "9. Read-mostly: four processes x 8 threads, 95 % reads",
    "takeover": "10. Take-over: what lease retention costs the next owner",
    "async-uncontended": "11. asyncio, uncontended",
    "async-tasks": "12. asyncio, 100 tasks of one process on one key",
    "async-processes": "13. asyncio, four processes x 50 tasks on one key",
    "async-loop": "14. asyncio, the event loop while 1,000 tasks wait",
    "procs-8x1": "15. Prefork: 8 processes x 1 thread, one key",
    "procs-16x1": "16. Prefork: 16 processes x 1 thread, one key",
    "async-procs-8x1": "17. asyncio prefork: 8 processes x 1 task, one key",
}

_GALLERY = re.compile(r"^<!-- workload-charts: (?P<folder>[\w./-]+) -->$", re.MULTILINE)


def on_files(files: Files, config: MkDocsConfig, **kwargs: Any) -> Files:
    for chart in sorted(RESULTS.rglob("*.png")):
        served = "benchmarks/" + chart.relative_to(RESULTS).as_posix()
        files.append(File.generated(config, served, abs_src_path=str(chart)))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files, **kwargs: Any) -> str:
    return _GALLERY.sub(lambda match: workload_gallery(match["folder"]), markdown)


def workload_gallery(folder: str) -> str:
    """Markdown showing every ``*.png`` in ``benchmarks/results/<folder>``, in workload order, each linked to
    itself full size; a note when the folder has none."""
    charts = {chart.stem: chart for chart in (RESULTS / folder).glob("*.png")}
    if not charts:
        return (
            f"*No per-workload charts in `benchmarks/results/{folder}/` yet: the next full run of "
            "`python -m benchmarks.run` writes them, and the next build of this site shows them here.*"
        )
    order = [name for name in WORKLOADS if name in charts] + sorted(set(charts) - set(WORKLOADS))
    parts = []
    for name in order:
        served = f"benchmarks/{folder}/{name}.png"
        title = WORKLOADS.get(name, name)
        parts.append(f"**{title}**\n\n[![{title}]({served})]({served})")
    return "\n\n".join(parts)
