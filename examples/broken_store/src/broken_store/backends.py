"""A correct in-process store that acts like a networked one, and four variants with one bug each.

:class:`RoundTripBackend` awaits once per call, as a network client does, so
concurrent tasks really interleave; each call is still atomic on its own.
Every variant below breaks exactly one guarantee, the way real stores do.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

from checkpoint_stores import Capabilities
from checkpoint_stores.backends.file import FileBackend

__all__ = [
    "BrokenCreateBackend",
    "BrokenFileHeadBackend",
    "BrokenHeadBackend",
    "BrokenPrefixBackend",
    "BrokenSeqBackend",
    "RoundTripBackend",
]

# "server" name -> thread -> key -> (value, seq)
_Rows = dict[str, tuple[bytes, int | None]]
_SERVERS: dict[str, dict[str, _Rows]] = {}


class RoundTripBackend:
    """A dict behind a simulated round trip. Claims what a good networked store claims."""

    capabilities = Capabilities(
        atomic_commit=True,
        fenced_commit=True,
        cross_process=False,
        durable=False,
        notes="deliberately broken example; in-process only",
    )

    def __init__(self, url: str, **options: Any) -> None:
        if options:
            raise TypeError(f"takes no options, got {sorted(options)}")
        self.url = url
        self._threads = _SERVERS.setdefault(url.partition("://")[2] or "default", {})

    async def _round_trip(self) -> None:
        await asyncio.sleep(0)

    async def setup(self) -> None:
        """Nothing to create."""

    async def close(self) -> None:
        """Nothing to release."""

    async def get(self, thread_id: str, key: str) -> bytes | None:
        """One key."""
        await self._round_trip()
        row = self._threads.get(thread_id, {}).get(key)
        return None if row is None else row[0]

    async def get_many(self, thread_id: str, keys: Sequence[str]) -> list[bytes | None]:
        """Several keys."""
        await self._round_trip()
        rows = self._threads.get(thread_id, {})
        return [rows[k][0] if k in rows else None for k in keys]

    async def put(self, thread_id: str, key: str, value: bytes) -> None:
        """Upsert (drops any seq)."""
        await self._round_trip()
        self._threads.setdefault(thread_id, {})[key] = (bytes(value), None)

    async def create(self, thread_id: str, key: str, value: bytes) -> bool:
        """Only if absent."""
        await self._round_trip()
        rows = self._threads.setdefault(thread_id, {})
        if key in rows:
            return False
        rows[key] = (bytes(value), None)
        return True

    def _stale(self, head: tuple[bytes, int | None] | None, seq: int) -> bool:
        return head is not None and head[1] is not None and head[1] >= seq

    async def commit(
        self,
        thread_id: str,
        writes: Sequence[tuple[str, bytes]],
        head_key: str,
        head_value: bytes,
        seq: int,
    ) -> bool:
        """Compare and write with no await in between."""
        await self._round_trip()
        rows = self._threads.setdefault(thread_id, {})
        if self._stale(rows.get(head_key), seq):
            return False
        for key, value in writes:
            rows[key] = (bytes(value), None)
        rows[head_key] = (bytes(head_value), seq)
        return True

    def _matches(self, key: str, prefix: str) -> bool:
        return key.startswith(prefix)

    async def list(self, thread_id: str, prefix: str = "") -> AsyncIterator[tuple[str, bytes]]:
        """Sorted keys under ``prefix``."""
        await self._round_trip()
        rows = self._threads.get(thread_id, {})
        for key in sorted(k for k in rows if self._matches(k, prefix)):
            yield key, rows[key][0]

    async def list_threads(self, prefix: str = "") -> AsyncIterator[str]:
        """Threads holding keys."""
        await self._round_trip()
        for thread in sorted(t for t, rows in self._threads.items() if rows):
            if thread.startswith(prefix):
                yield thread

    async def delete(self, thread_id: str, key: str) -> bool:
        """One key."""
        await self._round_trip()
        return self._threads.get(thread_id, {}).pop(key, None) is not None

    async def delete_prefix(self, thread_id: str, prefix: str) -> int:
        """Keys under ``prefix``."""
        await self._round_trip()
        rows = self._threads.get(thread_id, {})
        doomed = [k for k in rows if self._matches(k, prefix)]
        for key in doomed:
            del rows[key]
        return len(doomed)

    async def delete_thread(self, thread_id: str) -> int:
        """The whole thread."""
        await self._round_trip()
        return len(self._threads.pop(thread_id, {}))


class BrokenHeadBackend(RoundTripBackend):
    """BUG: check-then-act. The head's seq is read in one round trip and written in another."""

    async def commit(
        self,
        thread_id: str,
        writes: Sequence[tuple[str, bytes]],
        head_key: str,
        head_value: bytes,
        seq: int,
    ) -> bool:
        """Read the head (one round trip), then write (another): racers all pass the check."""
        await self._round_trip()
        rows = self._threads.setdefault(thread_id, {})
        head = rows.get(head_key)  # what the first round trip returned
        await self._round_trip()  # ... and the write goes out after the check came back
        if self._stale(head, seq):
            return False
        for key, value in writes:
            rows[key] = (bytes(value), None)
        rows[head_key] = (bytes(head_value), seq)
        return True


class BrokenPrefixBackend(RoundTripBackend):
    """BUG: prefix matching through an unescaped LIKE pattern (``prefix || '%'``)."""

    def _matches(self, key: str, prefix: str) -> bool:
        pattern = "".join(
            ".*" if ch == "%" else "." if ch == "_" else re.escape(ch) for ch in prefix + "%"
        )
        return re.fullmatch(pattern, key, flags=re.DOTALL) is not None


class BrokenCreateBackend(RoundTripBackend):
    """BUG: create checks for the key in one round trip and writes in another."""

    async def create(self, thread_id: str, key: str, value: bytes) -> bool:
        """Exists? (round trip) -- then write (round trip): racers all win."""
        if await self.get(thread_id, key) is not None:
            return False
        await self._round_trip()
        self._threads.setdefault(thread_id, {})[key] = (bytes(value), None)
        return True


class BrokenSeqBackend(RoundTripBackend):
    """BUG: seqs compared as floats (a naive Lua ``tonumber``): 2**53 + 1 == 2**53."""

    def _stale(self, head: tuple[bytes, int | None] | None, seq: int) -> bool:
        return head is not None and head[1] is not None and float(head[1]) >= float(seq)


class BrokenFileHeadBackend(FileBackend):
    """BUG: the file store without its cross-process lock.

    Commits are still serialized inside one process (the file backend's
    per-head asyncio lock), so every single-process check passes; two
    processes both read the old head and both write. Only the kit's
    cross-process race can see it.
    """

    @contextlib.contextmanager
    def _flock(self, directory: Path, head_key: str) -> Iterator[None]:
        yield  # forgot fcntl.flock: nothing stops another process between check and write
