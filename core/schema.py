"""The checkpoint record and its payloads, as pydantic v2 models.

A :class:`Checkpoint` is one record of a run's chain. Its ``payload`` stays a
plain dict so nothing is lost (unknown keys are kept); the payload model of
each phase (:func:`payload_model`) validates its shape on read and gives typed
access through :meth:`Checkpoint.typed_payload`.
"""

from __future__ import annotations

import time
from enum import Enum
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "CURRENT_SCHEMA_VERSION",
    "Checkpoint",
    "EffectRecord",
    "LLMResponseSnapshot",
    "Phase",
    "PhasePayload",
    "PostLLMPayload",
    "PostSubagentBatchPayload",
    "PostToolBatchPayload",
    "PreLLMPayload",
    "PreSubagentBatchPayload",
    "PreToolBatchPayload",
    "RunStartedPayload",
    "RunTerminalPayload",
    "RuntimeSnapshot",
    "StepStartedPayload",
    "ToolCallSnapshot",
    "UsageSnapshot",
    "now_ms",
    "payload_model",
]

CURRENT_SCHEMA_VERSION: Final = "2"


def now_ms() -> int:
    """Unix time in milliseconds, as stored in ``timestamp_ms``."""
    return time.time_ns() // 1_000_000


class Phase(str, Enum):
    """Phase boundaries at which a run writes a checkpoint.

    The nine of AFK's schema, plus ``runtime_state``: the phase under which AFK
    writes its full runtime snapshots, so AFK-written chains read back.
    """

    RUN_STARTED = "run_started"
    STEP_STARTED = "step_started"
    PRE_LLM = "pre_llm"
    POST_LLM = "post_llm"
    PRE_TOOL_BATCH = "pre_tool_batch"
    POST_TOOL_BATCH = "post_tool_batch"
    PRE_SUBAGENT_BATCH = "pre_subagent_batch"
    POST_SUBAGENT_BATCH = "post_subagent_batch"
    RUN_TERMINAL = "run_terminal"
    RUNTIME_STATE = "runtime_state"

    def __str__(self) -> str:
        return self.value


class PhasePayload(BaseModel):
    """Base of every payload model: unknown keys are kept, not dropped."""

    model_config = ConfigDict(extra="allow")


class UsageSnapshot(PhasePayload):
    """Token usage aggregate."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    total_tokens: int | None = None


class ToolCallSnapshot(PhasePayload):
    """One tool call planned by an LLM response."""

    id: str | None = None
    tool_name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class LLMResponseSnapshot(PhasePayload):
    """A serialized LLM response (AFK's shape). Resuming with a pending one skips the LLM call."""

    text: str = ""
    request_id: str | None = None
    provider_request_id: str | None = None
    session_token: str | None = None
    checkpoint_token: str | None = None
    structured_response: dict[str, Any] | None = None
    tool_calls: list[ToolCallSnapshot] = Field(default_factory=list)
    finish_reason: str | None = None
    usage: UsageSnapshot | None = None
    raw: Any = None
    model: str | None = None


class RunStartedPayload(PhasePayload):
    """Payload of ``run_started``."""

    agent_name: str | None = None
    resumed: bool | None = None


class StepStartedPayload(PhasePayload):
    """Payload of ``step_started``."""

    state: str | None = None
    message_count: int | None = None


class PreLLMPayload(PhasePayload):
    """Payload of ``pre_llm``."""

    model: str | None = None
    provider: str | None = None
    message_count: int | None = None


class PostLLMPayload(PhasePayload):
    """Payload of ``post_llm``."""

    model: str | None = None
    provider: str | None = None
    finish_reason: str | None = None
    tool_call_count: int | None = None
    session_token: str | None = None
    checkpoint_token: str | None = None
    total_cost_usd: float | None = None


class PreToolBatchPayload(PhasePayload):
    """Payload of ``pre_tool_batch``."""

    tool_call_count: int | None = None


class PostToolBatchPayload(PhasePayload):
    """Payload of ``post_tool_batch``."""

    tool_calls_total: int | None = None
    tool_failures: int | None = None


class PreSubagentBatchPayload(PhasePayload):
    """Payload of ``pre_subagent_batch``."""

    subagent_count: int | None = None


class PostSubagentBatchPayload(PhasePayload):
    """Payload of ``post_subagent_batch``."""

    subagent_calls_total: int | None = None
    subagent_failures: int | None = None


class RunTerminalPayload(PhasePayload):
    """Payload of ``run_terminal``; ``terminal_result`` means: done, do not re-execute."""

    state: str | None = None
    final_text: str | None = None
    requested_model: str | None = None
    normalized_model: str | None = None
    provider_adapter: str | None = None
    terminal_result: dict[str, Any] | None = None


class RuntimeSnapshot(PhasePayload):
    """Everything needed to resume a run: the payload of ``runtime_state`` records."""

    messages: list[dict[str, Any]] = Field(default_factory=list)
    step: int = 0
    state: str | None = None
    context: dict[str, Any] = Field(default_factory=dict)
    llm_calls: int = 0
    tool_calls: int = 0
    started_at_s: float | None = None
    usage: UsageSnapshot | None = None
    total_cost_usd: float | None = None
    session_token: str | None = None
    checkpoint_token: str | None = None
    pending_llm_response: LLMResponseSnapshot | None = None
    tool_executions: list[dict[str, Any]] = Field(default_factory=list)
    subagent_executions: list[dict[str, Any]] = Field(default_factory=list)
    requested_model: str | None = None
    normalized_model: str | None = None
    provider_adapter: str | None = None
    final_text: str | None = None
    final_structured: dict[str, Any] | None = None
    replayed_effect_count: int = 0


_PAYLOAD_MODELS: dict[Phase, type[PhasePayload]] = {
    Phase.RUN_STARTED: RunStartedPayload,
    Phase.STEP_STARTED: StepStartedPayload,
    Phase.PRE_LLM: PreLLMPayload,
    Phase.POST_LLM: PostLLMPayload,
    Phase.PRE_TOOL_BATCH: PreToolBatchPayload,
    Phase.POST_TOOL_BATCH: PostToolBatchPayload,
    Phase.PRE_SUBAGENT_BATCH: PreSubagentBatchPayload,
    Phase.POST_SUBAGENT_BATCH: PostSubagentBatchPayload,
    Phase.RUN_TERMINAL: RunTerminalPayload,
    Phase.RUNTIME_STATE: RuntimeSnapshot,
}


def payload_model(phase: Phase | str) -> type[PhasePayload]:
    """The payload model of a phase."""
    return _PAYLOAD_MODELS[Phase(phase)]


class Checkpoint(BaseModel):
    """One checkpoint record.

    ``seq`` is strictly increasing per run and may carry a fencing epoch in its
    high bits (``epoch << 32 | counter``); the store refuses a commit whose seq
    is not above the run's stored head.

    >>> cp = Checkpoint(run_id="r1", thread_id="t1", seq=1, step=0,
    ...                 phase=Phase.RUN_STARTED, payload={"agent_name": "analyst"})
    >>> cp.typed_payload().agent_name
    'analyst'
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    schema_version: Literal["2"] = CURRENT_SCHEMA_VERSION
    run_id: str
    thread_id: str
    seq: int = Field(default=0, ge=0)
    step: int = Field(default=0, ge=0)
    phase: Phase
    payload: dict[str, Any]
    timestamp_ms: int = Field(default_factory=now_ms)

    @field_validator("run_id", "thread_id")
    @classmethod
    def _non_empty(cls, value: str) -> str:
        if not value:
            raise ValueError("must not be empty")
        return value

    @property
    def epoch(self) -> int:
        """The fencing epoch carried in the high bits of ``seq``."""
        return self.seq >> 32

    @property
    def is_terminal(self) -> bool:
        """True for ``run_terminal`` records."""
        return self.phase is Phase.RUN_TERMINAL

    def typed_payload(self) -> PhasePayload:
        """The payload validated into its phase's model (extra keys kept)."""
        return payload_model(self.phase).model_validate(self.payload)

    def to_record(self) -> dict[str, Any]:
        """The record as a JSON-ready dict (the payload is not copied)."""
        record: dict[str, Any] = {
            "schema_version": self.schema_version,
            "run_id": self.run_id,
            "thread_id": self.thread_id,
            "seq": self.seq,
            "step": self.step,
            "phase": self.phase.value,
            "payload": self.payload,
            "timestamp_ms": self.timestamp_ms,
        }
        if self.model_extra:
            for name, value in self.model_extra.items():
                record.setdefault(name, value)
        return record


class EffectRecord(BaseModel):
    """A tool effect: the intent recorded before execution, then its result.

    The fields ``input_hash``, ``output_hash``, ``output`` and ``success`` are
    AFK's, so AFK replays effects written by this library and vice versa.
    ``status`` is ``"intent"`` until the result is recorded.
    """

    model_config = ConfigDict(extra="allow")

    input_hash: str
    output_hash: str | None = None
    output: Any = None
    success: bool = False
    status: Literal["intent", "done"] = "done"
    tool_name: str | None = None
    idempotency_key: str | None = None
    executor: str | None = None
    started_at_ms: int | None = None
    finished_at_ms: int | None = None
