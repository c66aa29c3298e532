"""Group 3, replay idempotency: tool effects through the EffectLedger, on the store under test.

The ledger's exactly-once promise rests on two SPI guarantees -- ``create``
is first-writer-wins and ``commit`` fences by seq -- so a store that breaks
either lets a tool run twice. These checks drive the real ledger and count
executions with a witness the ledger cannot see (a counter in the tool, or a
file the tool appends to from worker processes).
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from checkpoint_stores import (
    EffectConflictError,
    EffectInDoubtError,
    EffectIntegrityError,
    MemoryStore,
)
from checkpoint_stores.conformance.checks import check
from checkpoint_stores.conformance.context import CheckContext
from checkpoint_stores.conformance.processes import run_workers
from checkpoint_stores.effects import EffectLedger, ToolCall, input_hash, output_hash
from checkpoint_stores.keys import effect_key

__all__ = ["ReplayChecks"]


class _CountingTool:
    """A tool that counts its executions and records the idempotency keys it was given."""

    def __init__(self, output: Any = None, delay: float = 0.0) -> None:
        self.calls: list[ToolCall] = []
        self.output = output
        self.delay = delay
        self.started = asyncio.Event()
        self.release: asyncio.Event | None = None

    async def __call__(self, call: ToolCall) -> Any:
        self.calls.append(call)
        self.started.set()
        if self.release is not None:
            await self.release.wait()
        if self.delay:
            await asyncio.sleep(self.delay)
        return self.output if self.output is not None else {"charged": call.args, "n": 1}


class ReplayChecks:
    """Group 3 of the kit (``conformance_replay``). Mixed into ``StoreConformance``."""

    #: Concurrent ledgers racing for one effect.
    effect_racers: int = 8
    #: Worker processes racing for one effect.
    effect_processes: int = 4

    @check("replay.effect_recorded_once")
    async def test_replay_effect_recorded_once(self, ctx: CheckContext) -> None:
        """an executed effect is stored once, under its key, with AFK's input and output hashes"""
        thread, run = ctx.thread(), ctx.run_id()
        tool = _CountingTool(output={"receipt": "r-1", "amount": 12.5})
        ledger = EffectLedger(ctx.store, thread, run)
        args = {"amount": 12.5, "to": "acct-\u00e9"}
        outcome = await ledger.execute(2, "call-1", "charge", args, tool)
        ctx.expect(
            outcome.executed and not outcome.replayed and len(tool.calls) == 1,
            f"first execute: executed={outcome.executed}, replayed={outcome.replayed}, "
            f"tool ran {len(tool.calls)} time(s)",
        )
        keys = await ctx.store.effect_keys(thread, run)
        ctx.expect(
            keys == [effect_key(run, 2, "call-1")],
            f"after one effect the run's effect keys are {keys!r}",
        )
        record = await ledger.lookup(2, "call-1")
        ctx.expect(record is not None, "lookup of the executed effect returned None")
        assert record is not None
        ctx.expect(
            record.status == "done"
            and record.success
            and record.input_hash == input_hash("charge", args)
            and record.output_hash == output_hash(outcome.output)
            and record.output == {"receipt": "r-1", "amount": 12.5},
            f"stored effect record is {record!r:.400}",
        )

    @check("replay.replay_returns_stored_output")
    async def test_replay_replay_returns_stored_output(self, ctx: CheckContext) -> None:
        """a resumed run (new process, reopened store) replays the stored output without
        executing
        """
        thread, run = ctx.thread(), ctx.run_id()
        first = _CountingTool(output={"receipt": "first"})
        outcome = await EffectLedger(ctx.store, thread, run).execute(
            1, "call-7", "charge", {"amount": 3}, first
        )
        # A resumed process: a fresh backend instance and a fresh ledger.
        backend = await ctx.new_backend() if ctx.capabilities.cross_process else ctx.backend
        again = _CountingTool(output={"receipt": "second"})
        ledger = EffectLedger(ctx.store_on(backend), thread, run)
        replay = await ledger.execute(1, "call-7", "charge", {"amount": 3}, again)
        ctx.expect(
            not again.calls and replay.replayed and not replay.executed,
            f"replay executed the tool {len(again.calls)} time(s) "
            f"(replayed={replay.replayed}, executed={replay.executed})",
        )
        ctx.expect(
            replay.output == outcome.output == {"receipt": "first"},
            f"replay returned {replay.output!r}, the recorded output is {outcome.output!r}",
        )
        ctx.expect(
            replay.idempotency_key == outcome.idempotency_key,
            "the idempotency key changed between the execution and its replay",
        )
        ctx.expect(ledger.stats.replayed == 1, f"ledger stats after a replay: {ledger.stats}")

    @check("replay.different_input_conflicts")
    async def test_replay_different_input_conflicts(self, ctx: CheckContext) -> None:
        """replaying a tool call with different input raises EffectConflictError and changes
        nothing
        """
        thread, run = ctx.thread(), ctx.run_id()
        tool = _CountingTool()
        ledger = EffectLedger(ctx.store, thread, run)
        await ledger.execute(4, "call-2", "charge", {"amount": 10}, tool)
        before = await ctx.backend.get(thread, effect_key(run, 4, "call-2"))
        for tool_name, args in (("charge", {"amount": 11}), ("refund", {"amount": 10})):
            try:
                await EffectLedger(ctx.store, thread, run).execute(
                    4, "call-2", tool_name, args, tool
                )
            except EffectConflictError:
                pass
            else:
                ctx.fail(f"execute with different input ({tool_name}, {args}) did not conflict")
        after = await ctx.backend.get(thread, effect_key(run, 4, "call-2"))
        ctx.expect(len(tool.calls) == 1, f"the tool ran {len(tool.calls)} times, expected once")
        ctx.expect(after == before, "a conflicting execute changed the stored effect record")

    @check("replay.concurrent_executors_one_executes")
    async def test_replay_concurrent_executors_one_executes(self, ctx: CheckContext) -> None:
        """of many concurrent executors of one effect (separate ledgers), exactly one executes; all
        get its output
        """
        thread, run = ctx.thread(), ctx.run_id()
        for step in range(3):
            tool = _CountingTool(delay=0.01)
            ledgers = [
                EffectLedger(ctx.store, thread, run, executor_id=f"racer-{i}", wait_timeout=30)
                for i in range(self.effect_racers)
            ]
            outcomes = await asyncio.gather(
                *(
                    ledger.execute(step, "call-1", "charge", {"step": step}, tool)
                    for ledger in ledgers
                ),
                return_exceptions=True,
            )
            errors = [o for o in outcomes if isinstance(o, BaseException)]
            executed = sum(1 for o in outcomes if not isinstance(o, BaseException) and o.executed)
            ctx.expect(
                len(tool.calls) == 1,
                f"step {step}: {self.effect_racers} executors raced and the tool ran "
                f"{len(tool.calls)} times (the effect happened {len(tool.calls)} times)"
                + (f"; {len(errors)} executor(s) then raised {errors[0]!r:.200}" if errors else ""),
            )
            ctx.expect(
                not errors and executed == 1,
                f"step {step}: {executed} outcome(s) say executed; errors: {errors[:2]!r:.300}",
            )
            outputs = {
                json.dumps(o.output, sort_keys=True)
                for o in outcomes
                if not isinstance(o, BaseException)
            }
            ctx.expect(len(outputs) == 1, f"step {step}: executors got different outputs {outputs}")

    @check("replay.concurrent_processes_one_executes", needs=("cross_process",))
    async def test_replay_concurrent_processes_one_executes(self, ctx: CheckContext) -> None:
        """of executors in several OS processes racing for one effect, exactly one executes"""
        thread, run = ctx.thread(), ctx.run_id()
        steps = list(range(5))
        with tempfile.TemporaryDirectory(prefix="csk-witness-") as tmp:
            witness = os.path.join(tmp, "executions.log")
            specs = [
                ctx.worker_spec(
                    "effect_race",
                    {
                        "thread_id": thread,
                        "run_id": run,
                        "writer": w,
                        "steps": steps,
                        "witness": witness,
                        "slot": 0.1,
                    },
                )
                for w in range(self.effect_processes)
            ]
            results = await run_workers(specs)
            text = await asyncio.to_thread(Path(witness).read_text, encoding="utf-8")
            lines = text.split()
        runs = Counter(int(step) for step in lines[0::2])
        problems = [
            f"step {step}: the tool ran {runs.get(step, 0)} time(s) across processes"
            for step in steps
            if runs.get(step, 0) != 1
        ]
        for step in steps:
            outputs = {json.dumps(rows[step][3], sort_keys=True) for rows in results}
            if len(outputs) != 1:
                problems.append(f"step {step}: processes got different outputs {sorted(outputs)}")
        ctx.expect(not problems, lambda: "\n".join(problems))

    @check("replay.intent_without_result_in_doubt")
    async def test_replay_intent_without_result_in_doubt(self, ctx: CheckContext) -> None:
        """an effect whose executor died mid-tool is reported in doubt, not silently re-run or
        skipped
        """
        thread, run = ctx.thread(), ctx.run_id()
        tool = _CountingTool()
        tool.release = asyncio.Event()  # never set: the executor "dies" inside the tool
        crashed = EffectLedger(ctx.store, thread, run, executor_id="crashed")
        task = asyncio.ensure_future(crashed.execute(5, "call-9", "charge", {"n": 1}, tool))
        await asyncio.wait_for(tool.started.wait(), 30)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        record = await crashed.lookup(5, "call-9")
        ctx.expect(
            record is not None and record.status == "intent",
            f"after the executor died mid-tool the record is {record!r:.300}",
        )
        strict = EffectLedger(ctx.store, thread, run, executor_id="resumer", wait_timeout=0.2)
        try:
            await strict.execute(5, "call-9", "charge", {"n": 1}, _CountingTool())
        except EffectInDoubtError:
            pass
        else:
            ctx.fail("an intent without a result was not reported in doubt (policy 'raise')")
        retry = _CountingTool(output={"retried": True})
        lenient = EffectLedger(
            ctx.store, thread, run, executor_id="resumer-2", in_doubt="reexecute", wait_timeout=0.2
        )
        outcome = await lenient.execute(5, "call-9", "charge", {"n": 1}, retry)
        ctx.expect(
            outcome.in_doubt and outcome.executed and len(retry.calls) == 1,
            f"policy 'reexecute': in_doubt={outcome.in_doubt}, executed={outcome.executed}, "
            f"tool ran {len(retry.calls)} time(s)",
        )
        ctx.expect(
            retry.calls[0].idempotency_key == tool.calls[0].idempotency_key,
            "the re-execution got a different idempotency key than the attempt that died",
        )
        replay = await EffectLedger(ctx.store, thread, run).execute(
            5, "call-9", "charge", {"n": 1}, _CountingTool()
        )
        ctx.expect(
            replay.replayed and replay.output == {"retried": True},
            f"after the re-execution a replay returned {replay.output!r}",
        )

    @check("replay.tampered_output_detected")
    async def test_replay_tampered_output_detected(self, ctx: CheckContext) -> None:
        """a stored effect output that no longer matches its hash raises EffectIntegrityError on
        replay
        """
        thread, run = ctx.thread(), ctx.run_id()
        ledger = EffectLedger(ctx.store, thread, run)
        await ledger.execute(3, "call-3", "charge", {"amount": 5}, _CountingTool(output={"ok": 1}))
        key = effect_key(run, 3, "call-3")
        store: MemoryStore = ctx.store

        def tamper(raw: bytes) -> bytes:
            record = store.decode(raw)
            record["output"] = {"ok": 2}
            return json.dumps(record).encode("utf-8")

        await ctx.corrupt(thread, key, tamper)
        tool = _CountingTool()
        for what, read in (
            ("lookup", lambda: ledger.lookup(3, "call-3")),
            (
                "execute (replay)",
                lambda: EffectLedger(ctx.store, thread, run).execute(
                    3, "call-3", "charge", {"amount": 5}, tool
                ),
            ),
        ):
            try:
                value = await read()
            except EffectIntegrityError:
                continue
            except Exception as exc:
                ctx.fail(f"{what} of a tampered effect raised {type(exc).__name__}: {exc}")
            ctx.fail(f"{what} of a tampered effect returned {value!r:.300}")
        ctx.expect(not tool.calls, "a tampered effect was executed again instead of refused")
