"""Run benchmarks: ``python -m benchmarks`` (all) or ``python -m benchmarks file redis``.

Each ``benchmarks/bench_<name>.py`` defines ``async def main(report) -> None``
and raises ``Unavailable("why")`` when its server is missing.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import pkgutil
import sys

from benchmarks._harness import Report, Unavailable


def _names() -> list[str]:
    import benchmarks

    return sorted(
        m.name[len("bench_") :]
        for m in pkgutil.iter_modules(benchmarks.__path__)
        if m.name.startswith("bench_")
    )


def cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("names", nargs="*", help=f"benchmarks to run (default: all of {_names()})")
    parser.add_argument("--json", help="also write the results as JSON to this path")
    args = parser.parse_args(argv)
    report = Report()
    missing = []
    for name in args.names or _names():
        module = importlib.import_module(f"benchmarks.bench_{name}")
        report.console.rule(f"[bold]{name}")
        try:
            asyncio.run(module.main(report))
        except Unavailable as exc:
            missing.append(f"{name}: {exc}")
            report.console.print(f"[yellow]skipped {name}: {exc}[/]")
    report.console.rule()
    report.print_table()
    for line in missing:
        report.console.print(f"[yellow]not run: {line}[/]")
    if args.json:
        report.write_json(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
