"""The MemoryStore facade on memory:// and file://: checkpoint calls, AFK's state calls, limits."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from checkpoint_stores import (
    AgentCheckpointCorruptionError,
    Capabilities,
    Checkpoint,
    CheckpointNotFoundError,
    Codec,
    InvalidIdentifierError,
    MemoryStore,
    Phase,
    StaleWriterError,
    ValueTooLargeError,
    checkpoint_key,
    checkpoint_latest_key,
    effect_key,
    open_store,
)
from checkpoint_stores.backends.memory import MemoryBackend

T, R = "thread-1", "run-1"


def cp(seq: int, phase: Phase = Phase.PRE_LLM, **fields: Any) -> Checkpoint:
    values: dict[str, Any] = {
        "thread_id": T,
        "run_id": R,
        "seq": seq,
        "step": seq,
        "phase": phase,
        "payload": {"seq": seq},
    }
    values.update(fields)
    return Checkpoint(**values)


@pytest.fixture(params=["memory", "file"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MemoryStore]:
    url = "memory://" if request.param == "memory" else f"file://{tmp_path}/store"
    async with open_store(url) as opened:
        yield opened


class LimitedBackend(MemoryBackend):
    """memory:// with small declared limits, to test the facade's checks."""

    capabilities = Capabilities(
        atomic_commit=True, fenced_commit=True, max_value_bytes=300, max_key_bytes=64
    )


# -- checkpoint calls ----------------------------------------------------------------------------


async def test_append_then_latest_history_and_runtime(store: MemoryStore) -> None:
    chain = [
        cp(1, Phase.RUN_STARTED, step=0, payload={"agent_name": "analyst"}),
        cp(2, Phase.STEP_STARTED, step=1),
        cp(3, Phase.RUNTIME_STATE, step=1, payload={"messages": [{"role": "user"}], "step": 1}),
        cp(4, Phase.PRE_LLM, step=1),
        cp(5, Phase.RUNTIME_STATE, step=2, payload={"messages": [], "step": 2}),
        cp(6, Phase.POST_LLM, step=2),
    ]
    for checkpoint in chain:
        await store.append(checkpoint)
        assert await store.latest(T, R) == checkpoint
    assert await store.history(T, R) == chain
    assert await store.runtime_snapshot(T, R) == chain[4]
    assert await store.get_checkpoint(T, R, 1, Phase.PRE_LLM) == chain[3]
    assert await store.get_checkpoint(T, R, 9, "pre_llm") is None
    assert await store.get_checkpoints(T, R, [(1, "step_started"), (7, Phase.PRE_LLM)]) == [
        chain[1],
        None,
    ]
    assert await store.list_runs(T) == [R]


async def test_latest_of_unknown_run_is_not_found(store: MemoryStore) -> None:
    with pytest.raises(CheckpointNotFoundError) as info:
        await store.latest(T, "missing-run")
    assert "'missing-run'" in str(info.value)
    assert "checkpoint-stores inspect" in str(info.value)  # says how to look
    assert await store.runtime_snapshot(T, "missing-run") is None
    assert await store.history(T, "missing-run") == []


async def test_stale_append_raises_and_changes_nothing(store: MemoryStore) -> None:
    await store.append(cp(5))
    before = await store.list_state(T)
    for stale in (cp(4, step=40), cp(5, step=50), cp(3, Phase.RUNTIME_STATE, step=30)):
        with pytest.raises(StaleWriterError) as info:
            await store.append(stale)
        assert f"seq {stale.seq}" in str(info.value)
        assert "latest is at seq 5" in str(info.value)
    assert await store.list_state(T) == before  # no record, no runtime copy, same head
    assert (await store.latest(T, R)).seq == 5
    assert await store.runtime_snapshot(T, R) is None


async def test_newer_epoch_fences_out_the_older_one(store: MemoryStore) -> None:
    await store.append(cp(7))
    resumed = (1 << 32) | 1
    await store.append(cp(resumed, step=8))
    with pytest.raises(StaleWriterError, match=r"\(epoch 0\).*\(epoch 1\)"):
        await store.append(cp(8, step=9))  # the zombie of epoch 0 carries on
    assert (await store.latest(T, R)).seq == resumed


async def test_retry_of_a_landed_append_is_success(store: MemoryStore) -> None:
    checkpoint = cp(3)
    await store.append(checkpoint)
    await store.append(checkpoint)  # e.g. a timeout after the server applied it
    assert await store.commit_checkpoint(checkpoint) is True
    # The same seq with other content is a different writer, not a retry.
    with pytest.raises(StaleWriterError):
        await store.append(cp(3, payload={"seq": 3, "other": True}))
    assert (await store.latest(T, R)).payload == {"seq": 3}


async def test_list_runs_and_delete_run_are_prefix_exact(store: MemoryStore) -> None:
    for run in ["r1", "r10", "r1x", "r2"]:
        await store.append(cp(1, run_id=run))
        await store.append(cp(2, Phase.RUNTIME_STATE, run_id=run))
        await store.put_state(T, effect_key(run, 1, "call-1"), {"output": run})
    await store.put_state(T, "checkpoint:r3:0:pre_llm", {"orphan": True})  # no latest: no run
    assert await store.list_runs(T) == ["r1", "r10", "r1x", "r2"]
    assert await store.delete_run(T, "r1") == 5  # two records, runtime, latest, one effect
    assert await store.list_runs(T) == ["r10", "r1x", "r2"]
    assert await store.effect_keys(T, "r1") == []
    assert await store.effect_keys(T, "r10") == [effect_key("r10", 1, "call-1")]
    for run in ["r10", "r1x", "r2"]:
        assert (await store.latest(T, run)).seq == 2
        assert len(await store.history(T, run)) == 2
    assert await store.delete_run(T, "r1") == 0


async def test_delete_thread_leaves_other_threads(store: MemoryStore) -> None:
    await store.append(cp(1))
    await store.append(cp(1, thread_id="thread-10"))
    await store.put_state(T, "note", 1)
    assert await store.delete_thread(T) == 3  # record, latest, note
    with pytest.raises(CheckpointNotFoundError):
        await store.latest(T, R)
    assert await store.list_state(T) == {}
    assert (await store.latest("thread-10", R)).seq == 1
    assert await store.delete_thread(T) == 0


async def test_runtime_snapshot_is_the_newest_runtime_record(store: MemoryStore) -> None:
    await store.append(cp(1, Phase.RUNTIME_STATE, payload={"step": 1}))
    await store.append(cp(2, Phase.POST_LLM))
    await store.append(cp(3, Phase.RUNTIME_STATE, payload={"step": 3}))
    await store.append(cp(4, Phase.PRE_TOOL_BATCH))
    snapshot = await store.runtime_snapshot(T, R)
    assert snapshot is not None
    assert snapshot.payload == {"step": 3}
    assert (await store.latest(T, R)).phase is Phase.PRE_TOOL_BATCH


async def test_a_record_of_another_run_under_our_key_is_corruption(store: MemoryStore) -> None:
    await store.append(cp(1, run_id="other"))
    moved = await store.backend.get(T, checkpoint_latest_key("other"))
    assert moved is not None
    await store.backend.put(T, checkpoint_latest_key(R), moved)
    with pytest.raises(AgentCheckpointCorruptionError, match="belongs to run 'other'"):
        await store.latest(T, R)


async def test_codec_settings_apply(tmp_path: Path) -> None:
    codec = Codec(compress_threshold=64)
    async with open_store(f"file://{tmp_path}/s", codec=codec) as store:
        big = cp(1, payload={"text": "abc" * 1000})
        await store.append(big)
        raw = await store.backend.get(T, checkpoint_latest_key(R))
        assert raw is not None
        assert len(raw) < 600  # compressed
        assert await store.latest(T, R) == big


# -- AFK compatibility ---------------------------------------------------------------------------


async def test_afk_state_api_round_trip(store: MemoryStore) -> None:
    values: dict[str, Any] = {
        "b": {"nested": [1, 2.5, None, "é"]},
        "a": "text",
        "a:b": [],
        "c": 0,
        "n": None,
    }
    for key, value in values.items():
        await store.put_state(T, key, value)
    assert await store.get_state(T, "a") == "text"
    assert await store.get_state(T, "missing") is None
    listed = await store.list_state(T)
    assert listed == values
    assert list(listed) == sorted(values)
    assert await store.list_state(T, prefix="a") == {"a": "text", "a:b": []}
    await store.put_state(T, "a", "replaced")
    assert await store.get_state(T, "a") == "replaced"
    assert await store.delete_state(T, "a") is True
    assert await store.delete_state(T, "a") is False
    assert await store.get_state(T, "a") is None
    assert await store.get_state("other-thread", "b") is None


async def test_afk_reads_our_latest_through_get_state(store: MemoryStore) -> None:
    await store.append(cp(2, Phase.POST_LLM, payload={"model": "m"}))
    record = await store.get_state(T, checkpoint_latest_key(R))
    # AFK's runner requires these fields on what get_state returns.
    assert {
        "run_id": R,
        "thread_id": T,
        "phase": "post_llm",
        "payload": {"model": "m"},
    }.items() <= (record.items())


async def test_afk_written_v1_records_read_back(store: MemoryStore) -> None:
    def afk(step: int, phase: str, payload: dict[str, Any]) -> bytes:
        # AFK's stores keep plain JSON, without a thread_id or seq, written with put.
        record = {
            "schema_version": "v1",
            "run_id": R,
            "step": step,
            "phase": phase,
            "payload": payload,
            "timestamp_ms": 1_700_000_000_000 + step,
        }
        return orjson.dumps(record)

    backend = store.backend
    await backend.put(T, checkpoint_key(R, 0, "run_started"), afk(0, "run_started", {}))
    await backend.put(T, checkpoint_key(R, 1, "post_llm"), afk(1, "post_llm", {"model": "m"}))
    await backend.put(T, checkpoint_latest_key(R), afk(1, "post_llm", {"model": "m"}))
    latest = await store.latest(T, R)
    assert (latest.thread_id, latest.step, latest.phase, latest.seq) == (T, 1, Phase.POST_LLM, 0)
    assert [c.phase for c in await store.history(T, R)] == [Phase.RUN_STARTED, Phase.POST_LLM]
    assert await store.list_runs(T) == [R]
    # A head written by plain put has no seq: the first seq-carrying append moves it.
    await store.append(cp(1, Phase.PRE_TOOL_BATCH, step=2))
    assert (await store.latest(T, R)).phase is Phase.PRE_TOOL_BATCH


# -- limits --------------------------------------------------------------------------------------


async def test_value_too_large_is_refused_before_writing() -> None:
    store = MemoryStore(LimitedBackend())
    with pytest.raises(ValueTooLargeError) as info:
        await store.append(cp(1, payload={"blob": "x" * 400}))
    assert "at most 300" in str(info.value)
    assert "Nothing was written" in str(info.value)
    with pytest.raises(CheckpointNotFoundError):
        await store.latest(T, R)
    with pytest.raises(ValueTooLargeError):
        await store.put_state(T, "k", "x" * 400)
    assert await store.get_state(T, "k") is None
    await store.append(cp(1))  # a small one fits
    assert (await store.latest(T, R)).seq == 1


async def test_ids_over_the_backend_key_limit_are_refused() -> None:
    store = MemoryStore(LimitedBackend())
    long_thread = "t" * 65
    calls = [
        store.append(cp(1, thread_id=long_thread)),
        store.latest(long_thread, R),
        store.history(long_thread, R),
        store.runtime_snapshot(long_thread, R),
        store.get_state(long_thread, "k"),
        store.put_state(long_thread, "k", 1),
        store.list_state(long_thread),
        store.delete_state(long_thread, "k"),
        store.delete_run(long_thread, R),
        store.delete_thread(long_thread),
        store.put_state(T, "k" * 65, 1),
        store.get_state(T, "k" * 65),
    ]
    for call in calls:
        with pytest.raises(InvalidIdentifierError, match=r"65 bytes .* at most 64"):
            await call
    assert await store.backend.get(long_thread, checkpoint_latest_key(R)) is None
    await store.put_state("t" * 64, "k" * 64, 1)  # exactly the limit is fine
    assert await store.get_state("t" * 64, "k" * 64) == 1


async def test_run_ids_whose_keys_exceed_the_backend_limit_are_refused() -> None:
    store = MemoryStore(LimitedBackend())
    run = "r" * 50  # fine as a run id, but "checkpoint:<run>:latest" is 68 bytes
    with pytest.raises(InvalidIdentifierError, match="at most 64"):
        await store.append(cp(1, run_id=run))
    with pytest.raises(InvalidIdentifierError, match="at most 64"):
        await store.latest(T, run)
    assert [k async for k, _ in store.backend.list(T)] == []


@pytest.mark.parametrize("bad_run", ["a:b", "", "x\x00"])
async def test_bad_run_ids_are_refused(store: MemoryStore, bad_run: str) -> None:
    with pytest.raises(InvalidIdentifierError):
        await store.latest(T, bad_run)
    with pytest.raises((InvalidIdentifierError, ValueError)):
        await store.append(cp(1, run_id=bad_run))


# -- lifecycle -----------------------------------------------------------------------------------


async def test_setup_is_lazy_and_idempotent(tmp_path: Path) -> None:
    root = tmp_path / "lazy"
    store = open_store(f"file://{root}")
    assert not root.exists()  # nothing happens before the first call
    await store.put_state(T, "k", 1)
    assert root.is_dir()
    await store.setup()
    await store.setup()
    await store.close()
    assert await store.get_state(T, "k") == 1  # usable again: sets itself up


def test_repr_names_the_store(tmp_path: Path) -> None:
    assert repr(open_store(f"file://{tmp_path}")) == f"<MemoryStore file://{tmp_path}>"
    assert repr(MemoryStore(MemoryBackend())) == "<MemoryStore MemoryBackend>"


class LeakyRaceBackend(MemoryBackend):
    """memory:// behaving like a backend without fenced_commit (S3) that loses a race.

    Its commit stores the writes, then finds the head taken and returns False: what
    a fenced-out writer's commit does on S3 when another writer moves latest between
    its records and its conditional head write.
    """

    capabilities = Capabilities(atomic_commit=False, fenced_commit=False)
    lose_races = False

    async def commit(self, thread_id, writes, head_key, head_value, seq):  # type: ignore[no-untyped-def]
        if not self.lose_races:
            return await super().commit(thread_id, writes, head_key, head_value, seq)
        for key, value in writes:
            await self.put(thread_id, key, value)
        return False


async def test_a_fenced_out_writer_never_replaces_the_runtime_snapshot() -> None:
    backend = LeakyRaceBackend()
    store = MemoryStore(backend)
    await store.append(cp(1, Phase.RUNTIME_STATE, payload={"step": 1, "messages": []}))
    runtime_before = await backend.get(T, "checkpoint:run-1:runtime")
    assert runtime_before is not None

    backend.lose_races = True
    with pytest.raises(StaleWriterError):
        await store.append(cp(2, Phase.RUNTIME_STATE, payload={"step": 2, "messages": []}))
    # Its step record leaked (that is what "not fenced" means), the runtime key did not.
    assert await backend.get(T, checkpoint_key(R, 2, "runtime_state")) is not None
    assert await backend.get(T, "checkpoint:run-1:runtime") == runtime_before
    snapshot = await store.runtime_snapshot(T, R)
    assert snapshot is not None
    assert snapshot.seq == 1

    backend.lose_races = False
    await store.append(cp(3, Phase.RUNTIME_STATE, payload={"step": 3, "messages": []}))
    snapshot = await store.runtime_snapshot(T, R)
    assert snapshot is not None
    assert snapshot.seq == 3


async def test_commit_checkpoints_batches_one_run(store: MemoryStore) -> None:
    batch = [
        (cp(1, Phase.STEP_STARTED), None),
        (cp(2, Phase.RUNTIME_STATE, payload={"step": 2, "messages": []}), None),
        (cp(3, Phase.PRE_TOOL_BATCH), None),
    ]
    assert await store.commit_checkpoints(batch)
    assert (await store.latest(T, R)).seq == 3
    snapshot = await store.runtime_snapshot(T, R)
    assert snapshot is not None
    assert snapshot.seq == 2
    assert [c.seq for c in await store.history(T, R)] == [1, 2, 3]
    assert not await store.commit_checkpoints([(cp(3, Phase.POST_TOOL_BATCH), None)])
    with pytest.raises(ValueError, match="one run"):
        await store.commit_checkpoints([(cp(4), None), (cp(5, run_id="other"), None)])
