"""Project-wide pytest configuration.

In CI (``CHECKPOINT_STORES_REQUIRE_BACKENDS=1``, set by ``nox -s tests``) a
backend whose tests were skipped fails the run: a skip for a missing server or
a missing driver ("could not import") turns the exit status red, with a list.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import UNAVAILABLE, ServerInfo, backends_required

pytest_plugins = [
    "tests.servers.redis",
    "tests.servers.sql",
    "tests.servers.mongodb",
    "tests.servers.s3",
]

_SKIP_MARKERS = (UNAVAILABLE, "could not import")
_backend_skips: list[str] = []


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = _reason(report)
        if any(marker in reason for marker in _SKIP_MARKERS):
            _backend_skips.append(f"{report.nodeid}: {reason}")


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.skipped:
        reason = _reason(report)
        if any(marker in reason for marker in _SKIP_MARKERS):
            _backend_skips.append(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _backend_skips and backends_required() and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _backend_skips:
        return
    verdict = "FAILED (every backend must run in CI)" if backends_required() else "skipped"
    terminalreporter.section(f"backend tests {verdict}", red=backends_required())
    for line in sorted(set(_backend_skips))[:50]:
        terminalreporter.write_line(line)


@pytest.fixture
def tmp_store_dir(tmp_path: Path) -> Path:
    """A fresh directory for a file:// store."""
    path = tmp_path / "store"
    path.mkdir()
    return path


@pytest.fixture(scope="session")
def memory_server() -> ServerInfo:
    """The in-process backend (a fresh shared namespace for the session)."""
    return ServerInfo("memory", "memory://test-session", description="in-process dict")


@pytest.fixture(scope="session")
def file_server(tmp_path_factory: pytest.TempPathFactory) -> ServerInfo:
    """A file:// store in a session temp directory."""
    root = tmp_path_factory.mktemp("file-store")
    return ServerInfo("file", f"file://{root}", description=f"directory {root}")
