"""MkDocs hooks for the documentation site (``mkdocs.yml`` names this file under ``hooks``).

The benchmark charts live beside their data in ``benchmarks/results/`` (the benchmark runner writes them there).
Rather than keep a second copy under ``docs/``, which would go stale at the next run, the build serves every chart
found there as ``benchmarks/<path under results>``: ``benchmarks/results/latest.png`` becomes
``benchmarks/latest.png`` and ``benchmarks/results/asyncio/latest.png`` ``benchmarks/asyncio/latest.png``, so a
page links them like any other file and a strict build fails when a linked chart is missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"


def on_files(files: Files, config: MkDocsConfig, **kwargs: Any) -> Files:
    for chart in sorted(RESULTS.rglob("*.png")):
        served = "benchmarks/" + chart.relative_to(RESULTS).as_posix()
        files.append(File.generated(config, served, abs_src_path=str(chart)))
    return files
