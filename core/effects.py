"""The effect ledger: a recorded tool side effect is replayed on resume, never executed twice.

A runner routes every side-effecting tool call through :meth:`EffectLedger.execute`::

    ledger = EffectLedger(store, thread_id, run_id, epoch=cursor.epoch, in_doubt="raise")
    outcome = await ledger.execute(step, tool_call_id, "send_email", args, send_email)
    outcome.output      # the tool's output, live or replayed from the ledger

Each call is recorded under ``effect:{run_id}:{step}:{tool_call_id}`` in the
run's thread, in AFK's shape (``input_hash``, ``output_hash``, ``output``,
``success``), so AFK replays effects written here and this ledger replays
effects AFK wrote:

1. Before the tool runs, an *intent* record is created with the backend's
   create-only ``create``: of several executors racing for one call, exactly
   one wins and runs the tool; the others wait (bounded) for its result and
   replay it.
2. After the tool returns, the *result* replaces the intent.
3. On a later ``execute`` of the same call (a resumed run): a result with the
   same input is replayed after its output hash is verified
   (:class:`EffectIntegrityError` on mismatch); a different input raises
   :class:`EffectConflictError`; an intent without a result is *in doubt*
   (the process died while the tool ran: the outside effect may or may not
   have happened) and is handled by the tool's policy: ``"raise"``
   (:class:`EffectInDoubtError`) or ``"reexecute"``.

The tool receives a :class:`ToolCall` carrying a stable ``idempotency_key``
(derived from thread, run, step and tool call id, identical across attempts
and processes). Pass it to the outside service (an ``Idempotency-Key``
header, a unique request id) and a re-execution after a crash cannot
duplicate the effect there either.

Attempts are fenced: attempt ``n`` holds the record with seq ``2n`` (intent)
and ``2n + 1`` (result) through the backend's ``commit``, so after an in-doubt
call was re-claimed, a late result of the older attempt is refused
(:class:`StaleWriterError`) instead of overwriting the newer one.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final, Literal, TypeAlias

from pydantic import ValidationError

from checkpoint_stores.errors import (
    AgentCheckpointCorruptionError,
    CheckpointEncodeError,
    EffectConflictError,
    EffectInDoubtError,
    EffectIntegrityError,
    StaleWriterError,
)
from checkpoint_stores.keys import effect_key, validate_run_id, validate_thread_id
from checkpoint_stores.schema import EffectRecord, now_ms
from checkpoint_stores.spi import StorageBackend
from checkpoint_stores.store import MemoryStore

__all__ = [
    "EffectLedger",
    "EffectOutcome",
    "EffectStats",
    "InDoubtPolicy",
    "Tool",
    "ToolCall",
    "idempotency_key",
    "input_hash",
    "output_hash",
]

InDoubtPolicy: TypeAlias = Literal["raise", "reexecute"]
_POLICIES: Final = frozenset({"raise", "reexecute"})
# Key of a per-tool policy mapping that applies to tools it does not name.
DEFAULT_POLICY_KEY: Final = "*"

_IDEMPOTENCY_NAMESPACE: Final = "checkpoint-stores/effect/v1"
_MAX_ERROR_TEXT: Final = 2000


def _json_hash(value: Mapping[str, Any], what: str) -> str:
    # AFK's formula, byte for byte: json.dumps(ensure_ascii, sort_keys, default=str), SHA-256 hex.
    try:
        encoded = json.dumps(value, ensure_ascii=True, sort_keys=True, default=str)
    except (TypeError, ValueError) as exc:
        raise CheckpointEncodeError(
            f"cannot hash the {what}: {exc}. Use JSON-like values (dicts with str keys, "
            "lists, str, numbers, bool, None)"
        ) from None
    return hashlib.sha256(encoded.encode("utf-8")).hexdigest()


def input_hash(tool_name: str, args: Any) -> str:
    """SHA-256 hex of a tool call's input, as AFK computes it.

    ``json.dumps({"tool_name": tool_name, "args": args}, ensure_ascii=True,
    sort_keys=True, default=str)`` hashed with SHA-256.

    >>> input_hash("add", {"a": 1, "b": 2})[:16]
    '7f509013eadd9e0d'
    """
    return _json_hash({"tool_name": tool_name, "args": args}, "tool input")


def output_hash(output: Any) -> str:
    """SHA-256 hex of a tool's output, as AFK computes it (over ``{"output": output}``).

    >>> output_hash(3)[:16]
    'b14b12a2dc67cda7'
    """
    return _json_hash({"output": output}, "tool output")


def idempotency_key(thread_id: str, run_id: str, step: int, tool_call_id: str) -> str:
    """The stable key a tool passes to the outside service for one tool call.

    The same on every attempt and in every process (it is derived only from the
    ids), and opaque: a hash, so thread ids never leak into outside systems.

    >>> idempotency_key("t1", "r1", 0, "call-1") == idempotency_key("t1", "r1", 0, "call-1")
    True
    """
    material = json.dumps([_IDEMPOTENCY_NAMESPACE, thread_id, run_id, step, tool_call_id])
    return "cs-" + hashlib.sha256(material.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class ToolCall:
    """What a tool receives: its input and the stable idempotency key.

    Attributes:
        tool_name: the tool's name.
        args: the call's arguments, as given to :meth:`EffectLedger.execute`.
        idempotency_key: pass it to the outside service so a re-execution after
            a crash does not repeat the effect there.
        thread_id: the run's thread.
        run_id: the run.
        step: the step the call belongs to.
        tool_call_id: the call's id within the step.
        attempt: 1 for the first execution; higher when an in-doubt or failed call
            is executed again.
    """

    tool_name: str
    args: Any
    idempotency_key: str
    thread_id: str
    run_id: str
    step: int
    tool_call_id: str
    attempt: int = 1


Tool: TypeAlias = Callable[[ToolCall], Awaitable[Any]]
"""A tool: an async callable that takes a :class:`ToolCall` and returns a JSON-able output."""


@dataclass(frozen=True)
class EffectOutcome:
    """The result of :meth:`EffectLedger.execute`.

    Attributes:
        output: the tool's output (live, or replayed from the ledger).
        idempotency_key: the key the tool was (or would have been) given.
        executed: the tool ran during this call.
        replayed: the output came from the ledger; the tool did not run.
        in_doubt: an earlier attempt started but never recorded its result; with
            the ``"reexecute"`` policy the tool ran again (``executed`` is True).
        attempt: the attempt whose result this is.
        record: the stored effect record.
    """

    output: Any
    idempotency_key: str
    executed: bool
    replayed: bool
    in_doubt: bool
    attempt: int
    record: EffectRecord


@dataclass
class EffectStats:
    """Counts of what a ledger did: tools executed, outputs replayed, calls found in doubt."""

    executed: int = 0
    replayed: int = 0
    in_doubt: int = 0

    def as_dict(self) -> dict[str, int]:
        """The counts as a plain dict (for logs and reports)."""
        return {"executed": self.executed, "replayed": self.replayed, "in_doubt": self.in_doubt}


def _attempt_of(record: EffectRecord) -> int:
    extra = record.model_extra or {}
    attempt = extra.get("attempt", 1)
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        return 1
    return attempt


def _extra_int(record: EffectRecord, name: str) -> int | None:
    value = (record.model_extra or {}).get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


class EffectLedger:
    """Exactly-once bookkeeping of a run's tool side effects, on any :class:`MemoryStore`.

    Args:
        store: the store holding the run.
        thread_id: the run's thread.
        run_id: the run.
        executor_id: identifies this executor in intent records; default: a random
            id per ledger. Must be unique among executors alive at the same time.
        in_doubt: what to do with a call whose earlier attempt never recorded a
            result: ``"raise"`` (:class:`EffectInDoubtError`, the default: check the
            outside system with the idempotency key first), ``"reexecute"`` (run
            the tool again with the same idempotency key), or a mapping
            ``{tool_name: policy}`` (``"*"`` sets the default for unnamed tools).
        epoch: the fencing epoch of the run's current owner (``RunCursor.epoch``
            from :func:`checkpoint_stores.resume.claim_run`). An intent written
            under an older epoch belongs to a previous owner that crashed or was
            fenced out, so it is in doubt at once instead of being waited for.
        wait_timeout: how long (seconds) to wait for another live executor's
            result before treating its intent as in doubt.
    """

    def __init__(
        self,
        store: MemoryStore,
        thread_id: str,
        run_id: str,
        executor_id: str | None = None,
        in_doubt: InDoubtPolicy | Mapping[str, InDoubtPolicy] = "raise",
        *,
        epoch: int | None = None,
        wait_timeout: float = 10.0,
    ) -> None:
        self.store = store
        self.thread_id = validate_thread_id(thread_id, max_bytes=store.capabilities.max_key_bytes)
        self.run_id = validate_run_id(run_id)
        self.executor_id = executor_id or f"executor-{uuid.uuid4().hex}"
        self.epoch = epoch
        self.wait_timeout = wait_timeout
        self.stats = EffectStats()
        self._policies = self._check_policies(in_doubt)
        # Calls this ledger is executing right now: a second execute of the same
        # call in this process waits for the first instead of polling the store.
        self._inflight: dict[str, asyncio.Future[None]] = {}

    def __repr__(self) -> str:
        return (
            f"<EffectLedger run {self.run_id!r} on {self.store!r} "
            f"executed={self.stats.executed} replayed={self.stats.replayed} "
            f"in_doubt={self.stats.in_doubt}>"
        )

    @staticmethod
    def _check_policies(
        in_doubt: InDoubtPolicy | Mapping[str, InDoubtPolicy],
    ) -> dict[str, InDoubtPolicy]:
        policies: dict[str, InDoubtPolicy] = (
            {DEFAULT_POLICY_KEY: in_doubt} if isinstance(in_doubt, str) else dict(in_doubt)
        )
        for tool, policy in policies.items():
            if policy not in _POLICIES:
                raise ValueError(
                    f"in-doubt policy {policy!r} for {tool!r} is not one of 'raise', 'reexecute'"
                )
        policies.setdefault(DEFAULT_POLICY_KEY, "raise")
        return policies

    def policy_for(self, tool_name: str) -> InDoubtPolicy:
        """The in-doubt policy that applies to ``tool_name``."""
        return self._policies.get(tool_name, self._policies[DEFAULT_POLICY_KEY])

    def idempotency_key(self, step: int, tool_call_id: str) -> str:
        """The idempotency key of one call of this run."""
        return idempotency_key(self.thread_id, self.run_id, step, tool_call_id)

    # -- reading -------------------------------------------------------------------

    async def lookup(self, step: int, tool_call_id: str) -> EffectRecord | None:
        """The stored record of one call, or ``None``.

        Raises:
            EffectIntegrityError: a result whose output does not match its hash.
            AgentCheckpointCorruptionError: a record that cannot be read.
        """
        key = effect_key(self.run_id, step, tool_call_id)
        backend = await self._backend()
        raw = await backend.get(self.thread_id, key)
        if raw is None:
            return None
        record = self._parse(raw, key)
        if record.status == "done":
            self._verify(record, key)
        return record

    async def _backend(self) -> StorageBackend:
        await self.store.setup()
        return self.store.backend

    def _parse(self, raw: bytes, key: str) -> EffectRecord:
        where = f"effect record {key!r} of thread {self.thread_id!r}"
        value = self.store.decode(raw, what=where)
        if not isinstance(value, dict):
            raise AgentCheckpointCorruptionError(
                f"{where}: must be a JSON object, got {type(value).__name__}; "
                "delete the record only after checking the outside effect it stands for"
            )
        try:
            return EffectRecord.model_validate(value)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '<record>'}: {e['msg']}"
                for e in exc.errors()[:5]
            )
            raise AgentCheckpointCorruptionError(f"{where} is malformed: {problems}") from None

    def _verify(self, record: EffectRecord, key: str) -> None:
        if record.output_hash is None:
            raise EffectIntegrityError(
                f"effect record {key!r} has a result but no output_hash, so its output cannot "
                "be verified; refusing to replay it. Check the effect and rewrite the record"
            )
        actual = output_hash(record.output)
        if actual != record.output_hash:
            raise EffectIntegrityError(
                f"effect record {key!r}: stored output hashes to {actual[:12]}..., the record "
                f"says {record.output_hash[:12]}...; the record was altered or damaged. "
                "Refusing to replay it"
            )

    # -- executing -----------------------------------------------------------------

    async def execute(
        self,
        step: int,
        tool_call_id: str,
        tool_name: str,
        args: Any,
        tool: Tool,
    ) -> EffectOutcome:
        """Run ``tool`` for one call at most once per recorded result; replay otherwise.

        Raises:
            EffectConflictError: the call was recorded with a different input.
            EffectIntegrityError: the recorded output fails its hash.
            EffectInDoubtError: an earlier attempt has no result and the tool's
                policy is ``"raise"``.
            StaleWriterError: the call was re-claimed by another executor while
                this one ran the tool (its result was not recorded).
            Exception: whatever the tool raised (the failure is recorded first, and
                the next ``execute`` of the call runs the tool again).
        """
        key = effect_key(self.run_id, step, tool_call_id)
        digest = input_hash(tool_name, args)
        call = ToolCall(
            tool_name=tool_name,
            args=args,
            idempotency_key=self.idempotency_key(step, tool_call_id),
            thread_id=self.thread_id,
            run_id=self.run_id,
            step=step,
            tool_call_id=tool_call_id,
        )
        while (running := self._inflight.get(key)) is not None:
            await asyncio.shield(running)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._inflight[key] = done
        try:
            return await self._execute(key, digest, call, tool)
        finally:
            del self._inflight[key]
            done.set_result(None)

    async def _execute(self, key: str, digest: str, call: ToolCall, tool: Tool) -> EffectOutcome:
        backend = await self._backend()
        deadline: float | None = None
        delay = 0.005
        counted_in_doubt = False
        while True:
            raw = await backend.get(self.thread_id, key)
            if raw is None:
                intent = self._intent_bytes(digest, call, attempt=1)
                if await backend.create(self.thread_id, key, intent):
                    return await self._run(backend, key, digest, call, tool, 1, in_doubt=False)
                continue  # another executor created it first: read what it wrote
            record = self._parse(raw, key)
            if record.input_hash != digest:
                raise EffectConflictError(
                    f"tool call {call.tool_call_id!r} at step {call.step} of run {self.run_id!r} "
                    f"was recorded with different input (tool {record.tool_name or '?'!r}, input "
                    f"hash {record.input_hash[:12]}...; now {call.tool_name!r}, {digest[:12]}...). "
                    "Replaying it would return the wrong output: give the new call its own "
                    "tool_call_id, or resume with the original input"
                )
            attempt = _attempt_of(record)
            if record.status == "done":
                self._verify(record, key)
                if record.success:
                    self.stats.replayed += 1
                    return EffectOutcome(
                        output=record.output,
                        idempotency_key=call.idempotency_key,
                        executed=False,
                        replayed=True,
                        in_doubt=False,
                        attempt=attempt,
                        record=record,
                    )
                # A recorded failure: the tool said the effect did not complete. Try again.
                if await self._reclaim(backend, key, digest, call, attempt + 1):
                    return await self._run(
                        backend, key, digest, call, tool, attempt + 1, in_doubt=False
                    )
                continue
            # An intent without a result.
            now = time.monotonic()
            if self._peer_may_be_running(record):
                if deadline is None:
                    deadline = now + self.wait_timeout
                if now < deadline:
                    await asyncio.sleep(min(delay, max(0.0, deadline - now)))
                    delay = min(delay * 2, 0.25)
                    continue
            if not counted_in_doubt:
                counted_in_doubt = True
                self.stats.in_doubt += 1
            if self.policy_for(call.tool_name) == "raise":
                raise EffectInDoubtError(
                    f"tool call {call.tool_call_id!r} ({call.tool_name!r}) at step {call.step} of "
                    f"run {self.run_id!r} started (attempt {attempt}, executor "
                    f"{record.executor or 'unknown'}) but its result was never recorded: the "
                    "effect may or may not have happened. Check the outside system with "
                    f"idempotency key {call.idempotency_key}, or use in_doubt='reexecute' "
                    "for tools that are idempotent under that key"
                )
            if await self._reclaim(backend, key, digest, call, attempt + 1):
                return await self._run(backend, key, digest, call, tool, attempt + 1, in_doubt=True)
            # Another executor re-claimed it first: wait for its result like any peer's.
            deadline = None

    def _peer_may_be_running(self, record: EffectRecord) -> bool:
        """Whether an intent may belong to a live executor worth waiting for."""
        if record.executor is None or record.executor == self.executor_id:
            return False  # nobody we know of, or our own attempt that died
        their_epoch = _extra_int(record, "epoch")
        # A previous owner of the run (crashed or fenced out): nothing to wait for.
        return not (self.epoch is not None and their_epoch is not None and their_epoch < self.epoch)

    def _intent_bytes(self, digest: str, call: ToolCall, attempt: int) -> bytes:
        record: dict[str, Any] = {
            "input_hash": digest,
            "output_hash": None,
            "output": None,
            "success": False,
            "status": "intent",
            "tool_name": call.tool_name,
            "idempotency_key": call.idempotency_key,
            "executor": self.executor_id,
            "started_at_ms": now_ms(),
            "finished_at_ms": None,
            "attempt": attempt,
            "epoch": self.epoch,
        }
        return self.store.encode(record, what=f"effect intent of {call.tool_call_id!r}")

    async def _reclaim(
        self, backend: StorageBackend, key: str, digest: str, call: ToolCall, attempt: int
    ) -> bool:
        # Seq 2n fences attempt n: of several re-claimers exactly one moves the record.
        intent = self._intent_bytes(digest, call, attempt)
        return await backend.commit(self.thread_id, [], key, intent, 2 * attempt)

    async def _run(
        self,
        backend: StorageBackend,
        key: str,
        digest: str,
        call: ToolCall,
        tool: Tool,
        attempt: int,
        *,
        in_doubt: bool,
    ) -> EffectOutcome:
        call = replace(call, attempt=attempt)
        started = now_ms()
        try:
            output = await tool(call)
        except Exception as exc:
            self.stats.executed += 1
            failure = {"error": type(exc).__name__, "message": str(exc)[:_MAX_ERROR_TEXT]}
            await self._record(backend, key, digest, call, attempt, started, failure, False)
            raise
        self.stats.executed += 1
        # If the output cannot be encoded, the intent stays: the effect happened but is
        # not recorded, so the next execute finds it in doubt (the honest state).
        record = await self._record(backend, key, digest, call, attempt, started, output, True)
        return EffectOutcome(
            output=record.output,
            idempotency_key=call.idempotency_key,
            executed=True,
            replayed=False,
            in_doubt=in_doubt,
            attempt=attempt,
            record=record,
        )

    async def _record(
        self,
        backend: StorageBackend,
        key: str,
        digest: str,
        call: ToolCall,
        attempt: int,
        started: int,
        output: Any,
        success: bool,
    ) -> EffectRecord:
        value: dict[str, Any] = {
            "input_hash": digest,
            "output_hash": output_hash(output),
            "output": output,
            "success": success,
            "status": "done",
            "tool_name": call.tool_name,
            "idempotency_key": call.idempotency_key,
            "executor": self.executor_id,
            "started_at_ms": started,
            "finished_at_ms": now_ms(),
            "attempt": attempt,
            "epoch": self.epoch,
        }
        data = self.store.encode(value, what=f"effect result of {call.tool_call_id!r}")
        if not await backend.commit(self.thread_id, [], key, data, 2 * attempt + 1):
            current = await backend.get(self.thread_id, key)
            if current != data:  # not merely our own earlier landing of this write
                raise StaleWriterError(
                    f"tool call {call.tool_call_id!r} at step {call.step} of run "
                    f"{self.run_id!r} was re-claimed by another executor while attempt "
                    f"{attempt} ran; this attempt's result was not recorded. Stop this "
                    "executor: a newer one owns the run"
                )
        return self._parse(data, key)
