"""``checkpoint-stores rotate``: re-encrypt every value with the active encryption key."""

from __future__ import annotations

import json
import sys

import click
from rich.table import Table
from rich.text import Text

from checkpoint_stores.cli._common import (
    console,
    format_bytes,
    format_seq,
    option_flag,
    parse_options,
    run_async,
)
from checkpoint_stores.cli._encryption import codec_from, keys_env_option, printable
from checkpoint_stores.encryption import DEFAULT_KEYS_ENV, RotationReport
from checkpoint_stores.encryption import rotate as rotate_values
from checkpoint_stores.store import open_store


@click.command()
@click.argument("url")
@click.option("--thread", "-t", "threads", multiple=True, help="Thread id (repeatable).")
@click.option("--thread-prefix", default="", help="Only threads whose id starts with this.")
@click.option("--run", "-r", "run_id", help="Only this run of each thread.")
@click.option("--dry-run", is_flag=True, help="Count what would be re-encrypted; write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@keys_env_option
@option_flag
@run_async
async def rotate(
    url: str,
    threads: tuple[str, ...],
    thread_prefix: str,
    run_id: str | None,
    dry_run: bool,
    as_json: bool,
    keys_env: str | None,
    options: tuple[str, ...],
) -> None:
    """Re-encrypt the values of URL with the active (first) key; idempotent.

    Put the new key first and keep the old ones after it, e.g.
    CHECKPOINT_STORES_ENCRYPTION_KEYS="2025-06:NEW,2024-01:OLD". Each run's
    latest is re-stamped at seq + 1: a writer still appending to that run gets
    StaleWriterError on its next checkpoint, so rotate idle or finished runs.
    """
    codec = codec_from(keys_env)
    if codec is None:
        raise click.UsageError(
            f"rotate needs the keys: set {DEFAULT_KEYS_ENV} (or name a variable with "
            "--keys-env) to 'NEWID:BASE64,OLDID:BASE64'"
        )
    async with open_store(url, codec=codec, **parse_options(options)) as store:
        report = await rotate_values(
            store,
            thread_ids=list(threads) or None,
            thread_prefix=thread_prefix,
            run_id=run_id,
            dry_run=dry_run,
        )
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        _print(report)
    if not report.ok:
        sys.exit(1)


def _print(report: RotationReport) -> None:
    verb = "would re-encrypt" if report.dry_run else "re-encrypted"
    console.print(
        f"{verb} {report.reencrypted} values ({format_bytes(report.bytes)}) in "
        f"{report.threads} threads; {report.already_current} already on the active key; "
        f"{len(report.restamped)} run heads re-stamped",
        highlight=False,
        markup=False,
    )
    if report.restamped:
        table = Table(title="re-stamped latest records", title_justify="left")
        for column in ("thread", "run", "seq", "new seq"):
            table.add_column(column)
        for thread_id, run_id, old, new in report.restamped:
            table.add_row(
                Text(printable(thread_id)),
                Text(printable(run_id)),
                format_seq(old),
                format_seq(new),
            )
        console.print(table)
    if report.failed:
        table = Table(title="not re-encrypted", title_justify="left")
        for column in ("thread", "key", "error"):
            table.add_column(column)
        for thread_id, key, error in report.failed:
            table.add_row(Text(printable(thread_id)), Text(printable(key)), Text(error))
        console.print(table)
