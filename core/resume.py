"""Resuming a run: claiming it (fencing), loading where it was, and handing out seqs.

A runner that resumes a run after a crash does three things::

    cursor = await claim_run(store, thread_id, run_id)        # take the next epoch
    point = await load_resume_point(store, thread_id, run_id)  # where the run was
    if point.terminal:
        return point.terminal_result                            # finished: no re-execution
    ...continue from point.snapshot, writing cursor.checkpoint(...) records

A new run starts with :func:`start_run` instead of :func:`claim_run`.

**Fencing.** ``seq`` carries an epoch in its high bits (``epoch << 32 |
counter``). A new run is epoch 0. Claiming a run re-stamps its latest record
with seq ``(epoch + 1) << 32`` through the backend's compare-seq ``commit``;
if another claimer wins that race, the claim re-reads and takes the next
epoch. The claimer then writes seqs ``(epoch << 32) | 1, | 2, ...``. So the
last claimer owns the run, a zombie writer of an earlier epoch gets
:class:`StaleWriterError` on its next commit, and a resumed run never moves
``latest`` backwards (its seqs are above everything written before).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from pydantic import ValidationError

from checkpoint_stores.errors import (
    AgentCheckpointCorruptionError,
    CheckpointNotFoundError,
    StaleWriterError,
)
from checkpoint_stores.keys import checkpoint_latest_key, validate_run_id, validate_thread_id
from checkpoint_stores.schema import (
    Checkpoint,
    LLMResponseSnapshot,
    Phase,
    RunTerminalPayload,
    RuntimeSnapshot,
    now_ms,
)
from checkpoint_stores.store import MemoryStore

__all__ = [
    "EPOCH_SHIFT",
    "ResumePoint",
    "RunCursor",
    "claim_run",
    "load_resume_point",
    "make_seq",
    "start_run",
]

EPOCH_SHIFT: Final = 32
_COUNTER_MASK: Final = (1 << EPOCH_SHIFT) - 1
_CLAIM_ATTEMPTS: Final = 64
# The v1 backward scan reads this many steps per get_many round trip.
_SCAN_BATCH: Final = 32


def make_seq(epoch: int, counter: int) -> int:
    """The seq of the ``counter``-th write of fencing ``epoch``: ``epoch << 32 | counter``."""
    if epoch < 0 or not 0 <= counter <= _COUNTER_MASK:
        raise ValueError(f"epoch must be >= 0 and counter in 0..2**32-1, got {epoch}, {counter}")
    return (epoch << EPOCH_SHIFT) | counter


@dataclass
class RunCursor:
    """The write side of a run owned by this process: hands out increasing seqs.

    Get one from :func:`start_run` (a new run, epoch 0) or :func:`claim_run`
    (a resumed run, the next epoch). ``claimed`` is the latest record as it was
    re-stamped by the claim (``None`` for a new run).

    >>> cursor = RunCursor("t1", "r1", epoch=2)
    >>> cursor.checkpoint(Phase.STEP_STARTED, step=3, payload={}).seq == (2 << 32) | 1
    True
    """

    thread_id: str
    run_id: str
    epoch: int = 0
    counter: int = 0
    claimed: Checkpoint | None = field(default=None, repr=False)

    @property
    def seq(self) -> int:
        """The last seq handed out (the claim's own seq right after a claim)."""
        return make_seq(self.epoch, self.counter)

    def next_seq(self) -> int:
        """The next seq of this epoch."""
        if self.counter >= _COUNTER_MASK:
            raise OverflowError(
                f"run {self.run_id!r} wrote 2**32 - 1 checkpoints in epoch {self.epoch}; "
                "claim the run again to start a new epoch"
            )
        self.counter += 1
        return self.seq

    def checkpoint(
        self, phase: Phase | str, step: int, payload: Mapping[str, Any], **extra: Any
    ) -> Checkpoint:
        """A new record of this run with the next seq."""
        return Checkpoint(
            run_id=self.run_id,
            thread_id=self.thread_id,
            seq=self.next_seq(),
            step=step,
            phase=Phase(phase),
            payload=dict(payload),
            **extra,
        )


async def start_run(store: MemoryStore, thread_id: str, run_id: str) -> RunCursor:
    """A cursor for a run that does not exist yet (epoch 0).

    Raises:
        StaleWriterError: the run already has checkpoints: resume it with
            :func:`claim_run` or pick a new run id.
    """
    validate_thread_id(thread_id, max_bytes=store.capabilities.max_key_bytes)
    validate_run_id(run_id)
    try:
        existing = await store.latest(thread_id, run_id)
    except CheckpointNotFoundError:
        return RunCursor(thread_id, run_id)
    raise StaleWriterError(
        f"run {run_id!r} in thread {thread_id!r} already exists (latest seq {existing.seq}, "
        f"{existing.phase.value} at step {existing.step}); resume it with claim_run() "
        "or start a run with a new run id"
    )


async def claim_run(store: MemoryStore, thread_id: str, run_id: str) -> RunCursor:
    """Take ownership of an existing run for resuming it: the next fencing epoch.

    Re-stamps the run's latest record with seq ``(epoch + 1) << 32`` and a
    top-level ``claim`` field (epoch, a unique token, the time) through one
    compare-seq ``commit`` (the head only; no other key is touched). Losing a
    race to another claimer (or to a writer still running) re-reads and takes
    the epoch after. A finished (terminal) run is not re-stamped: it has nothing
    left to fence.

    Raises:
        CheckpointNotFoundError: the run has no checkpoint (start it with :func:`start_run`).
        AgentCheckpointCorruptionError: the latest record is unreadable.
        StaleWriterError: the claim kept losing races (another process is claiming
            the run in a loop).
    """
    validate_thread_id(thread_id, max_bytes=store.capabilities.max_key_bytes)
    head = checkpoint_latest_key(run_id)
    await store.setup()
    backend = store.backend
    for _ in range(_CLAIM_ATTEMPTS):
        latest = await store.latest(thread_id, run_id)
        if latest.is_terminal:
            return RunCursor(
                thread_id, run_id, epoch=latest.epoch, counter=latest.seq & _COUNTER_MASK
            )
        epoch = latest.epoch + 1
        # The token makes each claimer's bytes unique, so the "did my earlier attempt
        # land?" check below can never mistake another claimer's win for its own.
        claim = {"epoch": epoch, "token": uuid.uuid4().hex, "claimed_at_ms": now_ms()}
        claimed = latest.model_copy(update={"seq": make_seq(epoch, 0), "claim": claim})
        data = store.encode_checkpoint(claimed)
        if await backend.commit(thread_id, [], head, data, claimed.seq):
            return RunCursor(thread_id, run_id, epoch=epoch, claimed=claimed)
        if await backend.get(thread_id, head) == data:
            # An earlier attempt of this very commit landed (e.g. a retried timeout).
            return RunCursor(thread_id, run_id, epoch=epoch, claimed=claimed)
    raise StaleWriterError(
        f"could not claim run {run_id!r} of thread {thread_id!r}: {_CLAIM_ATTEMPTS} claims "
        "in a row lost to other writers. Another process is claiming or writing the run; "
        "stop it before resuming here"
    )


@dataclass(frozen=True)
class ResumePoint:
    """Where a run stands, as :func:`load_resume_point` found it.

    Attributes:
        thread_id: the run's thread.
        run_id: the run.
        latest: the run's newest record.
        terminal: the run finished; do not execute it again.
        terminal_result: the stored result of a finished run (its ``run_terminal``
            payload's ``terminal_result``; ``None`` if it stored none).
        snapshot: the newest runtime snapshot to continue from (``None``: the run
            never wrote one, so it starts over from its inputs).
        snapshot_checkpoint: the record that holds ``snapshot``.
        source: how the snapshot was found: ``"runtime_key"`` (O(1)), ``"v1_scan"``
            (AFK's backward scan over steps, for data written without the runtime
            key), or ``None``.
    """

    thread_id: str
    run_id: str
    latest: Checkpoint
    terminal: bool
    terminal_result: dict[str, Any] | None
    snapshot: RuntimeSnapshot | None
    snapshot_checkpoint: Checkpoint | None
    source: Literal["runtime_key", "v1_scan"] | None

    @property
    def step(self) -> int:
        """The step to continue at (the snapshot's, else the latest record's)."""
        return self.snapshot.step if self.snapshot is not None else self.latest.step

    @property
    def pending_llm_response(self) -> LLMResponseSnapshot | None:
        """An LLM response recorded but not yet acted on: reuse it, do not call the LLM again."""
        return self.snapshot.pending_llm_response if self.snapshot is not None else None


async def load_resume_point(store: MemoryStore, thread_id: str, run_id: str) -> ResumePoint:
    """Load where a run stands: its terminal result, or its newest runtime snapshot.

    Reads ``latest``; a terminal run returns its stored result (the caller must not
    execute it again). Otherwise the snapshot comes from the runtime key in O(1);
    only a run that has no runtime key (AFK v1 data) is searched backwards step by
    step, as AFK does. A snapshot whose ``pending_llm_response`` cannot be
    deserialized raises: resuming without it would repeat the LLM call.

    Raises:
        CheckpointNotFoundError: the run has no checkpoint.
        AgentCheckpointCorruptionError: latest, the snapshot or its pending LLM
            response is malformed (nothing is partially recovered).
    """
    latest = await store.latest(thread_id, run_id)
    if latest.is_terminal:
        try:
            terminal = RunTerminalPayload.model_validate(latest.payload)
        except ValidationError as exc:  # normalize checked it already; stay defensive
            raise AgentCheckpointCorruptionError(
                f"run_terminal record of run {run_id!r} is malformed: {exc.errors()[:1]}"
            ) from None
        return ResumePoint(
            thread_id=thread_id,
            run_id=run_id,
            latest=latest,
            terminal=True,
            terminal_result=terminal.terminal_result,
            snapshot=None,
            snapshot_checkpoint=None,
            source=None,
        )
    record = await store.runtime_snapshot(thread_id, run_id)
    source: Literal["runtime_key", "v1_scan"] | None = "runtime_key"
    if record is None:
        record = await _scan_v1(store, thread_id, run_id, latest.step)
        source = "v1_scan" if record is not None else None
    snapshot = _snapshot(record, run_id) if record is not None else None
    return ResumePoint(
        thread_id=thread_id,
        run_id=run_id,
        latest=latest,
        terminal=False,
        terminal_result=None,
        snapshot=snapshot,
        snapshot_checkpoint=record,
        source=source,
    )


async def _scan_v1(
    store: MemoryStore, thread_id: str, run_id: str, from_step: int
) -> Checkpoint | None:
    """AFK's lookup without a runtime key: the newest ``runtime_state`` at or below a step."""
    step = from_step
    while step >= 0:
        steps = list(range(step, max(-1, step - _SCAN_BATCH), -1))
        found = await store.get_checkpoints(
            thread_id, run_id, [(s, Phase.RUNTIME_STATE) for s in steps]
        )
        for record in found:
            if record is not None:
                return record
        step -= _SCAN_BATCH
    return None


def _snapshot(record: Checkpoint, run_id: str) -> RuntimeSnapshot:
    where = f"runtime snapshot (step {record.step}, seq {record.seq}) of run {run_id!r}"
    if record.phase is not Phase.RUNTIME_STATE:
        raise AgentCheckpointCorruptionError(
            f"{where}: the runtime key holds a {record.phase.value} record, not runtime_state"
        )
    pending = record.payload.get("pending_llm_response")
    if pending is not None:
        try:
            LLMResponseSnapshot.model_validate(pending)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '<value>'}: {e['msg']}"
                for e in exc.errors()[:3]
            )
            raise AgentCheckpointCorruptionError(
                f"{where}: pending_llm_response cannot be deserialized ({problems}). Refusing "
                "to resume: dropping it would repeat the LLM call. Repair or delete the record"
            ) from None
    try:
        return RuntimeSnapshot.model_validate(record.payload)
    except ValidationError as exc:
        raise AgentCheckpointCorruptionError(f"{where} is malformed: {exc.errors()[:3]}") from None
