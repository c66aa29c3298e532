"""Read any checkpoint record this library or AFK ever wrote, or say exactly why not.

:func:`normalize_checkpoint_record` is the single gate every read goes
through. It accepts a dict, JSON text or bytes (raw JSON or a codec
envelope), AFK ``v1`` and version-less records, and the legacy camelCase
aliases; everything else raises :class:`AgentCheckpointCorruptionError`
naming the field and the problem. It never returns a partial record.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from pydantic import ValidationError

from checkpoint_stores.codec import decode_json_value
from checkpoint_stores.errors import AgentCheckpointCorruptionError, CheckpointNotFoundError
from checkpoint_stores.schema import CURRENT_SCHEMA_VERSION, Checkpoint, Phase, payload_model

__all__ = ["SUPPORTED_SCHEMA_VERSIONS", "normalize_checkpoint_record"]

# Legacy spellings -> canonical field. The canonical field wins when both exist.
_ALIASES: Final = (
    ("schemaVersion", "schema_version"),
    ("version", "schema_version"),
    ("runId", "run_id"),
    ("threadId", "thread_id"),
    ("data", "payload"),
)
_LEGACY_VERSIONS: Final = frozenset({"v1", "1"})
_CURRENT_VERSIONS: Final = frozenset({CURRENT_SCHEMA_VERSION, "v2"})
SUPPORTED_SCHEMA_VERSIONS: Final = _LEGACY_VERSIONS | _CURRENT_VERSIONS
_CURRENT_NUMBER: Final = int(CURRENT_SCHEMA_VERSION)
_PHASES: Final = ", ".join(p.value for p in Phase)
_KNOWN_FIELDS: Final = (
    "schema_version",
    "run_id",
    "thread_id",
    "phase",
    "payload",
    "step",
    "seq",
    "timestamp_ms",
)


class _Where:
    """The record's lookup context for messages, formatted only when an error needs it."""

    __slots__ = ("run_id", "thread_id")

    def __init__(self, thread_id: str | None, run_id: str | None) -> None:
        self.thread_id = thread_id
        self.run_id = run_id

    def __str__(self) -> str:
        parts = []
        if self.thread_id is not None:
            parts.append(f"thread {self.thread_id!r}")
        if self.run_id is not None:
            parts.append(f"run {self.run_id!r}")
        return f"checkpoint record ({', '.join(parts)})" if parts else "checkpoint record"


def _version(raw: object, where: _Where) -> str:
    """Map a stored schema version to "1" (legacy) or the current one, or raise."""
    if raw is None:
        return "1"  # version-less records are AFK's original shape
    text = str(raw).strip().lower() if isinstance(raw, (str, int)) else None
    if isinstance(raw, bool) or text is None:
        raise AgentCheckpointCorruptionError(
            f"{where}: schema_version must be a string such as 'v1' or "
            f"{CURRENT_SCHEMA_VERSION!r}, got {type(raw).__name__} {raw!r}"
        )
    if text in _LEGACY_VERSIONS:
        return "1"
    if text in _CURRENT_VERSIONS:
        return CURRENT_SCHEMA_VERSION
    digits = text[1:] if text.startswith("v") else text
    if digits.isdigit() and int(digits) > _CURRENT_NUMBER:
        raise AgentCheckpointCorruptionError(
            f"{where}: schema_version {raw!r} is newer than this library reads "
            f"(up to {CURRENT_SCHEMA_VERSION!r}); upgrade checkpoint-stores to read it"
        )
    raise AgentCheckpointCorruptionError(
        f"{where}: unknown schema_version {raw!r}; readable versions are "
        f"'v1' (AFK) and {CURRENT_SCHEMA_VERSION!r}"
    )


def _required_str(record: Mapping[str, Any], field: str, where: _Where) -> str:
    if field not in record:
        raise AgentCheckpointCorruptionError(f"{where}: missing required field {field!r}")
    value = record[field]
    if not isinstance(value, str) or not value:
        raise AgentCheckpointCorruptionError(
            f"{where}: field {field!r} must be a non-empty string, got {value!r}"
        )
    return value


def _optional_int(record: Mapping[str, Any], field: str, where: _Where) -> int:
    value = record.get(field, 0)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise AgentCheckpointCorruptionError(
            f"{where}: field {field!r} must be a non-negative integer, got {value!r}"
        )
    return value


def _format_validation(error: ValidationError) -> str:
    parts = []
    for item in error.errors()[:5]:
        loc = ".".join(str(p) for p in item["loc"])
        parts.append(f"payload.{loc}: {item['msg']}" if loc else item["msg"])
    return "; ".join(parts)


def normalize_checkpoint_record(
    raw: object,
    *,
    thread_id: str | None = None,
    run_id: str | None = None,
) -> Checkpoint:
    """Turn a stored record into a :class:`Checkpoint`, or raise with the exact problem.

    ``thread_id`` and ``run_id`` are the lookup context: a v1 record without a
    ``thread_id`` takes it from there, and a record that names another run or
    thread is rejected (a mixed-up key must never resume the wrong run).

    Raises:
        CheckpointNotFoundError: ``raw`` is ``None`` (nothing stored).
        AgentCheckpointCorruptionError: anything malformed, naming the field.

    >>> normalize_checkpoint_record(
    ...     {"schemaVersion": "v1", "runId": "r1", "phase": "pre_llm", "data": {}},
    ...     thread_id="t1").phase
    <Phase.PRE_LLM: 'pre_llm'>
    """
    where = _Where(thread_id, run_id)
    if raw is None:
        raise CheckpointNotFoundError(
            f"no checkpoint found for {str(where).removeprefix('checkpoint record ')}; "
            "check the thread and run ids, or start the run anew"
        )
    if isinstance(raw, (bytes, bytearray, memoryview, str)):
        raw = decode_json_value(raw, what=str(where))
    if isinstance(raw, Checkpoint):
        raw = raw.to_record()
    if not isinstance(raw, Mapping):
        raise AgentCheckpointCorruptionError(
            f"{where}: must be a JSON object, got {type(raw).__name__}"
        )

    record = dict(raw)
    odd_keys = [k for k in record if not isinstance(k, str)]
    if odd_keys:  # only a Python dict can hold these; JSON object keys are always strings
        raise AgentCheckpointCorruptionError(
            f"{where}: every top-level key must be a string, got {odd_keys[0]!r}"
        )
    for alias, canonical in _ALIASES:
        if alias in record:
            value = record.pop(alias)
            record.setdefault(canonical, value)

    version = _version(record.get("schema_version"), where)
    rec_run = _required_str(record, "run_id", where)
    if run_id is not None and rec_run != run_id:
        raise AgentCheckpointCorruptionError(
            f"{where}: the stored record belongs to run {rec_run!r}; a key points at the "
            "wrong run. Inspect the thread with `checkpoint-stores inspect`"
        )
    if "thread_id" in record and record["thread_id"] is not None:
        rec_thread = _required_str(record, "thread_id", where)
        if thread_id is not None and rec_thread != thread_id:
            raise AgentCheckpointCorruptionError(
                f"{where}: the stored record belongs to thread {rec_thread!r}"
            )
    elif thread_id is not None and version == "1":
        rec_thread = thread_id  # AFK v1 records carry no thread_id; the lookup gives it
    else:
        raise AgentCheckpointCorruptionError(f"{where}: missing required field 'thread_id'")

    phase_text = _required_str(record, "phase", where)
    try:
        phase = Phase(phase_text)
    except ValueError:
        raise AgentCheckpointCorruptionError(
            f"{where}: unknown phase {phase_text!r}; expected one of {_PHASES}"
        ) from None

    if "payload" not in record:
        raise AgentCheckpointCorruptionError(f"{where}: missing required field 'payload'")
    payload = record["payload"]
    if not isinstance(payload, dict):
        raise AgentCheckpointCorruptionError(
            f"{where}: field 'payload' must be a JSON object, got {type(payload).__name__}"
        )
    try:
        payload_model(phase).model_validate(payload)
    except ValidationError as exc:
        raise AgentCheckpointCorruptionError(
            f"{where}: {phase.value} payload is malformed: {_format_validation(exc)}"
        ) from None

    step = _optional_int(record, "step", where)
    seq = _optional_int(record, "seq", where)
    timestamp_ms = _optional_int(record, "timestamp_ms", where)
    for known in _KNOWN_FIELDS:
        record.pop(known, None)
    # Every field was checked above; pydantic-core builds the model faster than
    # model_construct, and extra top-level keys are kept.
    try:
        return Checkpoint.model_validate(
            {
                "schema_version": CURRENT_SCHEMA_VERSION,
                "run_id": rec_run,
                "thread_id": rec_thread,
                "seq": seq,
                "step": step,
                "phase": phase,
                "payload": payload,
                "timestamp_ms": timestamp_ms,
                **record,
            }
        )
    except ValidationError as exc:  # pragma: no cover - the checks above are stricter
        raise AgentCheckpointCorruptionError(f"{where}: {exc.errors()[:3]}") from None
