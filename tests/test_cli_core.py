"""The core CLI commands, ``plugins`` and ``inspect``, run through click against a file store."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from checkpoint_stores import Checkpoint, Phase, checkpoint_key, checkpoint_latest_key, open_store
from checkpoint_stores.cli import main

T = "thread-1"
WIDE = {"COLUMNS": "220"}  # rich wraps tables to the terminal width


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), env=WIDE)


def cp(run_id: str, seq: int, step: int, phase: Phase, **payload: Any) -> Checkpoint:
    return Checkpoint(
        thread_id=T,
        run_id=run_id,
        seq=seq,
        step=step,
        phase=phase,
        payload=payload,
        timestamp_ms=1_700_000_000_000 + seq,
    )


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """A file store with a finished run, a running one, a damaged one and a fenced one."""
    url = f"file://{tmp_path}/store"

    async def fill() -> None:
        async with open_store(url) as store:
            await store.append(cp("done", 1, 0, Phase.RUN_STARTED, agent_name="a"))
            await store.append(cp("done", 2, 1, Phase.RUNTIME_STATE, messages=[]))
            await store.append(cp("done", 3, 1, Phase.PRE_LLM, text="x" * 3000))
            await store.append(cp("done", 4, 1, Phase.RUN_TERMINAL, state="completed"))
            await store.append(cp("running", 1, 0, Phase.RUN_STARTED))
            await store.append(cp("damaged", 1, 0, Phase.RUN_STARTED))
            await store.backend.put(T, checkpoint_latest_key("damaged"), b'{"run_id": "dam')
            await store.append(cp("fenced", 5, 2, Phase.POST_LLM))
            await store.append(cp("fenced", (1 << 32) | 1, 3, Phase.PRE_TOOL_BATCH))
            await store.backend.delete(T, checkpoint_key("fenced", 3, "pre_tool_batch"))
            await store.backend.put(T, checkpoint_key("fenced", 2, "pre_llm"), b"\x00garbage")

    asyncio.run(fill())
    return url


# -- plugins -------------------------------------------------------------------------------------


def test_plugins_table() -> None:
    result = run("plugins")
    assert result.exit_code == 0, result.output
    for text in ["memory", "file", "redis+cluster", "postgresql+asyncpg", "mongodb", "s3"]:
        assert text in result.stdout
    assert "checkpoint-stores 0.1.0" in result.stdout
    assert "checkpoint_stores.backends.file:FileBackend" in result.stdout
    assert "failed to load" not in result.stdout


def test_plugins_json() -> None:
    result = run("plugins", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    schemes = {s["scheme"]: s for s in data["schemes"]}
    assert schemes["file"]["distribution"] == "checkpoint-stores"
    assert schemes["file"]["extra"] is None
    assert schemes["redis"]["extra"] == "redis"
    assert schemes["s3"]["target"] == "checkpoint_stores.backends.s3:S3Backend"
    assert schemes["postgresql+psycopg"]["extra"] == "psycopg"
    assert data["failures"] == []


# -- inspect -------------------------------------------------------------------------------------


def test_inspect_lists_runs(store_url: str) -> None:
    result = run("inspect", store_url, "--thread", T)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "runs in thread 'thread-1'" in out
    for run_id in ["damaged", "done", "fenced", "running"]:
        assert run_id in out
    assert "run_terminal" in out
    assert "1:1" in out  # seq with a fencing epoch shows as epoch:counter
    assert "unreadable" in out  # the damaged run is listed, not fatal
    assert "2023-11-14T22:13:20.004Z" in out


def test_inspect_lists_runs_as_json(store_url: str) -> None:
    result = run("inspect", store_url, "-t", T, "--json")
    assert result.exit_code == 0, result.output
    runs = {r["run_id"]: r for r in json.loads(result.stdout)}
    assert sorted(runs) == ["damaged", "done", "fenced", "running"]
    assert runs["done"] == {
        "run_id": "done",
        "seq": 4,
        "step": 1,
        "phase": "run_terminal",
        "timestamp_ms": 1_700_000_000_004,
        "error": None,
    }
    assert "invalid JSON" in runs["damaged"]["error"]
    assert runs["fenced"]["seq"] == (1 << 32) | 1


def test_inspect_chain_marks_latest(store_url: str) -> None:
    result = run("inspect", store_url, "-t", T, "--run", "done")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "run 'done' in thread 'thread-1'" in result.stdout
    marked = [line for line in lines if "latest" in line and "run_terminal" in line]
    assert len(marked) == 1
    assert sum("◀ latest" in line for line in lines) == 1
    phases = [p for line in lines for p in ["run_started", "runtime_state", "pre_llm"] if p in line]
    assert phases == ["run_started", "runtime_state", "pre_llm"]  # by seq; no latest/runtime copies
    assert "KiB" in result.stdout  # the 3 KB record's size


def test_inspect_chain_as_json(store_url: str) -> None:
    result = run("inspect", store_url, "-t", T, "-r", "done", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [(r["seq"], r["step"], r["phase"]) for r in rows] == [
        (1, 0, "run_started"),
        (2, 1, "runtime_state"),
        (3, 1, "pre_llm"),
        (4, 1, "run_terminal"),
    ]
    assert [r["latest"] for r in rows] == [False, False, False, True]
    assert rows[2]["size"] > 3000
    assert rows[0]["key"] == "checkpoint:done:0:run_started"
    assert all(r["error"] is None for r in rows)


def test_inspect_chain_with_damage_and_a_missing_latest_record(store_url: str) -> None:
    data = json.loads(run("inspect", store_url, "-t", T, "-r", "fenced", "--json").stdout)
    damaged = [r for r in data if r["error"]]
    assert len(damaged) == 1
    assert damaged[0]["key"] == "checkpoint:fenced:2:pre_llm"
    assert not any(r["latest"] for r in data)  # latest's own step record is gone
    table = run("inspect", store_url, "-t", T, "-r", "fenced")
    assert table.exit_code == 0, table.output
    assert "latest: seq 1:1, step 3, pre_tool_batch" in table.stdout
    assert "checkpoint:fenced:2:pre_llm" in table.stdout


def test_inspect_chain_with_an_unreadable_latest_shows_the_chain_then_fails(
    store_url: str,
) -> None:
    result = run("inspect", store_url, "-t", T, "-r", "damaged")
    assert result.exit_code == 1
    assert "run_started" in result.stdout  # the records that still read are shown
    assert "latest: unreadable" in result.stdout
    assert "AgentCheckpointCorruptionError" in result.stderr
    assert "invalid JSON" in result.stderr
    as_json = run("inspect", store_url, "-t", T, "-r", "damaged", "--json")
    assert as_json.exit_code == 1
    rows = json.loads(as_json.stdout)
    assert [(r["phase"], r["latest"]) for r in rows] == [("run_started", False)]


def test_inspect_unknown_run_is_an_error(store_url: str) -> None:
    result = run("inspect", store_url, "-t", T, "-r", "nope")
    assert result.exit_code == 1
    assert "CheckpointNotFoundError" in result.stderr
    assert "'nope'" in result.stderr


def test_inspect_bad_url_is_an_error_without_secrets() -> None:
    result = run("inspect", "nosuchdb://admin:hunter2@db/x", "-t", T)
    assert result.exit_code == 1
    assert "BackendNotFoundError" in result.stderr
    assert "hunter2" not in result.output


def test_inspect_bad_option_is_a_usage_error(store_url: str) -> None:
    result = run("inspect", store_url, "-t", T, "-o", "novalue")
    assert result.exit_code == 2
    assert "is not key=value" in result.output
    unknown = run("inspect", store_url, "-t", T, "-o", "pool=3")
    assert unknown.exit_code == 2
    assert "does not take options ['pool']" in unknown.stderr
