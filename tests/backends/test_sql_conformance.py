"""The conformance kit, every group, against PostgreSQL (asyncpg and psycopg), SQLite, MariaDB.

The backdoor damages the value column with a direct UPDATE, below the SPI
(the head's seq stays as it was), so the kit proves the codec's checks catch
damage the database hands back.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import update

from checkpoint_stores import StorageBackend
from checkpoint_stores.backends.sql import SQLBackend
from tests.kit_support import ServerConformance
from tests.support import ServerInfo


class _SQLConformance(ServerConformance):
    """Shared backdoor: rewrite the row's value in SQL, keeping its seq."""

    async def backdoor_corrupt(
        self,
        backend: StorageBackend,
        thread_id: str,
        key: str,
        mutate: Callable[[bytes], bytes],
    ) -> None:
        assert isinstance(backend, SQLBackend)
        value = await backend.get(thread_id, key)
        if value is None:
            raise LookupError(f"backdoor_corrupt: nothing stored under {key!r}")
        _, writer = await backend._engines()
        table = backend.table
        stmt = (
            update(table)
            .where(
                table.c.thread_id == thread_id.encode("utf-8"),
                table.c.state_key == key.encode("utf-8"),
            )
            .values(value=mutate(value))
        )
        async with writer.begin() as conn:
            assert (await conn.execute(stmt)).rowcount == 1


@pytest.mark.sql
class TestPostgresConformance(_SQLConformance):
    server_fixture = "postgres_server"


@pytest.mark.sql
class TestPostgresPsycopgConformance(_SQLConformance):
    """psycopg 3 runs through SQLAlchemy's generic execution path (no asyncpg fast path)."""

    server_fixture = "postgres_server"

    @pytest.fixture(scope="class")
    @classmethod
    def store_url(cls, server: ServerInfo) -> str:
        return server.url.replace("+asyncpg", "+psycopg")


@pytest.mark.sql
class TestSQLiteConformance(_SQLConformance):
    server_fixture = "sqlite_server"


@pytest.mark.sql
class TestMariaDBConformance(_SQLConformance):
    server_fixture = "mariadb_server"
