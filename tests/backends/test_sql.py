"""The SQL backend against real servers: PostgreSQL (asyncpg), SQLite files, MariaDB.

Every test runs on all three (``sql_server`` is parametrized); each test uses
thread ids of its own inside the session's schema / file / table.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from checkpoint_stores import (
    Checkpoint,
    InvalidIdentifierError,
    Phase,
    StaleWriterError,
    ValueTooLargeError,
    open_backend,
    open_store,
)
from checkpoint_stores.backends.sql import SCHEMA_VERSION, SQLBackend
from tests.support import ServerInfo

pytestmark = pytest.mark.sql

SERVERS = ["postgres_server", "sqlite_server", "mariadb_server"]


@pytest.fixture(params=SERVERS)
def sql_server(request: pytest.FixtureRequest) -> ServerInfo:
    """Each SQL server fixture in turn."""
    server: ServerInfo = request.getfixturevalue(request.param)
    return server


@pytest.fixture
async def backend(sql_server: ServerInfo) -> AsyncIterator[SQLBackend]:
    """A set-up backend on the session's store; closed afterwards."""
    b = open_backend(sql_server.url, **sql_server.options)
    assert isinstance(b, SQLBackend)
    await b.setup()
    try:
        yield b
    finally:
        await b.close()


def tid(label: str = "t") -> str:
    """A thread id no other test uses."""
    return f"{label}-{uuid.uuid4().hex}"


async def keys_of(b: SQLBackend, thread: str, prefix: str = "") -> list[str]:
    return [k async for k, _ in b.list(thread, prefix)]


# -- basic SPI -------------------------------------------------------------------------


async def test_get_put_create_delete(backend: SQLBackend) -> None:
    t = tid()
    assert await backend.get(t, "k") is None
    await backend.put(t, "k", b"one")
    assert await backend.get(t, "k") == b"one"
    await backend.put(t, "k", b"two")  # upsert
    assert await backend.get(t, "k") == b"two"
    assert await backend.create(t, "c", b"first") is True
    assert await backend.create(t, "c", b"second") is False
    assert await backend.get(t, "c") == b"first"
    assert await backend.delete(t, "k") is True
    assert await backend.delete(t, "k") is False
    assert await backend.get(t, "k") is None
    assert await backend.get_many(t, ["c", "k", "c"]) == [b"first", None, b"first"]
    assert await backend.get_many(t, []) == []
    assert await backend.delete_thread(t) == 1
    assert await keys_of(backend, t) == []


async def test_values_are_kept_verbatim(backend: SQLBackend) -> None:
    t = tid()
    values = {
        "empty": b"",
        "nul": b"\x00" * 50,
        "json-nul": b'{"text": "\\u0000 tool output \x00"}',
        "binary": bytes(range(256)) * 4,
        "quotes": b"'\"\\%_;--",
    }
    for key, value in values.items():
        await backend.put(t, key, value)
    for key, value in values.items():
        assert await backend.get(t, key) == value
    assert dict([kv async for kv in backend.list(t)]) == values


HOSTILE = [
    "../etc/passwd",
    "a/b\\c",
    "{tag}",
    "*",
    "%",
    "_",
    "\\",
    "a%",
    "a_",
    "a\x00b",
    "\x00",
    "nul\x00",
    "A",
    "a",
    "a ",
    "a\t",
    "é",
    "e\u0301",
    "\uffff",
    "\U0001f600",
    "'; DROP TABLE x; --",
    ":",
    "..",
]


async def test_hostile_ids_round_trip_without_collisions(backend: SQLBackend) -> None:
    base = tid("hostile")
    for n, ident in enumerate(HOSTILE):
        await backend.put(base + ident, ident, f"{n}".encode())
    for n, ident in enumerate(HOSTILE):
        thread = base + ident
        assert await backend.get(thread, ident) == f"{n}".encode(), repr(ident)
        assert await keys_of(backend, thread) == [ident], repr(ident)
    threads = [t async for t in backend.list_threads(base)]
    assert threads == sorted(base + i for i in HOSTILE)
    # Keys inside one thread: all distinct, in Python (= UTF-8 byte) order.
    t = tid()
    for n, key in enumerate(HOSTILE):
        await backend.put(t, key, f"{n}".encode())
    assert await keys_of(backend, t) == sorted(HOSTILE)
    assert [v for _, v in [kv async for kv in backend.list(t)]] == [
        f"{HOSTILE.index(k)}".encode() for k in sorted(HOSTILE)
    ]


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        ("a%", ["a%", "a%b"]),
        ("a_", ["a_", "a_b"]),
        ("a\\", ["a\\", "a\\_"]),
        ("a", ["a", "a%", "a%b", "a\\", "a\\_", "a_", "a_b", "ab", "a\U0010ffff"]),
        ("a\U0010ffff", ["a\U0010ffff"]),
        ("", None),
        ("zz", []),
    ],
)
async def test_list_prefix_is_exact(
    backend: SQLBackend, prefix: str, expected: list[str] | None
) -> None:
    t = tid()
    keys = ["a", "a%", "a%b", "a_", "a_b", "a\\", "a\\_", "ab", "a\U0010ffff", "b", "A", "b%"]
    for key in keys:
        await backend.put(t, key, key.encode())
    want = sorted(keys) if expected is None else sorted(expected)
    assert await keys_of(backend, t, prefix) == want
    assert await backend.delete_prefix(t, prefix) == len(want)
    assert await keys_of(backend, t) == sorted(set(keys) - set(want))


async def test_list_pages_through_many_keys(backend: SQLBackend) -> None:
    t = tid()
    keys = [f"k:{n:04d}" for n in range(300)] + ["k:\x00", "k:\U0001f600"]
    random.shuffle(keys)
    for key in keys:
        await backend.put(t, key, key.encode())
    listed = [kv async for kv in backend.list(t, "k:")]
    assert [k for k, _ in listed] == sorted(keys)
    assert all(v == k.encode() for k, v in listed)


async def test_list_threads(backend: SQLBackend) -> None:
    base = tid("lt")
    names = [f"{base}/{n:04d}" for n in range(1005)] + [f"{base}%", f"{base}_x"]
    # Insert through one commit per thread would be slow; puts are enough here.
    await asyncio.gather(*(backend.put(name, "k", b"v") for name in names[:40]))
    for name in names[40:]:
        await backend.put(name, "k", b"v")
    listed = [t async for t in backend.list_threads(base)]
    assert listed == sorted(names)
    assert [t async for t in backend.list_threads(f"{base}%")] == [f"{base}%"]
    await backend.delete_thread(names[0])
    assert names[0] not in [t async for t in backend.list_threads(base)]


# -- commit ----------------------------------------------------------------------------


async def test_commit_moves_head_only_forward(backend: SQLBackend) -> None:
    t = tid()
    assert await backend.commit(t, [("rec:1", b"r1")], "head", b"h1", 1) is True
    assert await backend.commit(t, [("rec:2", b"r2")], "head", b"h2", 2) is True
    # Stale and equal seqs write nothing, records included.
    assert await backend.commit(t, [("rec:0", b"r0")], "head", b"h0", 1) is False
    assert await backend.commit(t, [("rec:x", b"rx"), ("rec:1", b"X")], "head", b"hx", 2) is False
    assert await backend.get(t, "head") == b"h2"
    assert await keys_of(backend, t) == ["head", "rec:1", "rec:2"]
    assert await backend.get(t, "rec:1") == b"r1"
    # A head written by plain put counts as lower than any seq.
    await backend.put(t, "head", b"manual")
    assert await backend.commit(t, [], "head", b"h-after-put", 0) is True
    assert await backend.get(t, "head") == b"h-after-put"
    # Fencing epochs live in the high bits of a 64-bit seq.
    big = (7 << 32) | 5
    assert await backend.commit(t, [("rec:e", b"e")], "head", b"epoch7", big) is True
    assert await backend.commit(t, [], "head", b"old-epoch", (6 << 32) | 99) is False
    assert await backend.get(t, "head") == b"epoch7"


async def test_commit_writes_overwrite_and_clear_seq(backend: SQLBackend) -> None:
    t = tid()
    assert await backend.commit(t, [("runtime", b"a")], "head", b"h1", 1)
    assert await backend.commit(t, [("runtime", b"b"), ("runtime", b"c")], "head", b"h2", 2)
    assert await backend.get(t, "runtime") == b"c"  # the later write of a key wins
    # A write naming the head is superseded by the head itself (written last).
    assert await backend.commit(t, [("head", b"ignored")], "head", b"h3", 3)
    assert await backend.get(t, "head") == b"h3"
    # A record key that was once a head (has a seq) is a plain record after a write.
    assert await backend.commit(t, [], "other-head", b"o", 50)
    assert await backend.commit(t, [("other-head", b"plain")], "head", b"h4", 4)
    assert await backend.commit(t, [], "other-head", b"o2", 1) is True


async def test_commit_rejects_seq_outside_bigint(backend: SQLBackend) -> None:
    t = tid()
    with pytest.raises(ValueError, match="64-bit"):
        await backend.commit(t, [("r", b"x")], "head", b"h", 1 << 63)
    assert await keys_of(backend, t) == []


async def test_concurrent_commits_keep_the_highest(backend: SQLBackend) -> None:
    t = tid()
    seqs = list(range(1, 61))
    random.shuffle(seqs)

    async def one(seq: int) -> bool:
        rec = f"rec:{seq:03d}"
        return await backend.commit(t, [(rec, f"r{seq}".encode())], "head", f"{seq}".encode(), seq)

    results = await asyncio.gather(*(one(s) for s in seqs))
    assert await backend.get(t, "head") == b"60"
    moved = {s for s, ok in zip(seqs, results, strict=True) if ok}
    assert 60 in moved
    # Exactly the commits that moved the head left a record: stale ones wrote nothing.
    records = {int(k[4:]) for k in await keys_of(backend, t, "rec:")}
    assert records == moved


async def test_create_race_has_one_winner(backend: SQLBackend) -> None:
    t = tid()
    results = await asyncio.gather(
        *(backend.create(t, "intent", f"{n}".encode()) for n in range(12))
    )
    assert results.count(True) == 1
    winner = results.index(True)
    assert await backend.get(t, "intent") == f"{winner}".encode()


# -- limits ------------------------------------------------------------------------------


async def test_key_length_limit_is_honest(backend: SQLBackend) -> None:
    limit = backend.capabilities.max_key_bytes
    t = tid()
    longest_key = "k" * (limit - 4) + "\U0001f600"  # exactly limit bytes, 4-byte char last
    assert len(longest_key.encode()) == limit
    await backend.put(t, longest_key, b"v")
    assert await backend.get(t, longest_key) == b"v"
    longest_thread = t + "x" * (limit - len(t))
    assert await backend.commit(longest_thread, [(longest_key, b"r")], "h", b"h", 1)
    assert await keys_of(backend, longest_thread) == ["h", longest_key]
    with pytest.raises(InvalidIdentifierError, match=f"at most {limit}"):
        await backend.put(t, longest_key + "k", b"v")
    with pytest.raises(InvalidIdentifierError, match=f"at most {limit}"):
        await backend.get(longest_thread + "x", "k")
    with pytest.raises(InvalidIdentifierError, match="surrogate"):
        await backend.put(t, "bad\ud800", b"v")
    with pytest.raises(InvalidIdentifierError, match="empty"):
        await backend.put("", "k", b"v")


async def test_value_limit_refuses_before_writing(backend: SQLBackend) -> None:
    t = tid()
    backend._max_value = 10  # the check, not the server: a huge value is not needed
    with pytest.raises(ValueTooLargeError, match="at most 10"):
        await backend.put(t, "k", b"x" * 11)
    with pytest.raises(ValueTooLargeError):
        await backend.commit(t, [("r", b"x" * 11)], "head", b"ok", 1)
    with pytest.raises(ValueTooLargeError):
        await backend.create(t, "c", b"x" * 11)
    assert await keys_of(backend, t) == []


async def test_large_value_at_the_declared_limit(sql_server: ServerInfo) -> None:
    """The declared max_value_bytes is really storable (MySQL: worst-case escaping)."""
    # PostgreSQL/SQLite declare 256 MiB: 20 MiB is proof enough; MariaDB's limit is tested exactly.
    size = 0 if sql_server.name == "mariadb" else 20 * 1024 * 1024
    b = open_backend(sql_server.url, **sql_server.options)
    assert isinstance(b, SQLBackend)
    await b.setup()
    try:
        size = size or b.capabilities.max_value_bytes or 0
        assert size > 1024 * 1024
        t = tid()
        value = b"\x00'\\" * (size // 3) + b"\x00" * (size % 3)  # every byte needs escaping
        assert len(value) == size
        assert await b.commit(t, [("rec", value)], "head", b"small", 1)
        assert await b.get(t, "rec") == value
        await b.put(t, "put", value)
        assert await b.get(t, "put") == value
        await b.delete_thread(t)
    finally:
        await b.close()


# -- facade, durability ------------------------------------------------------------------


async def test_store_round_trip_and_durability(sql_server: ServerInfo) -> None:
    thread = tid("facade\x00")
    async with open_store(sql_server.url, **sql_server.options) as store:
        for seq, phase in enumerate([Phase.RUN_STARTED, Phase.STEP_STARTED], start=1):
            await store.append(
                Checkpoint(
                    run_id="r1",
                    thread_id=thread,
                    seq=seq,
                    step=0,
                    phase=phase,
                    payload={"text": "tool output with \u0000 inside"},
                )
            )
        stale = Checkpoint(
            run_id="r1", thread_id=thread, seq=1, step=0, phase=Phase.PRE_LLM, payload={}
        )
        with pytest.raises(StaleWriterError):
            await store.append(stale)
    # A new store (new pool) sees everything written before close().
    async with open_store(sql_server.url, **sql_server.options) as store:
        latest = await store.latest(thread, "r1")
        assert latest.phase is Phase.STEP_STARTED
        assert latest.payload["text"] == "tool output with \u0000 inside"
        assert [cp.seq for cp in await store.history(thread, "r1")] == [1, 2]
        assert await store.list_runs(thread) == ["r1"]


async def test_setup_is_idempotent_and_versioned(backend: SQLBackend) -> None:
    await backend.setup()
    again = open_backend(backend.url, **_options_of(backend))
    await again.setup()
    await again.setup()
    await again.close()
    engine, _ = await backend._engines()
    from sqlalchemy import select

    async with engine.connect() as conn:
        rows = (await conn.execute(select(backend.migrations_table))).all()
    assert [row.version for row in rows] == list(range(1, SCHEMA_VERSION + 1))


def _options_of(b: SQLBackend) -> dict[str, Any]:
    options: dict[str, Any] = {"table": b.table_name}
    if b.schema is not None:
        options["schema"] = b.schema
    return options


async def test_repr_and_errors_hide_the_password() -> None:
    from tests.support import free_port

    port = free_port()  # nothing listens there
    url = f"postgresql+asyncpg://app:hunter2-secret@127.0.0.1:{port}/db"
    b = open_backend(url, timeout=2)
    assert "hunter2" not in repr(b)
    from checkpoint_stores import StoreUnavailableError

    with pytest.raises(StoreUnavailableError) as info:
        await b.setup()
    message = str(info.value)
    assert "hunter2" not in message
    assert f"postgresql+asyncpg://app:***@127.0.0.1:{port}/db" in message
    await b.close()
