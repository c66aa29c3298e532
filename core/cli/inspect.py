"""``checkpoint-stores inspect``: a thread's runs, or one run's chain as a table."""

from __future__ import annotations

import json

import click
from rich.table import Table

from checkpoint_stores.cli._common import (
    console,
    format_bytes,
    format_ms,
    format_seq,
    option_flag,
    parse_options,
    run_async,
    with_store,
)
from checkpoint_stores.errors import AgentCheckpointCorruptionError, CheckpointNotFoundError
from checkpoint_stores.keys import checkpoint_latest_key, checkpoint_prefix, parse_checkpoint_key
from checkpoint_stores.normalize import normalize_checkpoint_record
from checkpoint_stores.schema import Checkpoint
from checkpoint_stores.store import MemoryStore


@click.command()
@click.argument("url")
@click.option("--thread", "-t", "thread_id", required=True, help="Thread id.")
@click.option("--run", "-r", "run_id", help="Run id; without it, list the thread's runs.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@option_flag
@run_async
async def inspect(
    url: str, thread_id: str, run_id: str | None, as_json: bool, options: tuple[str, ...]
) -> None:
    """Show the checkpoint chain of a run (seq, step, phase, size, time; latest marked)."""

    async def body(store: MemoryStore) -> None:
        if run_id is None:
            await _runs(store, thread_id, as_json)
        else:
            await _chain(store, thread_id, run_id, as_json)

    await with_store(url, parse_options(options), body)


async def _runs(store: MemoryStore, thread_id: str, as_json: bool) -> None:
    rows = []
    for run in await store.list_runs(thread_id):
        try:
            latest = await store.latest(thread_id, run)
            rows.append((run, latest.seq, latest.step, latest.phase.value, latest.timestamp_ms, ""))
        except AgentCheckpointCorruptionError as exc:
            rows.append((run, 0, 0, "?", 0, str(exc)))
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "run_id": r,
                        "seq": s,
                        "step": st,
                        "phase": p,
                        "timestamp_ms": t,
                        "error": e or None,
                    }
                    for r, s, st, p, t, e in rows
                ],
                indent=2,
            )
        )
        return
    table = Table(title=f"runs in thread {thread_id!r}", title_justify="left")
    for column in ("run", "seq", "step", "latest phase", "time"):
        table.add_column(column)
    for run, seq, step, phase, ts, error in rows:
        if error:
            table.add_row(run, "-", "-", f"[red]unreadable: {error}[/]", "-")
        else:
            table.add_row(run, format_seq(seq), str(step), phase, format_ms(ts))
    console.print(table)


async def _chain(store: MemoryStore, thread_id: str, run_id: str, as_json: bool) -> None:
    # A damaged latest is exactly when the chain is worth seeing: show it, then fail.
    latest_error: AgentCheckpointCorruptionError | None = None
    try:
        latest: Checkpoint | None = await store.latest(thread_id, run_id)
    except CheckpointNotFoundError:
        raise
    except AgentCheckpointCorruptionError as exc:
        latest, latest_error = None, exc
    latest_key = checkpoint_latest_key(run_id)
    rows: list[tuple[int, int, str, int, int, str, str | None]] = []
    async for key, raw in store.backend.list(thread_id, checkpoint_prefix(run_id)):
        parsed = parse_checkpoint_key(key)
        if key == latest_key or parsed is None or ":" not in parsed[1]:
            continue
        try:
            value = store.decode(raw, what=key)
            cp = normalize_checkpoint_record(value, thread_id=thread_id, run_id=run_id)
            rows.append((cp.seq, cp.step, cp.phase.value, len(raw), cp.timestamp_ms, key, None))
        except AgentCheckpointCorruptionError as exc:
            rows.append((-1, 0, "?", len(raw), 0, key, str(exc)))
    rows.sort(key=lambda r: (r[0], r[1]))
    is_latest = [
        latest is not None and (r[0], r[1], r[2]) == (latest.seq, latest.step, latest.phase.value)
        for r in rows
    ]
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "seq": s,
                        "step": st,
                        "phase": p,
                        "size": n,
                        "timestamp_ms": t,
                        "key": k,
                        "latest": flag,
                        "error": e,
                    }
                    for (s, st, p, n, t, k, e), flag in zip(rows, is_latest, strict=True)
                ],
                indent=2,
            )
        )
        _fail_on(latest_error)
        return
    table = Table(title=f"run {run_id!r} in thread {thread_id!r}", title_justify="left")
    for column in ("seq", "step", "phase", "size", "time", ""):
        table.add_column(column)
    for (seq, step, phase, size, ts, key, error), flag in zip(rows, is_latest, strict=True):
        if error:
            table.add_row("?", "-", f"[red]{key}: {error}[/]", format_bytes(size), "-", "")
            continue
        table.add_row(
            format_seq(seq),
            str(step),
            phase,
            format_bytes(size),
            format_ms(ts),
            "[bold green]◀ latest[/]" if flag else "",
        )
    if latest is None:
        table.caption = "[red]latest: unreadable (see the error below)[/]"
    elif not any(is_latest):
        table.caption = (
            f"latest: seq {format_seq(latest.seq)}, step {latest.step}, "
            f"{latest.phase.value} (its step record was pruned or is a claim)"
        )
    console.print(table)
    _fail_on(latest_error)


def _fail_on(error: AgentCheckpointCorruptionError | None) -> None:
    if error is not None:
        raise error  # run_async prints it and exits 1
