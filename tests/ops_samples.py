"""Sample data and helpers for the operating-tool tests (copy, retention, stats, rotate)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

import pytest

from checkpoint_stores import Checkpoint, EffectRecord, MemoryStore, Phase, effect_key
from checkpoint_stores.errors import StoreUnavailableError
from checkpoint_stores.spi import DelegatingBackend, StorageBackend
from tests.servers import BACKEND_FIXTURES
from tests.support import ServerInfo

# Thread ids that must survive every tool: separators, glob and LIKE characters, NUL.
HOSTILE_SUFFIXES = ("plain", "a/../b", "{tag}*%_:x", "nul\x00end", "ünï-çødé")
BASE_MS = 1_700_000_000_000


def unique_prefix() -> str:
    """A thread-id prefix no other test (or session) uses on a shared server."""
    return f"ops-{uuid.uuid4().hex[:10]}-"


def server_param(request: pytest.FixtureRequest) -> ServerInfo:
    """The ``ServerInfo`` of the backend fixture named by ``request.param``."""
    info = request.getfixturevalue(request.param)  # every backend has one: a missing one errors
    assert isinstance(info, ServerInfo)
    return info


backend_params = pytest.mark.parametrize("server", BACKEND_FIXTURES, indirect=True)


def cp(thread: str, run: str, seq: int, step: int, phase: Phase, **payload: Any) -> Checkpoint:
    """A checkpoint stamped ``BASE_MS + seq`` seconds (deterministic times)."""
    return Checkpoint(
        run_id=run,
        thread_id=thread,
        seq=seq,
        step=step,
        phase=phase,
        payload=payload,
        timestamp_ms=BASE_MS + seq * 1000,
    )


async def write_run(
    store: MemoryStore,
    thread: str,
    run: str,
    *,
    finished: bool,
    start_ms: int = BASE_MS,
    steps: int = 3,
) -> list[Checkpoint]:
    """A run: run_started, then per step runtime_state, pre_llm, post_llm; maybe run_terminal.

    Every record is ``start_ms + seq`` ms; two effects are recorded at step 1.
    """
    chain = [(0, Phase.RUN_STARTED, {"agent_name": "analyst"})]
    for step in range(1, steps + 1):
        chain.append((step, Phase.RUNTIME_STATE, {"step": step, "messages": [{"n": step}]}))
        chain.append((step, Phase.PRE_LLM, {"model": "m"}))
        chain.append((step, Phase.POST_LLM, {"model": "m", "finish_reason": "stop"}))
    if finished:
        chain.append((steps, Phase.RUN_TERMINAL, {"state": "completed", "final_text": "ok"}))
    written = []
    for seq, (step, phase, payload) in enumerate(chain, start=1):
        record = Checkpoint(
            run_id=run,
            thread_id=thread,
            seq=seq,
            step=step,
            phase=phase,
            payload=payload,
            timestamp_ms=start_ms + seq,
        )
        await store.append(record)
        written.append(record)
    for call in ("call-a", "call-b"):
        effect = EffectRecord(input_hash="h-" + call, output={"ok": call}, output_hash="o")
        await store.put_state(thread, effect_key(run, 1, call), effect.model_dump(mode="json"))
    return written


async def fill(
    store: MemoryStore, prefix: str, *, suffixes: Sequence[str] = HOSTILE_SUFFIXES
) -> list[str]:
    """Threads ``prefix + suffix``: a finished run, an unfinished one, and thread state."""
    threads = [prefix + s for s in suffixes]
    for thread in threads:
        await write_run(store, thread, "done-run", finished=True)
        await write_run(store, thread, "live-run", finished=False, steps=2)
        await store.put_state(thread, "notes", {"owner": thread, "tags": ["a", "b"]})
    return threads


async def dump(store: MemoryStore, threads: Iterable[str]) -> dict[str, list[tuple[str, bytes]]]:
    """Every ``(key, value)`` of the threads, exactly as the backend holds them."""
    out: dict[str, list[tuple[str, bytes]]] = {}
    for thread in threads:
        out[thread] = [(k, bytes(v)) async for k, v in store.backend.list(thread)]
    return out


class UnlistedBackend(DelegatingBackend):
    """A real backend seen through a wrapper that forwards the SPI but not ``list_threads``."""

    def __init__(self, inner: StorageBackend) -> None:
        super().__init__(inner)
        self.puts = 0
        self.keys_written = 0

    def _before_write(self, count: int) -> None:
        """Hook for subclasses: raise here to fail a write before it reaches the server."""

    async def put(self, thread_id: str, key: str, value: bytes) -> None:
        self._before_write(1)
        await self.inner.put(thread_id, key, value)
        self.puts += 1
        self.keys_written += 1

    async def create(self, thread_id: str, key: str, value: bytes) -> bool:
        self._before_write(1)
        return await self.inner.create(thread_id, key, value)

    async def commit(
        self,
        thread_id: str,
        writes: Sequence[tuple[str, bytes]],
        head_key: str,
        head_value: bytes,
        seq: int,
    ) -> bool:
        self._before_write(len(writes) + 1)
        moved = await self.inner.commit(thread_id, writes, head_key, head_value, seq)
        if moved:
            self.keys_written += len(writes) + 1
        return moved


class WrappedBackend(UnlistedBackend):
    """A real backend seen through a wrapper (for fault injection); forwards everything."""

    async def list_threads(self, prefix: str = "") -> AsyncIterator[str]:
        async for thread in self.inner.list_threads(prefix):  # type: ignore[attr-defined]
            yield thread


class FailAfter(WrappedBackend):
    """Fails (like a dropped connection) once ``limit`` keys have been written."""

    def __init__(self, inner: StorageBackend, limit: int) -> None:
        super().__init__(inner)
        self.limit = limit

    def _before_write(self, count: int) -> None:
        if self.keys_written + count > self.limit:
            raise StoreUnavailableError(f"injected: connection lost after {self.limit} keys")
