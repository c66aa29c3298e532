"""URLs: schemes, and secrets that never reach a repr or an error message."""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_stores import (
    BackendNotFoundError,
    BackendRegistry,
    MissingDependencyError,
    get_registry,
    open_backend,
    open_store,
)
from checkpoint_stores.urls import redact_url, scheme_of

SECRET = "hunter2-s3cr3t"


def full_text(exc: BaseException) -> str:
    """The exception as a user would see it: message, chained causes and traceback."""
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


@pytest.fixture
def registry() -> Iterator[BackendRegistry]:
    """The global registry, reloaded afterwards so schemes added here do not leak."""
    yield get_registry()
    get_registry(reload=True)


# -- redact_url ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            f"postgresql+asyncpg://app:{SECRET}@db:5432/runs?sslmode=require",
            "postgresql+asyncpg://app:***@db:5432/runs?sslmode=require",
        ),
        (f"redis://:{SECRET}@localhost:6379/0", "redis://:***@localhost:6379/0"),
        (f"rediss://default:{SECRET}@cache:6380", "rediss://default:***@cache:6380"),
        (
            f"mongodb://root:{SECRET}@h1:27017,h2:27017/db?replicaSet=rs0",
            "mongodb://root:***@h1:27017,h2:27017/db?replicaSet=rs0",
        ),
        (
            f"mongodb+srv://u:{SECRET}@cluster.example.net/",
            "mongodb+srv://u:***@cluster.example.net/",
        ),
        ("redis://localhost:6379/0", "redis://localhost:6379/0"),
        ("redis://user@localhost:6379/0", "redis://user@localhost:6379/0"),
        ("file:///var/lib/runs", "file:///var/lib/runs"),
        ("file:///tmp/a:b@c", "file:///tmp/a:b@c"),  # a path, not credentials
        ("memory://", "memory://"),
        ("s3://bucket/prefix?region=eu-west-1", "s3://bucket/prefix?region=eu-west-1"),
    ],
)
def test_redact_password(url: str, expected: str) -> None:
    assert redact_url(url) == expected


@pytest.mark.parametrize(
    "password",
    [
        f"p@ss{SECRET}",  # unescaped '@'
        f"pa/{SECRET}",  # unescaped '/': would otherwise end the host part early
        f"pa?{SECRET}",
        f"pa#{SECRET}",
        f"a@b/{SECRET}",
        f"{SECRET}:more",
    ],
)
def test_redact_password_with_unescaped_delimiters(password: str) -> None:
    redacted = redact_url(f"redis://user:{password}@cache.internal:6379/0")
    assert SECRET not in redacted
    assert redacted == "redis://user:***@cache.internal:6379/0"


def test_redact_password_without_a_scheme() -> None:
    assert SECRET not in redact_url(f"user:{SECRET}@host")


@pytest.mark.parametrize(
    "param",
    [
        "password",
        "PASSWORD",
        "aws_secret_access_key",
        "aws_access_key_id",
        "access_key",
        "secret",
        "client_secret",
        "token",
        "aws_session_token",
        "sas_token",
        "X-Amz-Signature",
        "X-Amz-Credential",
        "api_key",
        "apiKey",
        "key",
        "sse_customer_key",
        "tlsCertificateKeyFilePassword",
    ],
)
def test_redact_secret_query_params(param: str) -> None:
    redacted = redact_url(f"s3://bucket/prefix?region=eu-west-1&{param}={SECRET}&n=1")
    assert SECRET not in redacted
    assert f"{param}=***" in redacted
    assert "region=eu-west-1" in redacted  # the rest stays readable
    assert "n=1" in redacted


def test_redact_secret_value_with_unescaped_hash() -> None:
    redacted = redact_url(f"s3://bucket/p?token=ab#{SECRET}&region=x")
    assert SECRET not in redacted
    assert "region=x" in redacted


def test_redact_both_password_and_query() -> None:
    redacted = redact_url(f"postgresql://u:{SECRET}@h/db?password={SECRET}&application_name=x")
    assert SECRET not in redacted
    assert redacted == "postgresql://u:***@h/db?password=***&application_name=x"


def test_unparseable_url_is_still_masked() -> None:
    redacted = redact_url(f"redis://user:{SECRET}@[::1/0?token={SECRET}")
    assert SECRET not in redacted


# -- scheme_of --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "scheme"),
    [
        ("Redis://localhost", "redis"),
        ("postgresql+asyncpg://u@h/db", "postgresql+asyncpg"),
        ("file:///x", "file"),
        ("memory://", "memory"),
        ("s3://b", "s3"),
    ],
)
def test_scheme_of(url: str, scheme: str) -> None:
    assert scheme_of(url) == scheme


@pytest.mark.parametrize("url", [f"user:{SECRET}@host:6379", f"://u:{SECRET}@h", "", "/var/lib"])
def test_url_without_scheme_is_a_clear_error_without_secrets(url: str) -> None:
    with pytest.raises(ValueError, match="has no scheme") as info:
        scheme_of(url)
    assert "file:///var/lib/runs" in str(info.value)  # shows what a URL looks like
    assert SECRET not in full_text(info.value)


# -- secrets in errors from open_store / open_backend -------------------------------------------


def test_unknown_scheme_error_has_no_secret() -> None:
    with pytest.raises(BackendNotFoundError) as info:
        open_store(f"nosuchdb://admin:{SECRET}@db.internal/x?token={SECRET}")
    assert "nosuchdb" in str(info.value)
    assert SECRET not in full_text(info.value)


def test_missing_driver_error_has_no_secret(registry: BackendRegistry) -> None:
    registry.add("fakedb", "checkpoint_stores_no_such_driver.backend:FakeBackend", extra="fakedb")
    with pytest.raises(MissingDependencyError) as info:
        open_store(f"fakedb://admin:{SECRET}@db.internal/x?password={SECRET}")
    message = str(info.value)
    assert 'pip install "checkpoint-stores[fakedb]"' in message
    assert SECRET not in full_text(info.value)


def test_missing_no_scheme_error_has_no_secret() -> None:
    with pytest.raises(ValueError, match="no scheme") as info:
        open_backend(f"admin:{SECRET}@db.internal:5432")
    assert SECRET not in full_text(info.value)


def test_file_url_with_a_host_error_has_no_secret() -> None:
    with pytest.raises(ValueError, match="names a host") as info:
        open_store(f"file://admin:{SECRET}@fileserver/share")
    assert SECRET not in full_text(info.value)


def test_backend_that_is_not_a_storage_backend_error_has_no_secret(
    registry: BackendRegistry,
) -> None:
    registry.add("notabackend", lambda url, **options: object())
    with pytest.raises(
        BackendNotFoundError, match="does not implement the StorageBackend SPI"
    ) as info:
        open_backend(f"notabackend://u:{SECRET}@h")
    assert SECRET not in full_text(info.value)


def test_store_repr_and_url_are_redacted(tmp_path: Path, registry: BackendRegistry) -> None:
    registry.add("secretmem", lambda url, **options: open_backend("memory://"))
    store = open_store(f"secretmem://user:{SECRET}@host/db?api_key={SECRET}")
    assert SECRET not in repr(store)
    assert SECRET not in str(store.url)
    assert "user:***@host" in repr(store)
