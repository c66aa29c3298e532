"""Keys: AFK's exact formats, id validation, and exact prefix ranges."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from checkpoint_stores import (
    InvalidIdentifierError,
    checkpoint_key,
    checkpoint_latest_key,
    effect_key,
    runtime_key,
)
from checkpoint_stores.keys import (
    checkpoint_prefix,
    effect_prefix,
    parse_checkpoint_key,
    prefix_upper_bound,
    validate_key,
    validate_run_id,
    validate_thread_id,
    validate_tool_call_id,
)

HOSTILE_THREAD_IDS = [
    "../",
    "../../etc/passwd",
    "..",
    ".",
    "/",
    "a/b",
    "{tag}",
    "{",
    "}",
    "*",
    "?",
    "[a-z]",
    "%",
    "%2e%2e",
    "_",
    "a:b:c",
    "\x00",
    "nul\x00byte",
    "\\",
    "CON",
    "nul.txt",
    " ",
    "\n",
    "ümlaut",
    "🙂",
    "\U0010ffff",
]


# -- AFK key formats -----------------------------------------------------------------------


def test_afk_key_formats_exactly() -> None:
    assert checkpoint_latest_key("run-1") == "checkpoint:run-1:latest"
    assert checkpoint_key("run-1", 3, "pre_llm") == "checkpoint:run-1:3:pre_llm"
    assert checkpoint_key("run-1", 0, "run_started") == "checkpoint:run-1:0:run_started"
    assert runtime_key("run-1") == "checkpoint:run-1:runtime"
    assert effect_key("run-1", 2, "call_abc") == "effect:run-1:2:call_abc"
    assert checkpoint_prefix("run-1") == "checkpoint:run-1:"
    assert effect_prefix("run-1") == "effect:run-1:"


def test_prefixes_are_exact_for_similar_run_ids() -> None:
    assert not checkpoint_latest_key("run-10").startswith(checkpoint_prefix("run-1"))
    assert checkpoint_latest_key("run-1").startswith(checkpoint_prefix("run-1"))
    assert not effect_key("run-10", 1, "c").startswith(effect_prefix("run-1"))


@pytest.mark.parametrize(
    "build",
    [
        lambda v: checkpoint_latest_key(v),
        lambda v: runtime_key(v),
        lambda v: checkpoint_key(v, 1, "pre_llm"),
        lambda v: checkpoint_prefix(v),
        lambda v: effect_key(v, 1, "call"),
        lambda v: effect_key("run", 1, v),
    ],
)
@pytest.mark.parametrize("bad", ["a:b", ":", "run:", ":run"])
def test_colon_in_run_id_or_tool_call_id_is_rejected(build: object, bad: str) -> None:
    with pytest.raises(InvalidIdentifierError) as info:
        build(bad)  # type: ignore[operator]
    message = str(info.value)
    assert repr(bad) in message
    assert "contains ':'" in message
    assert "replace it" in message  # says what to do
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("bad", ["a\x00b", "tab\there", "line\n", "\x7f"])
def test_control_characters_in_run_ids_are_rejected(bad: str) -> None:
    with pytest.raises(InvalidIdentifierError, match="control character"):
        validate_run_id(bad)
    with pytest.raises(InvalidIdentifierError, match="control character"):
        validate_tool_call_id(bad)


@pytest.mark.parametrize("step", [-1, True, "3", 1.0, None])
def test_bad_step_is_rejected(step: object) -> None:
    with pytest.raises(InvalidIdentifierError, match="step must be a non-negative int"):
        checkpoint_key("run", step, "pre_llm")  # type: ignore[arg-type]
    with pytest.raises(InvalidIdentifierError, match="step must be a non-negative int"):
        effect_key("run", step, "call")  # type: ignore[arg-type]


def test_parse_checkpoint_key() -> None:
    assert parse_checkpoint_key("checkpoint:r1:latest") == ("r1", "latest")
    assert parse_checkpoint_key("checkpoint:r1:runtime") == ("r1", "runtime")
    assert parse_checkpoint_key("checkpoint:r1:4:post_llm") == ("r1", "4:post_llm")
    for not_a_key in ["effect:r1:1:c", "checkpoint:", "checkpoint:r1", "checkpoint::x", "other"]:
        assert parse_checkpoint_key(not_a_key) is None
    for run_id in ["r", "run-1", "ü", "{x}", "%", "a/b"]:
        assert parse_checkpoint_key(checkpoint_key(run_id, 7, "pre_llm")) == (run_id, "7:pre_llm")


# -- thread ids and keys ---------------------------------------------------------------------


@pytest.mark.parametrize("thread_id", HOSTILE_THREAD_IDS)
def test_hostile_thread_ids_and_keys_are_accepted_verbatim(thread_id: str) -> None:
    assert validate_thread_id(thread_id) == thread_id
    assert validate_key(thread_id) == thread_id


@pytest.mark.parametrize(
    "validate", [validate_thread_id, validate_key, validate_run_id, validate_tool_call_id]
)
def test_lone_surrogate_is_rejected_clearly(validate: object) -> None:
    with pytest.raises(InvalidIdentifierError) as info:
        validate("ab\ud800cd")  # type: ignore[operator]
    assert "not valid Unicode" in str(info.value)
    assert "lone surrogate" in str(info.value)


@pytest.mark.parametrize(
    "validate", [validate_thread_id, validate_key, validate_run_id, validate_tool_call_id]
)
@pytest.mark.parametrize(("value", "problem"), [("", "must not be empty"), (5, "must be a str")])
def test_empty_or_non_string_is_rejected(validate: object, value: object, problem: str) -> None:
    with pytest.raises(InvalidIdentifierError, match=problem):
        validate(value)  # type: ignore[operator]


def test_over_long_thread_id_counts_utf8_bytes() -> None:
    assert validate_thread_id("é" * 512) == "é" * 512  # 1024 bytes: the default limit
    with pytest.raises(InvalidIdentifierError) as info:
        validate_thread_id("é" * 512 + "x")
    message = str(info.value)
    assert "1025 bytes" in message
    assert "at most 1024" in message
    assert "hash long natural keys" in message  # says what to do
    assert validate_thread_id("x" * 10_000, max_bytes=10_000)
    with pytest.raises(InvalidIdentifierError, match="at most 9999"):
        validate_thread_id("x" * 10_000, max_bytes=9_999)


def test_over_long_run_id_is_rejected() -> None:
    assert validate_run_id("r" * 256)
    with pytest.raises(InvalidIdentifierError, match="257 bytes"):
        checkpoint_latest_key("r" * 257)
    with pytest.raises(InvalidIdentifierError, match="tool_call_id"):
        effect_key("r", 1, "c" * 257)


# -- prefix_upper_bound ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prefix", "bound"),
    [
        ("", None),
        ("a", "b"),
        ("abc", "abd"),
        ("a\x00", "a\x01"),
        ("checkpoint:r1:", "checkpoint:r1;"),
        ("\U0010ffff", None),
        ("\U0010ffff\U0010ffff", None),
        ("a\U0010ffff", "b"),
        ("\ud7ff", "\ue000"),  # skips the surrogate block: the bound must encode to UTF-8
        ("\uffff", "\U00010000"),
    ],
)
def test_prefix_upper_bound_cases(prefix: str, bound: str | None) -> None:
    assert prefix_upper_bound(prefix) == bound
    if bound is not None:
        bound.encode("utf-8")


# Few, edge-heavy characters so that random strings often share prefixes.
_EDGE_CHARS = st.sampled_from(
    [
        *("\x00", "\x01", "a", "b", "%", "_", "\x7f", "\x80", "\ud7ff", "\ue000", "\uffff"),
        *("\U00010000", "\U0010fffe", "\U0010ffff"),
    ]
)
_TEXT = st.text(alphabet=_EDGE_CHARS, max_size=6)


@settings(max_examples=1000, deadline=None)
@given(prefix=_TEXT, tail=_TEXT, other=_TEXT, related=st.booleans())
def test_prefix_upper_bound_is_an_exact_range(
    prefix: str, tail: str, other: str, related: bool
) -> None:
    candidate = prefix + tail if related else other
    bound = prefix_upper_bound(prefix)
    in_range = prefix <= candidate and (bound is None or candidate < bound)
    assert candidate.startswith(prefix) == in_range
    # The same holds in UTF-8 byte order (what byte-ordered indexes compare).
    raw, raw_prefix = candidate.encode(), prefix.encode()
    in_bytes = raw_prefix <= raw and (bound is None or raw < bound.encode())
    assert candidate.startswith(prefix) == in_bytes


@settings(max_examples=300, deadline=None)
@given(prefix=st.text(min_size=1), candidate=st.text())
def test_prefix_upper_bound_on_any_text(prefix: str, candidate: str) -> None:
    assume(not candidate.startswith(prefix))
    bound = prefix_upper_bound(prefix)
    assert not (prefix <= candidate and (bound is None or candidate < bound))
    extended = prefix_upper_bound(prefix + candidate)
    assert bound is None or extended is None or extended <= bound
