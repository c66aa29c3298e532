"""Test utilities shared by the project's test modules (not shipped in the wheel).

Servers: a test that needs a server the machine does not have calls
:func:`backend_unavailable`. Locally that skips with the reason; in CI
(``CHECKPOINT_STORES_REQUIRE_BACKENDS=1``, which ``nox -s tests`` sets) it
fails, because every backend must run there, none skipped.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NoReturn

import pytest

REQUIRE_ENV = "CHECKPOINT_STORES_REQUIRE_BACKENDS"
UNAVAILABLE = "backend unavailable"


def backends_required() -> bool:
    """True when a missing server must fail the run (CI), not skip."""
    return os.environ.get(REQUIRE_ENV, "").strip().lower() in {"1", "true", "yes", "on", "all"}


def backend_unavailable(name: str, reason: str) -> NoReturn:
    """Skip (locally) or fail (CI) because backend ``name`` has no server."""
    message = f"{UNAVAILABLE}: {name}: {reason}"
    if backends_required():
        pytest.fail(f"{message} ({REQUIRE_ENV} is set: every backend must run)", pytrace=False)
    pytest.skip(message)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """True if something accepts TCP connections on ``host:port``."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=timeout):
        return True
    return False


def wait_port(host: str, port: int, timeout: float = 30.0) -> None:
    """Wait until ``host:port`` accepts connections, or raise TimeoutError."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_open(host, port, timeout=0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout}s")


@contextlib.contextmanager
def child_process(
    args: Sequence[str], *, log: Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run a server process for the duration of a fixture; stop it (by pid) afterwards."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            list(args),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def python_child(code: str, *args: str) -> list[str]:
    """argv for running ``code`` in a fresh interpreter (same venv)."""
    return [sys.executable, "-c", code, *args]


class ServerInfo:
    """A store a test session can use: its URL, backend options, and where it came from.

    ``options`` must be JSON-serializable: the conformance kit passes them to
    worker processes for its cross-process checks.
    """

    def __init__(
        self, name: str, url: str, options: dict[str, object] | None = None, description: str = ""
    ) -> None:
        self.name = name
        self.url = url
        self.options: dict[str, object] = dict(options or {})
        self.description = description

    def __repr__(self) -> str:
        return f"ServerInfo({self.name!r}, {self.description or self.url!r})"
