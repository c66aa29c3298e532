"""The SQL backend across processes: concurrent setup, concurrent commits, a killed writer.

Each child is a fresh interpreter opening the same URL and options, the way
several workers of one application would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import inspect, select

from checkpoint_stores import open_backend
from checkpoint_stores.backends.sql import SCHEMA_VERSION, SQLBackend
from tests.servers.sql import (
    MARIADB_URL,
    POSTGRES_URL,
    scratch_mariadb_table,
    scratch_postgres_schema,
)
from tests.support import ServerInfo

pytestmark = pytest.mark.sql

CHILD = r"""
import asyncio, json, sys, time
from checkpoint_stores import open_backend

async def main():
    url, options, start, mode, arg = sys.argv[1:6]
    options, arg = json.loads(options), json.loads(arg)
    backend = open_backend(url, **options)
    time.sleep(max(0.0, float(start) - time.time()))  # line the processes up
    if mode == "setup":
        await backend.setup()
        print(json.dumps({"ok": True}))
    elif mode == "commits":
        moved = []
        for seq in arg["seqs"]:
            rec = f"rec:{seq:06d}"
            if await backend.commit(arg["thread"], [(rec, f"r{seq}".encode())], "head",
                                    f"{seq}".encode(), seq):
                moved.append(seq)
        print(json.dumps({"moved": moved}))
    elif mode == "forever":
        seq = 0
        while True:
            seq += 1
            rec = f"rec:{seq:06d}"
            value = (f"r{seq}:" + "x" * 20000).encode()
            await backend.commit(arg["thread"], [(rec, value), ("runtime", value)], "head",
                                 f"{seq}".encode(), seq)
            if seq == 3:
                print("running", flush=True)
    await backend.close()

asyncio.run(main())
"""


def spawn(
    url: str, options: dict[str, Any], start: float, mode: str, arg: Any
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, url, json.dumps(options), str(start), mode, json.dumps(arg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish(procs: list[subprocess.Popen[str]], timeout: float = 180) -> list[dict[str, Any]]:
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{err}"
        outputs.append(json.loads(out.strip().splitlines()[-1]))
    return outputs


@contextlib.contextmanager
def fresh_store(kind: str, tmp_path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """A URL and options naming an empty namespace: no schema, file or table exists yet."""
    if kind == "postgres":
        with scratch_postgres_schema() as schema:
            yield POSTGRES_URL, {"schema": schema}
    elif kind == "sqlite":
        path = tmp_path / f"fresh-{uuid.uuid4().hex[:8]}.db"
        assert not path.exists()
        yield f"sqlite+aiosqlite:///{path}", {}
    else:
        with scratch_mariadb_table() as table:
            yield MARIADB_URL, {"table": table}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["postgres", "sqlite", "mariadb"])
async def test_setup_from_four_processes_at_once(kind: str, tmp_path: Path) -> None:
    with fresh_store(kind, tmp_path) as (url, options):
        start = time.time() + 4.0  # every child has imported SQLAlchemy by then
        procs = [spawn(url, options, start, "setup", None) for _ in range(4)]
        assert finish(procs) == [{"ok": True}] * 4

        backend = open_backend(url, **options)
        assert isinstance(backend, SQLBackend)
        try:
            await backend.setup()
            engine, _ = await backend._engines()
            async with engine.connect() as conn:
                versions = (
                    await conn.execute(select(backend.migrations_table.c.version))
                ).scalars()
                assert list(versions) == list(range(1, SCHEMA_VERSION + 1))

                def tables(sync_conn: Any) -> list[str]:
                    names = inspect(sync_conn).get_table_names(schema=backend.schema)
                    return sorted(n for n in names if n.startswith(backend.table_name))

                names = await conn.run_sync(tables)
            assert names == sorted([backend.table_name, backend.table_name + "_migrations"])
            assert await backend.commit("t", [("r", b"v")], "head", b"h", 1)
        finally:
            await backend.close()


@pytest.mark.slow
@pytest.mark.parametrize("server", ["postgres_server", "sqlite_server", "mariadb_server"])
async def test_commits_from_four_processes(server: str, request: pytest.FixtureRequest) -> None:
    info: ServerInfo = request.getfixturevalue(server)
    thread = f"procs-{uuid.uuid4().hex}"
    per_process = 25
    start = time.time() + 4.0
    procs = [
        spawn(
            info.url,
            info.options,
            start,
            "commits",
            {"thread": thread, "seqs": [k * 4 + p + 1 for k in range(per_process)]},
        )
        for p in range(4)
    ]
    moved = [seq for out in finish(procs) for seq in out["moved"]]
    top = 4 * per_process
    assert top in moved
    backend = open_backend(info.url, **info.options)
    try:
        assert await backend.get(thread, "head") == f"{top}".encode()
        records = {int(k[4:]) async for k, _ in backend.list(thread, "rec:")}
        assert records == set(moved)  # stale commits wrote nothing, moved ones everything
    finally:
        await backend.close()


@pytest.mark.slow
@pytest.mark.parametrize("server", ["postgres_server", "sqlite_server", "mariadb_server"])
async def test_killed_writer_leaves_no_partial_commit(
    server: str, request: pytest.FixtureRequest
) -> None:
    info: ServerInfo = request.getfixturevalue(server)
    thread = f"kill-{uuid.uuid4().hex}"
    for _ in range(3):
        proc = spawn(info.url, info.options, time.time(), "forever", {"thread": thread})
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "running", proc.stderr.read() if proc.stderr else ""
        await asyncio.sleep(random.uniform(0.2, 0.8))  # kill at an arbitrary point of a commit
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        if proc.stdout:
            proc.stdout.close()
        if proc.stderr:
            proc.stderr.close()
        backend = open_backend(info.url, **info.options)
        try:
            head = await backend.get(thread, "head")
            assert head is not None
            seq = int(head)
            record = await backend.get(thread, f"rec:{seq:06d}")
            assert record is not None
            assert record.startswith(f"r{seq}:".encode())
            assert await backend.get(thread, "runtime") == record
            later = [k async for k, _ in backend.list(thread, "rec:") if int(k[4:]) > seq]
            assert later == []  # no record of a commit whose head did not move
            await backend.delete_thread(thread)
        finally:
            await backend.close()
