"""The benchmark harness: ratios against the raw driver doing the same work, in the same run.

A comparison runs ``ours`` and ``raw`` in interleaved rounds (so machine load
drifts hit both alike) and reports the median time per operation of each and
``ratio = raw / ours``: 1.0 means no overhead, 0.8 means ours takes 25% longer.
Absolute times are printed for context only; the ratio is the figure of merit.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

Op = Callable[[], Awaitable[Any]]


class Unavailable(Exception):
    """A benchmark's server or driver is missing (the run goes on without it)."""


@dataclass
class Result:
    """One comparison (or one single measurement when ``raw_s`` is None)."""

    group: str
    name: str
    ours_s: float
    raw_s: float | None
    ratio: float | None
    target: float | None
    ops: int
    note: str = ""

    @property
    def ok(self) -> bool | None:
        if self.ratio is None or self.target is None:
            return None
        return self.ratio >= self.target


@dataclass
class Report:
    """Collects results; prints a table and optionally writes JSON."""

    results: list[Result] = field(default_factory=list)
    console: Console = field(default_factory=Console)

    def add(self, result: Result) -> Result:
        self.results.append(result)
        status = {True: "[green]ok[/]", False: "[red]below target[/]", None: ""}[result.ok]
        ratio = f"{result.ratio:.2f}" if result.ratio is not None else "-"
        raw = f"{result.raw_s * 1e6:,.1f} µs" if result.raw_s is not None else "-"
        self.console.print(
            f"  {result.group} / {result.name}: ours {result.ours_s * 1e6:,.1f} µs, raw {raw}, "
            f"ratio {ratio} {status} {result.note}",
            highlight=False,
        )
        return result

    def print_table(self) -> None:
        table = Table(
            title="checkpoint-stores benchmarks (median per op; ratio = raw / ours)",
            title_justify="left",
        )
        for column in ("group", "benchmark", "ours", "raw", "ratio", "target", ""):
            table.add_column(column)
        for r in self.results:
            table.add_row(
                r.group,
                r.name,
                f"{r.ours_s * 1e6:,.1f} µs",
                f"{r.raw_s * 1e6:,.1f} µs" if r.raw_s is not None else "-",
                f"{r.ratio:.2f}" if r.ratio is not None else "-",
                f">= {r.target:.2f}" if r.target is not None else "-",
                {True: "[green]ok[/]", False: "[red]below[/]", None: r.note}[r.ok],
            )
        self.console.print(table)
        self.console.print(
            f"python {platform.python_version()}, {os.cpu_count()} cpus, {platform.machine()}"
        )

    def write_json(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump([asdict(r) for r in self.results], handle, indent=2)


async def _time(op: Op, ops: int) -> float:
    start = time.perf_counter()
    for _ in range(ops):
        await op()
    return (time.perf_counter() - start) / ops


async def compare(
    report: Report,
    group: str,
    name: str,
    ours: Op,
    raw: Op,
    *,
    ops: int = 200,
    rounds: int = 7,
    warmup: int = 20,
    target: float | None = 0.8,
    note: str = "",
) -> Result:
    """Median per-op time of ``ours`` and ``raw`` over interleaved rounds; ratio raw/ours."""
    for _ in range(warmup):
        await ours()
        await raw()
    ours_times: list[float] = []
    raw_times: list[float] = []
    for i in range(rounds):
        # Alternate which goes first so neither always pays for a cold cache.
        pair = [(ours, ours_times), (raw, raw_times)]
        if i % 2:
            pair.reverse()
        for op, sink in pair:
            sink.append(await _time(op, ops))
    ours_s = statistics.median(ours_times)
    raw_s = statistics.median(raw_times)
    return report.add(
        Result(group, name, ours_s, raw_s, raw_s / ours_s, target, ops * rounds, note)
    )


async def measure(
    report: Report,
    group: str,
    name: str,
    op: Op,
    *,
    ops: int = 200,
    rounds: int = 7,
    warmup: int = 20,
    note: str = "",
) -> Result:
    """Median per-op time of one operation (no baseline)."""
    for _ in range(warmup):
        await op()
    times = [await _time(op, ops) for _ in range(rounds)]
    return report.add(
        Result(group, name, statistics.median(times), None, None, None, ops * rounds, note)
    )
