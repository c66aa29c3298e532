"""The kit's pytest plugin (registered under ``pytest11``): inert unless a store is configured.

Always: registers the group markers (``conformance_latest``, ...), so
subclasses of ``StoreConformance`` work under ``--strict-markers``, and
prints a per-store summary with a conformance level whenever kit checks ran
(also for subclasses in a project's own suite).

With ``--checkpoint-store-url URL`` (repeatable) or ``CHECKPOINT_STORES_TEST_URL``
(whitespace-separated URLs): adds one kit run per URL to the session, shows
each store (URL redacted), its plugin distribution and version, and its
capabilities in the report header. ``--checkpoint-store-option key=value``
passes backend options; ``--checkpoint-store-report FILE`` writes the results
as JSON.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import pytest

if TYPE_CHECKING:
    from checkpoint_stores.conformance.results import ConformanceResults

__all__ = ["URL_ENV", "configured_urls", "results_of"]

URL_ENV: Final = "CHECKPOINT_STORES_TEST_URL"
SUITE_PATH: Final = Path(__file__).with_name("suite.py")
SUITE_MODULE: Final = "checkpoint_stores.conformance.suite"

_GROUP_HELP: Final = {
    "latest": "latest-key semantics: newest wins, stale writers change nothing, no forks",
    "corruption": "damaged or legacy records: clear errors, or normalized",
    "replay": "replay idempotency of tool effects (EffectLedger on this store)",
    "spi": "the StorageBackend SPI itself: create, list, ids, sizes, deletes, durability",
    "stateful": "a Hypothesis state machine: the store against a dict model",
}

_RESULTS: Final = pytest.StashKey["ConformanceResults"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("checkpoint-stores", "checkpoint-stores conformance kit")
    group.addoption(
        "--checkpoint-store-url",
        action="append",
        default=[],
        metavar="URL",
        help=f"Run the conformance kit against this store (repeatable; or set {URL_ENV}).",
    )
    group.addoption(
        "--checkpoint-store-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Backend option for the configured stores (repeatable).",
    )
    group.addoption(
        "--checkpoint-store-report",
        default=None,
        metavar="FILE",
        help="Write the kit's results (per store, group and check) as JSON to FILE.",
    )
    group.addoption(
        "--checkpoint-store-no-summary",
        action="store_true",
        default=False,
        help="Do not print the conformance summary (the CLI prints its own table).",
    )


def configured_urls(config: pytest.Config) -> list[str]:
    """Store URLs given by option or environment, in order, without repeats."""
    urls: list[str] = list(config.getoption("checkpoint_store_url") or [])
    urls += os.environ.get(URL_ENV, "").split()
    return list(dict.fromkeys(u for u in urls if u))


def _options(config: pytest.Config) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for pair in config.getoption("checkpoint_store_option") or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise pytest.UsageError(f"--checkpoint-store-option {pair!r} is not KEY=VALUE")
        options[key.strip()] = value
    return options


def results_of(config: pytest.Config) -> ConformanceResults:
    """The session's kit results (empty when no kit check ran)."""
    return config.stash[_RESULTS]


def pytest_configure(config: pytest.Config) -> None:
    for group, text in _GROUP_HELP.items():
        config.addinivalue_line("markers", f"conformance_{group}: conformance kit group: {text}")
    from checkpoint_stores.conformance.results import ConformanceResults

    config.stash[_RESULTS] = ConformanceResults()
    if configured_urls(config):
        _options(config)  # fail early on a malformed option
        suite = str(SUITE_PATH)
        if not any(Path(arg.split("::")[0]).resolve() == SUITE_PATH for arg in config.args):
            config.args.append(suite)


class _SuiteModule(pytest.Module):
    """The kit's suite module, imported by its package name (not by file path)."""

    def _getobj(self) -> Any:
        return importlib.import_module(SUITE_MODULE)


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(
    module_path: Path, parent: pytest.Collector
) -> pytest.Module | None:
    if module_path.resolve() == SUITE_PATH:
        return _SuiteModule.from_parent(parent, path=module_path)
    return None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "checkpoint_store_url" in metafunc.fixturenames:
        urls = configured_urls(metafunc.config)
        if not urls:
            raise pytest.UsageError(
                f"the conformance suite needs --checkpoint-store-url URL or {URL_ENV}"
            )
        from checkpoint_stores.urls import redact_url

        metafunc.parametrize(
            "checkpoint_store_url", urls, ids=[redact_url(u) for u in urls], scope="class"
        )


@pytest.fixture(scope="session")
def checkpoint_store_options(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Backend options given with ``--checkpoint-store-option key=value``."""
    return _options(request.config)


def pytest_report_header(config: pytest.Config) -> list[str]:
    urls = configured_urls(config)
    if not urls:
        return []
    from checkpoint_stores.conformance.base import describe_store
    from checkpoint_stores.urls import redact_url

    lines = []
    for url in urls:
        try:
            desc = describe_store(url, _options(config))
        except Exception as exc:
            lines.append(f"checkpoint store: {redact_url(url)} -- cannot open: {exc}")
            continue
        lines.append(f"checkpoint store: {desc.label} ({desc.provider}; {desc.backend})")
        lines.append(f"  capabilities: {desc.capability_line()}")
        if desc.capabilities.get("notes"):
            lines.append(f"  notes: {desc.capabilities['notes']}")
    return lines


def _explain(item: pytest.Item, call: pytest.CallInfo[None], report: pytest.TestReport) -> str:
    from checkpoint_stores.conformance.checks import ConformanceFailure

    excinfo = call.excinfo
    if excinfo is not None and isinstance(excinfo.value, ConformanceFailure):
        return excinfo.value.explanation
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    if hasattr(report, "wasxfail"):
        return str(report.wasxfail) or "expected failure"
    if report.failed and excinfo is None:
        return str(report.longrepr).splitlines()[0] if report.longrepr else "failed"
    if excinfo is not None:
        text = str(excinfo.value).strip().splitlines()
        return f"{excinfo.typename}: {text[0] if text else ''}"
    return ""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    info = getattr(getattr(item, "function", None), "_conformance_check", None)
    if info is None:
        return report
    from checkpoint_stores.conformance.checks import CAPABILITY_SKIP
    from checkpoint_stores.conformance.results import STORE_STASH, CheckResult

    description = item.stash.get(STORE_STASH, None)
    key = description.label if description is not None else item.nodeid.rpartition("::")[0]
    cls = getattr(item, "cls", None)
    if cls is not None and description is not None:
        key = f"{description.label} [{cls.__name__}]"
    store = results_of(item.config).store(key, description)
    result = store.checks.get(item.nodeid)
    if result is None:
        result = store.checks[item.nodeid] = CheckResult(
            name=info.name, group=info.group, nodeid=item.nodeid
        )
    explanation = _explain(item, call, report)
    if report.when == "call" or report.outcome != "passed":
        if hasattr(report, "wasxfail") and report.skipped:
            outcome = "xfailed"
        elif report.skipped:
            outcome = "skipped"
        elif report.failed:
            outcome = "failed"
            if hasattr(report, "wasxfail") or "XPASS" in str(report.longrepr or ""):
                explanation = (
                    f"[{info.name}] declared as a divergence but passed: remove it from "
                    "Capabilities.divergences"
                )
        else:
            outcome = "passed"
        if result.outcome != "failed":  # a teardown error must not hide a call failure
            result.outcome = outcome
            result.explanation = explanation
            result.capability = outcome == "skipped" and explanation.startswith(CAPABILITY_SKIP)
            if result.capability and description is not None:
                caps = description.capabilities
                result.missing = [
                    need
                    for need in info.needs
                    if not (description.thread_lister if need == "list_threads" else caps[need])
                ]
            if outcome == "failed" and report.longrepr is not None:
                result.detail = str(report.longrepr)[-4000:]
    return report


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    results = results_of(config)
    if not results.stores:
        return
    path = config.getoption("checkpoint_store_report")
    if path:
        Path(path).write_text(results.to_json(), encoding="utf-8")
    if config.getoption("checkpoint_store_no_summary"):
        return
    terminalreporter.section("checkpoint-stores conformance", red=not results.ok())
    for line in results.text_lines():
        terminalreporter.write_line(line)
