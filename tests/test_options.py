"""Option coercion shared by every backend: flags, counts, durations, clear errors."""

from __future__ import annotations

import pytest

from checkpoint_stores.options import (
    option_bool,
    option_float,
    option_int,
    option_optional_seconds,
    option_seconds,
)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, True),
        (False, False),
        ("1", True),
        ("On", True),
        (" yes ", True),
        ("true", True),
        ("0", False),
        ("OFF", False),
        ("no", False),
        ("false", False),
        ("", False),
    ],
)
def test_flags(value: object, expected: bool) -> None:
    assert option_bool(value, "fsync", scheme="file://") is expected


@pytest.mark.parametrize("value", ["maybe", "2", "tru", None])
def test_a_flag_that_is_neither_says_what_it_accepts(value: object) -> None:
    with pytest.raises(ValueError, match=r"file:// option fsync=.* is not a boolean; use true"):
        option_bool(value, "fsync", scheme="file://")


def test_counts() -> None:
    assert option_int("7", "retries", scheme="redis://") == 7
    assert option_int(3, "pool_size", scheme="sql", minimum=1) == 3
    with pytest.raises(ValueError, match="must be >= 1"):
        option_int("0", "max_connections", scheme="redis://", minimum=1)
    for bad in ("seven", "1.5", True, None):
        with pytest.raises(ValueError, match="is not an integer"):
            option_int(bad, "retries", scheme="redis://")


def test_durations() -> None:
    assert option_seconds("2.5", "timeout", scheme="sql") == 2.5
    assert option_seconds(0, "timeout", scheme="sql") == 0.0
    for bad in ("-1", "nan", "inf", "soon", None, True):
        with pytest.raises(ValueError, match="must be a finite number >= 0"):
            option_seconds(bad, "timeout", scheme="sql")
    assert option_optional_seconds(None, "ttl", scheme="redis://") is None
    assert option_optional_seconds(" None ", "ttl", scheme="redis://") is None
    assert option_optional_seconds("", "ttl", scheme="redis://") is None
    assert option_optional_seconds("60", "ttl", scheme="redis://") == 60.0
    assert option_float("0.5", "ratio", scheme="x", minimum=0.1) == 0.5
    with pytest.raises(ValueError, match=r">= 0\.1"):
        option_float("0.05", "ratio", scheme="x", minimum=0.1)
