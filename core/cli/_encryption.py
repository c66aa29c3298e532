"""Encryption keys for the operating commands: which environment variable holds them."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import click

from checkpoint_stores.codec import Codec
from checkpoint_stores.encryption import DEFAULT_KEYS_ENV, AESGCMCipher

F = TypeVar("F", bound=Callable[..., Any])

KEYS_ENV_HELP = (
    "Environment variable holding the encryption keys as 'id:BASE64[,id:BASE64...]' "
    f"(first = active). Default: {DEFAULT_KEYS_ENV}, when set."
)


def keys_env_option(func: F) -> F:
    """``--keys-env VAR``: where the store's encryption keys are (never the keys themselves)."""
    return click.option("--keys-env", "keys_env", metavar="VAR", help=KEYS_ENV_HELP)(func)


def cipher_from(var: str | None, *, default: bool = True) -> AESGCMCipher | None:
    """The cipher named by ``--keys-env`` (or the default variable when set and allowed).

    Keys are read from the environment so they never appear in a command line,
    a shell history or ``ps`` output.
    """
    if var is None:
        if not default or not os.environ.get(DEFAULT_KEYS_ENV, "").strip():
            return None
        var = DEFAULT_KEYS_ENV
    try:
        return AESGCMCipher.from_env(var)
    except ImportError as exc:
        raise click.ClickException(str(exc)) from None
    except (ValueError, TypeError) as exc:
        raise click.BadParameter(str(exc), param_hint="--keys-env") from None


def codec_from(var: str | None, *, default: bool = True) -> Codec | None:
    """A codec encrypting with the keys of ``var`` (``None``: the default codec)."""
    cipher = cipher_from(var, default=default)
    return None if cipher is None else Codec(cipher=cipher)


def printable(text: str) -> str:
    """An id as shown in a table: verbatim if printable, else its repr (NUL, escapes)."""
    return text if text.isprintable() else repr(text)
