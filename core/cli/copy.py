"""``checkpoint-stores copy``: copy threads or runs between two stores, with a progress bar."""

from __future__ import annotations

import json
import sys
from types import TracebackType

import click
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)
from rich.table import Table
from rich.text import Text

from checkpoint_stores.cli._common import (
    console,
    err_console,
    format_bytes,
    format_seq,
    option_flag,
    parse_options,
    run_async,
)
from checkpoint_stores.cli._encryption import cipher_from, printable
from checkpoint_stores.codec import Codec
from checkpoint_stores.copy import CopyReport, copy_store
from checkpoint_stores.store import open_store
from checkpoint_stores.urls import redact_url


class RichCopyProgress:
    """A rich progress bar over bytes, with a keys counter (both totals grow as keys are found)."""

    def __init__(self, enabled: bool) -> None:
        self._progress = Progress(
            TextColumn("[bold]copy[/]"),
            BarColumn(),
            TextColumn("{task.fields[items]}/{task.fields[total_items]} keys"),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeElapsedColumn(),
            console=err_console,
            disable=not enabled,
            transient=False,
        )
        self._task: TaskID = self._progress.add_task("copy", total=0, items=0, total_items=0)
        self._items = 0
        self._total_items = 0

    def __enter__(self) -> RichCopyProgress:
        self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.stop()

    def planned(self, items: int, nbytes: int) -> None:
        """More keys found in the source."""
        self._total_items += items
        task = self._progress.tasks[0]
        self._progress.update(
            self._task, total=(task.total or 0) + nbytes, total_items=self._total_items
        )

    def advanced(self, items: int, nbytes: int) -> None:
        """Keys examined (copied or already identical)."""
        self._items += items
        self._progress.update(self._task, advance=nbytes, items=self._items)


@click.command()
@click.argument("src_url")
@click.argument("dst_url")
@click.option("--thread", "-t", "threads", multiple=True, help="Thread id to copy (repeatable).")
@click.option("--thread-prefix", default="", help="Only threads whose id starts with this.")
@click.option("--run", "-r", "run_id", help="Copy only this run of each thread.")
@option_flag
@click.option(
    "-O",
    "--dst-option",
    "dst_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="Destination backend option, repeatable (-o applies to the source).",
)
@click.option("--src-keys-env", metavar="VAR", help="Env variable with the source's keys.")
@click.option(
    "--dst-keys-env",
    metavar="VAR",
    help="Env variable with the destination's keys: values are written encrypted "
    "with its first (active) key.",
)
@click.option(
    "--reencode/--no-reencode",
    default=None,
    help="Force decoding and re-encoding every value (default: only when the two "
    "stores' encryption differs).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@run_async
async def copy(
    src_url: str,
    dst_url: str,
    threads: tuple[str, ...],
    thread_prefix: str,
    run_id: str | None,
    options: tuple[str, ...],
    dst_options: tuple[str, ...],
    src_keys_env: str | None,
    dst_keys_env: str | None,
    reencode: bool | None,
    as_json: bool,
    no_progress: bool,
) -> None:
    """Copy threads (or one run) from SRC_URL to DST_URL.

    Resumable: rerun after an interruption and only missing or different keys
    are written. Each key is read back and compared. A run whose latest in the
    destination is newer than the source's is refused and left untouched (exit 1).
    Keys are taken from environment variables, never from the command line.
    """
    src_cipher = cipher_from(src_keys_env, default=False)
    # The same variable on both sides means the same key material: values can move as bytes.
    if dst_keys_env is not None and dst_keys_env == src_keys_env:
        dst_cipher = src_cipher
    else:
        dst_cipher = cipher_from(dst_keys_env, default=False)
    src_codec = None if src_cipher is None else Codec(cipher=src_cipher)
    dst_codec = None if dst_cipher is None else Codec(cipher=dst_cipher)
    show = not no_progress and not as_json and err_console.is_terminal
    async with (
        open_store(src_url, codec=src_codec, **parse_options(options)) as src,
        open_store(dst_url, codec=dst_codec, **parse_options(dst_options)) as dst,
    ):
        with RichCopyProgress(show) as bar:
            report = await copy_store(
                src,
                dst,
                thread_ids=list(threads) or None,
                thread_prefix=thread_prefix,
                run_id=run_id,
                progress=bar,
                transcode=reencode,
            )
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        _print(report, redact_url(src_url), redact_url(dst_url))
    if not report.ok:
        sys.exit(1)


def _print(report: CopyReport, src: str, dst: str) -> None:
    console.print(
        f"copied {src} -> {dst}: {report.threads} threads, {report.runs} runs "
        f"({report.runs_copied} copied, {report.runs_unchanged} already there), "
        f"{report.written} keys written ({format_bytes(report.bytes_written)}), "
        f"{report.unchanged} already identical",
        highlight=False,
        markup=False,
    )
    if report.refused:
        table = Table(title="refused runs (destination left as it was)", title_justify="left")
        for column in ("thread", "run", "source seq", "destination seq", "reason"):
            table.add_column(column)
        for r in report.refused:
            table.add_row(
                Text(printable(r.thread_id)),
                Text(printable(r.run_id)),
                "-" if r.source_seq is None else format_seq(r.source_seq),
                "-" if r.destination_seq is None else format_seq(r.destination_seq),
                Text(r.reason),
            )
        console.print(table)
    if report.errors:
        table = Table(title="keys not copied", title_justify="left")
        for column in ("thread", "key", "error"):
            table.add_column(column)
        for thread_id, key, error in report.errors:
            table.add_row(Text(printable(thread_id)), Text(printable(key)), Text(error))
        console.print(table)
