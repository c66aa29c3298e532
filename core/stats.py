"""Store statistics: runs, records, bytes, oldest and newest record per thread.

>>> import asyncio
>>> from checkpoint_stores import open_store
>>> from checkpoint_stores.stats import collect_stats
>>> asyncio.run(collect_stats(open_store("memory://"))).totals()["threads"]
0

Reads every value once (records are decoded for their timestamps); values
that cannot be read are counted as ``unreadable``, never fatal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from checkpoint_stores.errors import AgentCheckpointCorruptionError
from checkpoint_stores.inventory import is_terminal_record, iter_thread_ids, scan_thread
from checkpoint_stores.store import MemoryStore

__all__ = ["StoreStats", "ThreadStats", "collect_stats", "thread_stats"]


@dataclass
class ThreadStats:
    """Counts for one thread.

    Attributes:
        runs: runs with a latest record.
        finished_runs: of those, runs whose latest is ``run_terminal``.
        headless_runs: runs with records but no latest (e.g. a half-deleted run).
        records: step records (the latest and runtime copies not counted).
        effects: tool effect records.
        state_keys: other keys of the thread (AFK state).
        keys: every key of the thread.
        bytes: size of every stored value, as stored (compressed, encrypted).
        oldest_ms: oldest record timestamp (Unix ms), ``None`` without one.
        newest_ms: newest record timestamp (Unix ms), ``None`` without one.
        unreadable: records or latest values that could not be decoded.
    """

    thread_id: str
    runs: int = 0
    finished_runs: int = 0
    headless_runs: int = 0
    records: int = 0
    effects: int = 0
    state_keys: int = 0
    keys: int = 0
    bytes: int = 0
    oldest_ms: int | None = None
    newest_ms: int | None = None
    unreadable: int = 0

    def _seen(self, timestamp_ms: int | None) -> None:
        if not timestamp_ms:
            return
        if self.oldest_ms is None or timestamp_ms < self.oldest_ms:
            self.oldest_ms = timestamp_ms
        if self.newest_ms is None or timestamp_ms > self.newest_ms:
            self.newest_ms = timestamp_ms


@dataclass
class StoreStats:
    """Per-thread statistics of a store, sorted by thread id."""

    threads: list[ThreadStats] = field(default_factory=list)

    def totals(self) -> dict[str, Any]:
        """Sums over every thread (oldest/newest over every thread)."""
        oldest = [t.oldest_ms for t in self.threads if t.oldest_ms is not None]
        newest = [t.newest_ms for t in self.threads if t.newest_ms is not None]
        return {
            "threads": len(self.threads),
            "runs": sum(t.runs for t in self.threads),
            "finished_runs": sum(t.finished_runs for t in self.threads),
            "headless_runs": sum(t.headless_runs for t in self.threads),
            "records": sum(t.records for t in self.threads),
            "effects": sum(t.effects for t in self.threads),
            "state_keys": sum(t.state_keys for t in self.threads),
            "keys": sum(t.keys for t in self.threads),
            "bytes": sum(t.bytes for t in self.threads),
            "oldest_ms": min(oldest) if oldest else None,
            "newest_ms": max(newest) if newest else None,
            "unreadable": sum(t.unreadable for t in self.threads),
        }

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{"threads": [...], "totals": {...}}``."""
        return {"threads": [asdict(t) for t in self.threads], "totals": self.totals()}


async def thread_stats(store: MemoryStore, thread_id: str) -> ThreadStats:
    """Statistics of one thread (one scan of its keys)."""
    inventory = await scan_thread(store, thread_id, decode_records=True)
    stats = ThreadStats(thread_id, keys=inventory.key_count, bytes=inventory.size)
    stats.state_keys = len(inventory.state)
    for run in inventory.runs.values():
        stats.records += len(run.records)
        stats.effects += len(run.effects)
        for record in run.records:
            if record.error is not None:
                stats.unreadable += 1
            else:
                stats._seen(record.timestamp_ms)
        if run.head is None:
            stats.headless_runs += 1
            continue
        stats.runs += 1
        try:
            latest = store.decode(run.head, what=f"latest of run {run.run_id!r}")
        except AgentCheckpointCorruptionError:
            stats.unreadable += 1
            continue
        if is_terminal_record(latest):
            stats.finished_runs += 1
        stamp = latest.get("timestamp_ms") if isinstance(latest, dict) else None
        if isinstance(stamp, int) and not isinstance(stamp, bool):
            stats._seen(stamp)
    return stats


async def collect_stats(
    store: MemoryStore,
    *,
    thread_ids: Iterable[str] | None = None,
    thread_prefix: str = "",
    progress: Callable[[int, int], None] | None = None,
) -> StoreStats:
    """Statistics per thread of ``store``.

    Args:
        store: the store (with its encryption keys, if values are encrypted:
            otherwise records count as ``unreadable`` and times are missing).
        thread_ids: threads to count; default every thread (needs ``list_threads``).
        thread_prefix: only threads whose id starts with it (when enumerating).
        progress: called with ``(1, bytes)`` after each thread.
    """
    result = StoreStats()
    async for thread_id in iter_thread_ids(store, thread_ids, prefix=thread_prefix):
        stats = await thread_stats(store, thread_id)
        result.threads.append(stats)
        if progress is not None:
            progress(1, stats.bytes)
    result.threads.sort(key=lambda t: t.thread_id)
    return result
