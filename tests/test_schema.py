"""The checkpoint record and payload models."""

from __future__ import annotations

import time

import pytest
from pydantic import ValidationError

from checkpoint_stores import (
    CURRENT_SCHEMA_VERSION,
    Checkpoint,
    EffectRecord,
    LLMResponseSnapshot,
    Phase,
    RuntimeSnapshot,
)
from checkpoint_stores.schema import (
    PhasePayload,
    RunTerminalPayload,
    payload_model,
)

SEED_PHASES = [
    "run_started",
    "step_started",
    "pre_llm",
    "post_llm",
    "pre_tool_batch",
    "post_tool_batch",
    "pre_subagent_batch",
    "post_subagent_batch",
    "run_terminal",
]

# The runtime snapshot keys of the seed document, plus replayed_effect_count.
SNAPSHOT_FIELDS = [
    "messages",
    "step",
    "state",
    "context",
    "llm_calls",
    "tool_calls",
    "started_at_s",
    "usage",
    "total_cost_usd",
    "session_token",
    "checkpoint_token",
    "pending_llm_response",
    "tool_executions",
    "subagent_executions",
    "requested_model",
    "normalized_model",
    "provider_adapter",
    "final_text",
    "final_structured",
    "replayed_effect_count",
]


def make(**fields: object) -> Checkpoint:
    base: dict[str, object] = {
        "run_id": "r1",
        "thread_id": "t1",
        "seq": 1,
        "phase": Phase.PRE_LLM,
        "payload": {},
    }
    base.update(fields)
    return Checkpoint(**base)  # type: ignore[arg-type]


def test_phases_are_the_seed_nine_plus_runtime_state() -> None:
    assert [p.value for p in Phase] == [*SEED_PHASES, "runtime_state"]
    assert str(Phase.PRE_LLM) == "pre_llm"
    assert Phase("post_llm") is Phase.POST_LLM


def test_every_phase_has_a_payload_model_that_keeps_extra_keys() -> None:
    for phase in Phase:
        model = payload_model(phase)
        assert issubclass(model, PhasePayload)
        parsed = model.model_validate({"future_key": [1, 2]})
        assert parsed.model_dump()["future_key"] == [1, 2]
    assert payload_model("runtime_state") is RuntimeSnapshot
    assert payload_model(Phase.RUN_TERMINAL) is RunTerminalPayload


def test_runtime_snapshot_has_every_seed_field() -> None:
    assert set(SNAPSHOT_FIELDS) <= set(RuntimeSnapshot.model_fields)
    snapshot = RuntimeSnapshot()
    assert (snapshot.messages, snapshot.step, snapshot.pending_llm_response) == ([], 0, None)


def test_pending_llm_response_parses_tool_calls() -> None:
    response = LLMResponseSnapshot.model_validate(
        {"text": "", "tool_calls": [{"id": "c1", "tool_name": "search", "arguments": {"q": 1}}]}
    )
    assert response.tool_calls[0].tool_name == "search"
    with pytest.raises(ValidationError, match="tool_name"):
        LLMResponseSnapshot.model_validate({"tool_calls": [{"id": "c1"}]})


def test_checkpoint_defaults() -> None:
    before = time.time_ns() // 1_000_000
    cp = make()
    after = time.time_ns() // 1_000_000
    assert cp.schema_version == CURRENT_SCHEMA_VERSION == "2"
    assert cp.step == 0
    assert before <= cp.timestamp_ms <= after


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"run_id": ""}, "run_id"),
        ({"thread_id": ""}, "thread_id"),
        ({"seq": -1}, "seq"),
        ({"step": -1}, "step"),
        ({"phase": "pre_lunch"}, "phase"),
        ({"payload": []}, "payload"),
        ({"schema_version": "v1"}, "schema_version"),
    ],
)
def test_checkpoint_rejects_bad_fields(fields: dict[str, object], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        make(**fields)


def test_checkpoint_is_frozen() -> None:
    cp = make()
    with pytest.raises(ValidationError):
        cp.seq = 5  # type: ignore[misc]


def test_epoch_is_the_high_bits_of_seq() -> None:
    assert make(seq=7).epoch == 0
    assert make(seq=(3 << 32) | 7).epoch == 3


def test_is_terminal() -> None:
    assert make(phase=Phase.RUN_TERMINAL).is_terminal
    assert not make(phase=Phase.POST_LLM).is_terminal


def test_typed_payload() -> None:
    cp = make(phase=Phase.RUN_TERMINAL, payload={"terminal_result": {"ok": True}, "x": 1})
    typed = cp.typed_payload()
    assert isinstance(typed, RunTerminalPayload)
    assert typed.terminal_result == {"ok": True}


def test_to_record_is_complete_and_keeps_extras() -> None:
    cp = Checkpoint(
        run_id="r1",
        thread_id="t1",
        seq=2,
        step=1,
        phase=Phase.POST_LLM,
        payload={"model": "m"},
        timestamp_ms=5,
        trace_id="abc",  # type: ignore[call-arg]
    )
    assert cp.to_record() == {
        "schema_version": "2",
        "run_id": "r1",
        "thread_id": "t1",
        "seq": 2,
        "step": 1,
        "phase": "post_llm",
        "payload": {"model": "m"},
        "timestamp_ms": 5,
        "trace_id": "abc",
    }


def test_effect_record() -> None:
    effect = EffectRecord(input_hash="h", output={"a": 1}, success=True, custom="kept")  # type: ignore[call-arg]
    assert effect.status == "done"
    assert effect.model_dump()["custom"] == "kept"
    intent = EffectRecord(input_hash="h", status="intent")
    assert intent.output_hash is None
    with pytest.raises(ValidationError):
        EffectRecord(input_hash="h", status="maybe")  # type: ignore[arg-type]
