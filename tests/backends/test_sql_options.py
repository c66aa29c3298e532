"""SQL backend configuration: drivers, options, SQLite pragmas, migrations, caller-owned engines."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, inspect, text
from sqlalchemy.ext.asyncio import create_async_engine

from checkpoint_stores import (
    Checkpoint,
    Phase,
    StoreUnavailableError,
    open_backend,
    open_store,
)
from checkpoint_stores.backends.sql import SCHEMA_VERSION, SQLBackend
from tests.servers.sql import MARIADB_URL, POSTGRES_URL, scratch_postgres_schema
from tests.support import ServerInfo

pytestmark = pytest.mark.sql


def sql_backend(url: str, **options: Any) -> SQLBackend:
    backend = open_backend(url, **options)
    assert isinstance(backend, SQLBackend)
    return backend


async def exercise_spi(backend: SQLBackend) -> None:
    """Every SPI call once, with the results a correct store gives."""
    t = f"spi-{uuid.uuid4().hex}\x00%_"
    await backend.put(t, "a", b"1")
    assert await backend.get(t, "a") == b"1"
    assert await backend.create(t, "c", b"x") is True
    assert await backend.create(t, "c", b"y") is False
    assert await backend.commit(t, [("rec:1", b"r1")], "head", b"h1", 5) is True
    assert await backend.commit(t, [("rec:2", b"r2")], "head", b"h2", 5) is False
    assert await backend.get_many(t, ["rec:1", "rec:2", "head"]) == [b"r1", None, b"h1"]
    assert [k async for k, _ in backend.list(t)] == ["a", "c", "head", "rec:1"]
    assert [k async for k, _ in backend.list(t, "rec")] == ["rec:1"]
    assert t in [x async for x in backend.list_threads(t[:10])]
    assert await backend.delete(t, "a") is True
    assert await backend.delete_prefix(t, "rec:") == 1
    assert await backend.delete_thread(t) == 2


# -- drivers ------------------------------------------------------------------------------


def test_plain_schemes_pick_the_async_drivers(tmp_path: Path) -> None:
    cases = {
        "postgresql://u:p@db/x": ("postgresql", "asyncpg"),
        "postgresql+psycopg://u@db/x": ("postgresql", "psycopg"),
        f"sqlite:///{tmp_path}/a.db": ("sqlite", "aiosqlite"),
        "mysql://root@db/x": ("mysql", "aiomysql"),
        "mariadb://root@db/x": ("mysql", "aiomysql"),
        "mysql+asyncmy://root@db/x": ("mysql", "asyncmy"),
    }
    for url, (family, driver) in cases.items():
        backend = sql_backend(url)
        assert (backend.family, backend.driver) == (family, driver), url


async def test_psycopg_driver(postgres_server: ServerInfo) -> None:
    url = POSTGRES_URL.replace("+asyncpg", "+psycopg")
    backend = sql_backend(url, **postgres_server.options)
    try:
        await exercise_spi(backend)
    finally:
        await backend.close()
    thread = f"psycopg-{uuid.uuid4().hex}"
    async with open_store(url, **postgres_server.options) as store:
        await store.append(
            Checkpoint(
                run_id="r", thread_id=thread, seq=1, phase=Phase.RUN_STARTED, payload={"a": 1}
            )
        )
        assert (await store.latest(thread, "r")).payload == {"a": 1}


async def test_pgbouncer_mode_works_with_statement_caches_off(postgres_server: ServerInfo) -> None:
    """Against PostgreSQL directly (no PgBouncer on the test machine): the mode's settings work."""
    backend = sql_backend(postgres_server.url, pgbouncer="true", **postgres_server.options)
    try:
        await exercise_spi(backend)
        engine, _ = await backend._engines()
        async with engine.connect() as conn:
            raw = await conn.get_raw_connection()
            driver = raw.driver_connection
            assert driver is not None
            # asyncpg keeps no statement cache, so nothing outlives a pooled transaction.
            assert driver._stmt_cache.get_max_size() == 0
            assert await conn.get_isolation_level() != "AUTOCOMMIT"
    finally:
        await backend.close()


# -- options ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["Bad", "x-y", "a;drop", "", "9lives", "t" * 60, "a b"])
def test_table_names_are_validated(name: str) -> None:
    with pytest.raises(ValueError, match="table name"):
        sql_backend("postgresql://u@db/x", table=name)


def test_option_errors_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="schema name"):
        sql_backend("postgresql://u@db/x", schema="Public")
    with pytest.raises(ValueError, match="schema is for PostgreSQL"):
        sql_backend(f"sqlite:///{tmp_path}/a.db", schema="s")
    with pytest.raises(TypeError, match="does not take options"):
        sql_backend("postgresql://u@db/x", tabel="x")
    with pytest.raises(ValueError, match="memory://"):
        sql_backend("sqlite://")
    with pytest.raises(ValueError, match="memory://"):
        sql_backend("sqlite:///:memory:")
    with pytest.raises(ValueError, match="not an asyncio driver"):
        SQLBackend("postgresql+psycopg2://u@db/x")  # a scheme only a direct caller can pass
    with pytest.raises(ValueError, match="true or false"):
        sql_backend("postgresql://u@db/x", pgbouncer="maybe")
    with pytest.raises(ValueError, match="sqlite_synchronous"):
        sql_backend(f"sqlite:///{tmp_path}/a.db", sqlite_synchronous="off")
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/b.db")
    with pytest.raises(ValueError, match="pass the URL"):
        sql_backend(f"sqlite:///{tmp_path}/b.db", engine=engine)


def test_options_from_the_query_string(tmp_path: Path) -> None:
    backend = sql_backend("postgresql://u:pw@db/x?table=runs&schema=agents&pgbouncer=1&ssl=require")
    assert (backend.table_name, backend.schema, backend._pgbouncer) == ("runs", "agents", True)
    # Our options are taken out; the driver's stay in the URL SQLAlchemy sees.
    assert dict(backend._sa_url.query) == {"ssl": "require"}
    assert "pw" not in repr(backend)
    lite = sql_backend(f"sqlite:///{tmp_path}/q.db?table=t1&sqlite_synchronous=normal")
    assert (lite.table_name, lite._synchronous) == ("t1", "NORMAL")


async def test_sqlite_pragmas(tmp_path: Path) -> None:
    for option, expected in [("full", 2), ("normal", 1)]:
        path = tmp_path / f"{option}.db"
        backend = sql_backend(f"sqlite:///{path}", sqlite_synchronous=option, sqlite_busy_timeout=7)
        try:
            await exercise_spi(backend)
            engine, _ = await backend._engines()
            async with engine.connect() as conn:
                mode = (await conn.exec_driver_sql("PRAGMA journal_mode")).scalar()
                sync = (await conn.exec_driver_sql("PRAGMA synchronous")).scalar()
                busy = (await conn.exec_driver_sql("PRAGMA busy_timeout")).scalar()
            assert (mode, sync, busy) == ("wal", expected, 7000)
        finally:
            await backend.close()


async def test_sqlite_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    backend = sql_backend(f"sqlite:///{tmp_path}/no/such/dir/x.db")
    with pytest.raises(StoreUnavailableError, match=r"no/such/dir does not exist; create it"):
        await backend.setup()
    await backend.close()


async def test_mariadb_bad_password_is_redacted(mariadb_server: ServerInfo) -> None:
    url = MARIADB_URL.replace("root@", "root:wrong-pw-7f3a@")
    backend = sql_backend(url, **mariadb_server.options)
    with pytest.raises(StoreUnavailableError) as info:
        await backend.setup()
    assert "wrong-pw-7f3a" not in str(info.value)
    assert "root:***@" in str(info.value)
    await backend.close()


# -- migrations and caller-owned transactions/engines -----------------------------------


async def test_a_newer_schema_version_is_refused() -> None:
    with scratch_postgres_schema() as schema:
        backend = sql_backend(POSTGRES_URL, schema=schema)
        await backend.setup()
        engine, _ = await backend._engines()
        async with engine.begin() as conn:
            await conn.execute(
                insert(backend.migrations_table).values(
                    version=SCHEMA_VERSION + 1, description="from the future", applied_at_ms=0
                )
            )
        await backend.close()
        newer = sql_backend(POSTGRES_URL, schema=schema)
        with pytest.raises(StoreUnavailableError, match="upgrade checkpoint-stores"):
            await newer.setup()
        await newer.close()


async def test_migrate_inside_the_callers_transaction() -> None:
    with scratch_postgres_schema() as schema:
        engine = create_async_engine(POSTGRES_URL)
        backend = sql_backend(POSTGRES_URL, schema=schema, engine=engine)

        def tables(sync_conn: Any) -> list[str]:
            return sorted(inspect(sync_conn).get_table_names(schema=schema))

        try:
            async with engine.connect() as conn:
                await conn.begin()
                await conn.execute(text("SELECT 1"))  # the application's own work
                await backend.migrate(conn)
                assert await conn.run_sync(tables) == sorted(
                    [backend.table_name, backend.table_name + "_migrations"]
                )
                await conn.rollback()  # the schema goes with the caller's transaction
            async with engine.connect() as conn:
                has_schema = (
                    await conn.execute(
                        text("SELECT count(*) FROM pg_namespace WHERE nspname = :s"), {"s": schema}
                    )
                ).scalar()
            assert has_schema == 0
            async with engine.begin() as conn:
                await backend.migrate(conn)
            await exercise_spi(backend)
        finally:
            await backend.close()
            # The engine is the caller's: close() left it usable.
            async with engine.connect() as conn:
                assert (await conn.execute(text("SELECT 1"))).scalar() == 1
            await engine.dispose()


async def test_migrate_is_refused_on_mysql(mariadb_server: ServerInfo) -> None:
    backend = sql_backend(mariadb_server.url, **mariadb_server.options)
    engine = create_async_engine(MARIADB_URL)
    try:
        async with engine.connect() as conn:
            with pytest.raises(NotImplementedError, match="call setup"):
                await backend.migrate(conn)
    finally:
        await engine.dispose()


@pytest.mark.parametrize("isolation", ["AUTOCOMMIT", "REPEATABLE READ"])
async def test_callers_mariadb_engine(mariadb_server: ServerInfo, isolation: str) -> None:
    """A caller's engine, even an autocommitting one, still gets transactional commits."""
    engine = create_async_engine(MARIADB_URL, isolation_level=isolation)
    backend = sql_backend(mariadb_server.url, engine=engine, **mariadb_server.options)
    try:
        await exercise_spi(backend)
        t = f"callers-{uuid.uuid4().hex}"
        import asyncio

        results = await asyncio.gather(
            *(
                backend.commit(t, [(f"rec:{s:02d}", b"r")], "head", f"{s}".encode(), s)
                for s in range(1, 21)
            )
        )
        moved = {s for s, ok in zip(range(1, 21), results, strict=True) if ok}
        assert await backend.get(t, "head") == b"20"
        assert {int(k[4:]) async for k, _ in backend.list(t, "rec:")} == moved
    finally:
        await backend.close()
        async with engine.connect() as conn:
            assert (await conn.execute(text("SELECT 1"))).scalar() == 1
        await engine.dispose()


async def test_setup_needs_no_ddl_rights_once_migrated() -> None:
    """An application role with only table rights can open a store an administrator migrated."""
    from tests.servers.sql import _pg_connect

    with scratch_postgres_schema() as schema:
        admin = sql_backend(POSTGRES_URL, schema=schema)
        await admin.setup()
        await admin.close()
        role = f"cs_test_role_{uuid.uuid4().hex[:10]}"
        with _pg_connect() as conn:
            conn.execute(f'CREATE ROLE "{role}" LOGIN')
            conn.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
            conn.execute(
                f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "{schema}" '
                f'TO "{role}"'
            )
            conn.execute(f'REVOKE CREATE ON DATABASE test FROM "{role}"')
        try:
            app = sql_backend(POSTGRES_URL.replace("//postgres@", f"//{role}@"), schema=schema)
            try:
                await exercise_spi(app)
            finally:
                await app.close()
        finally:
            with _pg_connect() as conn:
                conn.execute(f'DROP OWNED BY "{role}"')
                conn.execute(f'DROP ROLE "{role}"')


def test_unparsable_url_is_refused_without_its_password() -> None:
    with pytest.raises(ValueError, match="cannot parse the SQL URL") as info:
        SQLBackend("postgresql://u:s3cret-pw@host:notaport/db")
    assert "s3cret-pw" not in str(info.value)
