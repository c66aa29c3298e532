"""Helpers shared by the CLI commands: running coroutines, opening stores, errors."""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from datetime import datetime, timezone
from typing import Any, ParamSpec, TypeVar

import click
from rich.console import Console
from rich.markup import escape

from checkpoint_stores.errors import CheckpointStoreError
from checkpoint_stores.store import MemoryStore, open_store

P = ParamSpec("P")
T = TypeVar("T")

console = Console()
err_console = Console(stderr=True)


def parse_options(pairs: Iterable[str]) -> dict[str, Any]:
    """``-o key=value`` pairs as backend options (values stay strings)."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not key=value", param_hint="-o/--option")
        options[key.strip()] = value
    return options


option_flag = click.option(
    "-o",
    "--option",
    "options",
    multiple=True,
    metavar="KEY=VALUE",
    help="Backend option, repeatable (e.g. -o key_prefix=myapp).",
)


def run_async(func: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, T]:
    """Run an async command body; turn library errors into a red message and exit 1."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return asyncio.run(func(*args, **kwargs))
        except CheckpointStoreError as exc:
            err_console.print(
                f"[bold red]error:[/] {type(exc).__name__}: {escape(str(exc))}", highlight=False
            )
            sys.exit(1)
        except (ValueError, TypeError) as exc:
            err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
            sys.exit(2)

    return wrapper


async def with_store(
    url: str, options: dict[str, Any], body: Callable[[MemoryStore], Awaitable[T]]
) -> T:
    """Open ``url``, set it up, run ``body(store)``, close it."""
    async with open_store(url, **options) as store:
        return await body(store)


def format_ms(timestamp_ms: int) -> str:
    """A record time as ISO-8601 UTC, to the millisecond."""
    if not timestamp_ms:
        return "-"
    moment = datetime.fromtimestamp(timestamp_ms / 1000, tz=timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def format_seq(seq: int) -> str:
    """``seq`` as ``epoch:counter`` when it carries a fencing epoch."""
    epoch, counter = seq >> 32, seq & 0xFFFFFFFF
    return f"{epoch}:{counter}" if epoch else str(counter)


def format_bytes(size: int) -> str:
    """A human size (B, KiB, MiB, GiB)."""
    value = float(size)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"
