"""The operating commands: copy, prune, stats, rotate (exit codes, output, --json, secrets)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from click.testing import CliRunner, Result

from checkpoint_stores import MemoryStore, Phase, open_store
from checkpoint_stores.cli import main
from checkpoint_stores.codec import envelope_key_id
from checkpoint_stores.encryption import generate_key
from tests.ops_samples import BASE_MS, cp, dump, fill, write_run
from tests.support import free_port

T = TypeVar("T")
KEYS = f"k1:{generate_key()}"


def run(body: Callable[[MemoryStore], Awaitable[T]], url: str) -> T:
    async def go() -> T:
        async with open_store(url) as store:
            return await body(store)

    return asyncio.run(go())


def cli(*args: str, env: dict[str, str] | None = None) -> Result:
    # Wide enough that rich does not wrap the lines the assertions look for.
    return CliRunner().invoke(
        main, list(args), env={"COLUMNS": "240", **(env or {})}, catch_exceptions=False
    )


@pytest.fixture
def src(tmp_path: Path) -> tuple[str, list[str]]:
    url = f"file://{tmp_path / 'src'}"
    threads = run(lambda s: fill(s, "c-", suffixes=("one", "[bold]two[/bold]")), url)
    return url, threads


def snapshot(url: str, threads: list[str]) -> dict[str, Any]:
    return run(lambda s: dump(s, threads), url)


def test_copy_then_rerun(src: tuple[str, list[str]], tmp_path: Path) -> None:
    url, threads = src
    dst = f"file://{tmp_path / 'dst'}"
    first = cli("copy", url, dst)
    assert first.exit_code == 0, first.output
    assert "2 threads, 4 runs (4 copied" in first.output
    assert snapshot(dst, threads) == snapshot(url, threads)
    again = cli("copy", url, dst, "--json")
    assert again.exit_code == 0
    report = json.loads(again.output)
    assert report["keys_written"] == 0
    assert report["runs_unchanged"] == 4
    assert report["refused"] == []


def test_copy_one_thread_and_run(src: tuple[str, list[str]], tmp_path: Path) -> None:
    url, threads = src
    dst = f"file://{tmp_path / 'dst'}"
    result = cli("copy", url, dst, "--thread", threads[0], "--run", "done-run", "--json")
    assert result.exit_code == 0, result.output
    copied = snapshot(dst, threads)
    assert copied[threads[1]] == []
    assert copied[threads[0]]
    assert all(":done-run:" in k for k, _ in copied[threads[0]])


def test_copy_refusal_exits_1_and_names_the_run(src: tuple[str, list[str]], tmp_path: Path) -> None:
    url, threads = src
    dst = f"file://{tmp_path / 'dst'}"

    async def ahead(store: MemoryStore) -> None:
        await store.append(cp(threads[0], "live-run", 99, 9, Phase.PRE_LLM))

    run(ahead, dst)
    result = cli("copy", url, dst)
    assert result.exit_code == 1
    assert "refused runs" in result.output
    assert "live-run" in result.output
    assert "99" in result.output
    assert run(lambda s: s.latest(threads[0], "live-run"), dst).seq == 99


def test_copy_encrypting_and_stats_with_and_without_keys(
    src: tuple[str, list[str]], tmp_path: Path
) -> None:
    url, threads = src
    dst = f"file://{tmp_path / 'enc'}"
    env = {"OPS_KEYS": KEYS}
    result = cli("copy", url, dst, "--dst-keys-env", "OPS_KEYS", env=env)
    assert result.exit_code == 0, result.output
    assert KEYS.split(":", 1)[1] not in result.output
    stored = snapshot(dst, threads)
    assert {envelope_key_id(v) for values in stored.values() for _, v in values} == {"k1"}

    with_keys = cli("stats", dst, "--json", "--keys-env", "OPS_KEYS", env=env)
    totals = json.loads(with_keys.output)["totals"]
    assert totals["unreadable"] == 0
    assert totals["newest_ms"] is not None
    without = cli("stats", dst, "--json", env={"CHECKPOINT_STORES_ENCRYPTION_KEYS": ""})
    assert json.loads(without.output)["totals"]["unreadable"] > 0


def test_stats_table_and_json(src: tuple[str, list[str]]) -> None:
    url, threads = src
    as_json = cli("stats", url, "--json")
    assert as_json.exit_code == 0
    data = json.loads(as_json.output)
    assert [t["thread_id"] for t in data["threads"]] == sorted(threads)
    assert data["totals"]["runs"] == 4
    assert data["totals"]["finished_runs"] == 2
    stored = snapshot(url, threads)
    assert data["totals"]["bytes"] == sum(len(v) for values in stored.values() for _, v in values)
    table = cli("stats", url)
    assert table.exit_code == 0
    # Ids are shown verbatim, never interpreted as rich markup.
    assert "[bold]two[/bold]" in table.output
    assert "2 threads" in table.output


def test_prune_dry_run_then_real(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'p'}"

    async def seed(store: MemoryStore) -> None:
        await write_run(store, "t", "old", finished=True, start_ms=BASE_MS)
        await write_run(store, "t", "new", finished=False, start_ms=BASE_MS + 10**12)

    run(seed, url)
    before = snapshot(url, ["t"])
    plan = cli("prune", url, "--older-than", "30d", "--keep-last", "2", "--dry-run", "--json")
    assert plan.exit_code == 0, plan.output
    assert snapshot(url, ["t"]) == before
    planned = json.loads(plan.output)
    assert planned["dry_run"] is True
    assert planned["runs_deleted"] == [{"thread_id": "t", "run_id": "old"}]

    shown = cli("prune", url, "--older-than", "30d", "--keep-last", "2", "--dry-run")
    assert "would delete" in shown.output
    assert snapshot(url, ["t"]) == before

    done = cli("prune", url, "--older-than", "30d", "--keep-last", "2", "--json")
    assert done.exit_code == 0
    report = json.loads(done.output)
    assert report["deleted"] == planned["deleted"]
    after = {k for k, _ in snapshot(url, ["t"])["t"]}
    assert after == {k for k, _ in before["t"]} - {d["key"] for d in planned["deleted"]}
    assert "checkpoint:new:latest" in after
    assert "checkpoint:new:runtime" in after


def test_prune_needs_a_rule(tmp_path: Path) -> None:
    result = cli("prune", f"file://{tmp_path}")
    assert result.exit_code == 2
    assert "--keep-last" in result.output
    bad_age = cli("prune", f"file://{tmp_path}", "--older-than", "soon")
    assert bad_age.exit_code == 2
    assert "30d" in bad_age.output


def test_rotate_via_env(src: tuple[str, list[str]], tmp_path: Path) -> None:
    url, threads = src
    enc = f"file://{tmp_path / 'enc'}"
    old = {"OPS_KEYS": KEYS}
    assert cli("copy", url, enc, "--dst-keys-env", "OPS_KEYS", env=old).exit_code == 0
    new_keys = f"k2:{generate_key()},{KEYS}"
    env = {"CHECKPOINT_STORES_ENCRYPTION_KEYS": new_keys}
    plan = cli("rotate", enc, "--dry-run", "--json", env=env)
    assert json.loads(plan.output)["reencrypted"] > 0
    result = cli("rotate", enc, env=env)
    assert result.exit_code == 0, result.output
    assert "re-stamped" in result.output
    for secret in (KEYS.split(":", 1)[1], new_keys.split(",")[0].split(":", 1)[1]):
        assert secret not in result.output
    stored = snapshot(enc, threads)
    assert {envelope_key_id(v) for values in stored.values() for _, v in values} == {"k2"}
    again = json.loads(cli("rotate", enc, "--json", env=env).output)
    assert again["reencrypted"] == 0


def test_rotate_without_keys_is_a_usage_error(tmp_path: Path) -> None:
    result = cli("rotate", f"file://{tmp_path}", env={"CHECKPOINT_STORES_ENCRYPTION_KEYS": ""})
    assert result.exit_code == 2
    assert "CHECKPOINT_STORES_ENCRYPTION_KEYS" in result.output


def test_bad_keys_variable_is_reported_without_the_value(tmp_path: Path) -> None:
    result = cli(
        "stats", f"file://{tmp_path}", "--keys-env", "BAD", env={"BAD": "k:hunter2hunter2"}
    )
    assert result.exit_code == 2
    assert "hunter2" not in result.output


def test_unreachable_server_error_redacts_the_password(tmp_path: Path) -> None:
    url = f"redis://:hunter2secret@127.0.0.1:{free_port()}/0?socket_connect_timeout=1"
    result = cli("copy", url, f"file://{tmp_path}", "--thread", "t")
    assert result.exit_code == 1
    assert "hunter2secret" not in result.output
    assert "StoreUnavailableError" in result.output


def test_progress_bar_counts_keys_and_bytes() -> None:
    from checkpoint_stores.cli.copy import RichCopyProgress

    with RichCopyProgress(enabled=False) as bar:
        bar.planned(3, 300)
        bar.planned(1, 50)
        bar.advanced(2, 200)
        task = bar._progress.tasks[0]
        assert (task.completed, task.total) == (200, 350)
        assert (task.fields["items"], task.fields["total_items"]) == (2, 4)
