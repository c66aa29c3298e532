"""Session fixtures for the SQL backend's servers (see tests/support.py:ServerInfo).

* ``postgres_server``: the machine's PostgreSQL on 127.0.0.1:5432, database
  ``test`` (or the server ``CHECKPOINT_STORES_TEST_POSTGRES_URL`` names), with
  a schema of its own for the session; at the end only that schema is dropped.
* ``sqlite_server``: a SQLite file in a session temp directory.
* ``mariadb_server``: the machine's MariaDB on 127.0.0.1:3306, database
  ``test`` (or ``CHECKPOINT_STORES_TEST_MARIADB_URL``), with a table name of
  its own for the session; at the end only that table and its migrations
  table are dropped.

Tests that need an empty namespace of their own (concurrent ``setup()`` from
several processes, migrations) use :func:`scratch_postgres_schema`,
:func:`scratch_mariadb_table` and a fresh SQLite path.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import ServerInfo, backend_unavailable

POSTGRES_ENV = "CHECKPOINT_STORES_TEST_POSTGRES_URL"
MARIADB_ENV = "CHECKPOINT_STORES_TEST_MARIADB_URL"
POSTGRES_URL = os.environ.get(POSTGRES_ENV, "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
MARIADB_URL = os.environ.get(MARIADB_ENV, "mysql+aiomysql://root@127.0.0.1:3306/test")


def unique_name(kind: str) -> str:
    """A schema or table name no other session uses (valid for the backend's name rule)."""
    return f"cs_test_{kind}_{uuid.uuid4().hex[:12]}"


def _pg_connect() -> Any:
    """A sync psycopg admin connection (autocommit) to the PostgreSQL the tests use."""
    import psycopg
    from sqlalchemy.engine import make_url

    url = make_url(POSTGRES_URL)
    return psycopg.connect(
        host=url.host or "127.0.0.1",
        port=url.port or 5432,
        user=url.username or "postgres",
        password=url.password if isinstance(url.password, str) else None,
        dbname=url.database or "test",
        connect_timeout=5,
        autocommit=True,
    )


def _maria_connect() -> Any:
    """A sync PyMySQL admin connection to the MariaDB the tests use."""
    import pymysql
    from sqlalchemy.engine import make_url

    url = make_url(MARIADB_URL)
    return pymysql.connect(
        host=url.host or "127.0.0.1",
        port=url.port or 3306,
        user=url.username or "root",
        password=url.password if isinstance(url.password, str) else "",
        database=url.database or "test",
        connect_timeout=5,
        autocommit=True,
    )


def postgres_version() -> str:
    """``server_version`` of the tests' PostgreSQL, or raise if it is unreachable."""
    with _pg_connect() as conn:
        return str(conn.execute("SHOW server_version").fetchone()[0])


def drop_postgres_schema(name: str) -> None:
    """Drop one schema this session created (and only that)."""
    assert name.startswith("cs_test_"), name
    with _pg_connect() as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def drop_mariadb_tables(*names: str) -> None:
    """Drop tables this session created (and only those)."""
    conn = _maria_connect()
    try:
        with conn.cursor() as cur:
            for name in names:
                assert name.startswith("cs_test_"), name
                cur.execute(f"DROP TABLE IF EXISTS `{name}`")
    finally:
        conn.close()


@contextlib.contextmanager
def scratch_postgres_schema() -> Iterator[str]:
    """A schema name nobody has created yet; dropped afterwards if anything created it."""
    try:
        postgres_version()
    except Exception as exc:
        backend_unavailable("postgres", f"no PostgreSQL at {POSTGRES_URL}: {exc}")
    name = unique_name("pg")
    try:
        yield name
    finally:
        drop_postgres_schema(name)


@contextlib.contextmanager
def scratch_mariadb_table() -> Iterator[str]:
    """A table name nobody has created yet; it and its migrations table are dropped afterwards."""
    try:
        _maria_connect().close()
    except Exception as exc:
        backend_unavailable("mariadb", f"no MariaDB at {MARIADB_URL}: {exc}")
    name = unique_name("my")
    try:
        yield name
    finally:
        drop_mariadb_tables(name, f"{name}_migrations")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[ServerInfo]:
    """PostgreSQL (asyncpg) with a schema of the session's own, dropped at the end."""
    try:
        version = postgres_version()
    except Exception as exc:
        backend_unavailable("postgres", f"no PostgreSQL at {POSTGRES_URL}: {exc}")
    schema = unique_name("pg")
    from sqlalchemy.engine import make_url

    where = make_url(POSTGRES_URL)
    try:
        yield ServerInfo(
            "postgres",
            POSTGRES_URL,
            {"schema": schema},
            description=f"PostgreSQL {version} on {where.host}:{where.port}, schema {schema}",
        )
    finally:
        drop_postgres_schema(schema)


@pytest.fixture(scope="session")
def sqlite_server(tmp_path_factory: pytest.TempPathFactory) -> ServerInfo:
    """A SQLite file (WAL) in a session temp directory."""
    try:
        import aiosqlite  # noqa: F401
    except ImportError as exc:
        backend_unavailable("sqlite", f"aiosqlite is not installed: {exc}")
    path: Path = tmp_path_factory.mktemp("sqlite-store") / "store.db"
    return ServerInfo("sqlite", f"sqlite+aiosqlite:///{path}", description=f"SQLite file {path}")


@pytest.fixture(scope="session")
def mariadb_server() -> Iterator[ServerInfo]:
    """MariaDB (aiomysql), database ``test``, a table of the session's own, dropped at the end."""
    try:
        conn = _maria_connect()
        with conn.cursor() as cur:
            cur.execute("SELECT VERSION()")
            version = str(cur.fetchone()[0])
        conn.close()
    except Exception as exc:
        backend_unavailable("mariadb", f"no MariaDB at {MARIADB_URL}: {exc}")
    table = unique_name("my")
    from sqlalchemy.engine import make_url

    where = make_url(MARIADB_URL)
    try:
        yield ServerInfo(
            "mariadb",
            MARIADB_URL,
            {"table": table},
            description=f"MariaDB {version} on {where.host}:{where.port}, table {table}",
        )
    finally:
        drop_mariadb_tables(table, f"{table}_migrations")
