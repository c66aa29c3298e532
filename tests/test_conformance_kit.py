"""The kit's own machinery: fork detection, levels, divergences, the pytest plugin and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from checkpoint_stores.conformance import CHECKS, GROUPS
from checkpoint_stores.conformance.checks import CAPABILITY_SKIP
from checkpoint_stores.conformance.latest import Attempt, commit_history_problems
from checkpoint_stores.conformance.results import CheckResult, StoreResults

CLI = str(Path(sys.executable).with_name("checkpoint-stores"))
README = Path(__file__).resolve().parents[1] / "docs" / "conformance.md"


# -- fork and backwards detection ---------------------------------------------------------


def test_history_without_problems() -> None:
    attempts = [
        Attempt(0, 1, True, 0.0, 0.1),
        Attempt(1, 1, False, 0.0, 0.2),
        Attempt(1, 2, True, 0.3, 0.4),
        Attempt(0, 1, False, 0.5, 0.6),
    ]
    assert commit_history_problems(attempts) == []


def test_history_fork_is_found() -> None:
    attempts = [Attempt(0, 3, True, 0.0, 0.2), Attempt(1, 3, True, 0.1, 0.3)]
    (problem,) = commit_history_problems(attempts)
    assert problem.startswith("FORK: seq 3 was accepted 2 times (writers [0, 1])")


def test_history_backwards_is_found_only_in_real_time_order() -> None:
    # Overlapping calls may land in either order: not a violation.
    overlapping = [Attempt(0, 5, True, 0.0, 0.3), Attempt(1, 4, True, 0.1, 0.2)]
    assert commit_history_problems(overlapping) == []
    # Seq 4 started after seq 5 had returned, and was still accepted: backwards.
    ordered = [Attempt(0, 5, True, 0.0, 0.1), Attempt(1, 4, True, 0.2, 0.3)]
    (problem,) = commit_history_problems(ordered)
    assert problem.startswith("BACKWARDS: writer 0 committed seq 5")


# -- levels ----------------------------------------------------------------------------------


def _results(*checks: CheckResult) -> StoreResults:
    store = StoreResults(key="x")
    for i, check in enumerate(checks):
        store.checks[str(i)] = check
    return store


def _all(outcome: str = "passed") -> list[CheckResult]:
    return [
        CheckResult(name=n, group=c.group, nodeid=n, outcome=outcome) for n, c in CHECKS.items()
    ]


def test_level_full_needs_every_group_and_no_skips() -> None:
    assert _results(*_all()).level() == "full"
    only_spi = [c for c in _all() if c.group == "spi"]
    assert _results(*only_spi).level().startswith("partial (groups not run: latest, corruption")


def test_level_partial_names_divergences_and_undeclared_capabilities() -> None:
    checks = _all()
    checks[0].outcome = "xfailed"
    checks[1].outcome = "skipped"
    checks[1].capability = True
    checks[1].missing = ["cross_process"]
    level = _results(*checks).level()
    assert level.startswith("partial (")
    assert f"declared divergences: {checks[0].name}" in level
    assert "not declared, so not checked: cross_process" in level


def test_level_non_conformant_and_incomplete() -> None:
    checks = _all()
    checks[2].outcome = "failed"
    assert _results(*checks).level() == f"non-conformant (broken: {checks[2].name})"
    checks = _all()
    checks[3].outcome = "skipped"
    checks[3].explanation = "backend unavailable: redis: no server"
    assert _results(*checks).level().startswith("incomplete (1 checks skipped: backend unavailable")


# -- the registry is documented -----------------------------------------------------------------


def test_every_check_is_documented_with_its_guarantee() -> None:
    assert set(GROUPS) == {c.group for c in CHECKS.values()}
    text = README.read_text(encoding="utf-8")
    undocumented = [name for name in CHECKS if f"`{name}`" not in text]
    assert undocumented == [], f"add these check names to {README}: {undocumented}"
    for name, info in CHECKS.items():
        assert info.guarantee != name, f"{name} has no guarantee docstring"
        assert info.test_name == "test_" + name.replace(".", "_")


# -- divergences and the plugin, in a separate pytest process -------------------------------------

DIVERGING_SUITE = '''
import dataclasses

import pytest

from checkpoint_stores import get_registry
from checkpoint_stores.backends.memory import MemoryBackend
from checkpoint_stores.conformance import StoreConformance


class FloatSeqBackend(MemoryBackend):
    """Compares seqs as floats, and says so: it declares the check it fails."""

    capabilities = dataclasses.replace(
        MemoryBackend.capabilities,
        divergences=frozenset({"spi.commit_large_seq", "spi.get_many"}),
    )

    def __init__(self, url, **options):
        super().__init__("memory://")

    async def commit(self, thread_id, writes, head_key, head_value, seq):
        head = self._threads.get(thread_id, {}).get(head_key)
        if head is not None and head[1] is not None and float(head[1]) >= float(seq):
            return False
        return await super().commit(thread_id, writes, head_key, head_value, seq)


get_registry().add("kit-diverging", FloatSeqBackend)


class TestDiverging(StoreConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def store_url(cls):
        return "kit-diverging://"
'''


def _pytest(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    ini = tmp_path / "pytest.ini"
    ini.write_text("[pytest]\naddopts =\n", encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ini), "--rootdir", str(tmp_path), *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
        env=env,
    )
    return proc.returncode, proc.stdout + proc.stderr


def _report(path: Path) -> dict[str, Any]:
    (store,) = json.loads(path.read_text())["stores"]
    return {"level": store["level"], **{c["name"]: c for c in store["checks"]}}


def test_divergences_are_strict_expected_failures(tmp_path: Path) -> None:
    (tmp_path / "test_diverging.py").write_text(textwrap.dedent(DIVERGING_SUITE))
    report = tmp_path / "report.json"
    code, output = _pytest(
        tmp_path,
        "test_diverging.py",
        "-p",
        "no:cacheprovider",
        "-k",
        "commit_large_seq or get_many or commit_semantics",
        "--checkpoint-store-report",
        str(report),
    )
    results = _report(report)
    # Declared and really failing: an expected failure.
    assert results["spi.commit_large_seq"]["outcome"] == "xfailed", output
    # Declared but passing: strict, so reported as a failure that says what to do.
    assert results["spi.get_many"]["outcome"] == "failed", output
    assert "declared as a divergence but passed" in results["spi.get_many"]["explanation"]
    assert results["spi.commit_semantics"]["outcome"] == "passed"
    assert code == 1
    assert "conformance level: non-conformant (broken: spi.get_many)" in output


def test_plugin_is_inert_without_a_store(tmp_path: Path) -> None:
    (tmp_path / "test_plain.py").write_text("def test_one():\n    assert True\n")
    code, output = _pytest(tmp_path, "test_plain.py", "-p", "no:cacheprovider")
    assert code == 0, output
    assert "1 passed" in output
    assert "checkpoint-stores conformance" not in output
    assert "checkpoint store:" not in output


def test_plugin_runs_the_kit_for_a_configured_url(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    code, output = _pytest(
        tmp_path,
        "-p",
        "no:cacheprovider",
        "--checkpoint-store-url",
        "memory://plugin-check",
        "-m",
        "conformance_corruption",
        "--checkpoint-store-report",
        str(report),
    )
    assert code == 0, output
    assert "checkpoint store: memory://plugin-check (checkpoint-stores " in output
    assert "capabilities: atomic_commit=yes fenced_commit=yes cross_process=no" in output
    assert "checkpoint-stores conformance" in output
    results = _report(report)
    ran = {name for name in results if name != "level"}
    assert ran == {n for n, c in CHECKS.items() if c.group == "corruption"}
    assert all(results[n]["outcome"] == "passed" for n in ran)


def test_plugin_reads_the_url_from_the_environment(tmp_path: Path) -> None:
    import os

    env = dict(os.environ, CHECKPOINT_STORES_TEST_URL="memory://from-env")
    code, output = _pytest(
        tmp_path, "-p", "no:cacheprovider", "-k", "spi_get_many or spi_empty_value", env=env
    )
    assert code == 0, output
    assert "checkpoint store: memory://from-env" in output
    assert "2 passed" in output


def test_capability_skips_say_what_is_not_declared(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    code, output = _pytest(
        tmp_path,
        "-p",
        "no:cacheprovider",
        "--checkpoint-store-url",
        "memory://caps",
        "-k",
        "durable_reopen or create_race_processes",
        "--checkpoint-store-report",
        str(report),
    )
    assert code == 0, output
    results = _report(report)
    durable = results["spi.durable_reopen"]
    assert durable["outcome"] == "skipped"
    assert durable["capability"]
    assert durable["explanation"].startswith(f"{CAPABILITY_SKIP} durable")
    assert results["spi.create_race_processes"]["missing"] == ["cross_process"]
    assert results["level"].startswith("partial (")


# -- the CLI -------------------------------------------------------------------------------------


def test_cli_group_selection_and_junitxml(tmp_path: Path) -> None:
    junit = tmp_path / "kit.xml"
    proc = subprocess.run(
        [CLI, "conformance", "memory://", "--group", "corruption", "--junitxml", str(junit)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = proc.stdout.split("conformance level")[0]
    assert "corruption" in table
    assert "stateful" not in table
    xml = junit.read_text()
    corruption = [n for n, c in CHECKS.items() if c.group == "corruption"]
    assert xml.count("<testcase ") == len(corruption)
    assert 'failures="0"' in xml


def test_cli_unknown_scheme_is_a_clear_usage_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        [CLI, "conformance", "nosuchdb://host/db"], capture_output=True, text=True, cwd=tmp_path
    )
    assert proc.returncode == 2
    assert "no checkpoint-stores backend for scheme 'nosuchdb'" in proc.stderr
    assert "Installed schemes:" in proc.stderr


def test_cli_redacts_the_password(tmp_path: Path) -> None:
    proc = subprocess.run(
        [CLI, "conformance", "nosuchdb://user:hunter2@host/db"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert "hunter2" not in proc.stdout + proc.stderr


def test_cli_rejects_unknown_group(tmp_path: Path) -> None:
    proc = subprocess.run(
        [CLI, "conformance", "memory://", "--group", "nope"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert "nope" in proc.stderr
