"""Group 2, corruption: damaged records raise a clear error, legacy records are normalized.

Values are damaged through the suite's backdoor (``backdoor_corrupt``; by
default a get-mutate-put through the SPI, or below it where a subclass knows
how). A damaged record must raise ``AgentCheckpointCorruptionError`` -- and not
``CheckpointNotFoundError``: "not found" makes a runner start the run anew,
repeating its side effects. Records AFK wrote (``v1``, version-less,
camelCase) must read back as current ``Checkpoint`` objects.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from checkpoint_stores import (
    AgentCheckpointCorruptionError,
    Checkpoint,
    CheckpointNotFoundError,
    Phase,
)
from checkpoint_stores.conformance.checks import check
from checkpoint_stores.conformance.context import CheckContext
from checkpoint_stores.keys import checkpoint_key, checkpoint_latest_key, runtime_key

__all__ = ["CorruptionChecks"]


def _json(record: dict[str, Any]) -> Callable[[bytes], bytes]:
    """A mutation that replaces the stored value with ``record`` as plain JSON."""
    data = json.dumps(record).encode("utf-8")
    return lambda _old: data


async def _raises_corruption(
    ctx: CheckContext, read: Callable[[], Awaitable[Any]], what: str, *, field: str | None = None
) -> None:
    """``read()`` must raise AgentCheckpointCorruptionError (not NotFound), naming ``field``."""
    try:
        value = await read()
    except CheckpointNotFoundError as exc:
        ctx.fail(
            f"{what}: raised CheckpointNotFoundError ({exc}); the record exists but is damaged, "
            "and 'not found' would make a runner start the run anew"
        )
    except AgentCheckpointCorruptionError as exc:
        if field is not None and field not in str(exc):
            ctx.fail(f"{what}: the error does not name the field {field!r}: {exc}")
        return
    except Exception as exc:
        ctx.fail(
            f"{what}: raised {type(exc).__name__} ({exc}) instead of AgentCheckpointCorruptionError"
        )
    ctx.fail(f"{what}: returned {value!r:.200} instead of raising AgentCheckpointCorruptionError")


class CorruptionChecks:
    """Group 2 of the kit (``conformance_corruption``). Mixed into ``StoreConformance``."""

    async def _written(
        self, ctx: CheckContext, *, phase: Phase = Phase.PRE_LLM, payload: dict[str, Any] | None
    ) -> tuple[str, str, Checkpoint]:
        thread, run = ctx.thread(), ctx.run_id()
        cp = Checkpoint(
            run_id=run,
            thread_id=thread,
            seq=7,
            step=3,
            phase=phase,
            payload=payload if payload is not None else {"model": "m", "note": "x" * 200},
        )
        await ctx.store.append(cp)
        return thread, run, cp

    async def _check_damage(
        self, ctx: CheckContext, mutations: list[tuple[str, Callable[[bytes], bytes]]]
    ) -> None:
        """Apply each mutation to a fresh run's latest and record keys; reads must raise."""
        for label, mutate in mutations:
            thread, run, cp = await self._written(ctx, payload=None)
            await ctx.corrupt(thread, checkpoint_latest_key(run), mutate)
            await _raises_corruption(
                ctx, partial(ctx.store.latest, thread, run), f"latest after {label}"
            )
            record = checkpoint_key(run, cp.step, cp.phase.value)
            await ctx.corrupt(thread, record, mutate)
            await _raises_corruption(
                ctx,
                partial(ctx.store.get_checkpoint, thread, run, cp.step, cp.phase),
                f"get_checkpoint after {label}",
            )
            await _raises_corruption(
                ctx, partial(ctx.store.history, thread, run), f"history after {label}"
            )

    @check("corruption.missing_latest_not_found")
    async def test_corruption_missing_latest_not_found(self, ctx: CheckContext) -> None:
        """a run with no latest record raises CheckpointNotFoundError (an
        AgentCheckpointCorruptionError)
        """
        thread, run = ctx.thread(), ctx.run_id()
        for label in ("an unknown run", "a deleted run"):
            try:
                found = await ctx.store.latest(thread, run)
            except CheckpointNotFoundError as exc:
                ctx.expect(
                    isinstance(exc, AgentCheckpointCorruptionError),
                    "CheckpointNotFoundError is not an AgentCheckpointCorruptionError",
                )
            except Exception as exc:
                ctx.fail(f"latest of {label} raised {type(exc).__name__}: {exc}")
            else:
                ctx.fail(f"latest of {label} returned {found!r:.200}")
            snapshot = await ctx.store.runtime_snapshot(thread, run)
            ctx.expect(snapshot is None, f"runtime_snapshot of {label} returned {snapshot!r:.200}")
            await ctx.store.append(
                Checkpoint(run_id=run, thread_id=thread, seq=1, phase=Phase.RUN_STARTED, payload={})
            )
            await ctx.store.delete_run(thread, run)

    @check("corruption.invalid_json")
    async def test_corruption_invalid_json(self, ctx: CheckContext) -> None:
        """a value that is not valid JSON (or not an envelope) raises
        AgentCheckpointCorruptionError
        """
        await self._check_damage(
            ctx,
            [
                ("replacing it with half a JSON object", lambda _: b'{"schema_version": "2", "run'),
                ("replacing it with text", lambda _: b"this is not json"),
                ("replacing it with a JSON array", lambda _: b"[1, 2, 3]"),
                ("replacing it with a bare JSON string", lambda _: b'"checkpoint"'),
                ("replacing it with binary garbage", lambda _: bytes(range(255, 0, -3))),
            ],
        )
        thread, run, _ = await self._written(ctx, payload=None)
        await ctx.corrupt(thread, checkpoint_latest_key(run), lambda _: b"{not json")
        await _raises_corruption(
            ctx,
            lambda: ctx.store.get_state(thread, checkpoint_latest_key(run)),
            "get_state of a damaged value",
        )

    @check("corruption.truncated_value")
    async def test_corruption_truncated_value(self, ctx: CheckContext) -> None:
        """a truncated value raises AgentCheckpointCorruptionError, never returns partial data"""
        await self._check_damage(
            ctx,
            [
                (f"truncating it to {label}", cut)
                for label, cut in (
                    ("all but its last byte", lambda b: b[:-1]),
                    ("half its length", lambda b: b[: len(b) // 2]),
                    ("its 13-byte header", lambda b: b[:13]),
                    ("5 bytes", lambda b: b[:5]),
                    ("1 byte", lambda b: b[:1]),
                    ("nothing", lambda b: b""),
                )
            ],
        )

    @check("corruption.bit_flipped_value")
    async def test_corruption_bit_flipped_value(self, ctx: CheckContext) -> None:
        """a value with a flipped bit (header or body) raises AgentCheckpointCorruptionError"""

        def flip(position: int) -> Callable[[bytes], bytes]:
            def mutate(value: bytes) -> bytes:
                data = bytearray(value)
                index = position if position >= 0 else len(data) + position
                data[index] ^= 1 << (index % 8)
                return bytes(data)

            return mutate

        positions = [*range(13), 13, 20, 64, 100, -40, -2, -1]
        await self._check_damage(ctx, [(f"flipping a bit of byte {p}", flip(p)) for p in positions])

    @check("corruption.missing_required_fields")
    async def test_corruption_missing_required_fields(self, ctx: CheckContext) -> None:
        """a record missing a required field, or with one of the wrong type, raises an error naming
        the field
        """
        thread, run, cp = await self._written(ctx, payload=None)
        good = cp.to_record()
        cases: list[tuple[str, dict[str, Any], str]] = []
        for field in ("run_id", "thread_id", "phase", "payload"):
            record = {k: v for k, v in good.items() if k != field}
            cases.append((f"without {field!r}", record, field))
        cases += [
            ("with payload as a list", {**good, "payload": [1, 2]}, "payload"),
            ("with an unknown phase", {**good, "phase": "pre_lunch"}, "phase"),
            ("with a negative seq", {**good, "seq": -4}, "seq"),
            ("with step as text", {**good, "step": "three"}, "step"),
            ("with an empty run_id", {**good, "run_id": ""}, "run_id"),
        ]
        for label, record, field in cases:
            await ctx.corrupt(thread, checkpoint_latest_key(run), _json(record))
            await _raises_corruption(
                ctx,
                lambda: ctx.store.latest(thread, run),
                f"latest holding a record {label}",
                field=field,
            )

    @check("corruption.unknown_schema_version")
    async def test_corruption_unknown_schema_version(self, ctx: CheckContext) -> None:
        """a record with a schema version this library does not know (newer, or garbage) raises"""
        thread, run, cp = await self._written(ctx, payload=None)
        good = cp.to_record()
        for version in ("3", "v99", "banana", "", 2.5, True, ["2"]):
            await ctx.corrupt(
                thread, checkpoint_latest_key(run), _json({**good, "schema_version": version})
            )
            await _raises_corruption(
                ctx,
                lambda: ctx.store.latest(thread, run),
                f"latest holding schema_version {version!r}",
            )
        await ctx.corrupt(
            thread, checkpoint_latest_key(run), _json({**good, "schema_version": "7"})
        )
        try:
            await ctx.store.latest(thread, run)
        except AgentCheckpointCorruptionError as exc:
            ctx.expect(
                "newer" in str(exc),
                f"a record of schema_version '7' raised without saying it is newer: {exc}",
            )

    @check("corruption.undeserializable_pending_llm_response")
    async def test_corruption_undeserializable_pending_llm_response(
        self, ctx: CheckContext
    ) -> None:
        """a runtime snapshot whose pending_llm_response cannot be deserialized raises (no duplicate
        LLM call)
        """
        bad_responses: list[Any] = [
            "not an object",
            ["a", "list"],
            {"tool_calls": [{"arguments": {"x": 1}}]},  # a tool call without tool_name
            {"tool_calls": "many"},
            {"usage": {"input_tokens": "lots"}},
        ]
        for bad in bad_responses:
            thread, run = ctx.thread(), ctx.run_id()
            snapshot = Checkpoint(
                run_id=run,
                thread_id=thread,
                seq=4,
                step=2,
                phase=Phase.RUNTIME_STATE,
                payload={"step": 2, "pending_llm_response": {"text": "ok"}},
            )
            await ctx.store.append(snapshot)
            record = snapshot.to_record()
            record["payload"] = {"step": 2, "pending_llm_response": bad}
            for key in (runtime_key(run), checkpoint_latest_key(run)):
                await ctx.corrupt(thread, key, _json(record))
            await _raises_corruption(
                ctx,
                partial(ctx.store.runtime_snapshot, thread, run),
                f"runtime_snapshot with pending_llm_response={bad!r}",
                field="pending_llm_response",
            )
            await _raises_corruption(
                ctx,
                partial(ctx.store.latest, thread, run),
                f"latest with pending_llm_response={bad!r}",
            )

    @check("corruption.wrong_run_rejected")
    async def test_corruption_wrong_run_rejected(self, ctx: CheckContext) -> None:
        """a record stored under another run's or thread's key is rejected, never resumed"""
        thread, run, cp = await self._written(ctx, payload=None)
        other_run = {**cp.to_record(), "run_id": run + "-other"}
        await ctx.corrupt(thread, checkpoint_latest_key(run), _json(other_run))
        await _raises_corruption(
            ctx, lambda: ctx.store.latest(thread, run), "latest holding another run's record"
        )
        other_thread = {**cp.to_record(), "thread_id": thread + "-other"}
        await ctx.corrupt(thread, checkpoint_latest_key(run), _json(other_thread))
        await _raises_corruption(
            ctx, lambda: ctx.store.latest(thread, run), "latest holding another thread's record"
        )

    async def _legacy_roundtrip(
        self, ctx: CheckContext, build: Callable[[str, str], dict[str, Any]], label: str
    ) -> None:
        thread, run, _ = await self._written(ctx, phase=Phase.POST_LLM, payload={"model": "m"})
        record = build(thread, run)
        for key in (checkpoint_latest_key(run), checkpoint_key(run, 3, Phase.POST_LLM.value)):
            await ctx.corrupt(thread, key, _json(record))
        try:
            latest = await ctx.store.latest(thread, run)
            history = await ctx.store.history(thread, run)
        except AgentCheckpointCorruptionError as exc:
            ctx.fail(f"a {label} record was not normalized: {exc}")
        ctx.expect(
            latest.run_id == run
            and latest.thread_id == thread
            and latest.phase is Phase.POST_LLM
            and latest.step == 3
            and latest.schema_version == "2",
            f"a {label} record normalized to run {latest.run_id!r}, thread {latest.thread_id!r}, "
            f"phase {latest.phase.value}, step {latest.step}, schema {latest.schema_version!r}",
        )
        ctx.expect(
            latest.payload == {"model": "afk-model", "custom": {"kept": True}},
            f"a {label} record's payload came back as {latest.payload!r} "
            "(unknown keys must be kept)",
        )
        ctx.expect(
            len(history) == 1 and history[0].payload == latest.payload,
            f"history of a {label} record returned {history!r:.300}",
        )

    @check("corruption.afk_v1_normalized")
    async def test_corruption_afk_v1_normalized(self, ctx: CheckContext) -> None:
        """AFK v1 and version-less records (no thread_id) read back normalized, unknown keys kept"""
        payload = {"model": "afk-model", "custom": {"kept": True}}
        await self._legacy_roundtrip(
            ctx,
            lambda thread, run: {
                "schema_version": "v1",
                "run_id": run,
                "step": 3,
                "phase": "post_llm",
                "payload": payload,
                "timestamp_ms": 1700000000000,
            },
            "AFK v1",
        )
        await self._legacy_roundtrip(
            ctx,
            lambda thread, run: {"run_id": run, "step": 3, "phase": "post_llm", "payload": payload},
            "version-less",
        )

    @check("corruption.camelcase_normalized")
    async def test_corruption_camelcase_normalized(self, ctx: CheckContext) -> None:
        """camelCase records (schemaVersion, runId, threadId, data) read back normalized"""
        await self._legacy_roundtrip(
            ctx,
            lambda thread, run: {
                "schemaVersion": "v1",
                "runId": run,
                "threadId": thread,
                "step": 3,
                "phase": "post_llm",
                "data": {"model": "afk-model", "custom": {"kept": True}},
            },
            "camelCase",
        )
