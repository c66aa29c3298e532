"""``checkpoint-stores prune``: retention (keep the last N records, delete old finished runs)."""

from __future__ import annotations

import json
from collections import defaultdict

import click
from rich.table import Table
from rich.text import Text

from checkpoint_stores import retention
from checkpoint_stores.cli._common import (
    console,
    format_bytes,
    option_flag,
    parse_options,
    run_async,
)
from checkpoint_stores.cli._encryption import codec_from, keys_env_option, printable
from checkpoint_stores.inventory import classify_key
from checkpoint_stores.retention import PruneReport, parse_duration
from checkpoint_stores.store import open_store


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value).total_seconds()
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command()
@click.argument("url")
@click.option(
    "--keep-last",
    type=click.IntRange(min=0),
    help="Keep the N newest step records of each run (the latest, the runtime snapshot "
    "and the records they name are always kept).",
)
@click.option(
    "--older-than",
    callback=_duration,
    metavar="AGE",
    help="Delete whole runs whose latest record is older than AGE (30d, 12h, 1w2d, 90m).",
)
@click.option(
    "--include-unfinished",
    is_flag=True,
    help="Let --older-than delete runs that never reached run_terminal too.",
)
@click.option(
    "--native-ttl",
    is_flag=True,
    help="Hand finished runs younger than AGE to the backend's native expiry (Redis, MongoDB).",
)
@click.option("--dry-run", is_flag=True, help="Show what would be deleted; delete nothing.")
@click.option("--thread", "-t", "threads", multiple=True, help="Thread id (repeatable).")
@click.option("--thread-prefix", default="", help="Only threads whose id starts with this.")
@click.option("--run", "-r", "run_id", help="Only this run of each thread.")
@click.option("--json", "as_json", is_flag=True, help="Print the full report (every key) as JSON.")
@keys_env_option
@option_flag
@run_async
async def prune(
    url: str,
    keep_last: int | None,
    older_than: float | None,
    include_unfinished: bool,
    native_ttl: bool,
    dry_run: bool,
    threads: tuple[str, ...],
    thread_prefix: str,
    run_id: str | None,
    as_json: bool,
    keys_env: str | None,
    options: tuple[str, ...],
) -> None:
    """Apply retention to the store at URL.

    Examples: keep the last 20 records of every run, and delete finished runs
    older than 30 days, showing first what would go:

        checkpoint-stores prune file:///var/lib/runs --keep-last 20 --older-than 30d --dry-run
    """
    if keep_last is None and older_than is None:
        raise click.UsageError("say what to prune: --keep-last N and/or --older-than AGE")
    if native_ttl and older_than is None:
        raise click.UsageError("--native-ttl needs --older-than AGE (the age to expire at)")
    codec = codec_from(keys_env)
    async with open_store(url, codec=codec, **parse_options(options)) as store:
        report = await retention.prune(
            store,
            keep_last=keep_last,
            older_than=older_than,
            include_unfinished=include_unfinished,
            thread_ids=list(threads) or None,
            thread_prefix=thread_prefix,
            run_id=run_id,
            native_ttl=native_ttl,
            dry_run=dry_run,
        )
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
        return
    _print(report)


def _print(report: PruneReport) -> None:
    verb = "would delete" if report.dry_run else "deleted"
    whole = set(report.runs_deleted)
    per_run: dict[tuple[str, str], list[str]] = defaultdict(list)
    for thread_id, key in report.deleted:
        per_run[(thread_id, classify_key(key)[1] or "")].append(key)
    if per_run or report.runs_expiring:
        title = "dry run: would delete" if report.dry_run else "deleted"
        table = Table(title=title, title_justify="left")
        for column in ("thread", "run", "action", "keys"):
            table.add_column(column)
        for (thread_id, run_id), keys in sorted(per_run.items()):
            action = "whole run (by age)" if (thread_id, run_id) in whole else "older records"
            table.add_row(
                Text(printable(thread_id)), Text(printable(run_id)), action, str(len(keys))
            )
        for thread_id, run_id, ttl in report.runs_expiring:
            table.add_row(
                Text(printable(thread_id)),
                Text(printable(run_id)),
                f"native TTL: expires in {ttl / 86400:.1f} d",
                "-",
            )
        console.print(table)
    console.print(
        f"{verb} {len(report.deleted)} keys ({format_bytes(report.bytes_freed)}) in "
        f"{report.threads} threads, {report.runs} runs examined; "
        f"{len(report.runs_deleted)} whole runs; {len(report.runs_expiring)} handed to native TTL",
        highlight=False,
        markup=False,
    )
    for thread_id, run_id, reason in report.kept:
        console.print(
            Text(f"kept {printable(thread_id)} / {printable(run_id)}: {reason}", style="yellow")
        )
    for note in report.notes:
        console.print(Text(f"note: {note}", style="yellow"))
