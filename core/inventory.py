"""What a store holds: its threads, and each thread's keys grouped by run.

The operating tools (copy, prune, stats, rotate) all start the same way:
enumerate threads (through the optional :class:`~checkpoint_stores.spi.ThreadLister`
SPI extension, or from ids the caller names), then sort a thread's keys into
runs by the AFK-compatible key layout of :mod:`checkpoint_stores.keys`::

    checkpoint:{run}:latest          head       the run's newest full record (seq beside it)
    checkpoint:{run}:runtime         runtime    the newest runtime snapshot
    checkpoint:{run}:{step}:{phase}  record     one step record
    effect:{run}:{step}:{call}       effect     one tool effect
    anything else                    state      AFK thread state, owned by no run

This module only reads.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final

import orjson

from checkpoint_stores.codec import Codec, is_envelope
from checkpoint_stores.errors import AgentCheckpointCorruptionError, CheckpointStoreError
from checkpoint_stores.keys import (
    CHECKPOINT_PREFIX,
    EFFECT_PREFIX,
    LATEST_SUFFIX,
    RUNTIME_SUFFIX,
    validate_run_id,
    validate_thread_id,
)
from checkpoint_stores.spi import StorageBackend, ThreadLister
from checkpoint_stores.store import MemoryStore

__all__ = [
    "KeyKind",
    "RecordInfo",
    "RunKeys",
    "ThreadInventory",
    "ThreadListingUnsupportedError",
    "check_run_id",
    "classify_key",
    "is_terminal_record",
    "iter_thread_ids",
    "run_prefixes",
    "scan_thread",
    "value_body",
]

_TERMINAL: Final = "run_terminal"


class ThreadListingUnsupportedError(CheckpointStoreError):
    """The backend cannot enumerate its threads; name them (``--thread``) instead."""


class KeyKind(str, Enum):
    """What a key of a thread is, by the key layout."""

    HEAD = "head"
    RUNTIME = "runtime"
    RECORD = "record"
    EFFECT = "effect"
    STATE = "state"


def classify_key(key: str) -> tuple[KeyKind, str | None]:
    """The kind of ``key`` and the run it belongs to (``None`` for thread state).

    >>> classify_key("checkpoint:r1:latest")
    (<KeyKind.HEAD: 'head'>, 'r1')
    >>> classify_key("effect:r1:3:call-7")
    (<KeyKind.EFFECT: 'effect'>, 'r1')
    >>> classify_key("user-notes")
    (<KeyKind.STATE: 'state'>, None)
    """
    if key.startswith(CHECKPOINT_PREFIX):
        run_id, sep, rest = key[len(CHECKPOINT_PREFIX) :].partition(":")
        if sep and run_id and rest:
            if rest == LATEST_SUFFIX:
                return KeyKind.HEAD, run_id
            if rest == RUNTIME_SUFFIX:
                return KeyKind.RUNTIME, run_id
            return KeyKind.RECORD, run_id
    elif key.startswith(EFFECT_PREFIX):
        run_id, sep, rest = key[len(EFFECT_PREFIX) :].partition(":")
        if sep and run_id and rest:
            return KeyKind.EFFECT, run_id
    return KeyKind.STATE, None


def run_prefixes(run_id: str) -> tuple[str, str]:
    """The checkpoint and effect key prefixes of a run found in a store.

    Built without :func:`~checkpoint_stores.keys.validate_run_id`: a run id read
    back from a store (AFK may have written it) is used exactly as stored.
    """
    return f"{CHECKPOINT_PREFIX}{run_id}:", f"{EFFECT_PREFIX}{run_id}:"


def value_body(codec: Codec, raw: bytes, *, what: str = "value") -> bytes:
    """The JSON bytes inside a stored value: unwrapped (decrypted) envelope, or plain JSON.

    Raises :class:`AgentCheckpointCorruptionError` (or its ``DecryptionError``)
    when the value is damaged, not JSON, or encrypted with a key ``codec`` lacks.
    """
    if is_envelope(raw):
        return codec.unwrap(raw, what=what)
    try:
        orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise AgentCheckpointCorruptionError(
            f"{what}: neither a checkpoint-stores envelope nor JSON ({exc}); "
            "it was written by another tool and cannot be re-encoded"
        ) from None
    return bytes(raw)


@dataclass
class RecordInfo:
    """One step record (or effect) as scanned: size, and seq/step/time when decoded."""

    key: str
    size: int
    seq: int | None = None
    step: int | None = None
    timestamp_ms: int | None = None
    error: str | None = None


@dataclass
class RunKeys:
    """The keys of one run in a thread, with the head and runtime values kept."""

    run_id: str
    head: bytes | None = None
    runtime: bytes | None = None
    records: builtins.list[RecordInfo] = field(default_factory=builtins.list)
    effects: builtins.list[RecordInfo] = field(default_factory=builtins.list)

    @property
    def size(self) -> int:
        """Bytes of every value of the run."""
        return (
            len(self.head or b"")
            + len(self.runtime or b"")
            + sum(r.size for r in self.records)
            + sum(e.size for e in self.effects)
        )

    @property
    def key_count(self) -> int:
        """Number of keys of the run."""
        return (
            (self.head is not None)
            + (self.runtime is not None)
            + len(self.records)
            + len(self.effects)
        )

    def all_keys(self) -> builtins.list[str]:
        """Every key of the run, records and effects first, runtime, then the head."""
        checkpoint, _ = run_prefixes(self.run_id)
        keys = [r.key for r in self.records] + [e.key for e in self.effects]
        if self.runtime is not None:
            keys.append(checkpoint + RUNTIME_SUFFIX)
        if self.head is not None:
            keys.append(checkpoint + LATEST_SUFFIX)
        return keys


@dataclass
class ThreadInventory:
    """One thread's keys by run, plus the thread state keys owned by no run."""

    thread_id: str
    runs: dict[str, RunKeys] = field(default_factory=dict)
    state: builtins.list[RecordInfo] = field(default_factory=builtins.list)

    def run(self, run_id: str) -> RunKeys:
        """The run's entry (created empty when the thread has no key of it)."""
        found = self.runs.get(run_id)
        if found is None:
            found = self.runs[run_id] = RunKeys(run_id)
        return found

    @property
    def size(self) -> int:
        """Bytes of every value in the thread."""
        return sum(r.size for r in self.runs.values()) + sum(s.size for s in self.state)

    @property
    def key_count(self) -> int:
        """Number of keys in the thread."""
        return sum(r.key_count for r in self.runs.values()) + len(self.state)


def _record_fields(codec: Codec, raw: bytes, info: RecordInfo, what: str) -> None:
    """Fill seq/step/time from a record, tolerating damage (noted in ``info.error``)."""
    try:
        value: Any = codec.decode(raw, what=what)
    except AgentCheckpointCorruptionError as exc:
        info.error = str(exc)
        return
    if not isinstance(value, dict):
        info.error = f"{what}: not a JSON object"
        return
    for name in ("seq", "step", "timestamp_ms"):
        item = value.get(name, 0)
        if item is None:
            item = 0
        if isinstance(item, bool) or not isinstance(item, int):
            info.error = f"{what}: field {name!r} is not an integer ({item!r})"
            return
        setattr(info, name, item)


async def scan_thread(
    store: MemoryStore,
    thread_id: str,
    *,
    run_id: str | None = None,
    decode_records: bool = False,
) -> ThreadInventory:
    """Read a thread's keys once and group them by run.

    Head and runtime values are kept (the tools need them); other values are
    only measured, and with ``decode_records`` decoded for seq, step and time
    (an unreadable record gets ``error`` instead of stopping the scan). With
    ``run_id`` only that run's keys are read.
    """
    backend = store.backend
    inventory = ThreadInventory(thread_id)
    prefixes = [""] if run_id is None else list(run_prefixes(run_id))
    for prefix in prefixes:
        async for key, raw in backend.list(thread_id, prefix):
            kind, run = classify_key(key)
            if kind is KeyKind.STATE or run is None:
                inventory.state.append(RecordInfo(key, len(raw)))
                continue
            entry = inventory.run(run)
            if kind is KeyKind.HEAD:
                entry.head = bytes(raw)
            elif kind is KeyKind.RUNTIME:
                entry.runtime = bytes(raw)
            else:
                info = RecordInfo(key, len(raw))
                if decode_records and kind is KeyKind.RECORD:
                    _record_fields(store.codec, raw, info, f"{key!r} of thread {thread_id!r}")
                (entry.records if kind is KeyKind.RECORD else entry.effects).append(info)
    return inventory


def is_terminal_record(value: Any) -> bool:
    """True if a decoded record is a ``run_terminal`` record."""
    return isinstance(value, dict) and value.get("phase") == _TERMINAL


async def iter_thread_ids(
    store: MemoryStore,
    thread_ids: Iterable[str] | None = None,
    *,
    prefix: str = "",
) -> AsyncIterator[str]:
    """The threads to work on: ``thread_ids`` when given (validated), else every thread.

    Enumerating needs the backend's optional ``list_threads``
    (:class:`~checkpoint_stores.spi.ThreadLister`).

    Raises:
        ThreadListingUnsupportedError: no ``thread_ids`` and the backend cannot list.
        InvalidIdentifierError: a given thread id the store cannot hold.
    """
    await store.setup()
    limit = store.capabilities.max_key_bytes
    if thread_ids is not None:
        for thread_id in thread_ids:
            yield validate_thread_id(thread_id, max_bytes=limit)
        return
    backend: StorageBackend = store.backend
    if not isinstance(backend, ThreadLister):
        raise ThreadListingUnsupportedError(
            f"the {type(backend).__name__} backend of {store.url or 'this store'} cannot list "
            "its threads (it does not implement list_threads); name the threads to work on "
            "(--thread T, repeatable)"
        )
    async for thread_id in backend.list_threads(prefix):
        yield thread_id


def check_run_id(run_id: str | None) -> str | None:
    """A run id given by a user, validated (``None`` passes through)."""
    return None if run_id is None else validate_run_id(run_id)
