"""Session fixtures for the mongodb backend's server (see tests/support.py:ServerInfo).

Which server, in order:

1. ``CHECKPOINT_STORES_TEST_MONGODB_URL`` names a real ``mongod`` (or Atlas, or a
   replica set): the session uses its own database on it and drops it at the end;
2. testcontainers' MongoDB, when the package is installed and Docker answers;
3. SecantusDB (pip ``secantusdb``, the MongoDB wire protocol over WiredTiger),
   started by the session in a child process on a free loopback port with a
   temporary storage path, stopped (by pid) at the end. It advertises a
   single-node replica set, so commits run in transactions.

``ServerInfo.description`` says which one was used and its version.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import (
    ServerInfo,
    backend_unavailable,
    child_process,
    free_port,
    python_child,
    wait_port,
)

ENV_URL = "CHECKPOINT_STORES_TEST_MONGODB_URL"
# Short selection timeout: an unreachable test server should fail in seconds, not 30.
_TIMEOUT_QUERY = "serverSelectionTimeoutMS=10000"


def _with_database(url: str, database: str) -> str:
    """``url`` with its path set to ``/database`` (keeping credentials and query)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{database}", parts.query, parts.fragment))


def _add_query(url: str, extra: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{extra}"


def _server_version(url: str) -> str:
    """``buildInfo.version`` of the server at ``url`` (sync client: fixtures are sync)."""
    from pymongo import MongoClient

    client: MongoClient[dict[str, Any]] = MongoClient(url, serverSelectionTimeoutMS=10000)
    try:
        return str(client.admin.command("buildInfo").get("version", "?"))
    finally:
        client.close()


def _drop_database(url: str, database: str) -> None:
    from pymongo import MongoClient

    client: MongoClient[dict[str, Any]] = MongoClient(url, serverSelectionTimeoutMS=10000)
    try:
        client.drop_database(database)
    finally:
        client.close()


def _docker_works() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        import docker  # type: ignore[import-not-found,unused-ignore]

        docker.from_env().ping()
    except Exception:
        return False
    return True


@contextlib.contextmanager
def _external(url: str, database: str) -> Iterator[ServerInfo]:
    from checkpoint_stores.urls import redact_url

    try:
        version = _server_version(url)
    except Exception as exc:
        backend_unavailable("mongodb", f"{ENV_URL} server not reachable: {type(exc).__name__}")
    session_url = _add_query(_with_database(url, database), _TIMEOUT_QUERY)
    try:
        yield ServerInfo(
            "mongodb",
            session_url,
            description=f"MongoDB {version} at {redact_url(url)} ({ENV_URL}), database {database}",
        )
    finally:
        _drop_database(url, database)  # the session's own database, created by it


@contextlib.contextmanager
def _testcontainers(database: str) -> Iterator[ServerInfo]:
    from testcontainers.mongodb import (  # type: ignore[import-not-found,unused-ignore]
        MongoDbContainer,
    )

    with MongoDbContainer("mongo:7.0") as container:
        url = container.get_connection_url()
        version = _server_version(url)
        yield ServerInfo(
            "mongodb",
            _add_query(_with_database(url, database), "authSource=admin"),
            description=f"MongoDB {version} (testcontainers, standalone), database {database}",
        )


# The server runs in a child interpreter (a crash there cannot take pytest down).
# Not the ``secantusd-py`` CLI: in 0.7.0b3 it parses ``[storage] ttl_sweep_seconds``
# from its config file but never passes it to the server, so expiry would take a
# minute, and it has no transaction lifetime setting; the class takes both.
# A transaction left open by a killed writer holds its run's head until the server
# aborts it: 5 s here (mongod: transactionLifetimeLimitSeconds, 60 s by default),
# so the kit's killed-writer checks do not wait a minute per kill.
_SECANTUS_CHILD = """
import signal, sys, threading
from secantus import SecantusDBServer
host, port, storage = sys.argv[1], int(sys.argv[2]), sys.argv[3]
server = SecantusDBServer(
    host, port, storage, ttl_sweep_seconds=1.0, transaction_lifetime_seconds=5.0
)
server.start()
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
signal.signal(signal.SIGINT, lambda *_: stop.set())
stop.wait()
server.stop()
"""


@contextlib.contextmanager
def _secantus(root: Path, database: str) -> Iterator[ServerInfo]:
    try:
        version = importlib.metadata.version("secantusdb")
    except importlib.metadata.PackageNotFoundError:
        backend_unavailable(
            "mongodb",
            f"no server: set {ENV_URL}, or install the test extra (pip install secantusdb)",
        )
    port = free_port()
    log = root / "secantus.log"
    args = python_child(_SECANTUS_CHILD, "127.0.0.1", str(port), str(root / "data"))
    with child_process(args, log=log, cwd=root) as proc:
        try:
            wait_port("127.0.0.1", port, timeout=60)
        except TimeoutError:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            backend_unavailable(
                "mongodb", f"SecantusDB did not listen on {port} (exit {proc.poll()}): {tail}"
            )
        yield ServerInfo(
            "mongodb",
            f"mongodb://127.0.0.1:{port}/{database}?{_TIMEOUT_QUERY}",
            description=(
                f"SecantusDB {version} (child process {proc.pid}, single-node replica set "
                f"'secantus') on 127.0.0.1:{port}, database {database}"
            ),
        )


@pytest.fixture(scope="session")
def mongodb_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    """A MongoDB-wire server for the session, with a database of the session's own."""
    database = f"cs_test_{uuid.uuid4().hex[:12]}"
    external = os.environ.get(ENV_URL, "").strip()
    if external:
        manager: contextlib.AbstractContextManager[ServerInfo] = _external(external, database)
    elif _docker_works():
        manager = _testcontainers(database)
    else:
        manager = _secantus(tmp_path_factory.mktemp("secantus"), database)
    with manager as info:
        yield info
