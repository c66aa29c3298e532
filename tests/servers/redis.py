"""Session fixtures for the redis backend's servers (see tests/support.py:ServerInfo).

* ``redis_server``: the machine's Redis on 127.0.0.1:6379 (or the one
  ``CHECKPOINT_STORES_TEST_REDIS_URL`` names), with a key prefix of its own for
  the session; at the end only that prefix is removed (SCAN + UNLINK), never
  FLUSHALL.
* ``redis_cluster_server``: three ``redis-server --cluster-enabled yes`` on free
  loopback ports, joined with ``redis-cli --cluster create``, no persistence,
  data in a session temp dir, stopped at the end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import ServerInfo, backend_unavailable, child_process, free_port, wait_port

URL_ENV = "CHECKPOINT_STORES_TEST_REDIS_URL"
DEFAULT_URL = "redis://127.0.0.1:6379/0"


def session_prefix(kind: str) -> str:
    """A key prefix no other session uses (no glob or brace characters in it)."""
    return f"cs-test-{kind}-{uuid.uuid4().hex[:12]}:"


def _glob_escape(text: str) -> str:
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


def unlink_prefix(client: object, prefix: str) -> int:
    """UNLINK every key starting with ``prefix`` (SCAN with an escaped pattern)."""
    import redis

    assert isinstance(client, redis.Redis)
    removed = 0
    batch: list[bytes] = []
    for key in client.scan_iter(match=_glob_escape(prefix) + "*", count=1000):
        batch.append(key)
        if len(batch) >= 500:
            removed += int(client.unlink(*batch))
            batch.clear()
    if batch:
        removed += int(client.unlink(*batch))
    return removed


@pytest.fixture(scope="session")
def redis_server() -> Iterator[ServerInfo]:
    """The standalone Redis, with a key prefix of this session's own."""
    try:
        import redis
    except ImportError:
        backend_unavailable(
            "redis", 'redis-py is not installed: pip install "checkpoint-stores[redis]"'
        )
    url = os.environ.get(URL_ENV, DEFAULT_URL)
    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=10)
    try:
        version = client.info("server")["redis_version"]
    except redis.RedisError as exc:
        client.close()
        backend_unavailable("redis", f"no Redis answers at {url} ({exc}); start redis-server")
    prefix = session_prefix("redis")
    host = url.partition("://")[2].rpartition("@")[2]
    try:
        yield ServerInfo(
            "redis",
            url,
            {"key_prefix": prefix},
            description=f"Redis {version} at {host}, key prefix {prefix!r}",
        )
    finally:
        unlink_prefix(client, prefix)
        client.close()


def _redis_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["redis-cli", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def _cluster_ok(port: int) -> bool:
    out = _redis_cli("-h", "127.0.0.1", "-p", str(port), "cluster", "info", timeout=5).stdout
    return "cluster_state:ok" in out


@contextlib.contextmanager
def start_cluster(root: Path, log: Path) -> Iterator[list[tuple[int, subprocess.Popen[bytes]]]]:
    """Three masters on free loopback ports, joined and ``cluster_state:ok``; stopped on exit."""
    ports = [free_port() for _ in range(3)]
    procs: list[subprocess.Popen[bytes]] = []
    bus_ports = [free_port() for _ in range(3)]
    with contextlib.ExitStack() as stack:
        for port, bus in zip(ports, bus_ports, strict=True):
            data = root / str(port)
            data.mkdir()
            proc = stack.enter_context(
                child_process(
                    [
                        "redis-server",
                        "--port",
                        str(port),
                        "--cluster-port",
                        str(bus),
                        "--bind",
                        "127.0.0.1",
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        str(data / "nodes.conf"),
                        "--cluster-node-timeout",
                        "5000",
                        "--dir",
                        str(data),
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                        "--daemonize",
                        "no",
                    ],
                    log=log,
                )
            )
            procs.append(proc)
        for port in ports:
            wait_port("127.0.0.1", port, timeout=20)
        created = _redis_cli(
            "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports),
            "--cluster-replicas", "0", "--cluster-yes",
        )  # fmt: skip
        if created.returncode != 0:
            raise RuntimeError(
                f"redis-cli --cluster create failed: {created.stdout}{created.stderr}"
            )
        deadline = time.monotonic() + 30
        while not all(_cluster_ok(p) for p in ports):
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not reach cluster_state:ok in 30 s")
            time.sleep(0.1)
        yield list(zip(ports, procs, strict=True))


@pytest.fixture(scope="session")
def redis_cluster_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    """A three-master Redis Cluster started for this session on free loopback ports."""
    try:
        import redis  # noqa: F401
    except ImportError:
        backend_unavailable(
            "redis-cluster", 'redis-py is not installed: pip install "checkpoint-stores[redis]"'
        )
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        backend_unavailable("redis-cluster", "redis-server and redis-cli are not on PATH")
    version = subprocess.run(
        ["redis-server", "--version"], capture_output=True, text=True, check=False
    ).stdout.split()
    failure = ""
    for attempt in range(3):  # a free port can be taken by another process meanwhile
        root = tmp_path_factory.mktemp(f"redis-cluster-{attempt}")
        log = root / "servers.log"
        try:
            with start_cluster(root, log) as started:
                ports = [port for port, _ in started]
                nodes = ",".join(f"127.0.0.1:{p}" for p in ports)
                yield ServerInfo(
                    "redis-cluster",
                    f"redis+cluster://{nodes}",
                    {"key_prefix": session_prefix("cluster")},
                    description=f"Redis Cluster ({' '.join(version[:3])}), 3 masters on {nodes}",
                )
                return
        except (RuntimeError, TimeoutError, subprocess.TimeoutExpired) as exc:
            failure = (
                f"{exc}; log: {log.read_text(errors='replace')[-2000:] if log.exists() else ''}"
            )
    backend_unavailable("redis-cluster", f"could not start a Redis Cluster: {failure}")
