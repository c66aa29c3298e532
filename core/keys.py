"""AFK-compatible state keys and identifier validation.

Keys inside a thread, so AFK's ``get_state(thread_id, checkpoint_latest_key(run_id))``
reads what this library writes::

    checkpoint:{run_id}:latest               the full newest record of the run
    checkpoint:{run_id}:{step}:{phase}       each record
    checkpoint:{run_id}:runtime              the newest runtime snapshot record (O(1) resume)
    effect:{run_id}:{step}:{tool_call_id}    effect records

``run_id`` and ``tool_call_id`` never contain ``:`` (it would make keys
ambiguous). ``thread_id`` is opaque: any non-empty string of valid Unicode.
"""

from __future__ import annotations

import re
from typing import Final

from checkpoint_stores.errors import InvalidIdentifierError

__all__ = [
    "CHECKPOINT_PREFIX",
    "EFFECT_PREFIX",
    "checkpoint_key",
    "checkpoint_latest_key",
    "checkpoint_prefix",
    "effect_key",
    "effect_prefix",
    "parse_checkpoint_key",
    "prefix_upper_bound",
    "runtime_key",
    "validate_key",
    "validate_run_id",
    "validate_thread_id",
    "validate_tool_call_id",
]

CHECKPOINT_PREFIX: Final = "checkpoint:"
EFFECT_PREFIX: Final = "effect:"
LATEST_SUFFIX: Final = "latest"
RUNTIME_SUFFIX: Final = "runtime"

# Ids longer than this are refused by the facade unless a backend declares a
# smaller maximum (Capabilities.max_key_bytes). Real run ids are tens of bytes.
DEFAULT_MAX_ID_BYTES: Final = 1024

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _utf8_len(value: str, what: str) -> int:
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidIdentifierError(
            f"{what} {value!r} is not valid Unicode (it contains a lone surrogate); "
            "pass a string that encodes to UTF-8"
        ) from None


def _validate_text(value: object, what: str, max_bytes: int) -> str:
    if not isinstance(value, str):
        raise InvalidIdentifierError(f"{what} must be a str, got {type(value).__name__}")
    if not value:
        raise InvalidIdentifierError(f"{what} must not be empty")
    size = _utf8_len(value, what)
    if size > max_bytes:
        raise InvalidIdentifierError(
            f"{what} is {size} bytes in UTF-8; this store accepts at most {max_bytes}. "
            "Use a shorter id (hash long natural keys before using them as ids)"
        )
    return value


def validate_thread_id(thread_id: object, *, max_bytes: int = DEFAULT_MAX_ID_BYTES) -> str:
    """Return ``thread_id`` if usable, else raise :class:`InvalidIdentifierError`.

    Thread ids are opaque: ``/``, ``..``, ``{``, ``*``, ``%``, ``:`` and even NUL
    are allowed, and every backend stores them losslessly.
    """
    return _validate_text(thread_id, "thread_id", max_bytes)


def validate_key(key: object, *, max_bytes: int = DEFAULT_MAX_ID_BYTES) -> str:
    """Return a state key if usable, else raise :class:`InvalidIdentifierError`."""
    return _validate_text(key, "key", max_bytes)


def _validate_segment(value: object, what: str) -> str:
    text = _validate_text(value, what, DEFAULT_MAX_ID_BYTES // 4)
    if ":" in text:
        raise InvalidIdentifierError(
            f"{what} {text!r} contains ':', which separates key segments; "
            "choose an id without ':' (for example replace it with '-')"
        )
    if _CONTROL.search(text):
        raise InvalidIdentifierError(
            f"{what} {text!r} contains a control character; use printable characters only"
        )
    return text


def validate_run_id(run_id: object) -> str:
    """Return ``run_id`` if it can be a key segment (non-empty, no ``:``, printable)."""
    return _validate_segment(run_id, "run_id")


def validate_tool_call_id(tool_call_id: object) -> str:
    """Return ``tool_call_id`` if it can be a key segment (non-empty, no ``:``, printable)."""
    return _validate_segment(tool_call_id, "tool_call_id")


def _validate_step(step: object) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise InvalidIdentifierError(f"step must be a non-negative int, got {step!r}")
    return step


def checkpoint_latest_key(run_id: str) -> str:
    """Key of the run's newest full record: ``checkpoint:{run_id}:latest``."""
    return f"{CHECKPOINT_PREFIX}{validate_run_id(run_id)}:{LATEST_SUFFIX}"


def runtime_key(run_id: str) -> str:
    """Key of the run's newest runtime snapshot record: ``checkpoint:{run_id}:runtime``."""
    return f"{CHECKPOINT_PREFIX}{validate_run_id(run_id)}:{RUNTIME_SUFFIX}"


def checkpoint_key(run_id: str, step: int, phase: str) -> str:
    """Key of one record: ``checkpoint:{run_id}:{step}:{phase}``."""
    return f"{CHECKPOINT_PREFIX}{validate_run_id(run_id)}:{_validate_step(step)}:{phase}"


def checkpoint_prefix(run_id: str) -> str:
    """Prefix shared by every checkpoint key of one run: ``checkpoint:{run_id}:``."""
    return f"{CHECKPOINT_PREFIX}{validate_run_id(run_id)}:"


def effect_key(run_id: str, step: int, tool_call_id: str) -> str:
    """Key of one effect record: ``effect:{run_id}:{step}:{tool_call_id}``."""
    return (
        f"{EFFECT_PREFIX}{validate_run_id(run_id)}:{_validate_step(step)}:"
        f"{validate_tool_call_id(tool_call_id)}"
    )


def effect_prefix(run_id: str) -> str:
    """Prefix shared by every effect key of one run: ``effect:{run_id}:``."""
    return f"{EFFECT_PREFIX}{validate_run_id(run_id)}:"


def parse_checkpoint_key(key: str) -> tuple[str, str] | None:
    """Split a checkpoint key into ``(run_id, rest)``; ``None`` if it is not one.

    ``rest`` is ``"latest"``, ``"runtime"`` or ``"{step}:{phase}"``.
    """
    if not key.startswith(CHECKPOINT_PREFIX):
        return None
    run_id, sep, rest = key[len(CHECKPOINT_PREFIX) :].partition(":")
    if not sep or not run_id or not rest:
        return None
    return run_id, rest


def prefix_upper_bound(prefix: str) -> str | None:
    """Smallest string greater than every string that starts with ``prefix``.

    Lets a backend turn a prefix scan into an exact range query
    (``prefix <= key < bound``) instead of LIKE or a glob, so ``%``, ``_``,
    ``*`` or ``\\`` in a prefix never over-match. ``None`` means "no upper
    bound" (the empty prefix, or a prefix of only U+10FFFF). Python string
    order equals UTF-8 byte order, so the bound works for byte-ordered
    indexes too.
    """
    chars = list(prefix)
    while chars:
        last = ord(chars.pop())
        if last < 0x10FFFF:
            nxt = last + 1
            if 0xD800 <= nxt <= 0xDFFF:  # skip the surrogate block: not encodable
                nxt = 0xE000
            chars.append(chr(nxt))
            return "".join(chars)
    return None
