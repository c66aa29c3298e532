"""Resume points, claiming and fencing: every phase, two resumers, v1 data, corruption."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from checkpoint_stores import (
    AgentCheckpointCorruptionError,
    CheckpointFlushError,
    CheckpointNotFoundError,
    MemoryStore,
    Phase,
    StaleWriterError,
    checkpoint_key,
    checkpoint_latest_key,
    open_store,
    runtime_key,
)
from checkpoint_stores.backends.memory import MemoryBackend
from checkpoint_stores.resume import (
    RunCursor,
    claim_run,
    load_resume_point,
    make_seq,
    start_run,
)
from checkpoint_stores.writer import CheckpointWriter
from tests.servers import BACKEND_FIXTURES
from tests.support import ServerInfo

THREAD = "user:42/../%*{t}"
RUN = "run-7"

# One step of a run, as a runner writes it (runtime snapshots after post_llm and post_tool_batch).
STEP_PHASES: Sequence[Phase] = (
    Phase.STEP_STARTED,
    Phase.PRE_LLM,
    Phase.POST_LLM,
    Phase.RUNTIME_STATE,
    Phase.PRE_TOOL_BATCH,
    Phase.POST_TOOL_BATCH,
    Phase.RUNTIME_STATE,
)


@pytest.fixture(params=["memory", "file"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MemoryStore]:
    url = "memory://" if request.param == "memory" else f"file://{tmp_path}/store"
    async with open_store(url) as opened:
        yield opened


def _payload(phase: Phase, step: int, index: int) -> dict[str, Any]:
    if phase is Phase.RUNTIME_STATE:
        after_llm = STEP_PHASES[index - 1] is Phase.POST_LLM
        return {
            "step": step if after_llm else step + 1,
            "state": "running",
            "messages": [{"role": "user", "text": f"through step {step}"}],
            "llm_calls": step + 1,
            "pending_llm_response": (
                {"text": f"plan {step}", "tool_calls": [{"id": "c1", "tool_name": "add"}]}
                if after_llm
                else None
            ),
        }
    if phase is Phase.RUN_TERMINAL:
        return {"state": "completed", "terminal_result": {"answer": 42, "steps": step}}
    return {}


async def _write_run(
    store: MemoryStore, cursor: RunCursor, steps: int, stop_after: Phase | None = None
) -> list[int]:
    """Write a run's chain; stop after the first ``stop_after`` of the last step."""
    seqs = []
    await store.append(cursor.checkpoint(Phase.RUN_STARTED, 0, {"agent_name": "a"}))
    seqs.append(cursor.seq)
    if stop_after is Phase.RUN_STARTED:
        return seqs
    for step in range(steps):
        for index, phase in enumerate(STEP_PHASES):
            await store.append(cursor.checkpoint(phase, step, _payload(phase, step, index)))
            seqs.append(cursor.seq)
            if step == steps - 1 and phase is stop_after:
                return seqs
    await store.append(
        cursor.checkpoint(Phase.RUN_TERMINAL, steps, _payload(Phase.RUN_TERMINAL, steps, 0))
    )
    seqs.append(cursor.seq)
    return seqs


# -- starting and claiming ------------------------------------------------------------


async def test_start_run_is_epoch_zero_and_refuses_an_existing_run(store: MemoryStore) -> None:
    cursor = await start_run(store, THREAD, RUN)
    assert (cursor.epoch, cursor.counter) == (0, 0)
    assert cursor.next_seq() == 1
    await store.append(cursor.checkpoint(Phase.RUN_STARTED, 0, {}))
    with pytest.raises(StaleWriterError, match="already exists"):
        await start_run(store, THREAD, RUN)


async def test_claim_of_a_missing_run_says_so(store: MemoryStore) -> None:
    with pytest.raises(CheckpointNotFoundError):
        await claim_run(store, THREAD, "never-ran")


async def test_claim_restamps_latest_only(store: MemoryStore) -> None:
    first = await start_run(store, THREAD, RUN)
    await _write_run(store, first, steps=2, stop_after=Phase.PRE_TOOL_BATCH)
    before = await store.latest(THREAD, RUN)
    record_before = await store.backend.get(
        THREAD, checkpoint_key(RUN, before.step, before.phase.value)
    )

    cursor = await claim_run(store, THREAD, RUN)
    assert cursor.epoch == 1
    assert cursor.seq == make_seq(1, 0) == 1 << 32
    after = await store.latest(THREAD, RUN)
    assert after.seq == 1 << 32
    assert (after.step, after.phase, after.payload) == (before.step, before.phase, before.payload)
    assert after.model_extra is not None
    assert after.model_extra["claim"]["epoch"] == 1
    # The step record itself is untouched: a claim writes the head only.
    record_after = await store.backend.get(
        THREAD, checkpoint_key(RUN, before.step, before.phase.value)
    )
    assert record_after == record_before
    assert cursor.next_seq() == (1 << 32) | 1

    again = await claim_run(store, THREAD, RUN)
    assert again.epoch == 2


async def test_claim_of_a_finished_run_writes_nothing(store: MemoryStore) -> None:
    cursor = await start_run(store, THREAD, RUN)
    await _write_run(store, cursor, steps=1)
    raw = await store.backend.get(THREAD, checkpoint_latest_key(RUN))
    claimed = await claim_run(store, THREAD, RUN)
    assert await store.backend.get(THREAD, checkpoint_latest_key(RUN)) == raw
    assert claimed.epoch == 0


async def test_concurrent_claims_get_distinct_epochs(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    async with open_store(url) as store:
        await _write_run(
            store, await start_run(store, THREAD, RUN), steps=1, stop_after=Phase.PRE_LLM
        )
    stores = [open_store(url) for _ in range(6)]
    cursors = await asyncio.gather(*(claim_run(s, THREAD, RUN) for s in stores))
    epochs = sorted(c.epoch for c in cursors)
    assert len(set(epochs)) == 6
    assert min(epochs) >= 1
    latest = await stores[0].latest(THREAD, RUN)
    assert latest.epoch == max(epochs)
    for s in stores:
        await s.close()


# -- fencing --------------------------------------------------------------------------


async def test_two_resumers_zombie_is_fenced_and_latest_never_regresses(
    store: MemoryStore,
) -> None:
    original = await start_run(store, THREAD, RUN)
    await _write_run(store, original, steps=2, stop_after=Phase.POST_LLM)

    seen: list[int] = []

    async def watch() -> None:
        while True:
            seen.append((await store.latest(THREAD, RUN)).seq)
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    try:
        a = await claim_run(store, THREAD, RUN)
        b = await claim_run(store, THREAD, RUN)
        assert (a.epoch, b.epoch) == (1, 2)

        # Resumer A is now a zombie: its writer reports the fence at once, never retries.
        failures = []
        async with CheckpointWriter(store, on_error=failures.append, max_attempts=3) as writer_b:
            writer_a = CheckpointWriter(store, on_error=failures.append, max_attempts=3)
            await writer_a.submit(a.checkpoint(Phase.PRE_TOOL_BATCH, 1, {}))
            await writer_a.submit(a.checkpoint(Phase.POST_TOOL_BATCH, 1, {}))
            with pytest.raises(CheckpointFlushError, match="Another writer"):
                await writer_a.flush()
            assert len(failures) == 1
            assert failures[0].stale
            assert failures[0].attempts == 1
            assert failures[0].dropped == 1
            with pytest.raises(StaleWriterError):
                await writer_a.submit(a.checkpoint(Phase.RUNTIME_STATE, 1, {}))
            await writer_a.close()

            # The original writer (epoch 0) is fenced too.
            with pytest.raises(StaleWriterError):
                await store.append(original.checkpoint(Phase.PRE_TOOL_BATCH, 1, {}))

            for phase in (Phase.PRE_TOOL_BATCH, Phase.POST_TOOL_BATCH):
                await writer_b.submit(b.checkpoint(phase, 1, {}))
        latest = await store.latest(THREAD, RUN)
        assert latest.epoch == 2
        assert latest.phase is Phase.POST_TOOL_BATCH
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    seen.append((await store.latest(THREAD, RUN)).seq)
    assert len(seen) > 2
    assert seen == sorted(seen), "latest moved backwards"


# -- resume points --------------------------------------------------------------------


@pytest.mark.parametrize("phase", list(Phase))
async def test_resume_from_every_phase(store: MemoryStore, phase: Phase) -> None:
    cursor = await start_run(store, THREAD, RUN)
    if phase is Phase.RUN_TERMINAL:
        seqs = await _write_run(store, cursor, steps=3)
    elif phase in (Phase.PRE_SUBAGENT_BATCH, Phase.POST_SUBAGENT_BATCH):
        seqs = await _write_run(store, cursor, steps=3, stop_after=Phase.POST_TOOL_BATCH)
        await store.append(cursor.checkpoint(Phase.PRE_SUBAGENT_BATCH, 2, {"subagent_count": 1}))
        seqs.append(cursor.seq)
        if phase is Phase.POST_SUBAGENT_BATCH:
            await store.append(cursor.checkpoint(phase, 2, {"subagent_calls_total": 1}))
            seqs.append(cursor.seq)
    else:
        seqs = await _write_run(store, cursor, steps=3, stop_after=phase)

    resumer = await claim_run(store, THREAD, RUN)
    point = await load_resume_point(store, THREAD, RUN)
    assert point.latest.phase is phase

    if phase is Phase.RUN_TERMINAL:
        assert point.terminal
        assert point.terminal_result == {"answer": 42, "steps": 3}
        assert point.snapshot is None
        return

    assert not point.terminal
    assert point.latest.seq == resumer.seq > max(seqs)
    if phase in (Phase.RUN_STARTED, Phase.STEP_STARTED, Phase.PRE_LLM, Phase.POST_LLM):
        # The newest snapshot is step 1's final one (or none, for run_started).
        if phase is Phase.RUN_STARTED:
            assert point.snapshot is None
            assert point.source is None
            return
        assert point.snapshot is not None
        assert point.snapshot.step == 2
        assert point.pending_llm_response is None
    elif phase in (Phase.RUNTIME_STATE, Phase.PRE_TOOL_BATCH):
        # After post_llm's snapshot: the LLM response is pending and must be reused.
        assert point.snapshot is not None
        assert point.snapshot.step == 2
        assert point.pending_llm_response is not None
        assert point.pending_llm_response.text == "plan 2"
    else:  # post_tool_batch and the subagent phases: the step's first snapshot
        assert point.snapshot is not None
        assert point.pending_llm_response is not None
    assert point.source == "runtime_key"
    assert point.snapshot_checkpoint is not None
    assert point.snapshot_checkpoint.phase is Phase.RUNTIME_STATE

    # Continuing never moves latest backwards, even when a step is redone.
    before = (await store.latest(THREAD, RUN)).seq
    await store.append(resumer.checkpoint(Phase.STEP_STARTED, point.step, {}))
    after = await store.latest(THREAD, RUN)
    assert after.seq > before
    assert after.step == point.step


async def test_resume_is_two_reads_whatever_the_run_length() -> None:
    backend = CountingBackend()
    store = MemoryStore(backend)
    cursor = await start_run(store, THREAD, RUN)
    await _write_run(store, cursor, steps=60, stop_after=Phase.PRE_TOOL_BATCH)
    backend.reads.clear()
    point = await load_resume_point(store, THREAD, RUN)
    assert point.snapshot is not None
    assert point.snapshot.step == 59
    assert backend.reads == ["get", "get"]  # latest, then the runtime key


async def test_v1_data_resumes_through_the_backward_scan() -> None:
    backend = CountingBackend()
    store = MemoryStore(backend)
    # AFK v1 records written by plain puts: no thread_id, no seq, no runtime key.
    for step in range(3):
        await store.put_state(
            THREAD,
            checkpoint_key(RUN, step, "runtime_state"),
            {
                "schema_version": "v1",
                "run_id": RUN,
                "step": step,
                "phase": "runtime_state",
                "timestamp_ms": 1,
                "payload": {"step": step + 1, "messages": [], "state": "running"},
            },
        )
    latest = {
        "schema_version": "v1",
        "run_id": RUN,
        "step": 40,
        "phase": "pre_llm",
        "timestamp_ms": 2,
        "payload": {},
    }
    await store.put_state(THREAD, checkpoint_key(RUN, 40, "pre_llm"), latest)
    await store.put_state(THREAD, checkpoint_latest_key(RUN), latest)
    assert await store.backend.get(THREAD, runtime_key(RUN)) is None

    cursor = await claim_run(store, THREAD, RUN)  # a plain-put head counts as lowest
    assert cursor.epoch == 1
    backend.reads.clear()
    point = await load_resume_point(store, THREAD, RUN)
    assert point.source == "v1_scan"
    assert point.snapshot is not None
    assert point.snapshot.step == 3
    assert point.snapshot_checkpoint is not None
    assert point.snapshot_checkpoint.step == 2
    # Steps 40..2 in batches: latest, runtime key, then two get_many round trips.
    assert backend.reads == ["get", "get", "get_many", "get_many"]


@pytest.mark.parametrize(
    "pending",
    [
        "a serialized response as a string",
        {"text": ["not", "text"]},
        {"tool_calls": [{"arguments": {}}]},  # a tool call without tool_name
        {"tool_calls": "nope"},
    ],
)
async def test_malformed_pending_llm_response_is_corruption(
    store: MemoryStore, pending: Any
) -> None:
    cursor = await start_run(store, THREAD, RUN)
    await store.append(cursor.checkpoint(Phase.RUN_STARTED, 0, {}))
    await store.append(
        cursor.checkpoint(Phase.RUNTIME_STATE, 0, {"step": 0, "pending_llm_response": pending})
    )
    await store.append(cursor.checkpoint(Phase.PRE_TOOL_BATCH, 0, {}))
    await claim_run(store, THREAD, RUN)
    with pytest.raises(AgentCheckpointCorruptionError, match="pending_llm_response"):
        await load_resume_point(store, THREAD, RUN)


async def test_runtime_key_holding_another_phase_is_corruption(store: MemoryStore) -> None:
    cursor = await start_run(store, THREAD, RUN)
    record = cursor.checkpoint(Phase.PRE_LLM, 0, {})
    await store.append(record)
    await store.backend.put(THREAD, runtime_key(RUN), store.encode_checkpoint(record))
    with pytest.raises(AgentCheckpointCorruptionError, match="not runtime_state"):
        await load_resume_point(store, THREAD, RUN)


async def test_unreadable_latest_is_corruption(store: MemoryStore) -> None:
    await store.backend.put(THREAD, checkpoint_latest_key(RUN), b"\xffCP\x01\x00\x00\x00")
    with pytest.raises(AgentCheckpointCorruptionError):
        await load_resume_point(store, THREAD, RUN)
    with pytest.raises(AgentCheckpointCorruptionError):
        await claim_run(store, THREAD, RUN)


def test_seq_layout() -> None:
    assert make_seq(0, 1) == 1
    assert make_seq(3, 5) == (3 << 32) | 5
    with pytest.raises(ValueError, match="counter"):
        make_seq(1, 1 << 32)
    cursor = RunCursor("t", "r", epoch=1, counter=(1 << 32) - 1)
    with pytest.raises(OverflowError, match="claim the run again"):
        cursor.next_seq()


class CountingBackend(MemoryBackend):
    """The memory backend, recording which read calls the facade makes."""

    def __init__(self) -> None:
        super().__init__("memory://")
        self.reads: list[str] = []

    async def get(self, thread_id: str, key: str) -> bytes | None:
        self.reads.append("get")
        return await super().get(thread_id, key)

    async def get_many(self, thread_id: str, keys: Sequence[str]) -> list[bytes | None]:
        self.reads.append("get_many")
        return await super().get_many(thread_id, keys)

    async def list(self, thread_id: str, prefix: str = "") -> AsyncIterator[tuple[str, bytes]]:
        self.reads.append("list")
        async for item in super().list(thread_id, prefix):
            yield item


# -- every backend ------------------------------------------------------------------------


@pytest.fixture(params=BACKEND_FIXTURES)
def server(request: pytest.FixtureRequest) -> ServerInfo:
    info = request.getfixturevalue(request.param)
    assert isinstance(info, ServerInfo)
    return info


async def test_claims_and_fencing_on_every_backend(server: ServerInfo) -> None:
    """Racing claimers through separate store objects: distinct epochs, the last one owns it."""
    thread = f"resume-{uuid.uuid4().hex[:8]}/{{x}}*%"
    stores = [open_store(server.url, **server.options) for _ in range(4)]
    try:
        original = await start_run(stores[0], thread, RUN)
        await _write_run(stores[0], original, steps=2, stop_after=Phase.PRE_TOOL_BATCH)
        cursors = await asyncio.gather(*(claim_run(s, thread, RUN) for s in stores))
        epochs = sorted(c.epoch for c in cursors)
        assert epochs == [1, 2, 3, 4]
        owner = next(c for c in cursors if c.epoch == 4)
        zombie = next(c for c in cursors if c.epoch == 3)
        with pytest.raises(StaleWriterError):
            await stores[1].append(zombie.checkpoint(Phase.POST_TOOL_BATCH, 1, {}))
        with pytest.raises(StaleWriterError):
            await stores[2].append(original.checkpoint(Phase.POST_TOOL_BATCH, 1, {}))
        await stores[3].append(owner.checkpoint(Phase.POST_TOOL_BATCH, 1, {}))
        point = await load_resume_point(stores[0], thread, RUN)
        assert point.latest.epoch == 4
        assert point.latest.phase is Phase.POST_TOOL_BATCH
        assert point.source == "runtime_key"
        assert point.pending_llm_response is not None
    finally:
        await stores[0].delete_thread(thread)
        for s in stores:
            await s.close()
