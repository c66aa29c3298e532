"""SQL (PostgreSQL): the backend against raw asyncpg running the same SQL, and against LangGraph.

* commit: ``SQLBackend.commit`` against raw asyncpg executing the very same
  statement (the data-modifying CTE, compiled by the engine's own dialect, so
  the text and the ``$n::BYTEA`` casts are identical) with the same
  parameters, one connection, autocommit, one operation at a time, for 1 KB
  and 100 KB records; every operation inserts a new record row and moves the
  head, as a run does.
* get: ``SQLBackend.get`` against raw asyncpg running the same SELECT.
* LangGraph: ``MemoryStore.append`` (codec, schema, the same commit) against
  ``AsyncPostgresSaver.aput`` (langgraph-checkpoint-postgres, psycopg 3)
  writing a comparable state -- one checkpoint whose ``messages`` channel holds
  a message of the same size (random base64 text), a new checkpoint id and
  channel version each time (so it too inserts new rows every time) -- on the
  same server. The ratio is LangGraph's time over ours (above 1: ours is
  faster); no target. Our side includes its default codec (orjson, checksum,
  zstd for bodies of 16 KiB and more); LangGraph's includes msgpack.
* SQLite and MariaDB commits are measured for context (no raw baseline).

Run: ``python -m benchmarks sql``. Uses the PostgreSQL at
``CHECKPOINT_STORES_TEST_POSTGRES_URL`` (default
``postgresql+asyncpg://postgres@127.0.0.1:5432/test``) in schemas of its own,
dropped afterwards; MariaDB at ``CHECKPOINT_STORES_TEST_MARIADB_URL`` in a
table of its own, dropped afterwards; SQLite in a temp directory.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import os
import tempfile
import uuid
from typing import Any

from benchmarks._harness import Report, Unavailable, compare, measure
from checkpoint_stores import Checkpoint, MemoryStore, Phase
from checkpoint_stores.keys import checkpoint_key, checkpoint_latest_key

SIZES = {"1 KB": 1024, "100 KB": 100 * 1024}
PG_URL = os.environ.get(
    "CHECKPOINT_STORES_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
)
MARIADB_URL = os.environ.get(
    "CHECKPOINT_STORES_TEST_MARIADB_URL", "mysql+aiomysql://root@127.0.0.1:3306/test"
)


async def main(report: Report) -> None:
    """Run the SQL comparisons."""
    try:
        import asyncpg
        from sqlalchemy.engine import make_url

        from checkpoint_stores.backends.sql import SQLBackend
    except ImportError as exc:
        raise Unavailable(
            f"SQLAlchemy/asyncpg are not installed ({exc}): "
            'pip install "checkpoint-stores[postgres]"'
        ) from None
    where = make_url(PG_URL)
    connect_args: dict[str, Any] = {
        "host": where.host or "127.0.0.1",
        "port": where.port or 5432,
        "user": where.username or "postgres",
        "database": where.database or "test",
    }
    if isinstance(where.password, str):
        connect_args["password"] = where.password
    try:
        raw = await asyncpg.connect(**connect_args, timeout=10)
    except (OSError, asyncpg.PostgresError) as exc:
        raise Unavailable(f"no PostgreSQL at {where.host}:{where.port}: {exc}") from None

    schema = f"cs_bench_{uuid.uuid4().hex[:10]}"
    backend = SQLBackend(PG_URL, schema=schema)
    store = MemoryStore(backend, url=PG_URL)
    try:
        await store.setup()
        await _postgres(report, backend, store, raw)
        await _langgraph(report, store, where, schema)
    finally:
        await store.close()
        await raw.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await raw.close()
    await _others(report)


async def _postgres(report: Report, backend: Any, store: MemoryStore, raw: Any) -> None:
    engine, _ = await backend._engines()
    compiled = backend._s_commit.compile(dialect=engine.dialect)
    commit_sql, order = str(compiled), list(compiled.positiontup)
    get_compiled = backend._s_get.compile(dialect=engine.dialect)
    get_sql, get_order = str(get_compiled), list(get_compiled.positiontup)
    thread_id = "bench-thread"
    tid = thread_id.encode()
    seqs = itertools.count(1)  # shared: ours and raw advance the same head
    for label, size in SIZES.items():
        run_id = f"run-{size}"
        head_key = checkpoint_latest_key(run_id)
        value = os.urandom(size)

        async def ours_commit(
            head_key: str = head_key, value: bytes = value, run: str = run_id
        ) -> None:
            seq = next(seqs)
            record = checkpoint_key(run, seq, Phase.PRE_LLM.value)
            assert await backend.commit(thread_id, [(record, value)], head_key, value, seq)

        async def raw_commit(
            head_key: str = head_key, value: bytes = value, run: str = run_id
        ) -> None:
            seq = next(seqs)
            record = checkpoint_key(run, seq, Phase.PRE_LLM.value)
            params = {
                "p_tid": tid,
                "p_key": head_key.encode(),
                "p_value": value,
                "p_seq": seq,
                "p_keys": [record.encode()],
                "p_values": [value],
            }
            assert await raw.fetchval(commit_sql, *[params[name] for name in order]) == 1

        await compare(
            report,
            "sql/postgresql",
            f"commit {label} (asyncpg)",
            ours_commit,
            raw_commit,
            note="raw: asyncpg, same CTE",
        )

        async def ours_get(head_key: str = head_key) -> None:
            assert await backend.get(thread_id, head_key) is not None

        get_params = {"p_tid": tid, "p_key": head_key.encode()}

        async def raw_get(get_params: dict[str, bytes] = get_params) -> None:
            assert await raw.fetchval(get_sql, *[get_params[n] for n in get_order]) is not None

        await compare(
            report, "sql/postgresql", f"get {label} (asyncpg)", ours_get, raw_get, ops=300
        )


def _message_state(size: int) -> dict[str, Any]:
    # Random base64, not "x" * size: our codec zstd-compresses bodies of 16 KiB and
    # more, and a repetitive payload would flatter it. Base64 still compresses ~25%.
    content = base64.b64encode(os.urandom(size))[:size].decode()
    return {"messages": [{"role": "tool", "content": content}]}


async def _langgraph(report: Report, store: MemoryStore, where: Any, schema: str) -> None:
    try:
        from langgraph.checkpoint.base import empty_checkpoint
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    except ImportError as exc:
        report.console.print(
            f"[yellow]LangGraph comparison not run: {exc}; "
            "pip install langgraph-checkpoint-postgres[/]"
        )
        return
    lg_schema = f"{schema}_lg"
    password = f":{where.password}" if isinstance(where.password, str) else ""
    conninfo = (
        f"postgresql://{where.username or 'postgres'}{password}@{where.host}:{where.port}/"
        f"{where.database}?options=-csearch_path%3D{lg_schema}"
    )
    import psycopg

    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as admin:
        await admin.execute(f'CREATE SCHEMA "{lg_schema}"')
        try:
            async with AsyncPostgresSaver.from_conn_string(conninfo) as saver:
                await saver.setup()
                await _langgraph_compare(report, store, saver, empty_checkpoint)
        finally:
            await admin.execute(f'DROP SCHEMA IF EXISTS "{lg_schema}" CASCADE')


async def _langgraph_compare(
    report: Report, store: MemoryStore, saver: Any, empty_checkpoint: Any
) -> None:
    counter = itertools.count(1)
    for label, size in SIZES.items():
        run_id = f"lg-run-{size}"
        thread_id = f"lg-thread-{size}"
        state = _message_state(size)

        async def ours_append(
            state: dict[str, Any] = state, run: str = run_id, thread: str = thread_id
        ) -> None:
            seq = next(counter)
            await store.append(
                Checkpoint(
                    run_id=run,
                    thread_id=thread,
                    seq=seq,
                    step=seq,
                    phase=Phase.POST_LLM,
                    payload=state,
                )
            )

        async def langgraph_aput(state: dict[str, Any] = state, thread: str = thread_id) -> None:
            n = next(counter)
            checkpoint = empty_checkpoint()
            checkpoint["id"] = str(uuid.uuid4())
            checkpoint["channel_values"] = dict(state)
            checkpoint["channel_versions"] = {"messages": f"{n:032d}"}
            config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
            await saver.aput(config, checkpoint, {"step": n}, {"messages": f"{n:032d}"})

        await compare(
            report,
            "sql/langgraph",
            f"append {label} vs AsyncPostgresSaver.aput",
            ours_append,
            langgraph_aput,
            target=None,
            note="ratio = LangGraph / ours",
        )


async def _others(report: Report) -> None:
    """SQLite and MariaDB commit times, for context."""
    from checkpoint_stores.backends.sql import SQLBackend

    value = os.urandom(1024)
    with tempfile.TemporaryDirectory() as tmp:
        stores = [("sqlite", SQLBackend(f"sqlite:///{tmp}/bench.db"), None)]
        table = f"cs_bench_{uuid.uuid4().hex[:10]}"
        stores.append(("mariadb", SQLBackend(MARIADB_URL, table=table), table))
        for name, backend, created in stores:
            try:
                await backend.setup()
            except Exception as exc:
                report.console.print(f"[yellow]{name} not measured: {exc}[/]")
                continue
            seqs = itertools.count(1)

            async def commit(backend: Any = backend, seqs: Any = seqs) -> None:
                seq = next(seqs)
                record = checkpoint_key("run", seq, Phase.PRE_LLM.value)
                assert await backend.commit("t", [(record, value)], "head", value, seq)

            try:
                await measure(report, f"sql/{name}", "commit 1 KB", commit, ops=100, rounds=5)
            finally:
                if created is not None:
                    with contextlib.suppress(Exception):
                        engine, _ = await backend._engines()
                        async with engine.begin() as conn:
                            await conn.exec_driver_sql(f"DROP TABLE IF EXISTS `{created}`")
                            await conn.exec_driver_sql(
                                f"DROP TABLE IF EXISTS `{created}_migrations`"
                            )
                await backend.close()
