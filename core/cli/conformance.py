"""``checkpoint-stores conformance URL``: run the conformance kit against any registered scheme.

Runs pytest in-process on the kit's suite with the kit's plugin
(``--checkpoint-store-url URL``), isolated from the current directory's
tests, conftest files and pytest configuration; then prints a table of
groups with pass/fail/skip counts and the first failure's explanation.
Exit status: 0 when nothing failed, 1 when a check failed, 2 for usage errors
or a store that cannot be opened.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from checkpoint_stores.cli._common import console, err_console, option_flag, parse_options

_GROUPS = ("latest", "corruption", "replay", "spi", "stateful")


class _Collector:
    """A pytest plugin object that keeps the session's config (to read the kit's results)."""

    config: Any = None

    def pytest_configure(self, config: Any) -> None:
        self.config = config


def _pytest_args(
    url: str,
    options: dict[str, Any],
    groups: tuple[str, ...],
    junitxml: str | None,
    json_path: str | None,
    keyword: str | None,
    verbose: bool,
    workdir: Path,
) -> list[str]:
    from checkpoint_stores.conformance.plugin import SUITE_PATH

    ini = workdir / "pytest.ini"
    # Our own ini: the caller's addopts, markers and plugins settings must not leak in.
    ini.write_text("[pytest]\naddopts =\nxfail_strict = true\n", encoding="utf-8")
    args = [
        str(SUITE_PATH),
        "-c",
        str(ini),
        "--rootdir",
        str(workdir),
        "--noconftest",
        "-p",
        "no:cacheprovider",
        # Kit checks are sync and run their own loops; pytest-asyncio has nothing to do here.
        "-p",
        "no:asyncio",
        "--checkpoint-store-url",
        url,
        "--checkpoint-store-no-summary",
    ]
    args += ["-v", "--tb=short", "-rfE"] if verbose else ["-q", "--tb=no", "-rN"]
    for key, value in options.items():
        args += ["--checkpoint-store-option", f"{key}={value}"]
    if groups:
        args += ["-m", " or ".join(f"conformance_{g}" for g in groups)]
    if keyword:
        args += ["-k", keyword]
    if junitxml:
        args += ["--junitxml", str(Path(junitxml).resolve())]
    if json_path:
        args += ["--checkpoint-store-report", str(Path(json_path).resolve())]
    return args


@click.command()
@click.argument("url")
@click.option(
    "--group",
    "groups",
    multiple=True,
    type=click.Choice(_GROUPS),
    help="Run only this group (repeatable). Default: every group.",
)
@click.option("--junitxml", metavar="FILE", help="Write a JUnit XML report to FILE.")
@click.option(
    "--json", "json_path", metavar="FILE", help="Write the results (per check) as JSON to FILE."
)
@click.option(
    "-k", "keyword", metavar="EXPR", help="Only checks matching this pytest -k expression."
)
@click.option("-v", "--verbose", is_flag=True, help="Show each check and failure tracebacks.")
@option_flag
def conformance(
    url: str,
    groups: tuple[str, ...],
    junitxml: str | None,
    json_path: str | None,
    keyword: str | None,
    verbose: bool,
    options: tuple[str, ...],
) -> None:
    """Run the conformance kit against the store at URL (any installed scheme).

    \b
    Examples:
      checkpoint-stores conformance memory://
      checkpoint-stores conformance file:///tmp/kit-store --group latest --group spi
      checkpoint-stores conformance mydb://localhost/test -o pool_size=4 --junitxml kit.xml
    """
    try:
        import pytest

        from checkpoint_stores.conformance.base import describe_store
        from checkpoint_stores.conformance.plugin import results_of
    except ImportError as exc:  # pytest or hypothesis missing
        err_console.print(
            f"[bold red]error:[/] the conformance kit needs pytest and hypothesis ({exc}); "
            'install them with: pip install "checkpoint-stores[conformance]"',
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(2)
    backend_options = parse_options(options)
    try:
        description = describe_store(url, backend_options)
    except Exception as exc:
        err_console.print(
            f"[bold red]error:[/] cannot open the store: {type(exc).__name__}: {escape(str(exc))}",
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(2)
    console.print(
        f"[bold]conformance kit[/] against {escape(description.label)} "
        f"({escape(description.provider)}; {escape(description.backend)})",
        highlight=False,
        soft_wrap=True,
    )
    console.print(
        f"capabilities: {escape(description.capability_line())}", highlight=False, soft_wrap=True
    )
    collector = _Collector()
    with tempfile.TemporaryDirectory(prefix="checkpoint-stores-kit-") as tmp:
        args = _pytest_args(
            url, backend_options, groups, junitxml, json_path, keyword, verbose, Path(tmp)
        )
        code = pytest.main(args, plugins=[collector])
    if collector.config is None:
        err_console.print(f"[bold red]error:[/] pytest did not start (exit status {code})")
        sys.exit(2)
    results = results_of(collector.config)
    if not results.stores:
        err_console.print(
            f"[bold red]error:[/] no check ran (pytest exit status {int(code)}); "
            "check --group and -k"
        )
        sys.exit(2)
    for store in results.stores.values():
        table = Table(title="conformance by group", title_justify="left")
        for column in ("group", "passed", "failed", "skipped", "xfailed"):
            table.add_column(column, justify="left" if column == "group" else "right")
        table.add_column("first failure", overflow="fold")
        for group, counts in store.counts().items():
            if not sum(counts.values()):
                continue
            failed = counts["failed"]
            table.add_row(
                group,
                str(counts["passed"]),
                f"[red]{failed}[/]" if failed else "0",
                str(counts["skipped"]),
                str(counts["xfailed"]),
                escape(store.first_failure(group)),
            )
        console.print(table)
        skips = [r for r in store.checks.values() if r.outcome == "skipped"]
        for result in skips:
            console.print(
                f"[yellow]skipped[/] {result.name}: {escape(result.explanation)}",
                highlight=False,
                soft_wrap=True,
            )
        for result in store.failed():
            console.print(
                f"[bold red]FAILED[/] {escape(result.explanation)}", highlight=False, soft_wrap=True
            )
        level = store.level()
        colour = "green" if level.startswith("full") else "red" if store.failed() else "yellow"
        console.print(
            f"conformance level: [bold {colour}]{escape(level)}[/]", highlight=False, soft_wrap=True
        )
    if results.ok() and int(code) == 0:
        return
    if not verbose and not results.ok():
        console.print("Run again with -v (and -k NAME) for the full explanation of each failure.")
    sys.exit(1)
