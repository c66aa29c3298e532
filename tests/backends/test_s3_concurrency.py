"""Concurrent head advances on s3://, from many tasks and from two OS processes.

Lockstep rounds (every writer commits the same seq at once, then waits for the
others) make the expected outcome exact: one winner per seq. Free-running
writers check the weaker invariants: at most one winner per seq, latest never
goes backwards for a reader polling it, and it always decodes.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import uuid
from collections import Counter
from typing import Any

import pytest

from checkpoint_stores import (
    Checkpoint,
    CheckpointNotFoundError,
    MemoryStore,
    Phase,
    open_store,
)
from tests.support import ServerInfo

pytestmark = pytest.mark.s3

RUN = "run-1"


def _checkpoint(thread: str, seq: int, writer: str) -> Checkpoint:
    return Checkpoint(
        run_id=RUN,
        thread_id=thread,
        seq=seq,
        step=seq,
        phase=Phase.RUNTIME_STATE if seq % 3 == 0 else Phase.POST_LLM,
        payload={"writer": writer, "pad": "x" * 200},
    )


async def _commit(store: MemoryStore, thread: str, seq: int, writer: str) -> bool:
    return await store.commit_checkpoint(_checkpoint(thread, seq, writer))


async def _lockstep_rounds(
    url: str,
    options: dict[str, Any],
    thread: str,
    who: str,
    tasks: int,
    seqs: int,
    barrier: Any = None,
) -> list[tuple[int, str, bool]]:
    """Round k: ``tasks`` writers commit seq k at once; then all processes meet at ``barrier``."""
    stores = [open_store(url, **options) for _ in range(tasks)]
    results: list[tuple[int, str, bool]] = []
    try:
        for store in stores:
            await store.setup()
        for seq in range(1, seqs + 1):
            writers = [f"{who}/{i}" for i in range(tasks)]
            won = await asyncio.gather(
                *(_commit(s, thread, seq, w) for s, w in zip(stores, writers, strict=True))
            )
            results.extend((seq, w, ok) for w, ok in zip(writers, won, strict=True))
            if barrier is not None:
                await asyncio.to_thread(barrier.wait, 60)
    finally:
        for store in stores:
            await store.close()
    return results


async def _free_running(
    url: str, options: dict[str, Any], thread: str, who: str, tasks: int, seqs: int
) -> list[tuple[int, str, bool]]:
    """Writers race through seqs 1..N without waiting for each other."""
    stores = [open_store(url, **options) for _ in range(tasks)]

    async def writer(store: MemoryStore, name: str) -> list[tuple[int, str, bool]]:
        return [(seq, name, await _commit(store, thread, seq, name)) for seq in range(1, seqs + 1)]

    try:
        parts = await asyncio.gather(*(writer(s, f"{who}/{i}") for i, s in enumerate(stores)))
    finally:
        for store in stores:
            await store.close()
    return [row for part in parts for row in part]


def _process_main(
    mode: str,
    url: str,
    options: dict[str, Any],
    thread: str,
    who: str,
    tasks: int,
    seqs: int,
    barrier: Any,
    out: Any,
) -> None:
    try:
        if mode == "lockstep":
            rows = asyncio.run(
                _lockstep_rounds(url, options, thread, who, tasks, seqs, barrier=barrier)
            )
        else:
            rows = asyncio.run(_free_running(url, options, thread, who, tasks, seqs))
        out.put(("ok", rows))
    except BaseException as exc:  # report, do not hang the parent
        if barrier is not None:
            barrier.abort()
        out.put(("error", repr(exc)))


def _run_processes(
    mode: str, server: ServerInfo, thread: str, *, processes: int, tasks: int, seqs: int
) -> list[tuple[int, str, bool]]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(processes) if mode == "lockstep" else None
    out = ctx.Queue()
    procs = [
        ctx.Process(
            target=_process_main,
            args=(mode, server.url, server.options, thread, f"p{n}", tasks, seqs, barrier, out),
        )
        for n in range(processes)
    ]
    for proc in procs:
        proc.start()
    rows: list[tuple[int, str, bool]] = []
    try:
        for _ in procs:
            status, payload = out.get(timeout=300)
            assert status == "ok", f"worker failed: {payload}"
            rows.extend(payload)
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    return rows


async def _assert_final(server: ServerInfo, thread: str, rows: list[tuple[int, str, bool]]) -> None:
    wins = Counter(seq for seq, _, ok in rows if ok)
    top = max(seq for seq, _, _ in rows)
    assert wins[top] == 1, f"seq {top} had {wins[top]} winners"
    (winner,) = [w for seq, w, ok in rows if ok and seq == top]
    async with open_store(server.url, **server.options) as store:
        latest = await store.latest(thread, RUN)  # decodes and normalizes, or raises
        assert latest.seq == top
        assert latest.payload["writer"] == winner
        # The head never names a missing record. Its content may be another seq-`top`
        # writer's: a loser's record PUT can land after the winner's (ordered, not atomic).
        record = await store.get_checkpoint(thread, RUN, top, latest.phase)
        assert record is not None
        assert record.seq == top
        assert record.payload["writer"] in {w for seq, w, _ in rows if seq == top}


async def test_many_tasks_lockstep_one_winner_per_seq(s3_server: ServerInfo) -> None:
    thread = f"t-{uuid.uuid4().hex}"
    rows = await _lockstep_rounds(s3_server.url, s3_server.options, thread, "task", 12, 8)
    wins = Counter(seq for seq, _, ok in rows if ok)
    assert {seq: wins[seq] for seq in range(1, 9)} == dict.fromkeys(range(1, 9), 1)
    await _assert_final(s3_server, thread, rows)


async def test_two_processes_lockstep_one_winner_per_seq(s3_server: ServerInfo) -> None:
    thread = f"t-{uuid.uuid4().hex}"
    rows = await asyncio.to_thread(
        _run_processes, "lockstep", s3_server, thread, processes=2, tasks=4, seqs=8
    )
    assert len(rows) == 2 * 4 * 8
    wins = Counter(seq for seq, _, ok in rows if ok)
    assert {seq: wins[seq] for seq in range(1, 9)} == dict.fromkeys(range(1, 9), 1)
    # Both processes took part in the races (rows came from both).
    assert {w.split("/")[0] for _, w, _ in rows} == {"p0", "p1"}
    await _assert_final(s3_server, thread, rows)


async def test_two_processes_free_running_latest_never_goes_back(s3_server: ServerInfo) -> None:
    """Two processes of writers race; a reader polling latest sees seq only grow, always decoded."""
    thread = f"t-{uuid.uuid4().hex}"
    seen: list[int] = []
    done = asyncio.Event()

    async def reader() -> None:
        async with open_store(s3_server.url, **s3_server.options) as store:
            while not done.is_set():
                try:
                    seen.append((await store.latest(thread, RUN)).seq)
                except CheckpointNotFoundError:
                    pass  # before the first commit
                await asyncio.sleep(0.01)

    watcher = asyncio.create_task(reader())
    try:
        rows = await asyncio.to_thread(
            _run_processes, "free", s3_server, thread, processes=2, tasks=3, seqs=12
        )
    finally:
        done.set()
        await watcher
    wins = Counter(seq for seq, _, ok in rows if ok)
    assert all(count <= 1 for count in wins.values()), wins
    assert seen, "the reader never saw a latest record"
    assert seen == sorted(seen), "latest went backwards"
    await _assert_final(s3_server, thread, rows)
