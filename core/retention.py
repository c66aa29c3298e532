"""Retention: prune old step records and finished runs, never what resume needs.

Two rules, usable together:

* ``keep_last=N``: in every run keep the N newest step records (by seq) and
  delete the older ones. Never deleted: the latest key, the runtime key, the
  step records those two name, records newer than the latest read (a writer
  may be appending), records that cannot be read (left for a human), and
  effects (replay needs them while the run exists).
* ``older_than=age``: delete whole runs whose latest record is older than
  ``age`` -- only finished (``run_terminal``) runs unless
  ``include_unfinished``. Everything of the run goes, effects included, the
  latest last (a crash half-way leaves a run that still reads).

With ``native_ttl`` and a backend that implements the optional
:class:`~checkpoint_stores.spi.Expirer` extension, finished runs that are not
old yet are handed to the database's own expiry (Redis ``EXPIRE``, a MongoDB
TTL index) to vanish when they reach ``age``; unfinished runs never get a TTL.

``dry_run`` computes exactly the same plan and writes nothing; the report
lists every key that would go.

>>> import asyncio
>>> from checkpoint_stores import open_store
>>> from checkpoint_stores.retention import prune
>>> asyncio.run(prune(open_store("memory://"), keep_last=10, dry_run=True)).deleted
[]
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Final

from checkpoint_stores.errors import AgentCheckpointCorruptionError
from checkpoint_stores.inventory import (
    RunKeys,
    check_run_id,
    iter_thread_ids,
    run_prefixes,
    scan_thread,
)
from checkpoint_stores.normalize import normalize_checkpoint_record
from checkpoint_stores.schema import Checkpoint, now_ms
from checkpoint_stores.spi import Expirer
from checkpoint_stores.store import MemoryStore

__all__ = ["PruneReport", "parse_duration", "prune"]

_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION: Final = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")


def parse_duration(text: str) -> timedelta:
    """``"30d"``, ``"12h"``, ``"1w2d"``, ``"90m"``, ``"45s"`` (or plain seconds) as a timedelta.

    >>> parse_duration("1d12h")
    datetime.timedelta(days=1, seconds=43200)
    """
    spec = text.strip().lower()
    try:
        return timedelta(seconds=float(spec))
    except ValueError:
        pass
    pos, total = 0, 0.0
    for match in _DURATION.finditer(spec):
        if spec[pos : match.start()].strip():
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos == 0 or spec[pos:].strip():
        raise ValueError(
            f"cannot read the duration {text!r}; write it like 30d, 12h, 1w2d, 90m or 45s"
        )
    return timedelta(seconds=total)


@dataclass
class PruneReport:
    """What :func:`prune` deleted (or, with ``dry_run``, would delete).

    Attributes:
        deleted: ``(thread_id, key)`` of every key removed, in deletion order.
        runs_deleted: ``(thread_id, run_id)`` of whole runs removed by age.
        runs_expiring: ``(thread_id, run_id, ttl_seconds)`` handed to native TTL.
        kept: ``(thread_id, run_id, reason)`` for runs or records left alone on purpose.
    """

    dry_run: bool = False
    threads: int = 0
    runs: int = 0
    deleted: list[tuple[str, str]] = field(default_factory=list)
    runs_deleted: list[tuple[str, str]] = field(default_factory=list)
    runs_expiring: list[tuple[str, str, float]] = field(default_factory=list)
    kept: list[tuple[str, str, str]] = field(default_factory=list)
    bytes_freed: int = 0
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready report."""
        return {
            "dry_run": self.dry_run,
            "threads": self.threads,
            "runs": self.runs,
            "deleted": [{"thread_id": t, "key": k} for t, k in self.deleted],
            "runs_deleted": [{"thread_id": t, "run_id": r} for t, r in self.runs_deleted],
            "runs_expiring": [
                {"thread_id": t, "run_id": r, "ttl_seconds": s} for t, r, s in self.runs_expiring
            ],
            "kept": [{"thread_id": t, "run_id": r, "reason": w} for t, r, w in self.kept],
            "bytes_freed": self.bytes_freed,
            "notes": self.notes,
        }


def _seconds(value: timedelta | float | int | None) -> float | None:
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds < 0:
        raise ValueError("older_than must not be negative")
    return seconds


class _Pruner:
    def __init__(
        self,
        store: MemoryStore,
        report: PruneReport,
        *,
        keep_last: int | None,
        older_than_s: float | None,
        include_unfinished: bool,
        native_ttl: bool,
        now: int,
        progress: Callable[[int, int], None] | None,
    ) -> None:
        self.store = store
        self.backend = store.backend
        self.report = report
        self.keep_last = keep_last
        self.older_than_ms = None if older_than_s is None else int(older_than_s * 1000)
        self.include_unfinished = include_unfinished
        self.now = now
        self.progress = progress
        self.expirer: Expirer | None = None
        if native_ttl:
            if isinstance(self.backend, Expirer) and store.capabilities.ttl:
                self.expirer = self.backend
            else:
                report.notes.append(
                    f"the {type(self.backend).__name__} backend has no native TTL; finished "
                    "runs younger than the age were left for a later prune"
                )

    async def _delete(self, thread_id: str, keys: Iterable[tuple[str, int]]) -> None:
        for key, size in keys:
            if self.report.dry_run or await self.backend.delete(thread_id, key):
                self.report.deleted.append((thread_id, key))
                self.report.bytes_freed += size

    async def thread(self, thread_id: str, run_id: str | None) -> None:
        self.report.threads += 1
        inventory = await scan_thread(
            self.store, thread_id, run_id=run_id, decode_records=self.keep_last is not None
        )
        if self.progress is not None:
            self.progress(inventory.key_count, inventory.size)
        for name in sorted(inventory.runs):
            await self._run(thread_id, inventory.runs[name])

    def _latest(self, thread_id: str, run: RunKeys, raw: bytes, what: str) -> Checkpoint:
        value = self.store.decode(raw, what=f"{what} of run {run.run_id!r}")
        return normalize_checkpoint_record(value, thread_id=thread_id, run_id=run.run_id)

    async def _run(self, thread_id: str, run: RunKeys) -> None:
        self.report.runs += 1
        if run.head is None:
            self.report.kept.append(
                (thread_id, run.run_id, "no latest key (records without a head): left alone")
            )
            return
        try:
            latest = self._latest(thread_id, run, run.head, "latest")
        except AgentCheckpointCorruptionError as exc:
            self.report.kept.append((thread_id, run.run_id, f"latest unreadable: {exc}"))
            return
        if self.older_than_ms is not None and await self._by_age(thread_id, run, latest):
            return
        if self.keep_last is not None:
            await self._keep_last(thread_id, run, latest, self.keep_last)

    async def _by_age(self, thread_id: str, run: RunKeys, latest: Checkpoint) -> bool:
        """Delete or expire the run if it is old enough; return whether it was handled."""
        assert self.older_than_ms is not None
        if not (latest.is_terminal or self.include_unfinished):
            return False
        if not latest.timestamp_ms:
            self.report.kept.append(
                (thread_id, run.run_id, "latest has no timestamp: age unknown, left alone")
            )
            return False
        expires_at = latest.timestamp_ms + self.older_than_ms
        if expires_at <= self.now:
            checkpoint, _ = run_prefixes(run.run_id)
            sizes = {r.key: r.size for r in [*run.records, *run.effects]}
            sizes[checkpoint + "runtime"] = len(run.runtime or b"")
            sizes[checkpoint + "latest"] = len(run.head or b"")
            # Effects and records first, runtime, latest last: all_keys() gives that order.
            await self._delete(thread_id, [(k, sizes[k]) for k in run.all_keys()])
            self.report.runs_deleted.append((thread_id, run.run_id))
            return True
        if self.expirer is not None and latest.is_terminal:
            ttl = (expires_at - self.now) / 1000
            if not self.report.dry_run:
                for prefix in run_prefixes(run.run_id):
                    await self.expirer.expire_prefix(thread_id, prefix, ttl)
            self.report.runs_expiring.append((thread_id, run.run_id, ttl))
        return False

    async def _keep_last(self, thread_id: str, run: RunKeys, latest: Checkpoint, n: int) -> None:
        checkpoint, _ = run_prefixes(run.run_id)
        protected = {f"{checkpoint}{latest.step}:{latest.phase.value}"}
        if run.runtime is not None:
            try:
                snapshot = self._latest(thread_id, run, run.runtime, "runtime")
                protected.add(f"{checkpoint}{snapshot.step}:{snapshot.phase.value}")
            except AgentCheckpointCorruptionError as exc:
                self.report.kept.append((thread_id, run.run_id, f"runtime unreadable: {exc}"))
        readable = [r for r in run.records if r.error is None and r.seq is not None]
        unreadable = len(run.records) - len(readable)
        if unreadable:
            self.report.kept.append(
                (thread_id, run.run_id, f"{unreadable} unreadable record(s) left alone")
            )
        readable.sort(key=lambda r: (r.seq or 0, r.step or 0, r.key), reverse=True)
        doomed = [
            r
            for r in readable[n:]
            # A record at or past the latest we read was written after it: keep it.
            # (seq, step): AFK v1 records carry no seq, their steps still order them.
            if r.key not in protected and (r.seq or 0, r.step or 0) < (latest.seq, latest.step)
        ]
        doomed.sort(key=lambda r: r.key)
        await self._delete(thread_id, [(r.key, r.size) for r in doomed])


async def prune(
    store: MemoryStore,
    *,
    keep_last: int | None = None,
    older_than: timedelta | float | None = None,
    include_unfinished: bool = False,
    thread_ids: Iterable[str] | None = None,
    thread_prefix: str = "",
    run_id: str | None = None,
    native_ttl: bool = False,
    dry_run: bool = False,
    now: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> PruneReport:
    """Apply retention to a store; see the module docs for exactly what goes.

    Args:
        store: the store (opened with the encryption keys if its values are encrypted).
        keep_last: keep this many newest step records per run (0 keeps only what
            the latest and runtime keys name).
        older_than: delete runs whose latest is older than this (a timedelta or
            seconds); finished runs only unless ``include_unfinished``.
        include_unfinished: let ``older_than`` delete runs that never finished.
        thread_ids: threads to prune; default every thread (needs ``list_threads``).
        thread_prefix: only threads whose id starts with it (when enumerating).
        run_id: only this run in each thread.
        native_ttl: hand finished, not-yet-old runs to the backend's native expiry.
        dry_run: report what would be deleted, delete nothing.
        now: the current time in Unix milliseconds (default: the clock).
        progress: called with ``(items, bytes)`` per thread scanned.
    """
    if keep_last is None and older_than is None:
        raise ValueError("say what to prune: keep_last=N and/or older_than=age")
    if keep_last is not None and (isinstance(keep_last, bool) or keep_last < 0):
        raise ValueError(f"keep_last must be a non-negative int, got {keep_last!r}")
    report = PruneReport(dry_run=dry_run)
    pruner = _Pruner(
        store,
        report,
        keep_last=keep_last,
        older_than_s=_seconds(older_than),
        include_unfinished=include_unfinished,
        native_ttl=native_ttl,
        now=now_ms() if now is None else now,
        progress=progress,
    )
    run = check_run_id(run_id)
    async for thread_id in iter_thread_ids(store, thread_ids, prefix=thread_prefix):
        await pruner.thread(thread_id, run)
    return report
