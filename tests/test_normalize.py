"""normalize_checkpoint_record: every accepted shape, and a named error for everything else."""

from __future__ import annotations

import copy
import zlib
from typing import Any

import orjson
import pytest

from checkpoint_stores import (
    CURRENT_SCHEMA_VERSION,
    AgentCheckpointCorruptionError,
    Checkpoint,
    CheckpointNotFoundError,
    Codec,
    Phase,
    normalize_checkpoint_record,
)

V2: dict[str, Any] = {
    "schema_version": "2",
    "run_id": "run-1",
    "thread_id": "thread-1",
    "seq": 7,
    "step": 3,
    "phase": "pre_llm",
    "payload": {"model": "gpt", "message_count": 4},
    "timestamp_ms": 1_700_000_000_123,
}

# What AFK's runner writes: no thread_id (the lookup gives it), no seq.
AFK_V1: dict[str, Any] = {
    "schema_version": "v1",
    "run_id": "run-1",
    "step": 2,
    "phase": "post_llm",
    "payload": {"model": "gpt", "finish_reason": "stop"},
    "timestamp_ms": 1_700_000_000_000,
}


def corruption(raw: object, **context: Any) -> str:
    """The message of the AgentCheckpointCorruptionError ``raw`` must raise."""
    with pytest.raises(AgentCheckpointCorruptionError) as info:
        normalize_checkpoint_record(raw, **context)
    return str(info.value)


# -- accepted shapes -----------------------------------------------------------------


def test_current_record_reads_back_field_for_field() -> None:
    cp = normalize_checkpoint_record(V2, thread_id="thread-1", run_id="run-1")
    assert cp.schema_version == CURRENT_SCHEMA_VERSION
    assert (cp.run_id, cp.thread_id, cp.seq, cp.step) == ("run-1", "thread-1", 7, 3)
    assert cp.phase is Phase.PRE_LLM
    assert cp.payload == {"model": "gpt", "message_count": 4}
    assert cp.timestamp_ms == 1_700_000_000_123


def test_afk_v1_without_thread_id_takes_it_from_the_lookup() -> None:
    cp = normalize_checkpoint_record(AFK_V1, thread_id="thread-9", run_id="run-1")
    assert cp.thread_id == "thread-9"
    assert cp.schema_version == CURRENT_SCHEMA_VERSION  # upgraded on read
    assert (cp.seq, cp.step, cp.phase) == (0, 2, Phase.POST_LLM)


def test_afk_v1_without_thread_id_and_no_lookup_names_the_field() -> None:
    message = corruption(AFK_V1)
    assert "missing required field 'thread_id'" in message


def test_version_less_record_is_afk_v1() -> None:
    record = {k: v for k, v in AFK_V1.items() if k != "schema_version"}
    cp = normalize_checkpoint_record(record, thread_id="t")
    assert cp.thread_id == "t"
    assert cp.phase is Phase.POST_LLM


@pytest.mark.parametrize("version", ["v1", "1", "V1", " v1 ", 1])
def test_legacy_version_spellings(version: object) -> None:
    cp = normalize_checkpoint_record({**AFK_V1, "schema_version": version}, thread_id="t")
    assert cp.schema_version == CURRENT_SCHEMA_VERSION


@pytest.mark.parametrize("version", ["2", "v2", 2])
def test_current_version_spellings(version: object) -> None:
    cp = normalize_checkpoint_record({**V2, "schema_version": version})
    assert cp.seq == 7


def test_v2_record_does_not_borrow_thread_id_from_the_lookup() -> None:
    record = {k: v for k, v in V2.items() if k != "thread_id"}
    assert "missing required field 'thread_id'" in corruption(record, thread_id="thread-1")


def test_explicit_null_thread_id_in_v1_takes_the_lookup() -> None:
    cp = normalize_checkpoint_record({**AFK_V1, "thread_id": None}, thread_id="t")
    assert cp.thread_id == "t"


@pytest.mark.parametrize(
    ("alias", "canonical", "value"),
    [
        ("runId", "run_id", "run-1"),
        ("threadId", "thread_id", "thread-5"),
        ("data", "payload", {"model": "m"}),
    ],
)
def test_legacy_alias(alias: str, canonical: str, value: object) -> None:
    record = {**AFK_V1, "thread_id": "thread-5"}
    record.pop(canonical)
    record[alias] = value
    cp = normalize_checkpoint_record(record, thread_id="thread-5", run_id="run-1")
    assert getattr(cp, canonical) == value
    assert alias not in cp.to_record()  # aliases become the canonical field, not extras


@pytest.mark.parametrize("alias", ["schemaVersion", "version"])
def test_version_alias_is_read(alias: str) -> None:
    legacy = {k: v for k, v in AFK_V1.items() if k != "schema_version"}
    cp = normalize_checkpoint_record({**legacy, alias: "v1"}, thread_id="t")
    assert cp.schema_version == CURRENT_SCHEMA_VERSION
    assert alias not in cp.to_record()
    # The alias really is the version: a current one stops the v1 thread_id fallback,
    # and a future one is refused.
    message = corruption({**legacy, alias: "2"}, thread_id="t")
    assert "missing required field 'thread_id'" in message
    assert "newer than this library" in corruption({**legacy, alias: "v3"}, thread_id="t")


def test_camel_case_record_as_a_whole() -> None:
    record = {
        "schemaVersion": "v1",
        "runId": "r1",
        "threadId": "t1",
        "phase": "run_started",
        "data": {"agent_name": "analyst"},
    }
    cp = normalize_checkpoint_record(record)
    assert (cp.run_id, cp.thread_id, cp.payload) == ("r1", "t1", {"agent_name": "analyst"})


def test_canonical_field_wins_over_its_alias() -> None:
    record = {**V2, "runId": "other-run", "data": {"ignored": True}}
    cp = normalize_checkpoint_record(record, run_id="run-1")
    assert cp.run_id == "run-1"
    assert cp.payload == V2["payload"]


def test_input_dict_is_not_mutated() -> None:
    record = {**AFK_V1, "runId": "x", "extra": [1]}
    before = copy.deepcopy(record)
    normalize_checkpoint_record(record, thread_id="t")
    assert record == before


@pytest.mark.parametrize(
    "encode",
    [
        pytest.param(lambda r: orjson.dumps(r), id="json-bytes"),
        pytest.param(lambda r: orjson.dumps(r).decode(), id="json-str"),
        pytest.param(lambda r: bytearray(orjson.dumps(r)), id="bytearray"),
        pytest.param(lambda r: memoryview(orjson.dumps(r)), id="memoryview"),
        pytest.param(lambda r: Codec().encode(r), id="envelope"),
        pytest.param(lambda r: Codec(compress_threshold=1).encode(r), id="zstd-envelope"),
    ],
)
def test_serialized_inputs(encode: Any) -> None:
    cp = normalize_checkpoint_record(encode(V2))
    assert cp.to_record() == V2


def test_checkpoint_instance_passes_through() -> None:
    cp = Checkpoint(run_id="r", thread_id="t", seq=1, phase=Phase.RUN_TERMINAL, payload={})
    assert normalize_checkpoint_record(cp, thread_id="t", run_id="r") == cp


def test_unknown_payload_and_top_level_keys_are_kept() -> None:
    record = {
        **V2,
        "payload": {**V2["payload"], "future_field": {"nested": [1, 2]}},
        "trace_id": "abc",
        "epoch": 99,  # shadows a property name: still kept as data
    }
    cp = normalize_checkpoint_record(orjson.dumps(record))
    assert cp.payload["future_field"] == {"nested": [1, 2]}
    assert cp.to_record() == record
    assert cp.epoch == 0  # the property still reads seq, not the extra key
    again = normalize_checkpoint_record(Codec().encode(cp.to_record()))
    assert again.to_record() == record


def test_runtime_snapshot_payload_with_pending_response_is_accepted() -> None:
    payload = {
        "messages": [{"role": "user", "content": "hi"}],
        "step": 2,
        "pending_llm_response": {
            "text": "",
            "tool_calls": [{"id": "c1", "tool_name": "search", "arguments": {"q": "x"}}],
            "provider_specific": "kept",
        },
        "unknown_counter": 3,
    }
    cp = normalize_checkpoint_record({**V2, "phase": "runtime_state", "payload": payload})
    assert cp.payload == payload
    snapshot = cp.typed_payload()
    assert snapshot.pending_llm_response.tool_calls[0].tool_name == "search"  # type: ignore[attr-defined]


@pytest.mark.parametrize("phase", [p.value for p in Phase])
def test_every_phase_reads_with_an_empty_payload(phase: str) -> None:
    assert normalize_checkpoint_record({**V2, "phase": phase, "payload": {}}).phase.value == phase


# -- rejected: nothing stored, not an object --------------------------------------------


def test_none_is_not_found_naming_the_run() -> None:
    with pytest.raises(CheckpointNotFoundError) as info:
        normalize_checkpoint_record(None, thread_id="t1", run_id="r1")
    assert "'r1'" in str(info.value)
    assert "'t1'" in str(info.value)


@pytest.mark.parametrize("raw", [[1, 2], 5, '"text"', b"[]", True, 2.5])
def test_non_object_is_rejected(raw: object) -> None:
    assert "must be a JSON object" in corruption(raw)


def test_non_string_top_level_key_is_rejected() -> None:
    message = corruption({**V2, 3: "x"})
    assert "3" in message
    assert "key" in message


@pytest.mark.parametrize(
    "raw",
    [b"{not json", "{", b"", "", b"\xff\xfe{}", b'{"run_id": "r"', b"\x00\x01"],
)
def test_invalid_json_is_rejected(raw: object) -> None:
    message = corruption(raw)
    assert "invalid JSON" in message or "empty" in message or "envelope" in message


# -- rejected: missing and malformed fields ---------------------------------------------


@pytest.mark.parametrize("field", ["run_id", "thread_id", "phase", "payload"])
def test_missing_required_field_is_named(field: str) -> None:
    record = {k: v for k, v in V2.items() if k != field}
    assert f"missing required field {field!r}" in corruption(record)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("run_id", 5),
        ("run_id", ""),
        ("run_id", None),
        ("thread_id", 5),
        ("thread_id", ""),
        ("thread_id", ["t"]),
        ("phase", 3),
        ("phase", ""),
        ("phase", None),
    ],
)
def test_string_field_with_wrong_type_is_named(field: str, value: object) -> None:
    message = corruption({**V2, field: value})
    assert repr(field) in message
    assert "non-empty string" in message


@pytest.mark.parametrize("field", ["seq", "step", "timestamp_ms"])
@pytest.mark.parametrize("value", [-1, "3", 1.5, True, [1], {}])
def test_integer_field_with_wrong_type_is_named(field: str, value: object) -> None:
    message = corruption({**V2, field: value})
    assert repr(field) in message
    assert "non-negative integer" in message


@pytest.mark.parametrize("phase", ["pre_lunch", "PRE_LLM", "checkpoint", "run_started "])
def test_unknown_phase_lists_the_valid_ones(phase: str) -> None:
    message = corruption({**V2, "phase": phase})
    assert f"unknown phase {phase!r}" in message
    assert "run_terminal" in message  # says what would be valid


@pytest.mark.parametrize("payload", [[], "text", 5, None, True])
def test_non_dict_payload_is_named(payload: object) -> None:
    message = corruption({**V2, "payload": payload})
    assert "'payload' must be a JSON object" in message
    assert type(payload).__name__ in message


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({"pending_llm_response": "not a response"}, "payload.pending_llm_response"),
        ({"pending_llm_response": {"tool_calls": [{"id": "c1"}]}}, "tool_name"),
        ({"pending_llm_response": {"tool_calls": "call"}}, "payload.pending_llm_response"),
        ({"messages": "hello"}, "payload.messages"),
        ({"step": "three"}, "payload.step"),
        ({"usage": [1, 2]}, "payload.usage"),
    ],
)
def test_malformed_runtime_snapshot_payload_names_the_path(
    payload: dict[str, Any], expected: str
) -> None:
    message = corruption({**V2, "phase": "runtime_state", "payload": payload})
    assert "runtime_state payload is malformed" in message
    assert expected in message


def test_malformed_phase_payload_names_the_field() -> None:
    message = corruption({**V2, "phase": "run_terminal", "payload": {"terminal_result": "done"}})
    assert "run_terminal payload is malformed" in message
    assert "payload.terminal_result" in message


# -- rejected: another run or thread, versions ------------------------------------------


def test_record_of_another_run_is_rejected() -> None:
    message = corruption({**V2, "run_id": "run-2"}, thread_id="thread-1", run_id="run-1")
    assert "belongs to run 'run-2'" in message
    assert "'run-1'" in message


def test_record_of_another_thread_is_rejected() -> None:
    message = corruption({**V2, "thread_id": "thread-2"}, thread_id="thread-1", run_id="run-1")
    assert "belongs to thread 'thread-2'" in message


@pytest.mark.parametrize("version", ["v3", "3", 3, "V3", "v99", "0003"])
def test_future_version_says_upgrade(version: object) -> None:
    message = corruption({**V2, "schema_version": version})
    assert "newer than this library reads" in message
    assert "upgrade checkpoint-stores" in message


@pytest.mark.parametrize("version", ["banana", "", "v", "2.0", "v0", "0", "-1", "v1.5", "\uff12"])
def test_garbage_version_is_unknown(version: str) -> None:
    message = corruption({**V2, "schema_version": version})
    assert "unknown schema_version" in message
    assert repr(version) in message


@pytest.mark.parametrize("version", [True, 2.0, [2], {"v": 2}])
def test_version_of_wrong_type_is_rejected(version: object) -> None:
    message = corruption({**V2, "schema_version": version})
    assert "schema_version must be a string" in message


# -- rejected: damaged envelopes ---------------------------------------------------------


def test_truncated_envelope_at_every_length() -> None:
    data = Codec().encode(V2)
    for length in range(len(data)):
        with pytest.raises(AgentCheckpointCorruptionError):
            normalize_checkpoint_record(data[:length])


def test_bit_flipped_envelope_at_every_bit() -> None:
    data = Codec().encode(V2)
    for bit in range(len(data) * 8):
        flipped = bytearray(data)
        flipped[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(AgentCheckpointCorruptionError):
            normalize_checkpoint_record(bytes(flipped))


def test_damaged_envelope_messages_say_what_is_wrong() -> None:
    data = Codec().encode(V2)
    assert "truncated" in corruption(data[:-3], run_id="run-1")
    body_flip = bytearray(data)
    body_flip[-2] ^= 0x04
    assert "checksum mismatch" in corruption(bytes(body_flip))
    # A valid checksum over a body that is not JSON: still rejected, never returned.
    body = b'{"run_id": '
    header = data[:5] + zlib.crc32(body).to_bytes(4, "big") + len(body).to_bytes(4, "big")
    assert "invalid JSON" in corruption(header + body)
