"""Store URLs: the scheme that picks a backend, and redaction of secrets.

Secrets in URLs never appear in a repr, a log line or an error message:
everything user-facing goes through :func:`redact_url`.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import parse_qsl, urlencode

__all__ = ["redact_url", "scheme_of"]

_SECRET_PARAM: Final = re.compile(
    r"(pass|secret|token|credential|signature|(^|_)key$|apikey|access_key)", re.IGNORECASE
)
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
    scheme, sep, rest = url.partition("://")
    if not sep:  # "user:pw@host" typed without a scheme still holds a password
        scheme, rest = "", url
    colon, at = rest.find(":"), rest.rfind("@")
    if -1 < colon < at and not any(c in rest[:colon] for c in "/?#"):
        # user:password@ up to the last '@', not urlsplit's netloc: a password holding an
        # unescaped '/', '?', '#' or '@' would end the netloc early and leak its tail into
        # the path or query. Masking too much only hides a host; too little leaks a secret.
        url = f"{scheme}{sep}{rest[:colon]}:{_MASK}@{rest[at + 1 :]}"
    head, qmark, query = url.partition("?")
    if qmark:
        # The whole tail counts as the query (store URLs have no fragment), so an
        # unescaped '#' inside a secret value is masked with the rest of it.
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(_SECRET_PARAM.search(k) for k, _ in pairs):
            masked = [(k, _MASK if _SECRET_PARAM.search(k) else v) for k, v in pairs]
            url = f"{head}?{urlencode(masked, safe='*')}"
    # Rebuilt by hand, not with urlunsplit, so an unchanged URL stays byte-for-byte the same.
    return url
