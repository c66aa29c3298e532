"""Store URLs: the scheme that picks a backend, and redaction of secrets.

Secrets in URLs never appear in a repr, a log line or an error message:
everything user-facing goes through :func:`redact_url`.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = ["redact_url", "scheme_of"]

_SECRET_PARAM: Final = re.compile(
    r"(pass|secret|token|credential|signature|(^|_)key$|apikey|access_key)", re.IGNORECASE
)
_USERINFO: Final = re.compile(r"(?P<head>://[^/@:]*):(?P<pw>[^@/]*)@")
_MASK: Final = "***"


def scheme_of(url: str) -> str:
    """The lower-cased scheme of ``url`` (``"postgresql+asyncpg"`` for ``postgresql+asyncpg://...``).

    >>> scheme_of("Redis://localhost:6379/0")
    'redis'
    """
    scheme, sep, _ = url.partition("://")
    if not sep or not scheme:
        raise ValueError(
            f"store URL {redact_url(url)!r} has no scheme; write it like 'file:///var/lib/runs' "
            "or 'redis://localhost:6379/0'"
        )
    return scheme.strip().lower()


def redact_url(url: str) -> str:
    """``url`` with its password and secret-looking query parameters masked.

    >>> redact_url("postgresql+asyncpg://app:hunter2@db:5432/runs?sslmode=require")
    'postgresql+asyncpg://app:***@db:5432/runs?sslmode=require'
    >>> redact_url("s3://bucket/prefix?aws_secret_access_key=abc&region=eu-west-1")
    's3://bucket/prefix?aws_secret_access_key=***&region=eu-west-1'
    """
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, _, hostinfo = netloc.rpartition("@")
            user, colon, _pw = userinfo.partition(":")
            netloc = f"{user}:{_MASK}@{hostinfo}" if colon else netloc
        query = parts.query
        if query:
            pairs = parse_qsl(query, keep_blank_values=True)
            if any(_SECRET_PARAM.search(k) for k, _ in pairs):
                query = urlencode(
                    [(k, _MASK if _SECRET_PARAM.search(k) else v) for k, v in pairs], safe="*"
                )
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        # Unparseable: mask anything that looks like user:password@ and drop the query.
        return _USERINFO.sub(rf"\g<head>:{_MASK}@", url.split("?", 1)[0])
