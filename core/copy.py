"""Copy threads and runs between any two stores: resumable, verified, fenced.

>>> import asyncio
>>> from checkpoint_stores import open_store
>>> from checkpoint_stores.copy import copy_store
>>> async def main():
...     async with open_store("memory://") as src, open_store("memory://") as dst:
...         return (await copy_store(src, dst)).ok
>>> asyncio.run(main())
True

Order, per thread: thread state, then per run its step records and effects,
then its runtime key and latest together in one destination ``commit`` at the
source latest's seq. The latest is therefore written last and never names a
record the destination lacks, and it can never go backwards: a destination
whose latest is newer refuses the run, and the copy reports it.

Values move as bytes (envelopes are self-describing) unless the two codecs
differ in encryption: then each value is decoded with the source codec and
re-encoded with the destination's (encrypt, decrypt or re-key while copying).

Resumable: every key is compared with what the destination already holds
(bytes, or decoded JSON when re-encoding) and only missing or different keys
are written, so rerunning an interrupted copy finishes it without duplicates.
Every written key is read back and compared.

Copy adds and updates; it never deletes keys the destination has and the
source lacks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from checkpoint_stores.codec import envelope_key_id
from checkpoint_stores.errors import (
    AgentCheckpointCorruptionError,
    InvalidIdentifierError,
)
from checkpoint_stores.inventory import (
    KeyKind,
    check_run_id,
    classify_key,
    iter_thread_ids,
    run_prefixes,
    value_body,
)
from checkpoint_stores.keys import LATEST_SUFFIX, RUNTIME_SUFFIX, validate_key, validate_thread_id
from checkpoint_stores.store import MemoryStore

__all__ = ["CopyProgress", "CopyReport", "RefusedRun", "copy_store"]

DEFAULT_BATCH: Final = 128


class CopyProgress(Protocol):
    """Receives progress: ``planned`` as keys are found, ``advanced`` as they are done."""

    def planned(self, items: int, nbytes: int) -> None:
        """``items`` more keys (``nbytes`` of source values) are to be examined."""

    def advanced(self, items: int, nbytes: int) -> None:
        """``items`` keys were examined (copied, already identical, or skipped)."""


class _NoProgress:
    def planned(self, items: int, nbytes: int) -> None:
        pass

    def advanced(self, items: int, nbytes: int) -> None:
        pass


@dataclass(frozen=True)
class RefusedRun:
    """A run the copy did not write, and why (the destination is left as it was)."""

    thread_id: str
    run_id: str
    reason: str
    source_seq: int | None = None
    destination_seq: int | None = None


@dataclass
class CopyReport:
    """What :func:`copy_store` did."""

    threads: int = 0
    runs: int = 0
    runs_copied: int = 0
    runs_unchanged: int = 0
    refused: list[RefusedRun] = field(default_factory=list)
    written: int = 0
    unchanged: int = 0
    bytes_written: int = 0
    errors: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every run was copied or already there, with no error."""
        return not self.refused and not self.errors

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready summary."""
        return {
            "threads": self.threads,
            "runs": self.runs,
            "runs_copied": self.runs_copied,
            "runs_unchanged": self.runs_unchanged,
            "keys_written": self.written,
            "keys_unchanged": self.unchanged,
            "bytes_written": self.bytes_written,
            "refused": [
                {
                    "thread_id": r.thread_id,
                    "run_id": r.run_id,
                    "reason": r.reason,
                    "source_seq": r.source_seq,
                    "destination_seq": r.destination_seq,
                }
                for r in self.refused
            ],
            "errors": [{"thread_id": t, "key": k, "error": e} for t, k, e in self.errors],
        }


@dataclass
class _Run:
    run_id: str
    head: bytes | None = None
    runtime: bytes | None = None
    items: int = 0
    size: int = 0


class _Copier:
    def __init__(
        self,
        src: MemoryStore,
        dst: MemoryStore,
        report: CopyReport,
        progress: CopyProgress,
        transcode: bool | None,
        batch_size: int,
    ) -> None:
        self.src, self.dst = src, dst
        self.report = report
        self.progress = progress
        self.transcode = transcode
        self.batch_size = max(1, batch_size)
        self.dst_keys = dst.capabilities.max_key_bytes
        self.dst_values = dst.capabilities.max_value_bytes

    # -- deciding how a value travels ----------------------------------------------

    def _reencode(self, raw: bytes) -> bool:
        """Whether ``raw`` must be decoded and re-encoded rather than copied as bytes."""
        if self.transcode is not None:
            return self.transcode
        src_cipher, dst_cipher = self.src.codec.cipher, self.dst.codec.cipher
        key_id = envelope_key_id(raw)
        if dst_cipher is None:
            # Decrypt on the way out only when the source can (else copy the opaque bytes).
            return src_cipher is not None and key_id is not None
        # Bytes are right only if already under the destination's active key and
        # the key material is known to match (the very same cipher object).
        return not (src_cipher is dst_cipher and key_id == dst_cipher.active_key_id)

    def _target(self, raw: bytes, what: str) -> tuple[bytes, bytes | None]:
        """``(bytes to write, JSON body or None)`` for a source value."""
        if not self._reencode(raw):
            return raw, None
        body = value_body(self.src.codec, raw, what=what)
        return self.dst.codec.wrap(body), body

    def _same(self, existing: bytes | None, raw: bytes, body: bytes | None) -> bool:
        """Whether the destination already holds this value.

        Byte copies compare bytes. Re-encoded values get fresh nonces every time,
        so they compare the JSON inside: a destination value with the same JSON
        counts as copied however it is encoded (``rotate`` re-encrypts a store).
        """
        if existing is None:
            return False
        if existing == raw:
            return True
        if body is None:
            return False
        try:
            return value_body(self.dst.codec, existing) == body
        except AgentCheckpointCorruptionError:
            return False  # unreadable there: overwrite it with the good copy

    def _seq(self, store: MemoryStore, raw: bytes, what: str) -> int:
        value = store.codec.decode(raw, what=what)
        seq = value.get("seq", 0) if isinstance(value, dict) else None
        if seq is None:
            seq = 0
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
            raise AgentCheckpointCorruptionError(f"{what}: seq {seq!r} is not an integer")
        return seq

    # -- writing -------------------------------------------------------------------

    async def _sync(self, thread_id: str, items: Sequence[tuple[str, bytes]]) -> bool:
        """Make the destination hold ``items``; return False if any key failed."""
        if not items:
            return True
        ok = True
        backend = self.dst.backend
        existing = await backend.get_many(thread_id, [k for k, _ in items])
        written: list[tuple[str, bytes]] = []
        for (key, raw), current in zip(items, existing, strict=True):
            what = f"{key!r} of thread {thread_id!r}"
            try:
                validate_key(key, max_bytes=self.dst_keys)
                data, body = self._target(raw, what)
            except (AgentCheckpointCorruptionError, InvalidIdentifierError) as exc:
                self.report.errors.append((thread_id, key, str(exc)))
                ok = False
                continue
            if self._same(current, raw, body):
                self.report.unchanged += 1
                continue
            if self.dst_values is not None and len(data) > self.dst_values:
                self.report.errors.append(
                    (
                        thread_id,
                        key,
                        f"value is {len(data)} bytes; the destination stores at most "
                        f"{self.dst_values}. Not copied",
                    )
                )
                ok = False
                continue
            await backend.put(thread_id, key, data)
            written.append((key, data))
        await self._verify(thread_id, written)
        self.progress.advanced(len(items), sum(len(v) for _, v in items))
        return ok

    async def _verify(self, thread_id: str, written: Sequence[tuple[str, bytes]]) -> None:
        if not written:
            return
        back = await self.dst.backend.get_many(thread_id, [k for k, _ in written])
        for (key, data), found in zip(written, back, strict=True):
            if found != data:
                raise AgentCheckpointCorruptionError(
                    f"copy verification failed: {key!r} of thread {thread_id!r} reads back "
                    f"{'nothing' if found is None else f'{len(found)} different bytes'} from "
                    f"{self.dst.url or 'the destination'} after writing {len(data)} bytes. "
                    "The copy stopped before moving that run's latest; check the destination"
                )
            self.report.written += 1
            self.report.bytes_written += len(data)

    async def _batched(self, thread_id: str, prefix: str, kinds: set[KeyKind]) -> bool:
        ok = True
        batch: list[tuple[str, bytes]] = []
        async for key, raw in self.src.backend.list(thread_id, prefix):
            if classify_key(key)[0] not in kinds:
                continue
            batch.append((key, bytes(raw)))
            if len(batch) >= self.batch_size:
                ok = await self._sync(thread_id, batch) and ok
                batch = []
        return await self._sync(thread_id, batch) and ok

    # -- one thread ----------------------------------------------------------------

    async def thread(self, thread_id: str, run_id: str | None) -> None:
        try:
            validate_thread_id(thread_id, max_bytes=self.dst_keys)
        except InvalidIdentifierError as exc:
            self.report.errors.append((thread_id, "", str(exc)))
            return
        self.report.threads += 1
        runs: dict[str, _Run] = {}
        state: list[tuple[str, bytes]] = []
        prefixes = [""] if run_id is None else list(run_prefixes(run_id))
        for prefix in prefixes:
            async for key, raw in self.src.backend.list(thread_id, prefix):
                self.progress.planned(1, len(raw))
                kind, owner = classify_key(key)
                if owner is None:
                    # Thread state depends on no run: copy it while scanning.
                    state.append((key, bytes(raw)))
                    if len(state) >= self.batch_size:
                        await self._sync(thread_id, state)
                        state = []
                    continue
                run = runs.setdefault(owner, _Run(owner))
                if kind is KeyKind.HEAD:
                    run.head = bytes(raw)
                elif kind is KeyKind.RUNTIME:
                    run.runtime = bytes(raw)
                else:
                    run.items += 1
                    run.size += len(raw)
        await self._sync(thread_id, state)
        if not runs:
            return
        order = sorted(runs)
        heads = await self.dst.backend.get_many(
            thread_id, [run_prefixes(r)[0] + LATEST_SUFFIX for r in order]
        )
        for name, dst_head in zip(order, heads, strict=True):
            await self._run(thread_id, runs[name], dst_head)

    async def _run(self, thread_id: str, run: _Run, dst_head: bytes | None) -> None:
        self.report.runs += 1
        checkpoint, effect = run_prefixes(run.run_id)
        head_key, runtime_key = checkpoint + LATEST_SUFFIX, checkpoint + RUNTIME_SUFFIX
        where = f"run {run.run_id!r} in thread {thread_id!r}"
        tail = (run.head is not None) + (run.runtime is not None)
        tail_bytes = len(run.head or b"") + len(run.runtime or b"")

        def refuse(reason: str, src_seq: int | None = None, dst_seq: int | None = None) -> None:
            self.report.refused.append(RefusedRun(thread_id, run.run_id, reason, src_seq, dst_seq))
            self.progress.advanced(run.items + tail, run.size + tail_bytes)

        src_seq: int | None = None
        head_data: bytes | None = None
        head_same = False
        if run.head is not None:
            try:
                validate_key(head_key, max_bytes=self.dst_keys)
                src_seq = self._seq(self.src, run.head, f"source latest of {where}")
                head_data, head_body = self._target(run.head, f"source latest of {where}")
            except (AgentCheckpointCorruptionError, InvalidIdentifierError) as exc:
                self.report.errors.append((thread_id, head_key, str(exc)))
                self.progress.advanced(run.items + tail, run.size + tail_bytes)
                return
            if dst_head is not None:
                try:
                    dst_seq = self._seq(self.dst, dst_head, f"destination latest of {where}")
                except AgentCheckpointCorruptionError as exc:
                    refuse(f"the destination's latest is unreadable, left untouched: {exc}")
                    return
                head_same = self._same(dst_head, run.head, head_body)
                if dst_seq > src_seq:
                    refuse("the destination's latest is newer", src_seq, dst_seq)
                    return
                if dst_seq == src_seq and not head_same:
                    refuse(
                        "the destination's latest has the same seq, other content",
                        src_seq,
                        dst_seq,
                    )
                    return
        elif dst_head is not None:
            refuse("the destination has a latest for this run; the source has none")
            return

        ok = await self._batched(thread_id, checkpoint, {KeyKind.RECORD})
        ok = await self._batched(thread_id, effect, {KeyKind.EFFECT}) and ok
        if run.head is None or head_data is None or src_seq is None:
            # Records without a latest (e.g. a half-deleted run): copied as they are.
            if run.runtime is not None:
                ok = await self._sync(thread_id, [(runtime_key, run.runtime)]) and ok
            return
        if not ok:
            self.report.errors.append(
                (thread_id, head_key, f"latest of {where} not copied: some of its keys failed")
            )
            self.progress.advanced(tail, tail_bytes)
            return
        if head_same:
            if run.runtime is not None:
                await self._sync(thread_id, [(runtime_key, run.runtime)])
            self.progress.advanced(1, len(run.head))
            self.report.unchanged += 1
            self.report.runs_unchanged += 1
            return
        await self._commit(thread_id, run, head_data, src_seq, where)

    async def _commit(
        self, thread_id: str, run: _Run, head_data: bytes, seq: int, where: str
    ) -> None:
        checkpoint, _ = run_prefixes(run.run_id)
        head_key, runtime_key = checkpoint + LATEST_SUFFIX, checkpoint + RUNTIME_SUFFIX
        self.progress.advanced(
            1 + (run.runtime is not None), len(run.head or b"") + len(run.runtime or b"")
        )
        writes: list[tuple[str, bytes]] = []
        if run.runtime is not None:
            try:
                runtime_data, _ = self._target(run.runtime, f"runtime of {where}")
            except AgentCheckpointCorruptionError as exc:
                self.report.errors.append((thread_id, runtime_key, str(exc)))
                return
            writes.append((runtime_key, runtime_data))
        for key, data in [*writes, (head_key, head_data)]:
            if self.dst_values is not None and len(data) > self.dst_values:
                self.report.errors.append(
                    (thread_id, key, f"{len(data)} bytes, above the destination's maximum")
                )
                return
        # The runtime copy rides in the commit: it lands only if the latest moves.
        moved = await self.dst.backend.commit(thread_id, writes, head_key, head_data, seq)
        if not moved:
            self.report.refused.append(
                RefusedRun(
                    thread_id,
                    run.run_id,
                    "the destination's latest moved to seq >= the source's during the copy",
                    seq,
                )
            )
            return
        await self._verify(thread_id, [*writes, (head_key, head_data)])
        self.report.runs_copied += 1


async def copy_store(
    src: MemoryStore,
    dst: MemoryStore,
    *,
    thread_ids: Iterable[str] | None = None,
    thread_prefix: str = "",
    run_id: str | None = None,
    progress: CopyProgress | None = None,
    transcode: bool | None = None,
    batch_size: int = DEFAULT_BATCH,
) -> CopyReport:
    """Copy threads (or one run of each) from ``src`` to ``dst``; see the module docs.

    Args:
        src: the store to read.
        dst: the store to write (its codec decides whether values are encrypted).
        thread_ids: threads to copy; default every thread of ``src`` (needs its
            backend's ``list_threads``).
        thread_prefix: only threads whose id starts with it (when enumerating).
        run_id: copy only this run (its checkpoints and effects) of each thread.
        progress: a :class:`CopyProgress` (the CLI's rich bar is one).
        transcode: force decode/re-encode (``True``) or byte copy (``False``);
            default: re-encode only where the codecs' encryption differs.
        batch_size: keys compared and written per destination round trip.

    Returns:
        A :class:`CopyReport`; ``report.refused`` lists runs whose destination
        latest was newer (left untouched), ``report.errors`` keys that could not
        be copied (their run's latest was not moved).

    Raises:
        ThreadListingUnsupportedError: no ``thread_ids`` and ``src`` cannot list threads.
        AgentCheckpointCorruptionError: a written key read back different (the copy
            stops before that run's latest moves).
        StoreUnavailableError: either server failed; rerun to resume.
    """
    report = CopyReport()
    run = check_run_id(run_id)
    await dst.setup()
    copier = _Copier(src, dst, report, progress or _NoProgress(), transcode, batch_size)
    async for thread_id in iter_thread_ids(src, thread_ids, prefix=thread_prefix):
        await copier.thread(thread_id, run)
    return report
