"""The write-behind writer: what checkpointing every phase costs an agent's steps.

Workload, the same for every variant: a run of ``STEPS`` agent steps, each a
simulated LLM call (``LLM_S``) and ``TOOLS`` tool calls (``TOOL_S`` each),
writing the 7 checkpoints of a step (step_started, pre_llm, post_llm,
runtime_state, pre_tool_batch, post_tool_batch, runtime_state) to memory://
behind a wrapper that adds ``WRITE_LATENCY_S`` to every write (a network
round trip to a store). Variants, interleaved round by round in one process:

* no store: the steps alone (the baseline);
* async writer: ``CheckpointWriter`` write-behind, final flush included;
* async + flush: the same, plus ``flush()`` after the post-LLM snapshot (the
  demo's pattern: the LLM response is durable before tools act on it);
* synchronous: ``CheckpointWriter(synchronous=True)``, every write awaited.

``ratio = no-store time / variant time`` (1.0 = free). Target for the async
writer: within 1.2x of no store (ratio >= 0.83). A second measurement bursts
runtime snapshots faster than the store can take them and reports the
coalescing ratio (records submitted per backend write).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

from benchmarks._harness import Report, Result
from checkpoint_stores import MemoryStore, Phase, StorageBackend, open_backend
from checkpoint_stores.resume import RunCursor
from checkpoint_stores.spi import DelegatingBackend
from checkpoint_stores.writer import CheckpointWriter

STEPS: Final = 20
LLM_S: Final = 0.020
TOOLS: Final = 2
TOOL_S: Final = 0.0025
WRITE_LATENCY_S: Final = 0.002
ROUNDS: Final = 7
TARGET: Final = 1 / 1.2


class LatencyBackend(DelegatingBackend):
    """memory:// with a fixed delay on every write (commit, put, create)."""

    def __init__(self, inner: StorageBackend, latency: float) -> None:
        super().__init__(inner)
        self.latency = latency
        self.writes = 0

    async def put(self, thread_id: str, key: str, value: bytes) -> None:
        await self._delay()
        await self.inner.put(thread_id, key, value)

    async def create(self, thread_id: str, key: str, value: bytes) -> bool:
        await self._delay()
        return await self.inner.create(thread_id, key, value)

    async def commit(
        self,
        thread_id: str,
        writes: Sequence[tuple[str, bytes]],
        head_key: str,
        head_value: bytes,
        seq: int,
    ) -> bool:
        await self._delay()
        return await self.inner.commit(thread_id, writes, head_key, head_value, seq)

    async def _delay(self) -> None:
        self.writes += 1
        await asyncio.sleep(self.latency)


def _snapshot(step: int, messages: list[dict[str, object]]) -> dict[str, object]:
    return {"step": step, "state": "running", "messages": list(messages), "llm_calls": step}


Checkpointer = Callable[[Phase, int, dict[str, object]], Awaitable[None]]
Flusher = Callable[[], Awaitable[None]]


async def _run(
    checkpoint: Checkpointer | None, flush: Callable[[], Awaitable[None]] | None
) -> None:
    """One run of the agent loop; ``checkpoint`` None means no store at all."""
    messages: list[dict[str, object]] = []

    async def cp(phase: Phase, step: int, payload: dict[str, object]) -> None:
        if checkpoint is not None:
            await checkpoint(phase, step, payload)

    for step in range(STEPS):
        await cp(Phase.STEP_STARTED, step, {"message_count": len(messages)})
        await cp(Phase.PRE_LLM, step, {"model": "bench"})
        await asyncio.sleep(LLM_S)
        messages.append({"role": "assistant", "text": f"plan {step}" * 20})
        await cp(Phase.POST_LLM, step, {"tool_call_count": TOOLS})
        await cp(Phase.RUNTIME_STATE, step, _snapshot(step, messages))
        if flush is not None:
            await flush()
        await cp(Phase.PRE_TOOL_BATCH, step, {"tool_call_count": TOOLS})
        for call in range(TOOLS):
            await asyncio.sleep(TOOL_S)
            messages.append({"role": "tool", "text": f"result {step}.{call}" * 10})
        await cp(Phase.POST_TOOL_BATCH, step, {"tool_calls_total": TOOLS})
        await cp(Phase.RUNTIME_STATE, step, _snapshot(step + 1, messages))


class _Variant:
    def __init__(self, name: str, *, store: bool, synchronous: bool = False, flush: bool = False):
        self.name = name
        self.store = store
        self.synchronous = synchronous
        self.flush = flush
        self.times: list[float] = []
        self.submitted = 0
        self.written = 0
        self.coalesced = 0
        self.runs = 0

    async def once(self) -> None:
        if not self.store:
            start = time.perf_counter()
            await _run(None, None)
            self.times.append(time.perf_counter() - start)
            return
        backend = LatencyBackend(open_backend("memory://"), WRITE_LATENCY_S)
        store = MemoryStore(backend)
        await store.setup()
        self.runs += 1
        cursor = RunCursor("bench", f"{self.name.replace(' ', '-')}-{self.runs}")
        writer = CheckpointWriter(store, synchronous=self.synchronous)

        async def checkpoint(phase: Phase, step: int, payload: dict[str, object]) -> None:
            await writer.submit(cursor.checkpoint(phase, step, payload))

        start = time.perf_counter()
        await _run(checkpoint, writer.flush if self.flush else None)
        await writer.close()  # the final flush counts: everything is durable at the end
        self.times.append(time.perf_counter() - start)
        self.submitted += writer.stats.submitted
        self.coalesced += writer.stats.coalesced
        self.written += backend.writes
        await store.close()


async def _coalescing(report: Report) -> None:
    """A streaming agent: bursts of runtime snapshots, faster than the store takes them."""
    backend = LatencyBackend(open_backend("memory://"), WRITE_LATENCY_S)
    store = MemoryStore(backend)
    cursor = RunCursor("bench", "burst")
    bursts, per_burst = 100, 5
    start = time.perf_counter()
    async with CheckpointWriter(store) as writer:
        for i in range(bursts):
            for j in range(per_burst):
                step = i * per_burst + j
                await writer.submit(cursor.checkpoint(Phase.RUNTIME_STATE, i, {"step": step}))
            await asyncio.sleep(0.001)
    elapsed = time.perf_counter() - start
    submits = bursts * per_burst
    latest = await store.runtime_snapshot("bench", "burst")
    assert latest is not None
    assert latest.payload["step"] == submits - 1  # the newest snapshot always lands
    report.add(
        Result(
            "writer",
            "coalescing: snapshot bursts",
            elapsed / submits,
            None,
            None,
            None,
            submits,
            note=(
                f"{bursts} bursts of {per_burst} snapshots ~1 ms apart: {submits} submitted, "
                f"{writer.stats.coalesced} coalesced, {backend.writes} backend writes "
                f"({submits / backend.writes:.1f} records per write)"
            ),
        )
    )


async def main(report: Report) -> None:
    variants = [
        _Variant("no store", store=False),
        _Variant("async writer", store=True),
        _Variant("async + flush before tools", store=True, flush=True),
        _Variant("synchronous writes", store=True, synchronous=True),
    ]
    report.console.print(
        f"  {STEPS} steps per run; step = LLM {LLM_S * 1000:.0f} ms + {TOOLS} tools x "
        f"{TOOL_S * 1000:.1f} ms; 7 checkpoints per step; {WRITE_LATENCY_S * 1000:.0f} ms per "
        f"write; {ROUNDS} rounds, interleaved",
        highlight=False,
    )
    await variants[1].once()  # warm-up (imports, first-use setup)
    variants[1].times.clear()
    for round_index in range(ROUNDS):
        order = variants[round_index % len(variants) :] + variants[: round_index % len(variants)]
        for variant in order:
            await variant.once()
    baseline = statistics.median(variants[0].times) / STEPS
    for variant in variants[1:]:
        per_step = statistics.median(variant.times) / STEPS
        target = TARGET if variant.name == "async writer" else None
        runs = max(1, variant.runs)
        ratio_note = (
            f"{per_step / baseline:.2f}x the no-store step time; per run: "
            f"{variant.submitted / runs:.0f} records, {variant.coalesced / runs:.1f} coalesced, "
            f"{variant.written / runs:.1f} backend writes"
        )
        report.add(
            Result(
                "writer",
                f"{variant.name} vs no store",
                per_step,
                baseline,
                baseline / per_step,
                target,
                ROUNDS * STEPS,
                note=ratio_note,
            )
        )
    await _coalescing(report)
