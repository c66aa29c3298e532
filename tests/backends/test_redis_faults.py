"""Faults between the Redis backend and the real server, injected by tests/faultproxy.py.

Refused and unreachable servers, latency, a server that stops answering, cut
connections in the middle of many commits: the backend must raise a clear
StoreUnavailableError (URL redacted, no password anywhere), retry its way
through short outages, and never leave a partial commit visible.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import subprocess
import traceback
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from checkpoint_stores import open_backend, open_store
from checkpoint_stores.backends.redis import RedisBackend
from checkpoint_stores.errors import StoreUnavailableError
from checkpoint_stores.schema import Checkpoint, Phase
from checkpoint_stores.urls import redact_url
from tests.faultproxy import FaultProxy
from tests.servers.redis import start_cluster
from tests.support import ServerInfo, backend_unavailable, free_port

pytestmark = pytest.mark.redis

PASSWORD = "s3cret-pw-never-shown"


@pytest.fixture
def proxy(redis_server: ServerInfo) -> Iterator[FaultProxy]:
    host, _, port = (
        redis_server.url.partition("://")[2].rpartition("@")[2].partition("/")[0].rpartition(":")
    )
    with FaultProxy(host, int(port)) as fault_proxy:
        yield fault_proxy


def proxied(
    proxy: FaultProxy, redis_server: ServerInfo, **options: Any
) -> tuple[str, dict[str, Any]]:
    url = f"redis://127.0.0.1:{proxy.port}/0"
    base: dict[str, Any] = {
        "retries": 2,
        "retry_backoff": 0.01,
        "retry_backoff_cap": 0.05,
        "socket_timeout": 2.0,
        "socket_connect_timeout": 1.0,
    }
    return url, {**base, **redis_server.options, **options}


def assert_no_secret(exc: BaseException) -> None:
    text = "".join(traceback.format_exception(exc))
    assert PASSWORD not in text
    assert PASSWORD not in repr(exc)


def tid() -> str:
    return f"test-faults-{uuid.uuid4().hex[:8]}"


async def test_refused_connection_is_a_clear_error_with_the_url_redacted(
    proxy: FaultProxy, redis_server: ServerInfo
) -> None:
    proxy.refuse = True
    url = f"redis://app:{PASSWORD}@127.0.0.1:{proxy.port}/0"
    _, options = proxied(proxy, redis_server)
    backend = open_backend(url, **options)
    with pytest.raises(StoreUnavailableError) as info:
        await backend.setup()
    message = str(info.value)
    assert redact_url(url) in message
    assert "***" in message
    assert "connect" in message
    assert_no_secret(info.value)
    assert PASSWORD not in repr(backend)
    assert proxy.connections_accepted == 3  # the first try and two retries
    await backend.close()


async def test_unreachable_port_is_a_clear_error(redis_server: ServerInfo) -> None:
    url = f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"
    store = open_store(url, retries=1, retry_backoff=0.01, socket_connect_timeout=1.0)
    with pytest.raises(StoreUnavailableError, match="reachable") as info:
        await store.put_state("t", "k", 1)
    assert_no_secret(info.value)
    assert PASSWORD not in repr(store)
    await store.close()


async def test_latency_slows_operations_but_they_succeed(
    proxy: FaultProxy, redis_server: ServerInfo
) -> None:
    url, options = proxied(proxy, redis_server)
    backend = open_backend(url, **options)
    thread_id = tid()
    proxy.latency = 0.02
    assert await backend.commit(thread_id, [("r", b"x" * 200_000)], "h", b"head", 1)
    assert await backend.get(thread_id, "r") == b"x" * 200_000
    assert [k async for k, _ in backend.list(thread_id)] == ["h", "r"]
    assert await backend.delete_thread(thread_id) == 2
    await backend.close()


async def test_a_silent_server_times_out_then_the_same_backend_recovers(
    proxy: FaultProxy, redis_server: ServerInfo
) -> None:
    url, options = proxied(proxy, redis_server, socket_timeout=0.3, retries=1)
    backend = open_backend(url, **options)
    thread_id = tid()
    await backend.put(thread_id, "k", b"v")
    proxy.blackhole = True
    with pytest.raises(StoreUnavailableError, match="Timeout") as info:
        await backend.get(thread_id, "k")
    assert redact_url(url) in str(info.value)
    proxy.recover()
    proxy.cut()  # drop the stalled connections, as a restarted network would
    assert await backend.get(thread_id, "k") == b"v"
    assert await backend.delete_thread(thread_id) == 1
    await backend.close()


async def test_retries_carry_a_commit_through_a_short_outage(
    proxy: FaultProxy, redis_server: ServerInfo
) -> None:
    url, options = proxied(
        proxy, redis_server, retries=50, retry_backoff=0.02, retry_backoff_cap=0.05
    )
    backend = open_backend(url, **options)
    thread_id = tid()
    await backend.setup()
    proxy.refuse = True
    proxy.cut()
    before = proxy.connections_accepted
    task = asyncio.create_task(backend.commit(thread_id, [("r", b"1")], "h", b"1", 1))
    while proxy.connections_accepted < before + 3:  # noqa: ASYNC110 - counting real refusals
        await asyncio.sleep(0.01)
    assert not task.done()
    proxy.recover()
    assert await asyncio.wait_for(task, timeout=30)
    assert await backend.get(thread_id, "h") == b"1"
    await backend.delete_thread(thread_id)
    await backend.close()


async def test_cut_connections_during_many_commits_leave_no_partial_commit(
    proxy: FaultProxy, redis_server: ServerInfo
) -> None:
    url, options = proxied(proxy, redis_server, retries=3)
    thread_id = tid()
    runs = [f"run{i}" for i in range(4)]
    acknowledged: dict[str, int] = dict.fromkeys(runs, 0)
    unknown: dict[str, int] = dict.fromkeys(runs, 0)
    proxy.latency = 0.001  # forward in small steps, so cuts land inside commands
    payload = {"blob": "x" * 30_000}  # several TCP chunks per commit

    async def writer(store: Any, run_id: str) -> None:
        for seq in range(1, 41):
            phase = Phase.RUNTIME_STATE if seq % 3 == 0 else Phase.PRE_LLM
            checkpoint = Checkpoint(
                run_id=run_id, thread_id=thread_id, seq=seq, step=seq, phase=phase,
                payload={**payload, "seq": seq},
            )  # fmt: skip
            try:
                await store.append(checkpoint)
                acknowledged[run_id] = seq
            except StoreUnavailableError as exc:
                assert_no_secret(exc)
                unknown[run_id] += 1

    async def cutter(stop: asyncio.Event) -> int:
        cuts = 0
        while not stop.is_set():
            await asyncio.sleep(random.uniform(0.005, 0.03))
            await asyncio.to_thread(proxy.cut)
            cuts += 1
        return cuts

    stop = asyncio.Event()
    async with open_store(url, **options) as store:
        cut_task = asyncio.create_task(cutter(stop))
        await asyncio.gather(*(writer(store, r) for r in runs))
        stop.set()
        cuts = await cut_task
    assert cuts > 5

    proxy.recover()
    async with open_store(redis_server.url, **redis_server.options) as store:
        for run_id in runs:
            latest = await store.latest(thread_id, run_id)  # decodes, or raises
            assert latest.seq >= acknowledged[run_id]
            record = await store.get_checkpoint(thread_id, run_id, latest.step, latest.phase)
            assert record == latest, "the head names a record that is missing or different"
            history = await store.history(thread_id, run_id)
            assert max(c.seq for c in history) == latest.seq, "a record landed without its head"
            assert {c.seq for c in history} >= {acknowledged[run_id]} - {0}
            runtime = [c for c in history if c.phase is Phase.RUNTIME_STATE]
            snapshot = await store.runtime_snapshot(thread_id, run_id)
            if runtime:
                assert snapshot == max(runtime, key=lambda c: c.seq)
            for checkpoint in history:
                assert checkpoint.payload["seq"] == checkpoint.seq  # every record decodes whole
        await store.delete_thread(thread_id)


async def test_operations_queue_for_connections_then_time_out_clearly(
    proxy: FaultProxy, redis_server: ServerInfo
) -> None:
    url, options = proxied(proxy, redis_server, max_connections=2, pool_timeout=0.3)
    backend = open_backend(url, **options)
    thread_id = tid()
    await backend.put(thread_id, "k", b"v")
    # Forty at once through two connections: they wait their turn, none fails.
    assert await asyncio.gather(*(backend.get(thread_id, "k") for _ in range(40))) == [b"v"] * 40
    proxy.blackhole = True
    stalled = [asyncio.create_task(backend.get(thread_id, "k")) for _ in range(2)]
    await asyncio.sleep(0.05)
    with pytest.raises(StoreUnavailableError, match="max_connections"):
        await backend.get(thread_id, "k")
    proxy.recover()
    proxy.cut()
    for task in stalled:  # the two stalled ones retry on fresh connections and succeed
        assert await task == b"v"
    assert await backend.delete_thread(thread_id) == 1
    await backend.close()


# -- Cluster: a master that stops answering ---------------------------------------------

Started = list[tuple[int, "subprocess.Popen[bytes]"]]


@pytest.fixture(scope="module")
def private_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Started]]:
    """A three-master cluster of this module's own, so freezing a node disturbs no other test."""
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        backend_unavailable("redis-cluster", "redis-server and redis-cli are not on PATH")
    root = tmp_path_factory.mktemp("redis-cluster-faults")
    with start_cluster(root, root / "servers.log") as started:
        yield "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p, _ in started), started


async def test_cluster_master_that_stops_answering_fails_clearly_then_recovers(
    private_cluster: tuple[str, Started],
) -> None:
    url, started = private_cluster
    options = {"socket_timeout": 0.5, "retries": 1, "retry_backoff": 0.01, "key_prefix": "f:"}
    backend = open_backend(url, **options)
    assert isinstance(backend, RedisBackend)
    await backend.setup()
    client: Any = backend._connect()
    frozen_port, frozen = started[0]
    on_frozen = on_other = None
    for n in range(1000):  # a thread whose slot the frozen master owns, and one it does not
        thread_id = f"thread-{n}"
        names = backend.key_names(thread_id)
        port = client.get_node_from_key(names.index_key).port
        if port == frozen_port and on_frozen is None:
            on_frozen = thread_id
        elif port != frozen_port and on_other is None:
            on_other = thread_id
    assert on_frozen is not None
    assert on_other is not None
    await backend.put(on_frozen, "k", b"frozen")
    await backend.put(on_other, "k", b"other")
    os.kill(frozen.pid, signal.SIGSTOP)
    try:
        with pytest.raises(StoreUnavailableError, match="Timeout") as info:
            await backend.get(on_frozen, "k")
        assert redact_url(url) in str(info.value)
        assert await backend.get(on_other, "k") == b"other"  # the other masters still serve
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    assert await backend.get(on_frozen, "k") == b"frozen"  # the same backend recovers
    assert await backend.delete_thread(on_frozen) == 1
    assert await backend.delete_thread(on_other) == 1
    await backend.close()


async def test_wrong_credentials_fail_at_once_with_a_hint(
    proxy: FaultProxy, redis_server: ServerInfo
) -> None:
    url = f"redis://someone:{PASSWORD}@127.0.0.1:{proxy.port}/0"
    backend = open_backend(url, **{**redis_server.options, "retries": 5})
    with pytest.raises(StoreUnavailableError, match="password") as info:
        await backend.setup()
    assert proxy.connections_accepted == 1  # refused credentials are not retried
    assert redact_url(url) in str(info.value)
    assert_no_secret(info.value)
    await backend.close()
