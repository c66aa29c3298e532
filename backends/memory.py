"""``memory://``: an in-process backend, and the reference implementation of the SPI.

Read this file to learn what a backend must do; copy it to start a new one.
Every method is a few lines because a dict already gives what a database has
to work for: atomicity (no ``await`` between the check and the write),
ordering (sorting on read) and losslessness (any string is a dict key).

``memory://`` is private to one store object; ``memory://name`` is shared by
every store in the process that opens the same name (handy in tests). Nothing
survives the process.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Sequence
from typing import Any

from checkpoint_stores.spi import Capabilities

__all__ = ["MemoryBackend"]

# name -> thread_id -> key -> (value, seq); seq is None for values written by put/create.
_Namespace = dict[str, dict[str, tuple[bytes, int | None]]]
_SHARED: dict[str, _Namespace] = {}
_SHARED_LOCK = threading.Lock()


class MemoryBackend:
    """Stores values in a dict. Atomic and fenced; neither durable nor cross-process."""

    capabilities = Capabilities(
        atomic_commit=True,
        fenced_commit=True,
        cross_process=False,
        durable=False,
        ttl=False,
        max_value_bytes=None,
        max_key_bytes=1 << 20,
        notes="in-process only; memory://name shares a namespace within one process",
    )

    def __init__(self, url: str = "memory://", **options: Any) -> None:
        if options:
            raise TypeError(f"memory:// takes no options, got {sorted(options)}")
        name = url.partition("://")[2].strip("/")
        self.url = url
        if name:
            with _SHARED_LOCK:
                self._threads = _SHARED.setdefault(name, {})
        else:
            self._threads = {}
        # A lock, not just the event loop, so stores used from several threads stay consistent.
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"MemoryBackend({self.url!r})"

    async def setup(self) -> None:
        """Nothing to create."""

    async def close(self) -> None:
        """Nothing to release (data stays while the process lives, for ``memory://name``)."""

    async def get(self, thread_id: str, key: str) -> bytes | None:
        """The value under ``key``, or ``None``."""
        with self._lock:
            found = self._threads.get(thread_id, {}).get(key)
        return None if found is None else found[0]

    async def get_many(self, thread_id: str, keys: Sequence[str]) -> list[bytes | None]:
        """Values of ``keys``, in order."""
        with self._lock:
            rows = self._threads.get(thread_id, {})
            return [row[0] if (row := rows.get(k)) is not None else None for k in keys]

    async def put(self, thread_id: str, key: str, value: bytes) -> None:
        """Upsert ``value`` (copied, so a caller's buffer can change afterwards)."""
        with self._lock:
            self._threads.setdefault(thread_id, {})[key] = (bytes(value), None)

    async def create(self, thread_id: str, key: str, value: bytes) -> bool:
        """Store only if absent."""
        with self._lock:
            rows = self._threads.setdefault(thread_id, {})
            if key in rows:
                return False
            rows[key] = (bytes(value), None)
            return True

    async def commit(
        self,
        thread_id: str,
        writes: Sequence[tuple[str, bytes]],
        head_key: str,
        head_value: bytes,
        seq: int,
    ) -> bool:
        """Compare the head's seq, then write everything; all under one lock."""
        with self._lock:
            rows = self._threads.setdefault(thread_id, {})
            head = rows.get(head_key)
            if head is not None and head[1] is not None and head[1] >= seq:
                return False
            for key, value in writes:
                rows[key] = (bytes(value), None)
            rows[head_key] = (bytes(head_value), seq)
            return True

    async def list(self, thread_id: str, prefix: str = "") -> AsyncIterator[tuple[str, bytes]]:
        """Keys starting with ``prefix`` (plain ``str.startswith``), sorted, with values."""
        with self._lock:
            rows = self._threads.get(thread_id, {})
            snapshot = sorted((k, v[0]) for k, v in rows.items() if k.startswith(prefix))
        for item in snapshot:
            yield item

    async def list_threads(self, prefix: str = "") -> AsyncIterator[str]:
        """Thread ids that hold at least one key, sorted."""
        with self._lock:
            names = sorted(t for t, rows in self._threads.items() if rows and t.startswith(prefix))
        for name in names:
            yield name

    async def delete(self, thread_id: str, key: str) -> bool:
        """Delete one key."""
        with self._lock:
            return self._threads.get(thread_id, {}).pop(key, None) is not None

    async def delete_prefix(self, thread_id: str, prefix: str) -> int:
        """Delete keys starting with ``prefix``."""
        with self._lock:
            rows = self._threads.get(thread_id, {})
            doomed = [k for k in rows if k.startswith(prefix)]
            for key in doomed:
                del rows[key]
            return len(doomed)

    async def delete_thread(self, thread_id: str) -> int:
        """Delete the whole thread."""
        with self._lock:
            return len(self._threads.pop(thread_id, {}))
