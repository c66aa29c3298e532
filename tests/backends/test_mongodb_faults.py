"""The MongoDB backend under network faults (loopback TCP proxy) and a killed server.

What must hold: a fault surfaces as :class:`StoreUnavailableError` naming the
URL with the password masked; the same backend object works again once the
network is back; and a commit is never partial: after any fault, the records
and the head of one commit are all there or none is.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from checkpoint_stores.backends.mongodb import MongoBackend
from checkpoint_stores.errors import StoreUnavailableError
from tests.faultproxy import FaultProxy
from tests.support import ServerInfo, child_process, free_port, python_child, wait_port

pytestmark = pytest.mark.mongodb

# Short driver timeouts so faults surface in seconds; directConnection keeps the
# driver on the proxy (otherwise it follows the replica set's advertised host).
_FAST = (
    "directConnection=true&serverSelectionTimeoutMS=1500&socketTimeoutMS=1500&connectTimeoutMS=1500"
)


_USER, _PASSWORD = "cs_fault_app", "pa55word"


def _via(proxy: FaultProxy, server_url: str, collection: str, password: str = _PASSWORD) -> str:
    parts = urlsplit(server_url)
    return (
        f"mongodb://{_USER}:{password}@127.0.0.1:{proxy.port}{parts.path}"
        f"?{_FAST}&authSource=admin&collection={collection}"
    )


@pytest.fixture(scope="module")
def fault_user(mongodb_server: ServerInfo) -> Iterator[None]:
    """A user with a password on the session's SecantusDB, so URLs carry a real secret."""
    if "SecantusDB" not in mongodb_server.description:
        pytest.skip("fault tests run against the session's SecantusDB")
    from pymongo import MongoClient
    from pymongo.errors import OperationFailure

    client: MongoClient[dict[str, object]] = MongoClient(mongodb_server.url)
    try:
        try:
            client.admin.command("createUser", _USER, pwd=_PASSWORD, roles=["root"])
        except OperationFailure as exc:
            if exc.code != 51003:  # already exists (another module run in this session)
                raise
        yield
        client.admin.command("dropUser", _USER)
    finally:
        client.close()


@pytest.fixture
def proxy(mongodb_server: ServerInfo) -> Iterator[FaultProxy]:
    parts = urlsplit(mongodb_server.url)
    if parts.hostname is None or parts.port is None or "," in parts.netloc:
        pytest.skip("the fault proxy needs a single host:port server URL")
    with FaultProxy(parts.hostname, parts.port) as fault_proxy:
        yield fault_proxy


@pytest.fixture
async def backend(
    mongodb_server: ServerInfo, proxy: FaultProxy, fault_user: None, request: pytest.FixtureRequest
) -> AsyncIterator[MongoBackend]:
    collection = f"faults_{request.node.name[:20]}_{os.getpid()}"
    b = MongoBackend(_via(proxy, mongodb_server.url, collection))
    await b.setup()
    yield b
    proxy.recover()
    assert b._coll is not None
    await b._coll.drop()
    await b.close()


def _unavailable_ok(exc: StoreUnavailableError) -> None:
    message = str(exc)
    assert _PASSWORD not in message
    assert f"{_USER}:***@127.0.0.1" in message


async def test_wrong_password_is_a_clear_error_without_it(
    mongodb_server: ServerInfo, proxy: FaultProxy, fault_user: None
) -> None:
    b = MongoBackend(_via(proxy, mongodb_server.url, "never", password="Wr0ngPass"))
    with pytest.raises(StoreUnavailableError, match="authentication") as info:
        await b.setup()
    assert "Wr0ngPass" not in str(info.value)
    assert "Wr0ngPass" not in repr(b)
    await b.close()


async def test_refused_connections_are_clear_errors_and_recover(
    backend: MongoBackend, proxy: FaultProxy
) -> None:
    await backend.put("t", "k", b"before")
    proxy.refuse = True
    proxy.cut()
    for attempt in (backend.get("t", "k"), backend.put("t", "k", b"during")):
        with pytest.raises(StoreUnavailableError, match="unreachable") as info:
            await attempt
        _unavailable_ok(info.value)
    with pytest.raises(StoreUnavailableError):
        await backend.commit("t", [("r", b"1")], "head", b"h", 1)
    proxy.recover()
    # The same backend object recovers: no reopen needed.
    assert await backend.get("t", "k") == b"before"
    assert await backend.get_many("t", ["r", "head"]) == [None, None]
    assert await backend.commit("t", [("r", b"1")], "head", b"h", 1) is True


async def test_a_blackholed_server_times_out_then_recovers(
    backend: MongoBackend, proxy: FaultProxy
) -> None:
    await backend.put("t", "k", b"v")
    proxy.blackhole = True
    start = time.monotonic()
    with pytest.raises(StoreUnavailableError) as info:
        await backend.commit("t", [("r", b"1")], "head", b"h1", 1)
    _unavailable_ok(info.value)
    assert time.monotonic() - start < 120  # bounded by the driver's timeouts, not hanging
    proxy.recover()
    # The timed-out commit may have reached the server; it is all there or not at all.
    values = await backend.get_many("t", ["r", "head"])
    assert values in ([None, None], [b"1", b"h1"])
    assert await backend.get("t", "k") == b"v"


async def test_cut_connections_are_retried_transparently(
    backend: MongoBackend, proxy: FaultProxy
) -> None:
    await backend.put("t", "k", b"v")
    accepted = proxy.connections_accepted
    proxy.cut()
    # Retryable reads and writes (and whole transactions) redo once on a new connection.
    assert await backend.get("t", "k") == b"v"
    assert await backend.commit("t", [("r", b"1")], "head", b"h1", 1) is True
    assert proxy.connections_accepted > accepted


async def test_commits_cut_at_random_moments_are_never_partial(
    backend: MongoBackend, proxy: FaultProxy
) -> None:
    rng = random.Random(7)
    proxy.latency = 0.02  # widen the window so cuts land inside commits
    outcomes = {"ok": 0, "error": 0}
    for seq in range(1, 16):
        value = b"%d" % seq
        task = asyncio.create_task(
            backend.commit("t", [("a", value), ("b", value)], "head", value, seq)
        )
        await asyncio.sleep(rng.uniform(0.0, 0.15))
        proxy.cut()
        try:
            assert await task is True
            outcomes["ok"] += 1
        except StoreUnavailableError as exc:
            _unavailable_ok(exc)
            outcomes["error"] += 1
        saved = proxy.latency
        proxy.latency = 0.0
        a, b, head = await backend.get_many("t", ["a", "b", "head"])
        # All three from one commit: never a record without its head, or a mix.
        assert a == b == head, (seq, a, b, head)
        if head != value:
            # The commit did not land: retrying it (what the facade does) makes it land.
            assert await backend.commit("t", [("a", value), ("b", value)], "head", value, seq)
        assert await backend.get_many("t", ["a", "b", "head"]) == [value, value, value]
        proxy.latency = saved
    assert sum(outcomes.values()) == 15


# -- a server killed with SIGKILL and restarted on the same storage ------------------

# sync_on_commit: SecantusDB 0.7.0b3 acknowledges a commitTransaction with
# {w: "majority", j: true} before its WiredTiger log is written, so a SIGKILL loses
# the last acknowledged transactions unless it syncs on commit (single writes with
# j: true are kept). mongod journals such commits before acknowledging them; this
# is the configuration under which SecantusDB gives the same guarantee.

_SERVER_CHILD = """
import signal, sys, threading
from secantus import SecantusDBServer
server = SecantusDBServer("127.0.0.1", int(sys.argv[1]), sys.argv[2], sync_on_commit=True)
server.start()
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
stop.wait()
server.stop()
"""


async def test_killed_server_loses_no_acknowledged_commit(
    mongodb_server: ServerInfo, tmp_path: Path
) -> None:
    if "SecantusDB" not in mongodb_server.description:
        pytest.skip("the kill test starts its own SecantusDB")
    port = free_port()
    storage, log = tmp_path / "data", tmp_path / "log"
    url = f"mongodb://127.0.0.1:{port}/killed?{_FAST}"
    args = python_child(_SERVER_CHILD, str(port), str(storage))
    b = MongoBackend(url)
    with child_process(args, log=log) as proc:
        wait_port("127.0.0.1", port, timeout=60)
        for seq in range(1, 21):
            assert await b.commit("t", [(f"r{seq}", b"%d" % seq)], "head", b"%d" % seq, seq)
        os.kill(proc.pid, signal.SIGKILL)  # no shutdown, no checkpoint
        proc.wait(timeout=10)
    with pytest.raises(StoreUnavailableError, match="unreachable"):
        await b.get("t", "head")
    with child_process(args, log=log):
        wait_port("127.0.0.1", port, timeout=60)
        # Same backend object, reconnected: every acknowledged commit is there.
        assert await b.get("t", "head") == b"20"
        keys = [k async for k, _ in b.list("t", "r")]
        assert sorted(keys) == sorted(f"r{s}" for s in range(1, 21))
        assert await b.commit("t", [], "head", b"21", 21) is True
        await b.close()
