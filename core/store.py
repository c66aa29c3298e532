"""The MemoryStore facade: AFK's state calls plus checkpoint calls, over any backend.

>>> import asyncio
>>> from checkpoint_stores import Checkpoint, Phase, open_store
>>> async def main():
...     async with open_store("memory://") as store:
...         await store.append(Checkpoint(run_id="r1", thread_id="t1", seq=1,
...                                       phase=Phase.RUN_STARTED, payload={}))
...         return (await store.latest("t1", "r1")).phase
>>> asyncio.run(main())
<Phase.RUN_STARTED: 'run_started'>
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import Any

from checkpoint_stores.codec import DEFAULT_CODEC, Codec
from checkpoint_stores.errors import (
    AgentCheckpointCorruptionError,
    CheckpointNotFoundError,
    StaleWriterError,
    ValueTooLargeError,
)
from checkpoint_stores.keys import (
    CHECKPOINT_PREFIX,
    LATEST_SUFFIX,
    checkpoint_key,
    checkpoint_latest_key,
    checkpoint_prefix,
    effect_prefix,
    parse_checkpoint_key,
    runtime_key,
    validate_key,
    validate_run_id,
    validate_thread_id,
)
from checkpoint_stores.normalize import normalize_checkpoint_record
from checkpoint_stores.plugins import open_backend
from checkpoint_stores.schema import Checkpoint, Phase
from checkpoint_stores.spi import Capabilities, StorageBackend
from checkpoint_stores.urls import redact_url

__all__ = ["MemoryStore", "open_store"]

JsonValue = Any


class MemoryStore:
    """Checkpoints and thread-scoped state on one :class:`StorageBackend`.

    The state calls (``get_state``, ``put_state``, ``list_state``,
    ``delete_state``) match AFK's ``MemoryStore``, so AFK can use this store
    directly and reads back what the checkpoint calls write. The checkpoint
    calls keep the run's guarantees: ``append`` moves ``latest`` only forward
    (a stale writer gets :class:`StaleWriterError`), ``latest`` and
    ``runtime_snapshot`` are O(1), and every read is normalized or raises
    :class:`AgentCheckpointCorruptionError`.

    The backend is set up on first use; call :meth:`setup` (or use
    ``async with``) to fail fast on a bad URL or an unreachable server.
    """

    def __init__(
        self,
        backend: StorageBackend,
        *,
        codec: Codec | None = None,
        url: str | None = None,
    ) -> None:
        self.backend = backend
        self.codec = codec if codec is not None else DEFAULT_CODEC
        self.url = redact_url(url) if url else None
        self._setup_done = False
        self._setup_lock = asyncio.Lock()

    def __repr__(self) -> str:
        where = self.url or type(self.backend).__name__
        return f"<MemoryStore {where}>"

    @property
    def capabilities(self) -> Capabilities:
        """The backend's declared capabilities."""
        return self.backend.capabilities

    # -- lifecycle ---------------------------------------------------------------

    async def setup(self) -> None:
        """Set the backend up (idempotent)."""
        if self._setup_done:
            return
        async with self._setup_lock:
            if not self._setup_done:
                await self.backend.setup()
                self._setup_done = True

    async def close(self) -> None:
        """Close the backend."""
        await self.backend.close()
        self._setup_done = False

    async def __aenter__(self) -> MemoryStore:
        await self.setup()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _ready(self) -> StorageBackend:
        if not self._setup_done:
            await self.setup()
        return self.backend

    # -- checks ------------------------------------------------------------------

    def _thread(self, thread_id: str) -> str:
        return validate_thread_id(thread_id, max_bytes=self.capabilities.max_key_bytes)

    def _key(self, key: str) -> str:
        return validate_key(key, max_bytes=self.capabilities.max_key_bytes)

    def _sized(self, value: bytes, what: str) -> bytes:
        limit = self.capabilities.max_value_bytes
        if limit is not None and len(value) > limit:
            raise ValueTooLargeError(
                f"{what} encodes to {len(value)} bytes; this backend stores at most {limit}. "
                "Nothing was written. Keep large blobs outside the checkpoint (store a "
                "reference) or raise the codec's compression (Codec(compress_threshold=...))"
            )
        return value

    def encode(self, value: JsonValue, *, what: str = "value") -> bytes:
        """Encode a JSON value with this store's codec, checking the backend's size limit."""
        return self._sized(self.codec.encode(value), what)

    def decode(self, data: bytes, *, what: str = "value") -> JsonValue:
        """Decode bytes read from the backend with this store's codec."""
        return self.codec.decode(data, what=what)

    # -- AFK state API -------------------------------------------------------------

    async def get_state(self, thread_id: str, key: str) -> JsonValue | None:
        """The JSON value under ``key``, or ``None``."""
        backend = await self._ready()
        raw = await backend.get(self._thread(thread_id), self._key(key))
        if raw is None:
            return None
        return self.decode(raw, what=f"state {key!r} of thread {thread_id!r}")

    async def put_state(self, thread_id: str, key: str, value: JsonValue) -> None:
        """Store a JSON value under ``key`` (upsert)."""
        data = self.encode(value, what=f"state {key!r}")
        backend = await self._ready()
        await backend.put(self._thread(thread_id), self._key(key), data)

    async def list_state(self, thread_id: str, prefix: str | None = None) -> dict[str, JsonValue]:
        """Every key (optionally under ``prefix``) and its JSON value, sorted by key."""
        backend = await self._ready()
        out: dict[str, JsonValue] = {}
        async for key, raw in backend.list(self._thread(thread_id), prefix or ""):
            out[key] = self.decode(raw, what=f"state {key!r} of thread {thread_id!r}")
        return out

    async def delete_state(self, thread_id: str, key: str) -> bool:
        """Delete one key; return whether it existed."""
        backend = await self._ready()
        return await backend.delete(self._thread(thread_id), self._key(key))

    # -- checkpoint API ------------------------------------------------------------

    def encode_checkpoint(self, checkpoint: Checkpoint) -> bytes:
        """The bytes :meth:`append` writes for ``checkpoint``."""
        return self.encode(
            checkpoint.to_record(),
            what=f"checkpoint {checkpoint.phase.value} (step {checkpoint.step}) of run "
            f"{checkpoint.run_id!r}",
        )

    async def commit_checkpoint(self, checkpoint: Checkpoint, data: bytes | None = None) -> bool:
        """Commit one record and move ``latest`` to it; return whether latest moved.

        See :meth:`commit_checkpoints`, of which this is the one-record case.
        """
        return await self.commit_checkpoints([(checkpoint, data)])

    async def commit_checkpoints(self, batch: Sequence[tuple[Checkpoint, bytes | None]]) -> bool:
        """Commit records of one run and move ``latest`` to the last; return whether it moved.

        One backend ``commit``: every record under its step key, the newest
        ``runtime_state`` record under the runtime key, and the last record under
        the latest key, guarded by that record's ``seq`` (batching is safe because
        within an epoch only the run's owner writes, and a newer epoch's seqs are
        above the whole batch). ``data`` is the record's encoding if already made
        (``None``: encode here). A ``False`` return means a newer writer owns the
        run and nothing was written. A retry of a commit that already landed (same
        seq, same bytes) counts as success.

        On a backend without ``fenced_commit`` (a commit that loses a race may
        still leave its writes behind, e.g. S3), the runtime key is written only
        after ``latest`` moved, so a fenced-out writer can never replace the run's
        runtime snapshot with its own.
        """
        if not batch:
            raise ValueError("commit_checkpoints needs at least one record")
        last = batch[-1][0]
        thread_id = self._thread(last.thread_id)
        run_id = validate_run_id(last.run_id)
        head = self._key(checkpoint_latest_key(run_id))
        writes: dict[str, bytes] = {}
        runtime: bytes | None = None
        value = b""
        for checkpoint, data in batch:
            if checkpoint.run_id != run_id or checkpoint.thread_id != last.thread_id:
                raise ValueError("commit_checkpoints takes records of one run only")
            value = data if data is not None else self.encode_checkpoint(checkpoint)
            step_key = checkpoint_key(run_id, checkpoint.step, checkpoint.phase.value)
            writes[self._key(step_key)] = value
            if checkpoint.phase is Phase.RUNTIME_STATE:
                runtime = value
        runtime_at = self._key(runtime_key(run_id))
        backend = await self._ready()  # capabilities may be refined by setup()
        fenced = self.capabilities.fenced_commit
        if runtime is not None and fenced:
            writes[runtime_at] = runtime
        moved = await backend.commit(thread_id, list(writes.items()), head, value, last.seq)
        # Idempotent retry: our own earlier attempt may have landed (e.g. a timeout
        # after the server applied it). Same bytes under latest means it did.
        moved = moved or await backend.get(thread_id, head) == value
        if moved and runtime is not None and not fenced:
            await backend.put(thread_id, runtime_at, runtime)
        return moved

    async def append(self, checkpoint: Checkpoint) -> None:
        """Write ``checkpoint`` and make it the run's latest.

        Raises:
            StaleWriterError: the run's latest has a seq at or above this one
                (another writer, e.g. a resumer, owns the run). Nothing was written.
            ValueTooLargeError: the encoded record is above the backend's limit.
        """
        if not await self.commit_checkpoint(checkpoint):
            current = await self._latest_seq(checkpoint.thread_id, checkpoint.run_id)
            raise StaleWriterError(
                f"checkpoint seq {checkpoint.seq} (epoch {checkpoint.epoch}) of run "
                f"{checkpoint.run_id!r} was refused: the run's latest is at seq {current} "
                f"(epoch {current >> 32 if current is not None else '?'}). Another writer owns "
                "the run; stop writing and load it again to continue"
            )

    async def _latest_seq(self, thread_id: str, run_id: str) -> int | None:
        try:
            return (await self.latest(thread_id, run_id)).seq
        except AgentCheckpointCorruptionError:
            return None

    async def latest(self, thread_id: str, run_id: str) -> Checkpoint:
        """The run's newest record, in O(1) (one read of the latest key).

        Raises:
            CheckpointNotFoundError: the run has no checkpoint.
            AgentCheckpointCorruptionError: the record is unreadable.
        """
        backend = await self._ready()
        key = self._key(checkpoint_latest_key(run_id))
        raw = await backend.get(self._thread(thread_id), key)
        return self._checkpoint(raw, thread_id, run_id, "latest")

    async def runtime_snapshot(self, thread_id: str, run_id: str) -> Checkpoint | None:
        """The run's newest ``runtime_state`` record, in O(1) via the runtime key.

        ``None`` when the run never wrote one through this library (AFK v1 data:
        see ``checkpoint_stores.resume`` for the compatible backward scan).
        """
        backend = await self._ready()
        raw = await backend.get(self._thread(thread_id), self._key(runtime_key(run_id)))
        if raw is None:
            return None
        return self._checkpoint(raw, thread_id, run_id, "runtime snapshot")

    async def get_checkpoint(
        self, thread_id: str, run_id: str, step: int, phase: Phase | str
    ) -> Checkpoint | None:
        """One record by step and phase, or ``None``."""
        backend = await self._ready()
        key = self._key(checkpoint_key(run_id, step, Phase(phase).value))
        raw = await backend.get(self._thread(thread_id), key)
        if raw is None:
            return None
        return self._checkpoint(raw, thread_id, run_id, f"step {step} {Phase(phase).value}")

    async def get_checkpoints(
        self, thread_id: str, run_id: str, steps_phases: Sequence[tuple[int, Phase | str]]
    ) -> list[Checkpoint | None]:
        """Several records by (step, phase), in one ``get_many``."""
        backend = await self._ready()
        keys = [self._key(checkpoint_key(run_id, s, Phase(p).value)) for s, p in steps_phases]
        raws = await backend.get_many(self._thread(thread_id), keys)
        return [
            None if raw is None else self._checkpoint(raw, thread_id, run_id, key)
            for key, raw in zip(keys, raws, strict=True)
        ]

    async def history(self, thread_id: str, run_id: str) -> list[Checkpoint]:
        """Every record of the run (the latest and runtime copies excluded), by seq."""
        records = [cp async for _, cp in self.iter_records(thread_id, run_id)]
        records.sort(key=lambda cp: (cp.seq, cp.step, cp.timestamp_ms))
        return records

    async def iter_records(
        self, thread_id: str, run_id: str
    ) -> AsyncIterator[tuple[str, Checkpoint]]:
        """Yield ``(key, record)`` for each step record of the run, in key order."""
        backend = await self._ready()
        async for key, raw in backend.list(self._thread(thread_id), checkpoint_prefix(run_id)):
            parsed = parse_checkpoint_key(key)
            if parsed is None or ":" not in parsed[1]:
                continue  # the latest and runtime copies
            yield key, self._checkpoint(raw, thread_id, run_id, key)

    async def list_runs(self, thread_id: str) -> list[str]:
        """Run ids with a latest record in the thread, sorted."""
        backend = await self._ready()
        runs: list[str] = []
        async for key, _ in backend.list(self._thread(thread_id), CHECKPOINT_PREFIX):
            parsed = parse_checkpoint_key(key)
            if parsed is not None and parsed[1] == LATEST_SUFFIX:
                runs.append(parsed[0])
        return sorted(runs)

    async def delete_run(self, thread_id: str, run_id: str) -> int:
        """Delete every checkpoint and effect record of the run; return how many."""
        backend = await self._ready()
        thread = self._thread(thread_id)
        prefix = checkpoint_prefix(run_id)
        # Records first, latest last: a crash half-way leaves a run that still reads. Only
        # prefix and key deletes, never a list of values: deleting a run is the remedy for
        # damaged records, so a value that no longer reads must not block it. Step record
        # keys continue the prefix with a digit.
        removed = await backend.delete_prefix(thread, effect_prefix(run_id))
        for digit in "0123456789":
            removed += await backend.delete_prefix(thread, f"{prefix}{digit}")
        removed += await backend.delete(thread, runtime_key(run_id))
        removed += await backend.delete_prefix(thread, prefix)  # latest, and any other key
        return removed

    async def delete_thread(self, thread_id: str) -> int:
        """Delete everything stored for the thread; return how many keys."""
        backend = await self._ready()
        return await backend.delete_thread(self._thread(thread_id))

    async def effect_keys(self, thread_id: str, run_id: str) -> list[str]:
        """Effect keys recorded for the run, sorted."""
        backend = await self._ready()
        return [k async for k, _ in backend.list(self._thread(thread_id), effect_prefix(run_id))]

    def _checkpoint(self, raw: bytes | None, thread_id: str, run_id: str, what: str) -> Checkpoint:
        if raw is None:
            raise CheckpointNotFoundError(
                f"no checkpoint found for run {run_id!r} in thread {thread_id!r}; check the "
                "ids (`checkpoint-stores inspect URL --thread T` lists runs), or start the run anew"
            )
        value = self.decode(raw, what=f"{what} of run {run_id!r} in thread {thread_id!r}")
        return normalize_checkpoint_record(value, thread_id=thread_id, run_id=run_id)


def open_store(url: str, *, codec: Codec | None = None, **options: Any) -> MemoryStore:
    """Open a :class:`MemoryStore` on the backend ``url`` names.

    ``options`` go to the backend (pool sizes, key prefixes, ...); ``codec``
    sets compression and encryption. The store connects on first use, or in
    ``setup()`` / ``async with``.

    URLs: ``memory://``, ``file:///abs/path`` or ``file://./rel``,
    ``redis://``, ``rediss://``, ``redis+cluster://``, ``mongodb://``,
    ``mongodb+srv://``, ``s3://bucket/prefix``, ``postgresql+asyncpg://``,
    ``postgresql+psycopg://``, ``sqlite+aiosqlite:///path``,
    ``mysql+aiomysql://`` -- and any scheme a plugin registers.
    """
    return MemoryStore(open_backend(url, **options), codec=codec, url=url)
