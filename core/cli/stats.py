"""``checkpoint-stores stats``: runs, records, bytes, oldest and newest record per thread."""

from __future__ import annotations

import json

import click
from rich.console import JustifyMethod
from rich.table import Table
from rich.text import Text

from checkpoint_stores.cli._common import (
    console,
    format_bytes,
    format_ms,
    option_flag,
    parse_options,
    run_async,
)
from checkpoint_stores.cli._encryption import codec_from, keys_env_option, printable
from checkpoint_stores.stats import StoreStats, collect_stats
from checkpoint_stores.store import open_store


@click.command()
@click.argument("url")
@click.option("--thread", "-t", "threads", multiple=True, help="Thread id (repeatable).")
@click.option("--thread-prefix", default="", help="Only threads whose id starts with this.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@keys_env_option
@option_flag
@run_async
async def stats(
    url: str,
    threads: tuple[str, ...],
    thread_prefix: str,
    as_json: bool,
    keys_env: str | None,
    options: tuple[str, ...],
) -> None:
    """Show runs, records, bytes and the oldest/newest record of each thread.

    Without --thread every thread is counted (the backend must be able to list
    its threads). Times are UTC.
    """
    codec = codec_from(keys_env)
    async with open_store(url, codec=codec, **parse_options(options)) as store:
        result = await collect_stats(
            store, thread_ids=list(threads) or None, thread_prefix=thread_prefix
        )
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
        return
    console.print(_table(result, store.url or url))


def _table(result: StoreStats, where: str) -> Table:
    table = Table(title=f"stats of {where}", title_justify="left", show_footer=True)
    totals = result.totals()
    columns = [
        ("thread", f"{totals['threads']} threads"),
        ("runs", _runs(totals["runs"], totals["finished_runs"])),
        ("records", str(totals["records"])),
        ("bytes", format_bytes(totals["bytes"])),
        ("oldest (UTC)", _time(totals["oldest_ms"])),
        ("newest (UTC)", _time(totals["newest_ms"])),
    ]
    for name, footer in columns:
        right = name in {"runs", "records", "bytes"}
        justify: JustifyMethod = "right" if right else "left"
        # Counts never wrap; the thread and the times may (narrow terminals, pipes).
        table.add_column(
            name,
            footer=footer,
            justify=justify,
            no_wrap=right,
            min_width=None if right else 10,
        )
    for t in result.threads:
        thread = Text(printable(t.thread_id))
        if t.unreadable:
            thread.append(f" ({t.unreadable} unreadable)", style="red")
        table.add_row(
            thread,
            _runs(t.runs, t.finished_runs),
            str(t.records),
            format_bytes(t.bytes),
            _time(t.oldest_ms),
            _time(t.newest_ms),
        )
    return table


def _runs(runs: int, finished: int) -> str:
    return f"{runs} ({finished} done)" if finished else str(runs)


def _time(timestamp_ms: int | None) -> str:
    """To the second, without the T and Z, so two times fit an 80-column table."""
    if not timestamp_ms:
        return "-"
    return format_ms(timestamp_ms)[:19].replace("T", " ")
