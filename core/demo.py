"""A scripted agent that survives ``kill -9``: the worked example of writer + resume + ledger.

``checkpoint-stores demo`` runs :func:`run_agent` in a child process, kills it
with SIGKILL mid-run, and runs it again: the second process claims the run,
loads its resume point and carries on. Read :func:`run_agent` as the template
of a runner:

1. ``claim_run`` (or ``start_run`` for a new run), then ``load_resume_point``:
   a finished run returns its stored result; otherwise continue from the
   runtime snapshot, reusing a pending LLM response instead of calling again.
2. Write every phase boundary through a :class:`CheckpointWriter` (write-behind)
   with seqs from the run cursor, and ``flush()`` before acting on an LLM
   response, so a crash never forgets a response whose tool calls ran.
3. Run every side-effecting tool through the :class:`EffectLedger`: a recorded
   effect is replayed, never executed twice; a call interrupted mid-way is
   re-executed with the same idempotency key, which the (outside) service
   uses to drop the duplicate.

Nothing here touches the network: the "LLM" plans tool calls from a seeded
RNG, and the tools' "outside world" is a JSON-lines file in a work directory.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from checkpoint_stores.effects import EffectLedger, ToolCall
from checkpoint_stores.errors import CheckpointNotFoundError
from checkpoint_stores.resume import claim_run, load_resume_point, start_run
from checkpoint_stores.schema import LLMResponseSnapshot, Phase, RuntimeSnapshot
from checkpoint_stores.store import MemoryStore, open_store
from checkpoint_stores.writer import CheckpointWriter

__all__ = [
    "KILL_POINTS",
    "DemoConfig",
    "OutsideWorld",
    "plan_step",
    "run_agent",
]

# Where a demo run can be stopped: every phase boundary it writes, plus
# "tool_effect" (inside a tool, after its outside effect, before the result is recorded).
KILL_POINTS: Final = (
    "run_started",
    "step_started",
    "pre_llm",
    "post_llm",
    "runtime_state",
    "pre_tool_batch",
    "tool_effect",
    "post_tool_batch",
    "run_terminal",
)
EVENT_PREFIX: Final = "@demo "

Emit = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True)
class DemoConfig:
    """One demo run: where it is stored, what it does, and where to freeze for the kill.

    ``pause_at`` (``"phase@step"``) makes the process stop dead at that point
    (the event loop blocks, so not even the writer moves) until it is killed.
    """

    store_url: str
    workdir: str
    store_options: dict[str, Any] = field(default_factory=dict)  # JSON: sent to the child
    thread_id: str = "demo"
    run_id: str = "demo-run"
    steps: int = 4
    seed: int = 7
    tool_delay: float = 0.002
    pause_at: str | None = None


class OutsideWorld:
    """What the tools change: a payments/outbox log that honours idempotency keys.

    Like a payment API with an ``Idempotency-Key`` header: a request whose key
    was seen before is acknowledged without being applied again. Every request
    is also logged (``invocations.jsonl``) so the demo can prove what ran.
    """

    def __init__(self, workdir: str | Path) -> None:
        self.root = Path(workdir)
        self.root.mkdir(parents=True, exist_ok=True)
        self.effects = self.root / "outside.jsonl"
        self.invocations = self.root / "invocations.jsonl"
        self.llm_calls = self.root / "llm_calls.jsonl"

    @staticmethod
    def _append(path: Path, entry: dict[str, Any]) -> None:
        # One write(2) of one line with O_APPEND: a kill never leaves half a line.
        line = (json.dumps(entry, sort_keys=True) + "\n").encode("utf-8")
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    @staticmethod
    def read(path: Path) -> list[dict[str, Any]]:
        """Entries of one of the logs (empty if it does not exist yet)."""
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line]

    def apply(self, call: ToolCall) -> bool:
        """Apply the call's effect unless its idempotency key was seen; return whether applied."""
        self._append(
            self.invocations,
            {"key": call.idempotency_key, "attempt": call.attempt, "pid": os.getpid()},
        )
        if any(e["key"] == call.idempotency_key for e in self.read(self.effects)):
            return False
        self._append(
            self.effects, {"key": call.idempotency_key, "tool": call.tool_name, "args": call.args}
        )
        return True

    def log_llm_call(self, step: int) -> None:
        """Record that the (fake) LLM was called for ``step``."""
        self._append(self.llm_calls, {"step": step, "pid": os.getpid()})


def plan_step(seed: int, step: int, steps: int) -> LLMResponseSnapshot:
    """The fake LLM: the same plan for the same (seed, step), every time."""
    if step >= steps - 1:
        return LLMResponseSnapshot(text="All payments sent and customers notified.", model="fake")
    rng = random.Random(f"{seed}:{step}")
    calls = []
    for index in range(rng.randint(1, 3)):
        account = f"acct-{rng.randint(100, 999)}"
        if rng.random() < 0.6:
            name, args = "transfer", {"account": account, "cents": rng.randint(100, 99_999)}
        else:
            name, args = "notify", {"account": account, "text": f"step {step} update"}
        calls.append({"id": f"s{step}-call{index}", "tool_name": name, "arguments": args})
    return LLMResponseSnapshot.model_validate(
        {"text": "", "tool_calls": calls, "model": "fake", "finish_reason": "tool_calls"}
    )


def _summary(state: RuntimeSnapshot) -> dict[str, Any]:
    """The run's result: what an uninterrupted run must produce too."""
    outputs = [m["output"] for m in state.messages if m.get("role") == "tool"]
    return {
        "final_text": state.final_text,
        "steps": state.step,
        "tool_calls": state.tool_calls,
        "transferred_cents": sum(o.get("cents", 0) for o in outputs),
        "receipts": [o["receipt"] for o in outputs],
    }


async def run_agent(
    store: MemoryStore, config: DemoConfig, emit: Emit | None = None
) -> dict[str, Any]:
    """Run (or resume) the demo agent's run to its end; return its result.

    ``emit`` receives progress events (points, effects, LLM calls). The same call
    starts a new run, resumes an interrupted one, or returns a finished run's
    stored result without executing anything.
    """
    world = OutsideWorld(config.workdir)

    async def report(event: dict[str, Any]) -> None:
        if emit is not None:
            await emit(event)

    async def reached(point: str, step: int, seq: int | None = None) -> None:
        await report({"event": "point", "point": point, "step": step, "seq": seq})
        if config.pause_at == f"{point}@{step}":
            sys.stdout.flush()
            # Block the event loop on purpose: the process freezes (writer included) until killed.
            time.sleep(3600)  # noqa: ASYNC251

    # 1. Claim the run (or start it) and find where it stands.
    thread_id, run_id = config.thread_id, config.run_id
    try:
        cursor = await claim_run(store, thread_id, run_id)
        point = await load_resume_point(store, thread_id, run_id)
    except CheckpointNotFoundError:
        cursor, point = await start_run(store, thread_id, run_id), None
    await report(
        {
            "event": "session",
            "pid": os.getpid(),
            "epoch": cursor.epoch,
            "resumed": point is not None,
            "terminal": bool(point and point.terminal),
            "source": point.source if point else None,
            "step": point.step if point else 0,
            "pending_llm_response": bool(point and point.pending_llm_response),
            "latest": (
                {"seq": point.latest.seq, "step": point.latest.step, "phase": point.latest.phase}
                if point
                else None
            ),
        }
    )
    if point is not None and point.terminal:
        result = point.terminal_result or {}
        await report({"event": "done", "result": result, "effects": None, "already_done": True})
        return result
    state = point.snapshot if point is not None and point.snapshot is not None else None
    if state is None:
        state = RuntimeSnapshot(state="running", started_at_s=time.time())

    ledger = EffectLedger(
        store,
        thread_id,
        run_id,
        executor_id=f"demo-{os.getpid()}-{uuid.uuid4().hex[:8]}",
        in_doubt="reexecute",  # safe here: the outside world honours idempotency keys
        epoch=cursor.epoch,
    )

    async def tool(call: ToolCall) -> dict[str, Any]:
        await asyncio.sleep(config.tool_delay)  # the outside service takes a moment
        applied = world.apply(call)
        await reached("tool_effect", call.step)
        receipt = f"rcpt-{call.idempotency_key[-8:]}"
        return {"receipt": receipt, "cents": call.args.get("cents", 0), "applied": applied}

    # 2. Write-behind checkpoints at every phase boundary.
    async with CheckpointWriter(store) as writer:

        async def checkpoint(phase: Phase, step: int, payload: dict[str, Any]) -> None:
            record = cursor.checkpoint(phase, step, payload)
            await writer.submit(record)
            await reached(phase.value, step, record.seq)

        if point is None:
            await checkpoint(Phase.RUN_STARTED, 0, {"agent_name": "demo", "resumed": False})
        while state.step < config.steps:
            step = state.step
            await checkpoint(Phase.STEP_STARTED, step, {"message_count": len(state.messages)})
            response = state.pending_llm_response
            if response is None:
                await checkpoint(Phase.PRE_LLM, step, {"model": "fake"})
                await asyncio.sleep(0.001)
                world.log_llm_call(step)
                await report({"event": "llm_call", "step": step})
                response = plan_step(config.seed, step, config.steps)
                state.pending_llm_response = response
                state.llm_calls += 1
                await checkpoint(
                    Phase.POST_LLM, step, {"tool_call_count": len(response.tool_calls)}
                )
                await checkpoint(Phase.RUNTIME_STATE, step, state.model_dump(mode="json"))
                # The response must be durable before any tool acts on it.
                await writer.flush()
            else:
                await report({"event": "llm_reused", "step": step})

            # 3. Side effects through the ledger.
            replayed_before = ledger.stats.replayed
            await checkpoint(
                Phase.PRE_TOOL_BATCH, step, {"tool_call_count": len(response.tool_calls)}
            )
            for call in response.tool_calls:
                assert call.id is not None
                outcome = await ledger.execute(step, call.id, call.tool_name, call.arguments, tool)
                await report(
                    {
                        "event": "effect",
                        "step": step,
                        "tool_call_id": call.id,
                        "tool": call.tool_name,
                        "key": outcome.idempotency_key,
                        "executed": outcome.executed,
                        "replayed": outcome.replayed,
                        "in_doubt": outcome.in_doubt,
                        "attempt": outcome.attempt,
                    }
                )
                output = {k: v for k, v in outcome.output.items() if k != "applied"}
                state.messages.append({"role": "tool", "tool_call_id": call.id, "output": output})
                state.tool_calls += 1
            state.final_text = response.text or state.final_text
            state.pending_llm_response = None
            state.step += 1
            state.replayed_effect_count += ledger.stats.replayed - replayed_before
            await checkpoint(
                Phase.POST_TOOL_BATCH, step, {"tool_calls_total": len(response.tool_calls)}
            )
            await checkpoint(Phase.RUNTIME_STATE, step, state.model_dump(mode="json"))

        result = _summary(state)
        await checkpoint(
            Phase.RUN_TERMINAL,
            state.step,
            {"state": "completed", "final_text": state.final_text, "terminal_result": result},
        )
    # Leaving the writer's block flushed everything: the terminal record is durable.
    await report({"event": "done", "result": result, "effects": ledger.stats.as_dict()})
    return result


async def _child(config: DemoConfig) -> None:
    async def emit(event: dict[str, Any]) -> None:
        print(EVENT_PREFIX + json.dumps(event, default=str), flush=True)

    async with open_store(config.store_url, **config.store_options) as store:
        await run_agent(store, config, emit)


def main(argv: list[str] | None = None) -> int:
    """Child-process entry: ``python -m checkpoint_stores.demo '<DemoConfig as JSON>'``."""
    args = sys.argv[1:] if argv is None else argv
    config = DemoConfig(**json.loads(args[0]))
    try:
        asyncio.run(_child(config))
    except Exception as exc:  # reported to the parent, which shows it and fails the demo
        error = {"event": "error", "type": type(exc).__name__, "message": str(exc)}
        print(EVENT_PREFIX + json.dumps(error), flush=True)
        return 1
    return 0


def config_json(config: DemoConfig) -> str:
    """``config`` as the JSON argument of the child process."""
    return json.dumps(asdict(config))


if __name__ == "__main__":
    sys.exit(main())
