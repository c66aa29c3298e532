"""PostgreSQL behind the loopback fault proxy: clear errors, recovery, no partial commit.

The backend talks to PostgreSQL through ``tests.faultproxy.FaultProxy``; the
proxy cuts connections (RST), refuses new ones, or swallows traffic. The URL
carries a password (trust auth ignores it) so every error message is checked
for redaction.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from sqlalchemy.engine import make_url

from checkpoint_stores import StoreUnavailableError, open_backend
from checkpoint_stores.backends.sql import SQLBackend
from tests.faultproxy import FaultProxy
from tests.support import ServerInfo

pytestmark = pytest.mark.sql

SECRET = "pw-s3cret-never-shown"


@pytest.fixture
def proxy(postgres_server: ServerInfo) -> Iterator[FaultProxy]:
    target = make_url(postgres_server.url)
    with FaultProxy(target.host or "127.0.0.1", target.port or 5432) as fault_proxy:
        yield fault_proxy


@pytest.fixture
async def backend(postgres_server: ServerInfo, proxy: FaultProxy) -> AsyncIterator[SQLBackend]:
    url = make_url(postgres_server.url).set(host="127.0.0.1", port=proxy.port, password=SECRET)
    b = open_backend(
        url.render_as_string(hide_password=False), timeout=2, **postgres_server.options
    )
    assert isinstance(b, SQLBackend)
    await b.setup()
    try:
        yield b
    finally:
        await b.close()


def assert_clear(error: StoreUnavailableError, proxy: FaultProxy, operation: str) -> None:
    message = str(error)
    assert SECRET not in message
    assert f":***@127.0.0.1:{proxy.port}/" in message
    assert f"{operation} failed" in message
    assert "retrying is safe" in message


async def test_cut_connections_fail_clearly_then_reconnect(
    backend: SQLBackend, proxy: FaultProxy
) -> None:
    t = f"cut-{uuid.uuid4().hex}"
    assert await backend.commit(t, [("rec:1", b"1")], "head", b"1", 1)
    proxy.cut()  # every pooled connection is now dead
    with pytest.raises(StoreUnavailableError) as info:
        await backend.commit(t, [("rec:2", b"2")], "head", b"2", 2)
    assert_clear(info.value, proxy, "commit")
    # The pool noticed: the next operation opens a fresh connection.
    assert await backend.get(t, "head") == b"1"
    assert await backend.commit(t, [("rec:2", b"2")], "head", b"2", 2)
    assert [k async for k, _ in backend.list(t)] == ["head", "rec:1", "rec:2"]
    # A read on a dead pooled connection is retried once on a fresh one, also when
    # several pooled connections died at once.
    proxy.cut()
    assert await backend.get(t, "head") == b"2"
    await asyncio.gather(*(backend.get(t, "head") for _ in range(6)))
    proxy.cut()
    assert await backend.get(t, "head") == b"2"


async def test_refused_server_fails_clearly_then_recovers(
    backend: SQLBackend, proxy: FaultProxy
) -> None:
    t = f"refuse-{uuid.uuid4().hex}"
    await backend.put(t, "k", b"v")
    proxy.refuse = True
    proxy.cut()
    for operation, call in [
        ("get", lambda: backend.get(t, "k")),
        ("put", lambda: backend.put(t, "k", b"new")),
        ("commit", lambda: backend.commit(t, [("r", b"x")], "head", b"h", 1)),
    ]:
        with pytest.raises(StoreUnavailableError) as info:
            await call()
        assert_clear(info.value, proxy, operation)
    proxy.recover()
    assert await backend.get(t, "k") == b"v"  # nothing of the failed writes landed
    assert await backend.get(t, "head") is None
    assert await backend.commit(t, [("r", b"x")], "head", b"h", 1)


async def test_blackholed_server_times_out_then_recovers(
    backend: SQLBackend, proxy: FaultProxy
) -> None:
    t = f"hole-{uuid.uuid4().hex}"
    assert await backend.commit(t, [], "head", b"1", 1)
    proxy.blackhole = True
    with pytest.raises(StoreUnavailableError) as info:
        await backend.get(t, "head")
    assert_clear(info.value, proxy, "get")
    assert "no answer within 2s" in str(info.value)
    with pytest.raises(StoreUnavailableError):
        await backend.commit(t, [("rec:2", b"2")], "head", b"2", 2)
    proxy.recover()
    # Timed-out connections are not reused: reads work again, and the swallowed
    # commit either happened whole or not at all.
    head = await backend.get(t, "head")
    assert head in (b"1", b"2")
    assert (await backend.get(t, "rec:2") is not None) == (head == b"2")


@pytest.mark.slow
async def test_cuts_mid_commit_never_leave_a_partial_commit(
    backend: SQLBackend, proxy: FaultProxy
) -> None:
    t = f"midcut-{uuid.uuid4().hex}"
    proxy.latency = 0.002  # widen the window in which a cut lands inside a statement
    stop = threading.Event()

    def cutter() -> None:
        rng = random.Random(7)
        while not stop.is_set():
            time.sleep(rng.uniform(0.02, 0.2))
            proxy.cut()

    thread = threading.Thread(target=cutter, daemon=True)
    thread.start()
    confirmed: list[int] = []
    messages: list[str] = []
    failures = 0
    try:
        for seq in range(1, 151):
            value = f"{seq}:".encode() + b"x" * 4096
            try:
                ok = await backend.commit(
                    t, [(f"rec:{seq:05d}", value), ("runtime", value)], "head", value, seq
                )
            except StoreUnavailableError as exc:
                messages.append(str(exc))
                failures += 1
                continue
            assert ok  # nobody else writes this run: a returned commit moved the head
            confirmed.append(seq)
    finally:
        stop.set()
        thread.join()
        proxy.recover()
    assert failures > 0, "the cutter never hit a commit: the test proved nothing"
    assert confirmed, "no commit got through between cuts"
    assert not [m for m in messages if SECRET in m or "commit failed" not in m]

    head = await backend.get(t, "head")
    assert head is not None
    head_seq = int(head.split(b":", 1)[0])
    assert head_seq >= max(confirmed)
    # The head names a record that exists, with the same bytes; the runtime copy too.
    assert await backend.get(t, f"rec:{head_seq:05d}") == head
    assert await backend.get(t, "runtime") == head
    records = [int(k[4:]) async for k, _ in backend.list(t, "rec:")]
    assert max(records) == head_seq  # no record of a commit whose head did not move
    assert set(confirmed) <= set(records)


@pytest.mark.parametrize("driver", ["asyncpg", "psycopg"])
async def test_delete_racing_an_in_flight_commit_leaves_nothing(
    postgres_server: ServerInfo, driver: str
) -> None:
    """A commit still in flight (a killed client's statement finishing on the server)
    while delete_thread runs: the delete must not leave that commit's records behind."""
    import asyncpg

    url = postgres_server.url.replace("+asyncpg", f"+{driver}")
    backend = open_backend(url, **postgres_server.options)
    assert isinstance(backend, SQLBackend)
    where = make_url(postgres_server.url)
    raw = await asyncpg.connect(
        host=where.host, port=where.port, user=where.username, database=where.database
    )
    t = f"race-{uuid.uuid4().hex}"
    try:
        assert await backend.commit(t, [("rec:1", b"1")], "head", b"1", 1)
        # The racing commit: the backend's own statement, on another connection,
        # inside a transaction held open so it keeps the head's row lock.
        fast = SQLBackend(postgres_server.url, **postgres_server.options)
        await fast.setup()
        compiled = fast._compiled_for(fast._s_commit)
        await fast.close()
        params = {
            "p_tid": t.encode(),
            "p_key": b"head",
            "p_value": b"2",
            "p_seq": 2,
            "p_keys": [b"rec:2"],
            "p_values": [b"2"],
        }
        in_flight = raw.transaction()
        await in_flight.start()
        assert await raw.fetchval(compiled.sql, *[params[n] for n in compiled.order]) == 1
        deleting = asyncio.create_task(backend.delete_thread(t))
        for _ in range(200):  # until the DELETE waits for the head's row lock
            # pg_stat_activity is snapshotted once per transaction: clear it each time.
            await raw.execute("SELECT pg_stat_clear_snapshot()")
            waiting = await raw.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE 'DELETE FROM%' AND pid <> pg_backend_pid()"
            )
            if waiting:
                break
            await asyncio.sleep(0.05)
        else:
            outcome = deleting.exception() if deleting.done() else "still running"
            pytest.fail(f"delete_thread never waited for the in-flight commit's lock: {outcome!r}")
        await in_flight.commit()
        removed = await deleting
        assert [k async for k, _ in backend.list(t)] == []
        assert removed == 3  # head, rec:1 and the racing commit's rec:2
    finally:
        await raw.close()
        await backend.close()
