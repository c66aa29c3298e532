"""``file://``: the embedded default. One file per key, crash-safe and multi-process safe.

Layout under the root directory::

    ROOT/.checkpoint-stores          marker with the layout version
    ROOT/threads/<thread name>/      one directory per thread (created whole, by rename)
        .thread-id                   the thread id, verbatim (names may be hashed)
        k<encoded key>               one file per key
        h<sha256 of key>             a key whose encoded name would be too long
        .locks/<key name>            flock files, one per run head
        .tmp-*                       files being written (ignored when reading)

Names are percent-encoded with only ``a-z 0-9 - _ .`` left as is (upper case
is encoded too, so case-insensitive filesystems cannot merge two ids) and
prefixed with ``k``/``t``, so no id can be ``..``, a hidden file, a Windows
reserved name, or reach outside the root. Names above 200 bytes are replaced
by a SHA-256; the original is kept inside the file, so ``list`` is lossless.

Every file starts with a 28-byte header (magic, seq, key length, value
length, CRC-32 of everything else) followed by the key and the value: a
truncated or bit-flipped file is detected (the seq included, which no value
checksum covers), and the head's seq lives beside its value as the SPI requires.

Writes: temp file in the same directory, fsync, ``os.replace``, fsync of the
directory. ``commit`` takes an ``fcntl.flock`` on the run's lock file, checks
the head's seq, writes the records (made durable first), then the head: a
crash leaves every key old or new, and the head never names a missing record.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import errno
import fcntl
import hashlib
import os
import secrets
import shutil
import struct
import weakref
import zlib
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qsl, unquote

from checkpoint_stores.errors import AgentCheckpointCorruptionError, StoreUnavailableError
from checkpoint_stores.options import option_bool
from checkpoint_stores.spi import Capabilities
from checkpoint_stores.urls import redact_url

__all__ = ["FileBackend"]

LAYOUT_VERSION: Final = "2"
_FIELDS: Final = struct.Struct(">4sqIQ")  # magic, seq, key length, value length
_CRC: Final = struct.Struct(">I")  # CRC-32 of the fields, the key and the value
_HEADER_SIZE: Final = _FIELDS.size + _CRC.size
_MAGIC: Final = b"CSF2"
_NO_SEQ: Final = -1
_MAX_SEQ: Final = 2**63 - 1
_SAFE: Final = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_.")
_MAX_NAME: Final = 200
_TMP: Final = ".tmp-"


def _encode(text: str) -> str:
    out: list[str] = []
    for ch in text:
        if ch in _SAFE:
            out.append(ch)
        else:
            out.extend(f"%{b:02x}" for b in ch.encode("utf-8"))
    return "".join(out)


def _name(kind: str, text: str) -> str:
    """File name for a key (``kind="k"``) or thread (``kind="t"``)."""
    encoded = _encode(text)
    if len(encoded) + 1 > _MAX_NAME:
        return "h" + hashlib.sha256(text.encode("utf-8")).hexdigest()
    return kind + encoded


def _decode(name: str) -> str | None:
    """The key of a ``k`` name; ``None`` for hashed names (read the header instead)."""
    if name.startswith("k"):
        return unquote(name[1:], errors="strict")
    return None


def _parse_options(query: str, options: dict[str, Any]) -> dict[str, Any]:
    merged: dict[str, Any] = dict(parse_qsl(query))
    merged.update(options)
    return merged


class FileBackend:
    """A directory tree of fsync'd files. Durable, cross-process, fenced.

    URL: ``file:///absolute/path`` or ``file://./relative/path``.
    Options: ``fsync`` (default ``True``; ``False`` trades power-loss
    durability for speed, for tests on throwaway directories).
    """

    capabilities = Capabilities(
        atomic_commit=False,
        fenced_commit=True,
        cross_process=True,
        durable=True,
        ttl=False,
        max_value_bytes=None,
        max_key_bytes=64 * 1024,
        notes=(
            "commit is ordered, not atomic: records are durable before the head moves, "
            "so a crash can leave an extra record but never a head without its record"
        ),
    )

    def __init__(self, url: str, **options: Any) -> None:
        path_part, _, query = url.partition("://")[2].partition("?")
        if not path_part:
            raise ValueError("file:// URL needs a path: file:///var/lib/runs or file://./runs")
        if not path_part.startswith(("/", ".", "~")):
            raise ValueError(
                f"file:// URL {redact_url(url)!r} names a host; write file:///absolute/path or "
                "file://./relative/path"
            )
        opts = _parse_options(query, options)
        unknown = set(opts) - {"fsync"}
        if unknown:
            raise TypeError(f"file:// does not take options {sorted(unknown)}; it takes: fsync")
        self.url = url
        self.root = Path(unquote(path_part)).expanduser().resolve()
        self._fsync = option_bool(opts.get("fsync", True), "fsync", scheme="file://")
        self._threads_dir = self.root / "threads"
        # One asyncio lock per run head, so pool threads do not queue on flock.
        self._locks: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )

    def __repr__(self) -> str:
        return f"FileBackend({str(self.root)!r})"

    # -- lifecycle ---------------------------------------------------------------

    async def setup(self) -> None:
        """Create the root (idempotent, safe when several processes start at once)."""
        await asyncio.to_thread(self._setup_sync)

    def _setup_sync(self) -> None:
        try:
            self._threads_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailableError(
                f"cannot create the store directory {self.root}: {exc.strerror}; "
                "check the path and its permissions"
            ) from exc
        marker = self.root / ".checkpoint-stores"
        if not marker.exists():
            self._write_plain(marker, f"layout {LAYOUT_VERSION}\n".encode())
        else:
            found = marker.read_text(encoding="utf-8").split()
            if found[:1] != ["layout"] or found[1:2] != [LAYOUT_VERSION]:
                raise StoreUnavailableError(
                    f"{self.root} holds layout {found[1:2]}, this library writes layout "
                    f"{LAYOUT_VERSION}; upgrade checkpoint-stores or use another directory"
                )

    async def close(self) -> None:
        """Nothing stays open between calls."""

    # -- low-level file helpers (run in worker threads) ---------------------------

    def _sync_dir(self, directory: Path) -> None:
        if not self._fsync:
            return
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _write_temp(self, directory: Path, data: bytes) -> Path:
        tmp = directory / f"{_TMP}{os.getpid()}-{secrets.token_hex(6)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if self._fsync:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        os.close(fd)
        return tmp

    def _write_plain(self, path: Path, data: bytes) -> None:
        tmp = self._write_temp(path.parent, data)
        os.replace(tmp, path)
        self._sync_dir(path.parent)

    def _thread_dir(self, thread_id: str, *, create: bool) -> Path | None:
        directory = self._threads_dir / _name("t", thread_id)
        if directory.is_dir():
            return directory
        if not create:
            return None
        # Build the directory whole (.locks, .thread-id) under a temp name, then rename it
        # into place: another process sees it complete or not at all, and a crash half-way
        # leaves only a temp directory, never a thread without its id or lock directory.
        staging = self._threads_dir / f"{_TMP}{os.getpid()}-{secrets.token_hex(6)}"
        staging.mkdir(parents=True)
        try:
            (staging / ".locks").mkdir()
            self._write_plain(staging / ".thread-id", thread_id.encode("utf-8"))
            os.rename(staging, directory)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            if not directory.is_dir():  # not "another process created it first"
                raise
        self._sync_dir(self._threads_dir)
        return directory

    @staticmethod
    def _record(key: str, value: bytes, seq: int | None) -> bytes:
        raw_key = key.encode("utf-8")
        fields = _FIELDS.pack(_MAGIC, _NO_SEQ if seq is None else seq, len(raw_key), len(value))
        crc = zlib.crc32(value, zlib.crc32(raw_key, zlib.crc32(fields)))
        return fields + _CRC.pack(crc) + raw_key + value

    @staticmethod
    def _damaged(path: Path, problem: str) -> AgentCheckpointCorruptionError:
        return AgentCheckpointCorruptionError(
            f"{path}: {problem}; restore the file from a copy or delete the run "
            "(the store never returns partial data)"
        )

    @classmethod
    def _fields(cls, path: Path, data: bytes) -> tuple[int, int, int, int]:
        """``(seq, key length, value length, crc)`` of a header, checked for shape."""
        if len(data) < _HEADER_SIZE:
            raise cls._damaged(path, f"file truncated to {len(data)} bytes (header is 28)")
        magic, seq, key_len, value_len = _FIELDS.unpack_from(data)
        if magic != _MAGIC:
            raise cls._damaged(path, "not a checkpoint-stores file (bad magic)")
        return seq, key_len, value_len, _CRC.unpack_from(data, _FIELDS.size)[0]

    @classmethod
    def _parse(cls, path: Path, data: bytes) -> tuple[str, int | None, bytes]:
        seq, key_len, value_len, crc = cls._fields(path, data)
        end = _HEADER_SIZE + key_len + value_len
        if len(data) != end:
            raise cls._damaged(
                path, f"file is {len(data)} bytes, its header says {end} (truncated or appended to)"
            )
        body = memoryview(data)[_HEADER_SIZE:]
        if zlib.crc32(body, zlib.crc32(memoryview(data)[: _FIELDS.size])) != crc:
            raise cls._damaged(path, "checksum mismatch (bit flip or torn write)")
        return (
            cls._key(path, body[:key_len]),
            (None if seq == _NO_SEQ else seq),
            data[end - value_len :],
        )

    @classmethod
    def _key(cls, path: Path, raw: bytes | memoryview) -> str:
        try:
            return bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            raise cls._damaged(path, "stored key is not UTF-8") from None

    def _read(self, path: Path) -> tuple[str, int | None, bytes] | None:
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except FileNotFoundError:
            return None
        return self._parse(path, data)

    def _read_key(self, directory: Path, key: str) -> tuple[int | None, bytes] | None:
        path = directory / _name("k", key)
        found = self._read(path)
        if found is None:
            return None
        if found[0] != key:  # names are derived from keys: only damage (or a copy) gets here
            raise self._damaged(path, f"file holds key {found[0]!r}, not {key!r}")
        return found[1], found[2]

    def _stored_key(self, path: Path) -> str | None:
        """The key a hashed-name file holds, reading only its header and key."""
        try:
            with open(path, "rb") as handle:
                head = handle.read(_HEADER_SIZE)
                _, key_len, _, _ = self._fields(path, head)
                raw = handle.read(key_len)
        except FileNotFoundError:
            return None
        if len(raw) != key_len:
            raise self._damaged(path, "file truncated inside its key")
        return self._key(path, raw)

    def _replace(self, directory: Path, key: str, value: bytes, seq: int | None) -> None:
        tmp = self._write_temp(directory, self._record(key, value, seq))
        os.replace(tmp, directory / _name("k", key))

    @contextlib.contextmanager
    def _flock(self, directory: Path, head_key: str) -> Iterator[None]:
        lock_path = directory / ".locks" / _name("k", head_key)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _entries(self, directory: Path, prefix: str) -> list[tuple[str, Path]]:
        """``(key, path)`` for keys starting with ``prefix``, sorted by key."""
        found: list[tuple[str, Path]] = []
        with os.scandir(directory) as entries:
            for entry in entries:
                name = entry.name
                if name.startswith("k"):
                    key = _decode(name)
                elif name.startswith("h"):
                    key = self._stored_key(Path(entry.path))
                else:
                    continue  # .thread-id, .locks, temp files
                if key is not None and key.startswith(prefix):
                    found.append((key, Path(entry.path)))
        found.sort(key=lambda item: item[0])
        return found

    async def _run(self, func: Any, *args: Any) -> Any:
        try:
            return await asyncio.to_thread(func, *args)
        except (AgentCheckpointCorruptionError, StoreUnavailableError):
            raise
        except OSError as exc:
            if exc.errno in {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}:
                raise StoreUnavailableError(
                    f"file store {self.root}: {exc.strerror} ({exc.filename}); free space or fix "
                    "permissions, then retry: nothing partial was made visible"
                ) from exc
            raise

    # -- SPI -------------------------------------------------------------------------

    async def get(self, thread_id: str, key: str) -> bytes | None:
        """Read one file."""
        return await self._run(self._get_sync, thread_id, key)  # type: ignore[no-any-return]

    def _get_sync(self, thread_id: str, key: str) -> bytes | None:
        directory = self._thread_dir(thread_id, create=False)
        if directory is None:
            return None
        found = self._read_key(directory, key)
        return None if found is None else found[1]

    async def get_many(self, thread_id: str, keys: Sequence[str]) -> list[bytes | None]:
        """Read several files in one worker-thread hop."""
        return await self._run(self._get_many_sync, thread_id, list(keys))  # type: ignore[no-any-return]

    def _get_many_sync(self, thread_id: str, keys: list[str]) -> list[bytes | None]:
        directory = self._thread_dir(thread_id, create=False)
        if directory is None:
            return [None] * len(keys)
        out: list[bytes | None] = []
        for key in keys:
            found = self._read_key(directory, key)
            out.append(None if found is None else found[1])
        return out

    async def put(self, thread_id: str, key: str, value: bytes) -> None:
        """Atomic replace of one file."""
        await self._run(self._put_sync, thread_id, key, bytes(value))

    def _put_sync(self, thread_id: str, key: str, value: bytes) -> None:
        directory = self._thread_dir(thread_id, create=True)
        assert directory is not None
        self._replace(directory, key, value, None)
        self._sync_dir(directory)

    async def create(self, thread_id: str, key: str, value: bytes) -> bool:
        """Hard-link a finished temp file into place: the link fails if the name exists."""
        return await self._run(self._create_sync, thread_id, key, bytes(value))  # type: ignore[no-any-return]

    def _create_sync(self, thread_id: str, key: str, value: bytes) -> bool:
        directory = self._thread_dir(thread_id, create=True)
        assert directory is not None
        tmp = self._write_temp(directory, self._record(key, value, None))
        try:
            os.link(tmp, directory / _name("k", key))
        except FileExistsError:
            return False
        finally:
            tmp.unlink()
        self._sync_dir(directory)
        return True

    async def commit(
        self,
        thread_id: str,
        writes: Sequence[tuple[str, bytes]],
        head_key: str,
        head_value: bytes,
        seq: int,
    ) -> bool:
        """Under the run's flock: compare seq, write records durably, then the head."""
        if not 0 <= seq <= _MAX_SEQ:
            raise ValueError(f"seq must be between 0 and 2**63-1, got {seq}")
        lock = self._locks.get((thread_id, head_key))
        if lock is None:
            lock = asyncio.Lock()
            self._locks[(thread_id, head_key)] = lock
        async with lock:
            return await self._run(  # type: ignore[no-any-return]
                self._commit_sync, thread_id, list(writes), head_key, bytes(head_value), seq
            )

    def _commit_sync(
        self,
        thread_id: str,
        writes: list[tuple[str, bytes]],
        head_key: str,
        head_value: bytes,
        seq: int,
    ) -> bool:
        directory = self._thread_dir(thread_id, create=True)
        assert directory is not None
        with self._flock(directory, head_key):
            current = self._read_key(directory, head_key)
            if current is not None and current[0] is not None and current[0] >= seq:
                return False
            if writes:
                for key, value in writes:
                    self._replace(directory, key, bytes(value), None)
                self._sync_dir(directory)  # records durable before the head names them
            self._replace(directory, head_key, head_value, seq)
            self._sync_dir(directory)
        return True

    async def list(self, thread_id: str, prefix: str = "") -> AsyncIterator[tuple[str, bytes]]:
        """Scan the thread directory, filter by decoded key, sort, read in batches."""
        entries = await self._run(self._list_entries_sync, thread_id, prefix)
        batch = 64
        for start in range(0, len(entries), batch):
            chunk = entries[start : start + batch]
            values = await self._run(self._read_values_sync, chunk)
            for (key, _), value in zip(chunk, values, strict=True):
                if value is not None:  # deleted since the scan
                    yield key, value

    def _list_entries_sync(self, thread_id: str, prefix: str) -> builtins.list[tuple[str, Path]]:
        directory = self._thread_dir(thread_id, create=False)
        return [] if directory is None else self._entries(directory, prefix)

    def _read_values_sync(
        self, chunk: builtins.list[tuple[str, Path]]
    ) -> builtins.list[bytes | None]:
        out: builtins.list[bytes | None] = []
        for key, path in chunk:
            found = self._read(path)
            if found is not None and found[0] != key:
                raise self._damaged(path, f"file holds key {found[0]!r}, not {key!r}")
            out.append(None if found is None else found[2])  # None: deleted since the scan
        return out

    async def list_threads(self, prefix: str = "") -> AsyncIterator[str]:
        """Thread ids read from each directory's ``.thread-id``, sorted."""
        for thread_id in await self._run(self._list_threads_sync, prefix):
            yield thread_id

    def _list_threads_sync(self, prefix: str) -> builtins.list[str]:
        out: builtins.list[str] = []
        try:
            entries = list(os.scandir(self._threads_dir))
        except FileNotFoundError:
            return out
        for entry in entries:
            if not entry.name.startswith(("t", "h")):
                continue  # a thread directory being created (.tmp-*)
            try:
                with open(os.path.join(entry.path, ".thread-id"), "rb") as handle:
                    thread_id = handle.read().decode("utf-8")
            except (FileNotFoundError, NotADirectoryError):
                continue
            if thread_id.startswith(prefix) and any(
                e.name.startswith(("k", "h")) for e in os.scandir(entry.path)
            ):
                out.append(thread_id)
        return sorted(out)

    async def delete(self, thread_id: str, key: str) -> bool:
        """Unlink one file."""
        return await self._run(self._delete_sync, thread_id, key)  # type: ignore[no-any-return]

    def _delete_sync(self, thread_id: str, key: str) -> bool:
        # No read first: a damaged file must stay deletable (it is the remedy errors name).
        directory = self._thread_dir(thread_id, create=False)
        if directory is None:
            return False
        try:
            os.unlink(directory / _name("k", key))
        except FileNotFoundError:
            return False
        self._sync_dir(directory)
        return True

    async def delete_prefix(self, thread_id: str, prefix: str) -> int:
        """Unlink every file whose key starts with ``prefix``."""
        return await self._run(self._delete_prefix_sync, thread_id, prefix)  # type: ignore[no-any-return]

    def _delete_prefix_sync(self, thread_id: str, prefix: str) -> int:
        directory = self._thread_dir(thread_id, create=False)
        if directory is None:
            return 0
        removed = 0
        for _, path in self._entries(directory, prefix):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                removed += 1
        if removed:
            self._sync_dir(directory)
        return removed

    async def delete_thread(self, thread_id: str) -> int:
        """Move the thread directory aside atomically, then remove it."""
        return await self._run(self._delete_thread_sync, thread_id)  # type: ignore[no-any-return]

    def _delete_thread_sync(self, thread_id: str) -> int:
        directory = self._thread_dir(thread_id, create=False)
        if directory is None:
            return 0
        # Count by name, reading nothing: a damaged file must not block deleting its thread.
        with os.scandir(directory) as entries:
            count = sum(1 for e in entries if e.name.startswith(("k", "h")))
        trash = self.root / f"{_TMP}trash-{secrets.token_hex(8)}"
        try:
            os.rename(directory, trash)
        except FileNotFoundError:
            return 0
        self._sync_dir(self._threads_dir)
        shutil.rmtree(trash, ignore_errors=True)
        return count
