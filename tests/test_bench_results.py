# SPDX-License-Identifier: LGPL-3.0-only
"""bench/RESULTS.md is what bench/run writes: every benchmark it knows about has its rows.

No timing here: only that no benchmark is left out of the run or out of its results (a
stale RESULTS.md, from before a benchmark was added, fails).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def bench_run():
    loader = importlib.machinery.SourceFileLoader("bench_run", str(BENCH / "run"))
    spec = importlib.util.spec_from_loader("bench_run", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_bench_run_knows_every_benchmark_in_bench():
    files = {p.stem.removeprefix("bench_") for p in BENCH.glob("bench_*.py")}
    assert set(bench_run().BENCHMARKS) == files


def test_every_benchmark_bench_run_knows_has_rows_in_results():
    rows = [line.split("|") for line in (BENCH / "RESULTS.md").read_text().splitlines()]
    named = {cells[1].strip() for cells in rows if len(cells) > 2}
    missing = [name for name in bench_run().BENCHMARKS if name not in named]
    assert not missing, f"bench/RESULTS.md has no rows for {missing}: run bench/run"
