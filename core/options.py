"""Backend options: one way to read flags, counts and durations, from keywords or a URL query.

Options reach a backend as keyword arguments or as strings (the URL's query
string, the CLI's ``-o key=value``), so each value is coerced here, once, with
an error that names the scheme, the option and what it accepts.

>>> option_bool("off", "fsync", scheme="file")
False
>>> option_seconds("2.5", "timeout", scheme="redis")
2.5
"""

from __future__ import annotations

import math
from typing import Any, Final

__all__ = [
    "option_bool",
    "option_float",
    "option_int",
    "option_optional_seconds",
    "option_seconds",
]

_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off", ""})
_NONE: Final = frozenset({"", "none", "null"})


def option_bool(value: Any, name: str, *, scheme: str) -> bool:
    """``value`` as a flag: a bool, or ``1/true/yes/on`` and ``0/false/no/off/''``."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{scheme} option {name}={value!r} is not a boolean; use true or false")


def option_int(value: Any, name: str, *, scheme: str, minimum: int = 0) -> int:
    """``value`` as an integer of at least ``minimum``."""
    if isinstance(value, bool):
        raise ValueError(f"{scheme} option {name}={value!r} is not an integer")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{scheme} option {name}={value!r} is not an integer") from None
    if number < minimum:
        raise ValueError(f"{scheme} option {name}={value!r} must be >= {minimum}")
    return number


def option_float(value: Any, name: str, *, scheme: str, minimum: float = 0.0) -> float:
    """``value`` as a finite number of at least ``minimum``."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not math.isfinite(number) or number < minimum:
        raise ValueError(f"{scheme} option {name}={value!r} must be a finite number >= {minimum:g}")
    return number


def option_seconds(value: Any, name: str, *, scheme: str) -> float:
    """``value`` as a duration in seconds (a finite number >= 0)."""
    return option_float(value, name, scheme=scheme)


def option_optional_seconds(value: Any, name: str, *, scheme: str) -> float | None:
    """Like :func:`option_seconds`, but ``None``, ``''``, ``'none'`` mean "not set"."""
    if value is None or (isinstance(value, str) and value.strip().lower() in _NONE):
        return None
    return option_seconds(value, name, scheme=scheme)
