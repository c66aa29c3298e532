"""The effect ledger: replay, conflict, races, in-doubt policies, AFK hashes, integrity."""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from checkpoint_stores import (
    AgentCheckpointCorruptionError,
    CheckpointEncodeError,
    EffectConflictError,
    EffectInDoubtError,
    EffectIntegrityError,
    MemoryStore,
    StaleWriterError,
    effect_key,
    open_store,
)
from checkpoint_stores.effects import (
    EffectLedger,
    ToolCall,
    idempotency_key,
    input_hash,
    output_hash,
)

THREAD = "thread/../{x}*%\x00end"  # hostile on purpose: ids are opaque
RUN = "run-1"


@pytest.fixture(params=["memory", "file"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MemoryStore]:
    url = "memory://" if request.param == "memory" else f"file://{tmp_path}/store"
    async with open_store(url) as opened:
        yield opened


class CountingTool:
    """A tool with a visible side effect: it counts its executions per idempotency key."""

    def __init__(self, delay: float = 0.0) -> None:
        self.calls: list[ToolCall] = []
        self.delay = delay
        self.started = asyncio.Event()

    async def __call__(self, call: ToolCall) -> dict[str, Any]:
        self.calls.append(call)
        self.started.set()
        if self.delay:
            await asyncio.sleep(self.delay)
        return {"sum": call.args["a"] + call.args["b"], "key": call.idempotency_key}


def _afk_hash(payload: dict[str, Any]) -> str:
    # The formula written out independently of the library.
    text = json.dumps(payload, ensure_ascii=True, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# -- hashes -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool_name", "args", "expected"),
    [
        (
            "add",
            {"a": 1, "b": 2},
            "7f509013eadd9e0d8c1901017250fd78228dbb07182a916948799ad1f2c11080",
        ),
        (
            "send_email",
            {"to": "ana@example.com", "body": "olá ✓", "cc": []},
            _afk_hash(
                {
                    "tool_name": "send_email",
                    "args": {"to": "ana@example.com", "body": "olá ✓", "cc": []},
                }
            ),
        ),
    ],
)
def test_input_hash_matches_afk_formula(tool_name: str, args: Any, expected: str) -> None:
    assert input_hash(tool_name, args) == expected
    assert input_hash(tool_name, args) == _afk_hash({"tool_name": tool_name, "args": args})


def test_hash_vectors_are_stable() -> None:
    # Pinned values: if these change, AFK-written effects stop replaying.
    assert output_hash(3) == "b14b12a2dc67cda7689f4c289cb4ad7db3a41b3146a88324e1afc42c22bf556d"
    assert output_hash({"b": 1, "a": [1, "x"]}) == output_hash({"a": [1, "x"], "b": 1})
    assert output_hash(None) == _afk_hash({"output": None})
    # default=str: values JSON cannot hold hash through str(), as in AFK.
    when = datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.timezone.utc)
    assert output_hash({"at": when}) == _afk_hash({"output": {"at": str(when)}})
    assert input_hash("t", {"x": "é"}) != input_hash("t", {"x": "e"})


def test_idempotency_key_is_stable_and_distinct() -> None:
    key = idempotency_key("t", "r", 1, "c")
    assert key == idempotency_key("t", "r", 1, "c")
    others = {
        idempotency_key("t", "r", 2, "c"),
        idempotency_key("t", "r", 1, "d"),
        idempotency_key("t", "r2", 1, "c"),
        idempotency_key("t2", "r", 1, "c"),
        # Separator games cannot collide: the ids are JSON-encoded, not joined.
        idempotency_key("t:r", "1", 1, "c"),
    }
    assert key not in others
    assert len(others) == 5
    assert THREAD not in idempotency_key(THREAD, "r", 1, "c")


# -- execute and replay ---------------------------------------------------------------


async def test_execute_then_replay_in_a_new_ledger(store: MemoryStore) -> None:
    tool = CountingTool()
    first = EffectLedger(store, THREAD, RUN)
    outcome = await first.execute(0, "call-1", "add", {"a": 1, "b": 2}, tool)
    assert outcome.executed
    assert not outcome.replayed
    assert not outcome.in_doubt
    assert outcome.output == {"sum": 3, "key": outcome.idempotency_key}
    assert first.stats.as_dict() == {"executed": 1, "replayed": 0, "in_doubt": 0}

    resumed = EffectLedger(store, THREAD, RUN)  # another executor, e.g. after a crash
    again = await resumed.execute(0, "call-1", "add", {"a": 1, "b": 2}, tool)
    assert again.replayed
    assert not again.executed
    assert again.output == outcome.output
    assert len(tool.calls) == 1
    assert resumed.stats.as_dict() == {"executed": 0, "replayed": 1, "in_doubt": 0}

    record = await resumed.lookup(0, "call-1")
    assert record is not None
    assert record.status == "done"
    assert record.success
    assert record.input_hash == input_hash("add", {"a": 1, "b": 2})
    assert record.output_hash == output_hash(outcome.output)
    assert record.idempotency_key == idempotency_key(THREAD, RUN, 0, "call-1")
    assert await resumed.lookup(0, "call-2") is None


async def test_tool_gets_stable_idempotency_key(store: MemoryStore) -> None:
    tool = CountingTool()
    ledger = EffectLedger(store, THREAD, RUN)
    await ledger.execute(3, "c", "add", {"a": 1, "b": 1}, tool)
    assert tool.calls[0].idempotency_key == idempotency_key(THREAD, RUN, 3, "c")
    assert (tool.calls[0].step, tool.calls[0].tool_call_id, tool.calls[0].attempt) == (3, "c", 1)


async def test_afk_written_effect_replays(store: MemoryStore) -> None:
    # AFK's EffectJournal shape, written with a plain put (no status, no seq).
    args = {"a": 2, "b": 5}
    output = {"sum": 7, "receipt": "afk-1"}
    await store.put_state(
        THREAD,
        effect_key(RUN, 4, "tc-9"),
        {
            "input_hash": _afk_hash({"tool_name": "add", "args": args}),
            "output_hash": _afk_hash({"output": output}),
            "output": output,
            "success": True,
        },
    )
    tool = CountingTool()
    ledger = EffectLedger(store, THREAD, RUN)
    outcome = await ledger.execute(4, "tc-9", "add", args, tool)
    assert outcome.replayed
    assert outcome.output == output
    assert tool.calls == []


async def test_conflicting_input_raises_and_does_not_execute(store: MemoryStore) -> None:
    tool = CountingTool()
    ledger = EffectLedger(store, THREAD, RUN)
    await ledger.execute(0, "call-1", "add", {"a": 1, "b": 2}, tool)
    with pytest.raises(EffectConflictError, match="different input"):
        await EffectLedger(store, THREAD, RUN).execute(0, "call-1", "add", {"a": 1, "b": 3}, tool)
    with pytest.raises(EffectConflictError):
        await EffectLedger(store, THREAD, RUN).execute(0, "call-1", "sub", {"a": 1, "b": 2}, tool)
    assert len(tool.calls) == 1


async def test_tampered_output_fails_integrity(store: MemoryStore) -> None:
    tool = CountingTool()
    await EffectLedger(store, THREAD, RUN).execute(0, "c", "add", {"a": 1, "b": 2}, tool)
    key = effect_key(RUN, 0, "c")
    record = await store.get_state(THREAD, key)
    record["output"]["sum"] = 4
    await store.put_state(THREAD, key, record)
    ledger = EffectLedger(store, THREAD, RUN)
    with pytest.raises(EffectIntegrityError, match="altered or damaged"):
        await ledger.execute(0, "c", "add", {"a": 1, "b": 2}, tool)
    with pytest.raises(EffectIntegrityError):
        await ledger.lookup(0, "c")
    assert len(tool.calls) == 1
    assert ledger.stats.replayed == 0


@pytest.mark.parametrize(
    "stored",
    [
        {"output": 1, "success": True},  # no input_hash
        {"input_hash": 5, "success": True},  # wrong type
        ["not", "an", "object"],
    ],
)
async def test_malformed_record_is_corruption(stored: Any) -> None:
    async with open_store("memory://") as store:
        await store.put_state(THREAD, effect_key(RUN, 0, "c"), stored)
        tool = CountingTool()
        with pytest.raises(AgentCheckpointCorruptionError, match="effect record"):
            await EffectLedger(store, THREAD, RUN).execute(0, "c", "add", {"a": 1, "b": 1}, tool)
        assert tool.calls == []


async def test_undecodable_record_is_corruption() -> None:
    async with open_store("memory://") as store:
        await store.backend.put(THREAD, effect_key(RUN, 0, "c"), b"\xffCP\x01garbage")
        with pytest.raises(AgentCheckpointCorruptionError):
            await EffectLedger(store, THREAD, RUN).lookup(0, "c")


# -- races ----------------------------------------------------------------------------


async def test_race_between_executors_runs_the_tool_once(store: MemoryStore) -> None:
    tool = CountingTool(delay=0.05)
    ledgers = [EffectLedger(store, THREAD, RUN, executor_id=f"ex-{i}") for i in range(8)]
    outcomes = await asyncio.gather(
        *(ledger.execute(1, "c", "add", {"a": 2, "b": 2}, tool) for ledger in ledgers)
    )
    assert len(tool.calls) == 1
    assert sum(o.executed for o in outcomes) == 1
    assert sum(o.replayed for o in outcomes) == 7
    assert all(o.output == outcomes[0].output for o in outcomes)
    assert not any(o.in_doubt for o in outcomes)


async def test_race_across_separate_store_objects_on_files(tmp_path: Path) -> None:
    # Separate backend objects share nothing in memory: only the files decide.
    url = f"file://{tmp_path}/store"
    stores = [open_store(url) for _ in range(4)]
    for s in stores:
        await s.setup()
    tool = CountingTool(delay=0.02)
    outcomes = await asyncio.gather(
        *(
            EffectLedger(s, THREAD, RUN).execute(0, "c", "add", {"a": 1, "b": 1}, tool)
            for s in stores
        )
    )
    assert len(tool.calls) == 1
    assert sum(o.executed for o in outcomes) == 1
    for s in stores:
        await s.close()


async def test_same_ledger_concurrent_calls_run_once(store: MemoryStore) -> None:
    tool = CountingTool(delay=0.02)
    ledger = EffectLedger(store, THREAD, RUN)
    outcomes = await asyncio.gather(
        *(ledger.execute(0, "c", "add", {"a": 1, "b": 1}, tool) for _ in range(5))
    )
    assert len(tool.calls) == 1
    assert ledger.stats.executed == 1
    assert ledger.stats.replayed == 4
    assert len({json.dumps(o.output) for o in outcomes}) == 1


async def test_waiter_replays_a_live_peers_result(store: MemoryStore) -> None:
    tool = CountingTool(delay=0.1)
    slow = EffectLedger(store, THREAD, RUN, executor_id="slow", epoch=1)
    task = asyncio.create_task(slow.execute(0, "c", "add", {"a": 1, "b": 2}, tool))
    await tool.started.wait()  # the peer recorded its intent and its tool is running
    waiter = EffectLedger(store, THREAD, RUN, executor_id="waiter", epoch=1)
    outcome = await waiter.execute(0, "c", "add", {"a": 1, "b": 2}, tool)
    assert outcome.replayed
    assert not outcome.in_doubt
    assert (await task).executed
    assert len(tool.calls) == 1
    assert waiter.stats.in_doubt == 0


# -- in doubt -------------------------------------------------------------------------


async def _crash_mid_tool(store: MemoryStore, executor: str, epoch: int | None) -> CountingTool:
    """Leave an intent without a result: the executor dies while its tool runs."""
    started = asyncio.Event()
    tool = CountingTool()

    async def hanging(call: ToolCall) -> Any:
        tool.calls.append(call)
        started.set()
        await asyncio.sleep(3600)

    ledger = EffectLedger(store, THREAD, RUN, executor_id=executor, epoch=epoch)
    task = asyncio.create_task(ledger.execute(2, "c", "charge", {"a": 5, "b": 0}, hanging))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    record = await ledger.lookup(2, "c")
    assert record is not None
    assert record.status == "intent"
    return tool


async def test_in_doubt_raise_policy(store: MemoryStore) -> None:
    crashed = await _crash_mid_tool(store, "old", epoch=0)
    tool = CountingTool()
    ledger = EffectLedger(store, THREAD, RUN, epoch=1, in_doubt="raise")
    with pytest.raises(EffectInDoubtError) as info:
        await ledger.execute(2, "c", "charge", {"a": 5, "b": 0}, tool)
    assert crashed.calls[0].idempotency_key in str(info.value)
    assert tool.calls == []
    assert ledger.stats.in_doubt == 1
    record = await ledger.lookup(2, "c")
    assert record is not None
    assert record.status == "intent"


async def test_in_doubt_reexecute_policy_and_zombie_result_is_fenced(store: MemoryStore) -> None:
    crashed = await _crash_mid_tool(store, "old", epoch=0)
    tool = CountingTool()
    ledger = EffectLedger(store, THREAD, RUN, epoch=1, in_doubt={"charge": "reexecute"})
    outcome = await ledger.execute(2, "c", "charge", {"a": 5, "b": 0}, tool)
    assert outcome.in_doubt
    assert outcome.executed
    assert outcome.attempt == 2
    assert tool.calls[0].attempt == 2
    assert tool.calls[0].idempotency_key == crashed.calls[0].idempotency_key
    assert ledger.stats.as_dict() == {"executed": 1, "replayed": 0, "in_doubt": 1}

    # The old attempt finishing late cannot overwrite attempt 2's result.
    zombie = EffectLedger(store, THREAD, RUN, executor_id="old", epoch=0)
    with pytest.raises(StaleWriterError, match="re-claimed"):
        await zombie._record(
            store.backend,
            effect_key(RUN, 2, "c"),
            input_hash("charge", {"a": 5, "b": 0}),
            crashed.calls[0],
            1,
            0,
            {"sum": 999},
            True,
        )
    replay = await EffectLedger(store, THREAD, RUN).execute(
        2, "c", "charge", {"a": 5, "b": 0}, tool
    )
    assert replay.replayed
    assert replay.output == outcome.output
    assert len(tool.calls) == 1


async def test_per_tool_policy_default_is_raise(store: MemoryStore) -> None:
    await _crash_mid_tool(store, "old", epoch=0)
    ledger = EffectLedger(store, THREAD, RUN, epoch=1, in_doubt={"other_tool": "reexecute"})
    assert ledger.policy_for("charge") == "raise"
    with pytest.raises(EffectInDoubtError):
        await ledger.execute(2, "c", "charge", {"a": 5, "b": 0}, CountingTool())
    star = EffectLedger(store, THREAD, RUN, epoch=1, in_doubt={"*": "reexecute"})
    assert star.policy_for("charge") == "reexecute"


def test_unknown_policy_is_refused() -> None:
    store = open_store("memory://")
    with pytest.raises(ValueError, match="policy"):
        EffectLedger(store, THREAD, RUN, in_doubt="retry")  # type: ignore[arg-type]


async def test_same_epoch_intent_is_waited_for_then_in_doubt(store: MemoryStore) -> None:
    # No epoch tells the intent is from a dead owner: wait (bounded), then apply the policy.
    await _crash_mid_tool(store, "peer", epoch=None)
    ledger = EffectLedger(store, THREAD, RUN, wait_timeout=0.2)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(EffectInDoubtError):
        await ledger.execute(2, "c", "charge", {"a": 5, "b": 0}, CountingTool())
    assert loop.time() - started >= 0.2
    assert ledger.stats.in_doubt == 1


async def test_intent_without_executor_is_in_doubt_at_once(store: MemoryStore) -> None:
    await store.put_state(
        THREAD,
        effect_key(RUN, 0, "c"),
        {"input_hash": input_hash("add", {"a": 1, "b": 1}), "status": "intent"},
    )
    ledger = EffectLedger(store, THREAD, RUN, wait_timeout=60)
    with pytest.raises(EffectInDoubtError):
        await asyncio.wait_for(
            ledger.execute(0, "c", "add", {"a": 1, "b": 1}, CountingTool()), timeout=5
        )


async def test_concurrent_reexecutors_of_an_in_doubt_call_run_it_once(
    store: MemoryStore,
) -> None:
    await _crash_mid_tool(store, "old", epoch=0)
    tool = CountingTool(delay=0.03)
    ledgers = [
        EffectLedger(store, THREAD, RUN, executor_id=f"new-{i}", epoch=1, in_doubt="reexecute")
        for i in range(5)
    ]
    outcomes = await asyncio.gather(
        *(ledger.execute(2, "c", "charge", {"a": 5, "b": 0}, tool) for ledger in ledgers)
    )
    assert len(tool.calls) == 1
    assert sum(o.executed for o in outcomes) == 1
    assert all(o.output == outcomes[0].output for o in outcomes)


# -- failures -------------------------------------------------------------------------


async def test_tool_failure_is_recorded_and_retried_next_time(store: MemoryStore) -> None:
    attempts: list[int] = []

    async def flaky(call: ToolCall) -> Any:
        attempts.append(call.attempt)
        if call.attempt == 1:
            raise RuntimeError("gateway said 503")
        return "ok"

    ledger = EffectLedger(store, THREAD, RUN)
    with pytest.raises(RuntimeError, match="503"):
        await ledger.execute(0, "c", "pay", {"x": 1}, flaky)
    record = await ledger.lookup(0, "c")
    assert record is not None
    assert record.status == "done"
    assert not record.success
    assert record.output == {"error": "RuntimeError", "message": "gateway said 503"}

    outcome = await EffectLedger(store, THREAD, RUN).execute(0, "c", "pay", {"x": 1}, flaky)
    assert outcome.executed
    assert outcome.output == "ok"
    assert outcome.attempt == 2
    assert attempts == [1, 2]
    again = await EffectLedger(store, THREAD, RUN).execute(0, "c", "pay", {"x": 1}, flaky)
    assert again.replayed
    assert attempts == [1, 2]


async def test_unencodable_output_leaves_the_call_in_doubt(store: MemoryStore) -> None:
    async def returns_bytes(call: ToolCall) -> Any:
        return b"\x00raw"

    ledger = EffectLedger(store, THREAD, RUN, epoch=0)
    with pytest.raises(CheckpointEncodeError):
        await ledger.execute(0, "c", "blob", {}, returns_bytes)
    # The effect happened but was not recorded: the honest state is "in doubt".
    with pytest.raises(EffectInDoubtError):
        await EffectLedger(store, THREAD, RUN, epoch=1).execute(0, "c", "blob", {}, returns_bytes)


async def test_bad_ids_are_refused(store: MemoryStore) -> None:
    ledger = EffectLedger(store, THREAD, RUN)
    with pytest.raises(ValueError, match="tool_call_id"):
        await ledger.execute(0, "a:b", "add", {"a": 1, "b": 1}, CountingTool())
    with pytest.raises(ValueError, match="run_id"):
        EffectLedger(store, THREAD, "run:1")
