"""A worker process of the cross-process checks: ``python -m checkpoint_stores.conformance.worker``.

Protocol (one JSON object per line): the parent writes the job, the worker
answers ``{"event": "ready"}`` once the store is open, the parent writes
``go`` (optionally ``go <start>``: a ``time.monotonic()`` value at which
round 0 starts, so every worker's round ``r`` begins at the same instant),
and the worker answers ``{"event": "result", "data": ...}``. A scenario that
never ends reports ``{"event": "progress", ...}`` until it is killed.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Coroutine
from typing import IO, Any

from checkpoint_stores import Checkpoint, MemoryStore, Phase, open_store

__all__ = ["main"]

Scenario = Callable[[MemoryStore, dict[str, Any], float, IO[str]], Coroutine[Any, Any, Any]]


def _emit(out: IO[str], event: dict[str, Any]) -> None:
    out.write(json.dumps(event) + "\n")
    out.flush()


async def _at(start: float, slot: float, index: int) -> None:
    """Sleep until round ``index`` of the shared schedule (no sleep if late)."""
    delay = start + slot * index - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


def _checkpoint(thread_id: str, run_id: str, seq: int, payload: dict[str, Any]) -> Checkpoint:
    phase = Phase.RUNTIME_STATE if seq % 2 == 0 else Phase.STEP_STARTED
    return Checkpoint(
        run_id=run_id, thread_id=thread_id, seq=seq, step=seq, phase=phase, payload=payload
    )


async def _commit_race(
    store: MemoryStore, params: dict[str, Any], start: float, out: IO[str]
) -> Any:
    """Commit each planned seq at its slot; read latest after each commit."""
    thread_id, run_id, writer = params["thread_id"], params["run_id"], params["writer"]
    slot = float(params.get("slot", 0.02))
    attempts: list[list[Any]] = []
    for index, seq in enumerate(params["plan"]):
        await _at(start, slot, index)
        cp = _checkpoint(thread_id, run_id, seq, {"writer": writer, "seq": seq})
        t0 = time.monotonic()
        ok = await store.commit_checkpoint(cp)
        t1 = time.monotonic()
        seen = await store.latest(thread_id, run_id)
        attempts.append([writer, seq, ok, t0, t1, seen.seq, seen.payload.get("writer")])
    return attempts


async def _create_race(
    store: MemoryStore, params: dict[str, Any], start: float, out: IO[str]
) -> Any:
    """``create`` each key at its slot with this worker's own value."""
    thread_id, writer = params["thread_id"], params["writer"]
    slot = float(params.get("slot", 0.02))
    results: list[bool] = []
    await store.setup()
    for index, key in enumerate(params["keys"]):
        await _at(start, slot, index)
        results.append(await store.backend.create(thread_id, key, f"writer-{writer}".encode()))
    return results


async def _effect_race(
    store: MemoryStore, params: dict[str, Any], start: float, out: IO[str]
) -> Any:
    """Execute the same effects as every other worker; the tool leaves a witness line."""
    from checkpoint_stores.effects import EffectLedger, ToolCall

    thread_id, run_id, writer = params["thread_id"], params["run_id"], params["writer"]
    witness = params["witness"]
    slot = float(params.get("slot", 0.05))
    ledger = EffectLedger(store, thread_id, run_id, executor_id=f"worker-{writer}", wait_timeout=60)

    async def tool(call: ToolCall) -> Any:
        # One short O_APPEND write per execution: the witness the kit counts.
        fd = os.open(witness, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{call.step} {writer}\n".encode())
        finally:
            os.close(fd)
        await asyncio.sleep(0.02)  # a tool takes time: others arrive while it runs
        return {"step": call.step, "by": writer}

    results: list[list[Any]] = []
    for index, step in enumerate(params["steps"]):
        await _at(start, slot, index)
        outcome = await ledger.execute(step, "call-1", "charge", {"step": step}, tool)
        results.append([step, outcome.executed, outcome.replayed, outcome.output])
    return results


async def _writer(store: MemoryStore, params: dict[str, Any], start: float, out: IO[str]) -> Any:
    """Commit seq after seq until killed, reporting each commit."""
    thread_id, run_id = params["thread_id"], params["run_id"]
    pad = "x" * int(params.get("pad", 0))
    seq = int(params["first_seq"])
    count = 0
    while True:
        cp = _checkpoint(thread_id, run_id, seq, {"seq": seq, "pad": pad})
        if not await store.commit_checkpoint(cp):
            raise RuntimeError(f"commit of seq {seq} was refused; nobody else writes this run")
        count += 1
        _emit(out, {"event": "progress", "n": count, "seq": seq})
        seq += 1


SCENARIOS: dict[str, Scenario] = {
    "commit_race": _commit_race,
    "create_race": _create_race,
    "effect_race": _effect_race,
    "writer": _writer,
}


async def _run(job: dict[str, Any], out: IO[str]) -> None:
    scenario = SCENARIOS[job["scenario"]]
    store = open_store(job["url"], **job.get("options", {}))
    try:
        await store.setup()
        _emit(out, {"event": "ready"})
        line = await asyncio.to_thread(sys.stdin.readline)
        parts = line.split()
        if not parts or parts[0] != "go":
            return  # the parent gave up
        start = float(parts[1]) if len(parts) > 1 else time.monotonic()
        data = await scenario(store, job["params"], start, out)
        _emit(out, {"event": "result", "data": data})
    finally:
        await store.close()


def main() -> None:
    """Read a job from stdin, run it, report on stdout."""
    # Results go to a private copy of stdout; anything else printed goes to stderr.
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    try:
        job = json.loads(sys.stdin.readline())
        for entry in reversed(job.get("sys_path", [])):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        for module in job.get("imports", []):
            importlib.import_module(module)
        asyncio.run(_run(job, out))
    except BaseException as exc:
        _emit(
            out,
            {
                "event": "error",
                "type": type(exc).__name__,
                "message": str(exc),
                "traceback": traceback.format_exc(),
            },
        )
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
