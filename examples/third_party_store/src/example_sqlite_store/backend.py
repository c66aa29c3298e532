"""``example-sqlite:///path/to/file.db``: a StorageBackend on SQLite via the standard library.

Written the way a platform team would write one for their own database,
method order as in ``checkpoint_stores.backends.memory``:

* thread ids and keys are stored as UTF-8 BLOBs: SQLite compares BLOBs with
  memcmp, which is UTF-8 byte order = Python string order, and a BLOB keeps
  NUL and every other character as it is;
* ``list`` and ``delete_prefix`` are range scans (``key >= prefix AND key <
  prefix_upper_bound(prefix)``), never LIKE or GLOB, so no character in a
  prefix is a wildcard;
* ``commit`` runs in one ``BEGIN IMMEDIATE`` transaction (SQLite's write lock
  is taken before the seq is read), so it is atomic and fenced across
  processes; the seq lives in its own column, NULL for values written by
  ``put`` or ``create``.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote

from checkpoint_stores import Capabilities, StoreUnavailableError
from checkpoint_stores.keys import prefix_upper_bound
from checkpoint_stores.urls import redact_url

__all__ = ["SqliteBackend"]

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (
    thread BLOB NOT NULL,
    key    BLOB NOT NULL,
    value  BLOB NOT NULL,
    seq    INTEGER,
    PRIMARY KEY (thread, key)
) WITHOUT ROWID
"""
_PAGE = 500


def _b(text: str) -> bytes:
    return text.encode("utf-8")


def _range(prefix: str) -> tuple[str, list[bytes]]:
    """SQL condition and parameters for ``key`` starting with ``prefix`` (exact, no LIKE)."""
    upper = prefix_upper_bound(prefix)
    if upper is None:
        return "key >= ?", [_b(prefix)]
    return "key >= ? AND key < ?", [_b(prefix), _b(upper)]


class SqliteBackend:
    """SQLite in one file. Atomic, fenced, cross-process and durable."""

    capabilities = Capabilities(
        atomic_commit=True,
        fenced_commit=True,
        cross_process=True,
        durable=True,
        ttl=False,
        max_value_bytes=256 * 1024 * 1024,
        max_key_bytes=64 * 1024,
        notes="example third-party backend (stdlib sqlite3, WAL, synchronous=FULL)",
    )

    def __init__(self, url: str, **options: Any) -> None:
        path = unquote(url.partition("://")[2].partition("?")[0])
        if not path:
            raise ValueError("example-sqlite:// needs a file path: example-sqlite:///tmp/runs.db")
        if options:
            raise TypeError(f"example-sqlite:// takes no options, got {sorted(options)}")
        self.url = url
        self.path = Path(path).expanduser()
        self._db: sqlite3.Connection | None = None
        # One connection per backend; SQLite serializes writers across processes itself.
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SqliteBackend({redact_url(self.url)!r})"

    async def _call(self, func: Callable[[sqlite3.Connection], T]) -> T:
        def run() -> T:
            with self._lock:
                if self._db is None:
                    raise StoreUnavailableError(
                        f"{redact_url(self.url)} is not open; call setup() first"
                    )
                return func(self._db)

        try:
            return await asyncio.to_thread(run)
        except sqlite3.OperationalError as exc:
            raise StoreUnavailableError(
                f"{redact_url(self.url)}: {exc}; check the file and its permissions, then retry"
            ) from exc

    async def setup(self) -> None:
        """Open the file and create the table (idempotent, safe from several processes)."""
        if self._db is not None:
            return

        def connect() -> sqlite3.Connection:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(
                self.path, timeout=60, isolation_level=None, check_same_thread=False
            )
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute(_SCHEMA)
            return db

        try:
            db = await asyncio.to_thread(connect)
        except (sqlite3.Error, OSError) as exc:
            raise StoreUnavailableError(f"cannot open {redact_url(self.url)}: {exc}") from exc
        with self._lock:
            # Two setup() calls may race: the first connection stays, the other is closed.
            self._db = self._db or db
        if self._db is not db:
            db.close()

    async def close(self) -> None:
        """Close the connection."""
        with self._lock:
            db, self._db = self._db, None
        if db is not None:
            db.close()

    async def get(self, thread_id: str, key: str) -> bytes | None:
        """One row."""

        def run(db: sqlite3.Connection) -> bytes | None:
            row = db.execute(
                "SELECT value FROM kv WHERE thread = ? AND key = ?", (_b(thread_id), _b(key))
            ).fetchone()
            return None if row is None else bytes(row[0])

        return await self._call(run)

    async def get_many(self, thread_id: str, keys: Sequence[str]) -> builtins.list[bytes | None]:
        """One query for all keys."""
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return []

        def run(db: sqlite3.Connection) -> dict[str, bytes]:
            found: dict[str, bytes] = {}
            for start in range(0, len(wanted), _PAGE):
                chunk = wanted[start : start + _PAGE]
                marks = ",".join("?" * len(chunk))
                rows = db.execute(
                    f"SELECT key, value FROM kv WHERE thread = ? AND key IN ({marks})",
                    [_b(thread_id), *(_b(k) for k in chunk)],
                ).fetchall()
                found.update((bytes(k).decode("utf-8"), bytes(v)) for k, v in rows)
            return found

        found = await self._call(run)
        return [found.get(k) for k in keys]

    async def put(self, thread_id: str, key: str, value: bytes) -> None:
        """Upsert; a put drops any seq the key had (it is no longer a committed head)."""
        await self._call(
            lambda db: db.execute(
                "INSERT INTO kv (thread, key, value, seq) VALUES (?, ?, ?, NULL) "
                "ON CONFLICT (thread, key) DO UPDATE SET value = excluded.value, seq = NULL",
                (_b(thread_id), _b(key), bytes(value)),
            )
        )

    async def create(self, thread_id: str, key: str, value: bytes) -> bool:
        """Insert only if absent: the primary key decides the winner."""
        cursor = await self._call(
            lambda db: db.execute(
                "INSERT INTO kv (thread, key, value, seq) VALUES (?, ?, ?, NULL) "
                "ON CONFLICT (thread, key) DO NOTHING",
                (_b(thread_id), _b(key), bytes(value)),
            )
        )
        return cursor.rowcount == 1

    async def commit(
        self,
        thread_id: str,
        writes: Sequence[tuple[str, bytes]],
        head_key: str,
        head_value: bytes,
        seq: int,
    ) -> bool:
        """Compare the head's seq and write everything in one IMMEDIATE transaction."""
        thread = _b(thread_id)

        def run(db: sqlite3.Connection) -> bool:
            db.execute("BEGIN IMMEDIATE")  # the write lock first: nobody moves the head meanwhile
            try:
                row = db.execute(
                    "SELECT seq FROM kv WHERE thread = ? AND key = ?", (thread, _b(head_key))
                ).fetchone()
                if row is not None and row[0] is not None and row[0] >= seq:
                    db.execute("ROLLBACK")
                    return False
                db.executemany(
                    "INSERT INTO kv (thread, key, value, seq) VALUES (?, ?, ?, NULL) "
                    "ON CONFLICT (thread, key) DO UPDATE SET value = excluded.value, seq = NULL",
                    [(thread, _b(k), bytes(v)) for k, v in writes],
                )
                db.execute(
                    "INSERT INTO kv (thread, key, value, seq) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (thread, key) DO UPDATE SET value = excluded.value, "
                    "seq = excluded.seq",
                    (thread, _b(head_key), bytes(head_value), seq),
                )
                db.execute("COMMIT")
                return True
            except BaseException:
                db.execute("ROLLBACK")
                raise

        return await self._call(run)

    async def list(self, thread_id: str, prefix: str = "") -> AsyncIterator[tuple[str, bytes]]:
        """Range scan in pages (keyset pagination: each page starts after the last key)."""
        condition, params = _range(prefix)
        thread = _b(thread_id)
        after: bytes | None = None
        while True:
            rows = await self._call(functools.partial(self._page, thread, condition, params, after))
            for key, value in rows:
                yield bytes(key).decode("utf-8"), bytes(value)
            if len(rows) < _PAGE:
                return
            after = bytes(rows[-1][0])

    @staticmethod
    def _page(
        thread: bytes,
        condition: str,
        params: builtins.list[bytes],
        after: bytes | None,
        db: sqlite3.Connection,
    ) -> builtins.list[tuple[bytes, bytes]]:
        extra, args = ("", []) if after is None else (" AND key > ?", [after])
        rows: builtins.list[tuple[bytes, bytes]] = db.execute(
            f"SELECT key, value FROM kv WHERE thread = ? AND {condition}{extra} "
            f"ORDER BY key LIMIT {_PAGE}",
            [thread, *params, *args],
        ).fetchall()
        return rows

    async def list_threads(self, prefix: str = "") -> AsyncIterator[str]:
        """Distinct thread ids starting with ``prefix``, sorted."""
        upper = prefix_upper_bound(prefix)
        condition = "thread >= ?" if upper is None else "thread >= ? AND thread < ?"
        params = [_b(prefix)] if upper is None else [_b(prefix), _b(upper)]
        rows = await self._call(
            lambda db: db.execute(
                f"SELECT DISTINCT thread FROM kv WHERE {condition} ORDER BY thread", params
            ).fetchall()
        )
        for (thread,) in rows:
            yield bytes(thread).decode("utf-8")

    async def delete(self, thread_id: str, key: str) -> bool:
        """Delete one row."""
        cursor = await self._call(
            lambda db: db.execute(
                "DELETE FROM kv WHERE thread = ? AND key = ?", (_b(thread_id), _b(key))
            )
        )
        return cursor.rowcount == 1

    async def delete_prefix(self, thread_id: str, prefix: str) -> int:
        """Delete the same exact range ``list`` scans."""
        condition, params = _range(prefix)
        cursor = await self._call(
            lambda db: db.execute(
                f"DELETE FROM kv WHERE thread = ? AND {condition}", [_b(thread_id), *params]
            )
        )
        return int(cursor.rowcount)

    async def delete_thread(self, thread_id: str) -> int:
        """Delete every row of the thread."""
        cursor = await self._call(
            lambda db: db.execute("DELETE FROM kv WHERE thread = ?", (_b(thread_id),))
        )
        return int(cursor.rowcount)
