"""prune: exact key sets kept and deleted, heads never touched, dry-run, native TTL."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta

import pytest

from checkpoint_stores import MemoryStore, Phase, open_store
from checkpoint_stores.backends.memory import MemoryBackend
from checkpoint_stores.inventory import ThreadListingUnsupportedError
from checkpoint_stores.retention import parse_duration, prune
from checkpoint_stores.schema import Checkpoint
from tests.ops_samples import (
    BASE_MS,
    UnlistedBackend,
    WrappedBackend,
    backend_params,
    dump,
    server_param,
    unique_prefix,
    write_run,
)
from tests.support import ServerInfo

pytestmark = pytest.mark.timeout(300)

DAY_MS = 86_400_000


@pytest.fixture
def server(request: pytest.FixtureRequest) -> ServerInfo:
    return server_param(request)


def rec(thread: str, run: str, seq: int, step: int, phase: Phase, ts: int = BASE_MS) -> Checkpoint:
    return Checkpoint(
        run_id=run, thread_id=thread, seq=seq, step=step, phase=phase, payload={}, timestamp_ms=ts
    )


# seq -> (step, phase) of a run whose runtime key names an older record (seq 5)
# than the latest (seq 8): both must survive any keep_last.
CHAIN = [
    (0, Phase.RUN_STARTED),
    (1, Phase.RUNTIME_STATE),
    (1, Phase.PRE_LLM),
    (1, Phase.POST_LLM),
    (2, Phase.RUNTIME_STATE),
    (2, Phase.PRE_LLM),
    (2, Phase.POST_LLM),
    (3, Phase.STEP_STARTED),
]


def key(run: str, step: int, phase: Phase) -> str:
    return f"checkpoint:{run}:{step}:{phase.value}"


async def write_chain(store: MemoryStore, thread: str, run: str = "r") -> None:
    for seq, (step, phase) in enumerate(CHAIN, start=1):
        await store.append(rec(thread, run, seq, step, phase, BASE_MS + seq))
    await store.put_state(thread, f"effect:{run}:1:call-1", {"input_hash": "x"})
    await store.put_state(thread, "notes", {"a": 1})


async def keys_of(store: MemoryStore, thread: str) -> set[str]:
    return {k async for k, _ in store.backend.list(thread)}


def all_chain_keys(run: str = "r") -> set[str]:
    return {key(run, step, phase) for step, phase in CHAIN}


HEADS = {"checkpoint:r:latest", "checkpoint:r:runtime"}
OTHERS = {"effect:r:1:call-1", "notes"}


@pytest.mark.parametrize(
    ("keep", "kept_seqs"),
    [
        (0, {8, 5}),  # only what latest and runtime name
        (1, {8, 5}),
        (2, {8, 7, 5}),
        (3, {8, 7, 6, 5}),
        (5, {8, 7, 6, 5, 4}),
        (8, set(range(1, 9))),
        (100, set(range(1, 9))),
    ],
)
async def test_keep_last_keeps_exactly_the_newest_and_what_heads_name(
    keep: int, kept_seqs: set[int]
) -> None:
    async with open_store("memory://") as store:
        await write_chain(store, "t")
        report = await prune(store, keep_last=keep)
        expected_records = {key("r", *CHAIN[s - 1]) for s in kept_seqs}
        assert await keys_of(store, "t") == expected_records | HEADS | OTHERS
        assert {k for _, k in report.deleted} == all_chain_keys() - expected_records
        # The heads still read, and resume's O(1) runtime read still works.
        assert (await store.latest("t", "r")).seq == 8
        snapshot = await store.runtime_snapshot("t", "r")
        assert snapshot is not None
        assert snapshot.seq == 5


async def test_dry_run_lists_exactly_what_a_real_run_deletes_and_changes_nothing() -> None:
    async with open_store("memory://") as store:
        await write_chain(store, "t")
        await write_run(store, "t", "old", finished=True, start_ms=BASE_MS)
        before = await dump(store, ["t"])
        now = BASE_MS + 40 * DAY_MS
        plan = await prune(store, keep_last=2, older_than=timedelta(days=30), dry_run=True, now=now)
        assert plan.dry_run
        assert await dump(store, ["t"]) == before
        done = await prune(store, keep_last=2, older_than=timedelta(days=30), now=now)
        assert plan.deleted == done.deleted
        assert plan.runs_deleted == done.runs_deleted == [("t", "old")]
        assert plan.bytes_freed == done.bytes_freed > 0
        assert await dump(store, ["t"]) != before


async def test_older_than_deletes_finished_runs_with_their_effects() -> None:
    async with open_store("memory://") as store:
        await write_run(store, "t", "old-done", finished=True, start_ms=BASE_MS)
        await write_run(store, "t", "old-live", finished=False, start_ms=BASE_MS)
        await write_run(store, "t", "new-done", finished=True, start_ms=BASE_MS + 20 * DAY_MS)
        await store.put_state("t", "notes", {"kept": True})
        old_done = {k for k in await keys_of(store, "t") if ":old-done:" in k}
        assert any(k.startswith("effect:old-done:") for k in old_done)
        before = await keys_of(store, "t")

        report = await prune(store, older_than=timedelta(days=10), now=BASE_MS + 25 * DAY_MS)
        assert report.runs_deleted == [("t", "old-done")]
        assert await keys_of(store, "t") == before - old_done
        assert {k for _, k in report.deleted} == old_done
        # The latest goes last, so an interrupted prune leaves a run that still reads.
        assert report.deleted[-1] == ("t", "checkpoint:old-done:latest")

        unfinished = await prune(
            store, older_than=timedelta(days=10), include_unfinished=True, now=BASE_MS + 25 * DAY_MS
        )
        assert unfinished.runs_deleted == [("t", "old-live")]
        assert await store.list_runs("t") == ["new-done"]
        assert "notes" in await keys_of(store, "t")


async def test_keep_last_leaves_unreadable_records_and_reports_them() -> None:
    async with open_store("memory://") as store:
        await write_chain(store, "t")
        damaged = key("r", 1, Phase.PRE_LLM)
        await store.backend.put("t", damaged, b"\xffCP\x01\x00garbage")
        report = await prune(store, keep_last=1)
        assert damaged in await keys_of(store, "t")
        assert any("unreadable" in reason for _, _, reason in report.kept)


async def test_unreadable_latest_leaves_the_run_alone() -> None:
    async with open_store("memory://") as store:
        await write_chain(store, "t")
        await store.backend.put("t", "checkpoint:r:latest", b"{not json")
        before = await dump(store, ["t"])
        report = await prune(store, keep_last=0, older_than=0)
        assert report.deleted == []
        assert await dump(store, ["t"]) == before
        assert [(r, why[:17]) for _, r, why in report.kept] == [("r", "latest unreadable")]


async def test_records_newer_than_the_latest_read_are_kept() -> None:
    # A writer may append between prune's read of latest and its delete: simulate a
    # record with a higher seq than latest (written by commit, head not yet moved).
    async with open_store("memory://") as store:
        await write_chain(store, "t")
        await store.backend.put(
            "t",
            key("r", 4, Phase.PRE_LLM),
            store.encode_checkpoint(rec("t", "r", 9, 4, Phase.PRE_LLM)),
        )
        await prune(store, keep_last=0)
        assert key("r", 4, Phase.PRE_LLM) in await keys_of(store, "t")


async def test_afk_v1_records_without_seq_prune_by_step() -> None:
    async with open_store("memory://") as store:
        for step in range(4):
            await store.put_state(
                "t",
                f"checkpoint:v1run:{step}:pre_llm",
                {
                    "schema_version": "v1",
                    "run_id": "v1run",
                    "step": step,
                    "phase": "pre_llm",
                    "payload": {},
                },
            )
        await store.put_state(
            "t",
            "checkpoint:v1run:latest",
            {
                "schema_version": "v1",
                "run_id": "v1run",
                "step": 3,
                "phase": "pre_llm",
                "payload": {},
            },
        )
        await prune(store, keep_last=2)
        assert await keys_of(store, "t") == {
            "checkpoint:v1run:2:pre_llm",
            "checkpoint:v1run:3:pre_llm",
            "checkpoint:v1run:latest",
        }


async def test_arguments_are_checked() -> None:
    store = open_store("memory://")
    with pytest.raises(ValueError, match="keep_last"):
        await prune(store)
    with pytest.raises(ValueError, match="non-negative"):
        await prune(store, keep_last=-1)
    with pytest.raises(ValueError, match="negative"):
        await prune(store, older_than=-5)
    unlisted = MemoryStore(UnlistedBackend(MemoryBackend()))
    with pytest.raises(ThreadListingUnsupportedError):
        await prune(unlisted, keep_last=1)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30d", 30 * 86400), ("12h", 43200), ("1w2d", 9 * 86400), ("90m", 5400), ("45", 45)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text).total_seconds() == seconds


@pytest.mark.parametrize("text", ["", "abc", "10x", "5d junk", "d5"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="30d"):
        parse_duration(text)


class ExpiringBackend(WrappedBackend):
    """Records Expirer calls (the passthrough itself is what is tested here)."""

    def __init__(self, inner: MemoryBackend) -> None:
        super().__init__(inner)
        self.expired: list[tuple[str, str, float]] = []

    @property
    def capabilities(self):  # type: ignore[no-untyped-def]
        from dataclasses import replace

        return replace(self.inner.capabilities, ttl=True)

    async def expire_prefix(self, thread_id: str, prefix: str, ttl_seconds: float) -> int:
        self.expired.append((thread_id, prefix, ttl_seconds))
        return 1


async def test_native_ttl_hands_young_finished_runs_to_the_backend() -> None:
    backend = ExpiringBackend(MemoryBackend())
    store = MemoryStore(backend)
    await write_run(store, "t", "young-done", finished=True, start_ms=BASE_MS)
    await write_run(store, "t", "young-live", finished=False, start_ms=BASE_MS)
    await write_run(store, "t", "old-done", finished=True, start_ms=BASE_MS - 40 * DAY_MS)
    now = BASE_MS + 10 * DAY_MS
    dry = await prune(store, older_than=timedelta(days=30), native_ttl=True, dry_run=True, now=now)
    assert backend.expired == []
    report = await prune(store, older_than=timedelta(days=30), native_ttl=True, now=now)
    assert report.runs_deleted == dry.runs_deleted == [("t", "old-done")]
    latest_ms = (await store.latest("t", "young-done")).timestamp_ms
    ttl = (latest_ms + 30 * DAY_MS - now) / 1000
    assert backend.expired == [
        ("t", "checkpoint:young-done:", ttl),
        ("t", "effect:young-done:", ttl),
    ]
    assert report.runs_expiring == dry.runs_expiring == [("t", "young-done", ttl)]


async def test_native_ttl_without_support_says_so() -> None:
    async with open_store("memory://") as store:
        await write_run(store, "t", "r", finished=True)
        report = await prune(store, older_than=timedelta(days=30), native_ttl=True, now=BASE_MS)
        assert report.runs_expiring == []
        assert any("no native TTL" in n for n in report.notes)


# -- every backend -----------------------------------------------------------------


async def _seed(store: MemoryStore, threads: Sequence[str]) -> None:
    for thread in threads:
        await write_chain(store, thread)
        await write_run(store, thread, "old", finished=True, start_ms=BASE_MS - 60 * DAY_MS)
        await write_run(store, thread, "stuck", finished=False, start_ms=BASE_MS - 60 * DAY_MS)


@backend_params
async def test_prune_on_each_backend(server: ServerInfo) -> None:
    prefix = unique_prefix()
    threads = [prefix + "a", prefix + "{b}/../%_*"]
    async with open_store(server.url, **server.options) as store:
        try:
            await _seed(store, threads)
            before = await dump(store, threads)
            rules = {"keep_last": 2, "older_than": timedelta(days=30), "now": BASE_MS}
            plan = await prune(store, thread_prefix=prefix, dry_run=True, **rules)  # type: ignore[arg-type]
            assert await dump(store, threads) == before
            report = await prune(store, thread_prefix=prefix, **rules)  # type: ignore[arg-type]
            assert report.deleted == plan.deleted
            for thread in threads:
                expected = (
                    {key("r", *CHAIN[s - 1]) for s in (8, 7, 5)}
                    | HEADS
                    | OTHERS
                    | {k for k, _ in before[thread] if ":stuck:" in k and not _pruned_stuck(k)}
                )
                assert await keys_of(store, thread) == expected, thread
                assert sorted(await store.list_runs(thread)) == ["r", "stuck"]
            assert sorted(r for _, r in report.runs_deleted) == ["old", "old"]
        finally:
            for thread in threads:
                await store.delete_thread(thread)


def _pruned_stuck(key_: str) -> bool:
    """keep_last=2 on the unfinished 'stuck' run (steps 1-3, runtime at step 3, latest seq 10)."""
    kept = {
        "checkpoint:stuck:3:post_llm",  # seq 10, the latest's record
        "checkpoint:stuck:3:pre_llm",  # seq 9
        "checkpoint:stuck:3:runtime_state",  # seq 8, named by runtime (and 3rd newest)
        "checkpoint:stuck:latest",
        "checkpoint:stuck:runtime",
    }
    return key_.startswith("checkpoint:stuck:") and key_ not in kept


@backend_params
async def test_native_ttl_on_each_backend(server: ServerInfo) -> None:
    thread = unique_prefix() + "ttl"
    async with open_store(server.url, **server.options) as store:
        try:
            await write_run(store, thread, "done", finished=True, start_ms=BASE_MS)
            await write_run(store, thread, "live", finished=False, start_ms=BASE_MS)
            keys = await keys_of(store, thread)
            latest_ms = (await store.latest(thread, "done")).timestamp_ms
            # Two seconds before the finished run reaches the age.
            now = latest_ms + 30 * DAY_MS - 2000
            report = await prune(
                store, older_than=timedelta(days=30), native_ttl=True, thread_ids=[thread], now=now
            )
            assert report.deleted == []
            if not store.capabilities.ttl:
                assert report.runs_expiring == []
                assert report.notes
                assert await keys_of(store, thread) == keys
                return
            assert report.runs_expiring == [(thread, "done", 2.0)]
            if server.name.startswith("redis"):
                # Redis expires on time: wait (bounded) for the finished run to vanish.
                for _ in range(200):
                    if not any(":done:" in k for k in await keys_of(store, thread)):
                        break
                    await asyncio.sleep(0.1)
                assert await keys_of(store, thread) == {k for k in keys if ":done:" not in k}
            # (MongoDB's TTL monitor runs about once a minute: its expiry is the
            # backend's own test; here the unfinished run must simply stay.)
            assert await store.list_runs(thread) in (["live"], ["done", "live"])
            assert (await store.latest(thread, "live")).seq > 0
        finally:
            await store.delete_thread(thread)
