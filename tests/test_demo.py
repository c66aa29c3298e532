"""The crash-and-resume demo: killed at every point and at 50 random points, verified.

The verification here is done again from the raw files and the store, not
only by trusting the demo's own checks.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from checkpoint_stores import EffectRecord, open_store
from checkpoint_stores.cli import demo as demo_cli
from checkpoint_stores.cli.demo import DemoReport, run_demo
from checkpoint_stores.demo import KILL_POINTS, DemoConfig, OutsideWorld, plan_step, run_agent
from checkpoint_stores.effects import output_hash
from tests.servers import BACKEND_FIXTURES
from tests.support import ServerInfo


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def assert_exactly_once(report: DemoReport) -> None:
    """Independent check of the demo's promises, from the files and the stored records."""
    world = Path(report.config.workdir)
    outside = _lines(world / "outside.jsonl")
    invocations = _lines(world / "invocations.jsonl")
    keys = Counter(e["key"] for e in outside)
    assert all(n == 1 for n in keys.values()), f"an outside effect happened twice: {keys}"

    records = [EffectRecord.model_validate(r) for r in report.effects.values()]
    assert records, "the run recorded no effects"
    for record in records:
        assert record.status == "done"
        assert record.success
        assert record.output_hash == output_hash(record.output)
        assert keys[record.idempotency_key] == 1
        attempts = [i["attempt"] for i in invocations if i["key"] == record.idempotency_key]
        assert len(attempts) == len(set(attempts)), "one attempt ran twice"
        assert len(attempts) <= (record.model_extra or {}).get("attempt", 1)
    assert set(keys) == {r.idempotency_key for r in records}

    assert report.result == report.expected
    assert report.observed_latest == sorted(report.observed_latest)
    assert report.latest is not None
    assert report.latest.is_terminal
    assert report.latest.seq == max(r.seq for r in report.history)
    assert report.ok, [c for c in report.checks if not c.ok]


def test_plan_is_deterministic_and_ends_with_an_answer() -> None:
    assert plan_step(7, 1, 4) == plan_step(7, 1, 4)
    assert plan_step(7, 1, 4) != plan_step(8, 1, 4)
    assert all(plan_step(s, step, 4).tool_calls for s in range(5) for step in range(3))
    assert plan_step(7, 3, 4).tool_calls == []


async def test_uninterrupted_agent_and_rerun_of_a_finished_run(tmp_path: Path) -> None:
    config = DemoConfig(store_url="", workdir=str(tmp_path / "world"), steps=3, seed=2)
    async with open_store(f"file://{tmp_path}/store") as store:
        first = await run_agent(store, config)
        world = OutsideWorld(config.workdir)
        effects = world.read(world.effects)
        # A finished run returns its stored result and executes nothing.
        events: list[dict[str, Any]] = []

        async def emit(event: dict[str, Any]) -> None:
            events.append(event)

        again = await run_agent(store, config, emit)
    assert again == first
    assert world.read(world.effects) == effects
    assert [e["event"] for e in events] == ["session", "done"]
    assert events[1]["already_done"]
    assert events[0]["terminal"]
    assert first["steps"] == 3
    assert len(first["receipts"]) == first["tool_calls"] == len(effects)


@pytest.mark.slow
@pytest.mark.parametrize("point", KILL_POINTS)
async def test_kill_at_each_point_then_resume(tmp_path: Path, point: str) -> None:
    report = await run_demo(
        store_url=f"file://{tmp_path}/store", workdir=tmp_path, steps=3, seed=5, kill_at=point
    )
    assert report.kills == 1
    assert report.sessions[0].killed
    assert report.sessions[0].last_point is not None
    assert report.sessions[0].last_point.startswith(point)
    assert len(report.sessions) == 2
    assert_exactly_once(report)
    second = report.sessions[1].first("session")
    assert second is not None
    if point == "run_terminal":
        return
    if point != "run_started":
        assert second["resumed"]
        assert second["epoch"] == 1
    if point in {"pre_tool_batch", "tool_effect"}:
        # Killed after the LLM response was flushed: it is reused, not requested again.
        # (At runtime_state the process froze before that flush, so a repeat is allowed.)
        assert second["pending_llm_response"]
        llm_steps = [c["step"] for c in report.llm_calls]
        assert len(llm_steps) == len(set(llm_steps)) == 3
    if point == "tool_effect":
        # The tool's effect happened but its result was never recorded: in doubt, re-executed
        # with the same idempotency key, which the outside world deduplicates.
        assert any(e["in_doubt"] for e in report.sessions[1].of("effect"))


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_crash_loop_50_random_kills_on_the_file_store(tmp_path: Path) -> None:
    store_url = f"file://{tmp_path}/store"  # one store for every run, as in production
    rng = random.Random(20240521)
    kills = runs = in_doubt = replayed = 0
    while kills < 50:
        report = await run_demo(
            store_url=store_url,
            workdir=tmp_path / f"run-{runs}",
            steps=4,
            seed=runs,
            kill_at="random",
            kills=min(6, 50 - kills),
            rng=rng,
        )
        assert_exactly_once(report)
        kills += report.kills
        runs += 1
        effects = [e for s in report.sessions for e in s.of("effect")]
        in_doubt += sum(e["in_doubt"] for e in effects)
        replayed += sum(e["replayed"] for e in effects)
    assert kills >= 50
    # The loop must have exercised the hard paths, not only kills between steps.
    assert replayed > 0
    assert in_doubt > 0


def test_cli_demo_exits_zero_and_reports(tmp_path: Path) -> None:
    # As a user runs it: the console script, in a fresh interpreter.
    script = Path(sys.executable).with_name("checkpoint-stores")
    proc = subprocess.run(
        [str(script), "demo", "--kill-at", "tool_effect", "--steps", "3"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "200", "TMPDIR": str(tmp_path)},
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "killed (frozen at tool_effect@1, then SIGKILL)" in out
    assert "reusing the pending LLM response" in out
    assert "✓ each outside effect happened exactly once" in out
    assert "all checks passed" in out
    assert list(tmp_path.iterdir()) == []  # the temporary store was removed


def test_cli_demo_fails_when_a_check_fails(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real_verify = demo_cli._verify

    async def duplicate_an_effect(store: Any, config: DemoConfig, *args: Any) -> DemoReport:
        # Fault injection: the outside world applies one effect a second time.
        world = OutsideWorld(config.workdir)
        first = world.read(world.effects)[0]
        with open(world.effects, "a", encoding="utf-8") as handle:  # noqa: ASYNC230
            handle.write(json.dumps(first) + "\n")
        return await real_verify(store, config, *args)

    monkeypatch.setattr(demo_cli, "_verify", duplicate_an_effect)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    result = CliRunner().invoke(
        demo_cli.demo, ["--kill-at", "none", "--steps", "2"], catch_exceptions=False
    )
    assert result.exit_code == 1
    assert "✗ each outside effect happened exactly once" in result.output
    assert "a check failed" in result.output
    assert "files kept in" in result.output


def test_cli_rejects_unknown_kill_point() -> None:
    result = CliRunner().invoke(demo_cli.demo, ["--kill-at", "lunch"])
    assert result.exit_code == 2
    assert "tool_effect" in result.output


@pytest.fixture(params=[name for name in BACKEND_FIXTURES if name != "memory_server"])
def server(request: pytest.FixtureRequest) -> ServerInfo:
    info = request.getfixturevalue(request.param)
    assert isinstance(info, ServerInfo)
    return info


@pytest.mark.slow
async def test_demo_resumes_on_every_cross_process_backend(
    server: ServerInfo, tmp_path: Path
) -> None:
    report = await run_demo(
        store_url=server.url,
        store_options=server.options,
        workdir=tmp_path,
        steps=3,
        seed=11,
        kill_at="random",
        kills=2,
        rng=random.Random(3),
    )
    try:
        assert report.kills >= 1
        assert_exactly_once(report)
    finally:
        async with open_store(server.url, **server.options) as store:
            await store.delete_run(report.config.thread_id, report.config.run_id)
