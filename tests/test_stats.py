"""collect_stats: exact counts, bytes as stored, oldest/newest, unreadable values."""

from __future__ import annotations

import pytest

from checkpoint_stores import Codec, MemoryStore, open_store
from checkpoint_stores.encryption import AESGCMCipher, generate_key
from checkpoint_stores.stats import collect_stats
from tests.ops_samples import (
    BASE_MS,
    backend_params,
    dump,
    fill,
    server_param,
    unique_prefix,
    write_run,
)
from tests.support import ServerInfo

# write_run(finished=True, steps=3): 11 records, 2 effects; (finished=False, steps=2): 7 records.
FINISHED_RECORDS, LIVE_RECORDS = 11, 7


@pytest.fixture
def server(request: pytest.FixtureRequest) -> ServerInfo:
    return server_param(request)


async def _check(store: MemoryStore, prefix: str, threads: list[str]) -> None:
    stats = await collect_stats(store, thread_prefix=prefix)
    stored = await dump(store, threads)
    assert [t.thread_id for t in stats.threads] == sorted(threads)
    for t in stats.threads:
        values = stored[t.thread_id]
        assert t.runs == 2
        assert t.finished_runs == 1
        assert t.headless_runs == 0
        assert t.records == FINISHED_RECORDS + LIVE_RECORDS
        assert t.effects == 4
        assert t.state_keys == 1
        assert t.keys == len(values)
        assert t.bytes == sum(len(v) for _, v in values)
        # write_run stamps records BASE_MS + seq: oldest is seq 1, newest the terminal (seq 11).
        assert t.oldest_ms == BASE_MS + 1
        assert t.newest_ms == BASE_MS + FINISHED_RECORDS
        assert t.unreadable == 0
    totals = stats.totals()
    assert totals["threads"] == len(threads)
    assert totals["runs"] == 2 * len(threads)
    assert totals["bytes"] == sum(t.bytes for t in stats.threads)
    assert stats.as_dict()["totals"] == totals


async def test_counts_are_exact() -> None:
    async with open_store("memory://") as store:
        threads = await fill(store, "s-")
        await _check(store, "s-", threads)


async def test_named_threads_and_empty_store() -> None:
    async with open_store("memory://") as store:
        assert (await collect_stats(store)).totals()["threads"] == 0
        await fill(store, "n-", suffixes=("a", "b"))
        only = await collect_stats(store, thread_ids=["n-b"])
        assert [t.thread_id for t in only.threads] == ["n-b"]


async def test_unreadable_values_are_counted_not_fatal() -> None:
    async with open_store("memory://") as store:
        await write_run(store, "t", "r", finished=True)
        await store.backend.put("t", "checkpoint:r:2:pre_llm", b"\xffCP\x01\x00 broken")
        await store.backend.put("t", "checkpoint:headless:1:pre_llm", b"[1, 2]")
        stats = (await collect_stats(store)).threads[0]
        assert stats.unreadable == 2  # the broken envelope, and JSON that is not a record
        assert stats.headless_runs == 1


async def test_encrypted_store_needs_its_keys_for_times() -> None:
    cipher = AESGCMCipher({"k": generate_key()})
    async with open_store("memory://", codec=Codec(cipher=cipher)) as store:
        await write_run(store, "t", "r", finished=True)
        with_keys = (await collect_stats(store)).threads[0]
        assert with_keys.unreadable == 0
        assert with_keys.newest_ms == BASE_MS + FINISHED_RECORDS
        without = (await collect_stats(MemoryStore(store.backend))).threads[0]
        assert without.unreadable == FINISHED_RECORDS + 1  # every record and the latest
        assert without.oldest_ms is None
        assert without.bytes == with_keys.bytes


@backend_params
async def test_stats_on_each_backend(server: ServerInfo) -> None:
    prefix = unique_prefix()
    async with open_store(server.url, **server.options) as store:
        threads = await fill(store, prefix, suffixes=("a", "{b}%_*/..", "nul\x00"))
        try:
            await _check(store, prefix, threads)
        finally:
            for thread in threads:
                await store.delete_thread(thread)
