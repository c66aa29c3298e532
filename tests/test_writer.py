"""The write-behind writer: coalescing, backpressure, failures surfaced, ordering, flushes.

Faults are injected by :class:`FaultyBackend`, a wrapper around a real backend
(memory:// or file://) that counts, delays, holds or fails writes; the data
itself always lives in the real backend.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from checkpoint_stores import (
    AgentCheckpointCorruptionError,
    CheckpointEncodeError,
    CheckpointFlushError,
    InvalidIdentifierError,
    MemoryStore,
    Phase,
    StaleWriterError,
    StorageBackend,
    StoreUnavailableError,
    open_backend,
    open_store,
    runtime_key,
)
from checkpoint_stores.resume import RunCursor, claim_run
from checkpoint_stores.spi import DelegatingBackend
from checkpoint_stores.writer import CheckpointWriter, WriteFailure
from tests.servers import BACKEND_FIXTURES
from tests.support import ServerInfo

THREAD = "t-writer"

# A broken writer tends to hang a flush rather than raise: fail fast instead.
pytestmark = pytest.mark.timeout(60)


class FaultyBackend(DelegatingBackend):
    """Delegates to a real backend; counts commits and can hold, delay or fail them."""

    def __init__(self, inner: StorageBackend) -> None:
        super().__init__(inner)
        self.commits: list[tuple[str, int]] = []  # (head_key, seq) of commits that reached inner
        self.attempts = 0
        self.fail_next = 0  # fail this many commits, then succeed
        self.fail_with: Exception = StoreUnavailableError("injected: server unreachable")
        self.gate = asyncio.Event()
        self.gate.set()
        self.entered = asyncio.Event()  # set when a commit is waiting at a closed gate
        self.latency = 0.0

    async def commit(
        self,
        thread_id: str,
        writes: Sequence[tuple[str, bytes]],
        head_key: str,
        head_value: bytes,
        seq: int,
    ) -> bool:
        self.attempts += 1
        if not self.gate.is_set():
            self.entered.set()
            await self.gate.wait()
        if self.latency:
            await asyncio.sleep(self.latency)
        if self.fail_next:
            self.fail_next -= 1
            raise self.fail_with
        moved = await self.inner.commit(thread_id, writes, head_key, head_value, seq)
        if moved:
            self.commits.append((head_key, seq))
        return moved


@pytest.fixture(params=["memory", "file"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> FaultyBackend:
    url = "memory://" if request.param == "memory" else f"file://{tmp_path}/store?fsync=false"
    return FaultyBackend(open_backend(url))


@pytest.fixture
def store(backend: FaultyBackend) -> MemoryStore:
    return MemoryStore(backend)


def snapshot(cursor: RunCursor, step: int, marker: int) -> Any:
    return cursor.checkpoint(Phase.RUNTIME_STATE, step, {"step": step, "context": {"m": marker}})


# -- coalescing -----------------------------------------------------------------------


async def test_runtime_snapshots_are_coalesced(store: MemoryStore, backend: FaultyBackend) -> None:
    cursor = RunCursor(THREAD, "r1")
    backend.gate.clear()
    async with CheckpointWriter(store) as writer:
        try:
            await writer.submit(snapshot(cursor, 0, 0))
            await backend.entered.wait()  # the first is being written; the rest wait behind it
            for marker in range(1, 10):
                await writer.submit(snapshot(cursor, 0, marker))
            pending_while_held = writer.pending
        finally:
            backend.gate.set()
    assert pending_while_held == 2  # the one in flight and the newest
    assert len(backend.commits) == 2
    assert writer.stats.submitted == 10
    assert writer.stats.coalesced == 8
    assert writer.stats.written == 2
    stored = await store.runtime_snapshot(THREAD, "r1")
    assert stored is not None
    assert stored.payload["context"] == {"m": 9}


async def test_coalescing_keeps_other_phases_and_order(
    store: MemoryStore, backend: FaultyBackend
) -> None:
    cursor = RunCursor(THREAD, "r1")
    backend.gate.clear()
    async with CheckpointWriter(store) as writer:
        try:
            await writer.submit(snapshot(cursor, 0, 1))  # in flight, never replaced
            await backend.entered.wait()
            pre = cursor.checkpoint(Phase.PRE_LLM, 1, {})
            await writer.submit(pre)
            await writer.submit(snapshot(cursor, 1, 2))  # replaced by the next one
            post = cursor.checkpoint(Phase.POST_LLM, 1, {})
            await writer.submit(post)
            last = snapshot(cursor, 1, 3)
            await writer.submit(last)
        finally:
            backend.gate.set()
    # The first was in flight alone; the three that queued behind it went in one commit.
    assert [seq for _, seq in backend.commits] == [1, last.seq]
    assert writer.stats.coalesced == 1
    assert writer.stats.written == 4
    assert writer.stats.commits == 2
    assert (await store.latest(THREAD, "r1")).seq == last.seq
    for record in (pre, post):
        stored = await store.get_checkpoint(THREAD, "r1", record.step, record.phase)
        assert stored is not None
        assert stored.seq == record.seq
    snap = await store.runtime_snapshot(THREAD, "r1")
    assert snap is not None
    assert snap.payload["context"] == {"m": 3}


async def test_coalescing_can_be_turned_off(store: MemoryStore, backend: FaultyBackend) -> None:
    cursor = RunCursor(THREAD, "r1")
    async with CheckpointWriter(store, coalesce=False, max_batch=1) as writer:
        for marker in range(5):
            await writer.submit(snapshot(cursor, 0, marker))
    assert len(backend.commits) == 5
    assert writer.stats.coalesced == 0


# -- backpressure ---------------------------------------------------------------------


async def test_full_queue_blocks_submitters(store: MemoryStore, backend: FaultyBackend) -> None:
    cursor = RunCursor(THREAD, "r1")
    backend.gate.clear()
    writer = CheckpointWriter(store, max_pending=3)
    for step in range(3):
        await writer.submit(cursor.checkpoint(Phase.STEP_STARTED, step, {}))
    blocked = asyncio.create_task(writer.submit(cursor.checkpoint(Phase.STEP_STARTED, 3, {})))
    try:
        await backend.entered.wait()
        for _ in range(20):
            await asyncio.sleep(0)
        # The gate is closed, so nothing can complete: the fourth submit must still wait.
        still_blocked, pending_while_held = not blocked.done(), writer.pending
    finally:
        backend.gate.set()
    assert still_blocked
    assert pending_while_held == 3
    await blocked
    await writer.close()
    assert writer.stats.written == 4
    assert (await store.latest(THREAD, "r1")).step == 3
    for step in range(4):
        assert await store.get_checkpoint(THREAD, "r1", step, Phase.STEP_STARTED) is not None


async def test_a_coalescible_snapshot_does_not_wait_for_space(
    store: MemoryStore, backend: FaultyBackend
) -> None:
    cursor = RunCursor(THREAD, "r1")
    backend.gate.clear()
    writer = CheckpointWriter(store, max_pending=2)
    await writer.submit(cursor.checkpoint(Phase.PRE_LLM, 0, {}))
    try:
        await backend.entered.wait()
        await writer.submit(snapshot(cursor, 0, 1))
        # Full, but this one replaces the waiting snapshot instead of adding to the queue.
        await asyncio.wait_for(writer.submit(snapshot(cursor, 0, 2)), timeout=5)
        pending_while_held = writer.pending
    finally:
        backend.gate.set()
    assert pending_while_held == 2
    await writer.close()


# -- failures -------------------------------------------------------------------------


async def test_failing_backend_is_surfaced_by_flush_and_callback(
    store: MemoryStore, backend: FaultyBackend
) -> None:
    cursor = RunCursor(THREAD, "r1")
    failures: list[WriteFailure] = []
    writer = CheckpointWriter(
        store, max_attempts=3, backoff_initial=0.001, on_error=failures.append
    )
    backend.fail_next = 10**6
    first = cursor.checkpoint(Phase.RUN_STARTED, 0, {})
    second = cursor.checkpoint(Phase.STEP_STARTED, 0, {})
    await writer.submit(first)
    await writer.submit(second)
    with pytest.raises(CheckpointFlushError) as info:
        await writer.flush(timeout=30)
    message = str(info.value)
    assert "2 checkpoint writes failed" in message
    assert f"seq {first.seq} (run_started at step 0)" in message
    assert "StoreUnavailableError after 3 attempts" in message
    assert [f.seq for f in info.value.failures] == [first.seq, second.seq]
    assert [f.seq for f in failures] == [first.seq, second.seq]
    assert all(not f.stale for f in failures)
    assert all(f.attempts == 3 for f in failures)
    assert backend.attempts == 3  # both records travel in one commit
    assert writer.stats.retries == 2
    assert writer.stats.failed == 2
    assert backend.commits == []
    # Each failure is reported once; the writer keeps working when the store recovers.
    backend.fail_next = 0
    await writer.submit(cursor.checkpoint(Phase.PRE_LLM, 0, {}))
    await writer.close()
    assert (await store.latest(THREAD, "r1")).phase is Phase.PRE_LLM


async def test_transient_failures_are_retried(store: MemoryStore, backend: FaultyBackend) -> None:
    cursor = RunCursor(THREAD, "r1")
    failures: list[WriteFailure] = []
    backend.fail_next = 2
    async with CheckpointWriter(
        store, max_attempts=5, backoff_initial=0.001, on_error=failures.append
    ) as writer:
        await writer.submit(cursor.checkpoint(Phase.RUN_STARTED, 0, {}))
    assert failures == []
    assert writer.stats.retries == 2
    assert len(backend.commits) == 1


async def test_corruption_and_bad_values_are_not_retried(
    store: MemoryStore, backend: FaultyBackend
) -> None:
    cursor = RunCursor(THREAD, "r1")
    backend.fail_next = 1
    backend.fail_with = AgentCheckpointCorruptionError("injected: head file truncated")
    writer = CheckpointWriter(store, max_attempts=5, backoff_initial=0.001)
    await writer.submit(cursor.checkpoint(Phase.RUN_STARTED, 0, {}))
    with pytest.raises(CheckpointFlushError, match="truncated"):
        await writer.close()
    assert backend.attempts == 1


async def test_flush_timeout_names_what_is_pending(
    store: MemoryStore, backend: FaultyBackend
) -> None:
    cursor = RunCursor(THREAD, "run-slow")
    backend.gate.clear()
    writer = CheckpointWriter(store)
    cp = cursor.checkpoint(Phase.PRE_TOOL_BATCH, 4, {})
    await writer.submit(cp)
    try:
        with pytest.raises(CheckpointFlushError, match="timed out") as info:
            await writer.flush(timeout=0.05)
    finally:
        backend.gate.set()
    assert f"run 'run-slow' seq {cp.seq} (pre_tool_batch" in str(info.value)
    await writer.flush(timeout=30)  # still queued: it lands once the store answers
    await writer.close()
    assert (await store.latest(THREAD, "run-slow")).seq == cp.seq


async def test_stale_writer_is_not_retried_and_blocks_the_run(
    store: MemoryStore, backend: FaultyBackend
) -> None:
    old = RunCursor(THREAD, "r1")
    await store.append(old.checkpoint(Phase.RUN_STARTED, 0, {}))
    new = await claim_run(store, THREAD, "r1")
    failures: list[WriteFailure] = []
    writer = CheckpointWriter(store, on_error=failures.append)
    attempts_before = backend.attempts
    await writer.submit(old.checkpoint(Phase.STEP_STARTED, 0, {}))
    with pytest.raises(CheckpointFlushError, match="Another writer"):
        await writer.flush()
    assert backend.attempts == attempts_before + 1
    assert failures[0].stale
    with pytest.raises(StaleWriterError):
        await writer.submit(old.checkpoint(Phase.PRE_LLM, 0, {}))
    # The new owner's epoch is not blocked.
    await writer.submit(new.checkpoint(Phase.STEP_STARTED, 0, {}))
    await writer.close()
    assert (await store.latest(THREAD, "r1")).epoch == 1


async def test_callback_errors_do_not_hide_failures(
    store: MemoryStore, backend: FaultyBackend
) -> None:
    def broken(failure: WriteFailure) -> None:
        raise RuntimeError("callback bug")

    backend.fail_next = 10
    writer = CheckpointWriter(store, max_attempts=1, on_error=broken)
    await writer.submit(RunCursor(THREAD, "r1").checkpoint(Phase.RUN_STARTED, 0, {}))
    with pytest.raises(CheckpointFlushError, match="1 checkpoint writes failed"):
        await writer.close()


# -- what submit refuses at once ------------------------------------------------------


async def test_unstorable_records_fail_in_submit(store: MemoryStore) -> None:
    writer = CheckpointWriter(store)
    cursor = RunCursor(THREAD, "r1")
    with pytest.raises(CheckpointEncodeError, match="NaN"):
        await writer.submit(cursor.checkpoint(Phase.PRE_LLM, 0, {"cost": math.nan}))
    with pytest.raises(InvalidIdentifierError):
        await writer.submit(RunCursor(THREAD, "bad:run").checkpoint(Phase.PRE_LLM, 0, {}))
    assert writer.pending == 0
    await writer.close()
    with pytest.raises(RuntimeError, match="closed"):
        await writer.submit(cursor.checkpoint(Phase.PRE_LLM, 0, {}))


async def test_payload_is_captured_at_submit(store: MemoryStore) -> None:
    cursor = RunCursor(THREAD, "r1")
    payload: dict[str, Any] = {"messages": [{"text": "before"}], "step": 0}
    async with CheckpointWriter(store) as writer:
        await writer.submit(cursor.checkpoint(Phase.RUNTIME_STATE, 0, payload))
        payload["messages"][0]["text"] = "after"  # the caller reuses its state object
    stored = await store.runtime_snapshot(THREAD, "r1")
    assert stored is not None
    assert stored.payload["messages"] == [{"text": "before"}]


# -- ordering and monotonic latest ------------------------------------------------------


async def test_per_run_order_across_interleaved_runs(
    store: MemoryStore, backend: FaultyBackend
) -> None:
    runs = {f"run-{i}": RunCursor(THREAD, f"run-{i}") for i in range(5)}
    submitted: dict[str, list[int]] = {run: [] for run in runs}
    async with CheckpointWriter(store, coalesce=False) as writer:

        async def drive(run: str) -> None:
            for step in range(30):
                cp = runs[run].checkpoint(Phase.STEP_STARTED, step, {})
                submitted[run].append(cp.seq)
                await writer.submit(cp)
                if step % 7 == 0:
                    await asyncio.sleep(0)

        await asyncio.gather(*(drive(run) for run in runs))
    for run, seqs in submitted.items():
        heads = [seq for head, seq in backend.commits if head == f"checkpoint:{run}:latest"]
        # Batches move latest in submit order, ending at the last record...
        assert heads == sorted(set(heads))
        assert set(heads) <= set(seqs)
        assert heads[-1] == seqs[-1]
        # ...and every record landed with its own seq.
        for step, seq in enumerate(seqs):
            stored = await store.get_checkpoint(THREAD, run, step, Phase.STEP_STARTED)
            assert stored is not None
            assert stored.seq == seq


async def test_without_batching_each_record_is_its_own_commit_in_order(
    store: MemoryStore, backend: FaultyBackend
) -> None:
    cursor = RunCursor(THREAD, "r1")
    backend.latency = 0.001
    async with CheckpointWriter(store, max_batch=1) as writer:
        seqs = []
        for step in range(10):
            record = cursor.checkpoint(Phase.STEP_STARTED, step, {})
            seqs.append(record.seq)
            await writer.submit(record)
    assert [seq for _, seq in backend.commits] == seqs


async def test_batches_respect_the_byte_cap(store: MemoryStore, backend: FaultyBackend) -> None:
    cursor = RunCursor(THREAD, "r1")
    backend.gate.clear()
    writer = CheckpointWriter(store, max_batch_bytes=3000)
    try:
        await writer.submit(cursor.checkpoint(Phase.STEP_STARTED, 0, {}))
        await backend.entered.wait()
        for step in range(1, 9):
            await writer.submit(cursor.checkpoint(Phase.STEP_STARTED, step, {"pad": "x" * 1000}))
    finally:
        backend.gate.set()
    await writer.close()
    assert writer.stats.written == 9
    # Two ~1 KiB records fit under 3000 bytes per commit: 1 + 4 commits, never all 8 at once.
    assert writer.stats.commits == 5


async def test_latest_never_goes_backwards_under_async_writes(
    store: MemoryStore, backend: FaultyBackend
) -> None:
    backend.latency = 0.001
    runs = [RunCursor(THREAD, f"run-{i}") for i in range(3)]
    observed: dict[str, list[int]] = {c.run_id: [] for c in runs}
    stop = asyncio.Event()

    async def watch() -> None:
        while not stop.is_set():
            for cursor in runs:
                raw = await store.backend.get(THREAD, f"checkpoint:{cursor.run_id}:latest")
                if raw is not None:
                    observed[cursor.run_id].append((await store.latest(THREAD, cursor.run_id)).seq)
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    async with CheckpointWriter(store, max_pending=8) as writer:
        for step in range(25):
            for cursor in runs:
                await writer.submit(cursor.checkpoint(Phase.STEP_STARTED, step, {}))
                await writer.submit(snapshot(cursor, step, step))
    stop.set()
    await watcher
    for cursor in runs:
        seen = observed[cursor.run_id] + [(await store.latest(THREAD, cursor.run_id)).seq]
        assert seen == sorted(seen)
        assert seen[-1] == cursor.seq
        snap = await store.runtime_snapshot(THREAD, cursor.run_id)
        assert snap is not None
        assert snap.payload["context"] == {"m": 24}


# -- terminal flush, durability, synchronous mode ---------------------------------------


async def test_closing_is_a_final_flush_and_survives_reopening(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    cursor = RunCursor(THREAD, "r1")
    async with open_store(url) as store, CheckpointWriter(store) as writer:
        for step in range(3):
            await writer.submit(cursor.checkpoint(Phase.STEP_STARTED, step, {}))
            await writer.submit(snapshot(cursor, step, step))
        await writer.submit(
            cursor.checkpoint(Phase.RUN_TERMINAL, 3, {"terminal_result": {"ok": True}})
        )
        # Leaving the block returned only after the terminal record was durable.
    async with open_store(url) as reopened:
        latest = await reopened.latest(THREAD, "r1")
        assert latest.phase is Phase.RUN_TERMINAL
        assert latest.payload["terminal_result"] == {"ok": True}
        assert await reopened.backend.get(THREAD, runtime_key("r1")) is not None


async def test_synchronous_mode_writes_in_submit(
    store: MemoryStore, backend: FaultyBackend
) -> None:
    cursor = RunCursor(THREAD, "r1")
    writer = CheckpointWriter(store, synchronous=True, max_attempts=2, backoff_initial=0.001)
    await writer.submit(cursor.checkpoint(Phase.RUN_STARTED, 0, {}))
    assert len(backend.commits) == 1  # acknowledged before submit returned
    backend.fail_next = 1
    await writer.submit(cursor.checkpoint(Phase.STEP_STARTED, 0, {}))
    assert len(backend.commits) == 2
    backend.fail_next = 5
    with pytest.raises(CheckpointFlushError, match="StoreUnavailableError after 2 attempts"):
        await writer.submit(cursor.checkpoint(Phase.PRE_LLM, 0, {}))
    await writer.flush()  # already raised from submit: not reported twice
    backend.fail_next = 0
    await claim_run(store, THREAD, "r1")
    with pytest.raises(StaleWriterError):
        await writer.submit(cursor.checkpoint(Phase.PRE_LLM, 0, {}))
    with pytest.raises(StaleWriterError):
        await writer.submit(cursor.checkpoint(Phase.POST_LLM, 0, {}))
    await writer.close()


# -- every backend ------------------------------------------------------------------------


@pytest.fixture(params=BACKEND_FIXTURES)
def server(request: pytest.FixtureRequest) -> ServerInfo:
    info = request.getfixturevalue(request.param)
    assert isinstance(info, ServerInfo)
    return info


async def test_batched_commits_on_every_backend(server: ServerInfo) -> None:
    """Batches are multi-record commits: every backend must store all of them, in order."""
    backend = FaultyBackend(open_backend(server.url, **server.options))
    store = MemoryStore(backend)
    thread = f"writer-{uuid.uuid4().hex[:8]}/{{x}}*%"
    cursor = RunCursor(thread, "run-b")
    try:
        await store.setup()
        backend.gate.clear()
        writer = CheckpointWriter(store)
        submitted = []
        try:
            for step in range(6):
                for phase in (Phase.STEP_STARTED, Phase.PRE_LLM, Phase.RUNTIME_STATE):
                    record = (
                        snapshot(cursor, step, step)
                        if phase is Phase.RUNTIME_STATE
                        else cursor.checkpoint(phase, step, {})
                    )
                    submitted.append(record)
                    await writer.submit(record)
                if step == 0:
                    await backend.entered.wait()  # the rest queue up behind a held write
        finally:
            backend.gate.set()
        await writer.close()
        assert writer.stats.commits < writer.stats.written  # batching really happened
        latest = await store.latest(thread, "run-b")
        assert latest.seq == submitted[-1].seq
        history = await store.history(thread, "run-b")
        kept = {(r.step, r.phase) for r in history}
        for record in submitted:
            if record.phase is not Phase.RUNTIME_STATE:
                assert (record.step, record.phase) in kept
        snap = await store.runtime_snapshot(thread, "run-b")
        assert snap is not None
        assert snap.payload["context"] == {"m": 5}
    finally:
        await store.delete_thread(thread)
        await store.close()
