"""copy_store: byte-exact round trips, resume after interruption, fencing, re-encoding."""

from __future__ import annotations

from pathlib import Path

import pytest

from checkpoint_stores import (
    AgentCheckpointCorruptionError,
    Codec,
    MemoryStore,
    Phase,
    StaleWriterError,
    open_store,
)
from checkpoint_stores.backends.memory import MemoryBackend
from checkpoint_stores.codec import envelope_key_id
from checkpoint_stores.copy import copy_store
from checkpoint_stores.encryption import AESGCMCipher, generate_key
from checkpoint_stores.inventory import ThreadListingUnsupportedError
from checkpoint_stores.keys import checkpoint_latest_key
from tests.ops_samples import (
    FailAfter,
    UnlistedBackend,
    WrappedBackend,
    backend_params,
    cp,
    dump,
    fill,
    server_param,
    unique_prefix,
    write_run,
)
from tests.support import ServerInfo

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def server(request: pytest.FixtureRequest) -> ServerInfo:
    return server_param(request)


def fresh_memory() -> MemoryStore:
    return open_store("memory://")


async def test_memory_file_memory_round_trip_is_byte_for_byte(tmp_path: Path) -> None:
    prefix = unique_prefix()
    async with fresh_memory() as src, open_store(f"file://{tmp_path}") as mid:
        threads = await fill(src, prefix)
        first = await copy_store(src, mid, thread_prefix=prefix)
        async with fresh_memory() as back:
            second = await copy_store(mid, back, thread_prefix=prefix)
            original = await dump(src, threads)
            assert await dump(mid, threads) == original
            assert await dump(back, threads) == original
            assert sorted([t async for t in back.backend.list_threads()]) == sorted(threads)
    total = sum(len(v) for v in original.values())
    for report in (first, second):
        assert report.ok, report
        assert report.written == total
        assert report.threads == len(threads)
        assert report.runs_copied == 2 * len(threads)


async def test_copied_latest_keeps_its_seq_for_fencing(tmp_path: Path) -> None:
    async with fresh_memory() as src, open_store(f"file://{tmp_path}") as dst:
        chain = await write_run(src, "t", "r", finished=False)
        assert (await copy_store(src, dst)).ok
        last = chain[-1]
        # The destination's head carries the source seq: a writer at that seq is stale...
        with pytest.raises(StaleWriterError):
            await dst.append(cp("t", "r", last.seq, last.step + 1, last.phase))
        # ...and the next seq moves it.
        await dst.append(cp("t", "r", last.seq + 1, last.step + 1, last.phase))
        assert (await dst.latest("t", "r")).seq == last.seq + 1


async def test_rerun_writes_nothing() -> None:
    async with fresh_memory() as src, fresh_memory() as dst:
        threads = await fill(src, "x-")
        await copy_store(src, dst)
        again = await copy_store(src, dst)
        assert again.ok
        assert again.written == 0
        assert again.unchanged == sum(len(v) for v in (await dump(src, threads)).values())
        assert again.runs_unchanged == 2 * len(threads)


async def test_interrupted_copy_resumes_without_duplicates_at_every_point() -> None:
    async with fresh_memory() as src:
        threads = await fill(src, "i-", suffixes=("one", "t/two"))
        original = await dump(src, threads)
        total = sum(len(v) for v in original.values())
        assert total > 20
        for limit in range(total):
            dst_backend = MemoryBackend()
            failing = FailAfter(dst_backend, limit)
            with pytest.raises(Exception, match="injected"):
                await copy_store(src, MemoryStore(failing))
            landed = sum(len(v) for v in (await dump(MemoryStore(dst_backend), threads)).values())
            # A commit carries two keys (runtime + latest), so it may stop one short.
            assert landed == failing.keys_written
            assert limit - 1 <= landed <= limit

            counting = WrappedBackend(dst_backend)
            report = await copy_store(src, MemoryStore(counting))
            assert report.ok, (limit, report)
            # Only what was missing is written, once: no duplicate and nothing rewritten.
            assert report.written == total - landed, limit
            assert counting.keys_written == total - landed, limit
            assert report.unchanged == landed, limit
            assert await dump(MemoryStore(dst_backend), threads) == original, limit


async def test_interrupted_copy_never_leaves_a_latest_without_its_records() -> None:
    async with fresh_memory() as src:
        await write_run(src, "t", "r", finished=True)
        total = sum(len(v) for v in (await dump(src, ["t"])).values())
        for limit in range(total):
            dst_backend = MemoryBackend()
            with pytest.raises(Exception, match="injected"):
                await copy_store(src, MemoryStore(FailAfter(dst_backend, limit)))
            # The latest is written last, so a destination with a latest has everything.
            assert await dst_backend.get("t", checkpoint_latest_key("r")) is None


async def test_copy_refuses_to_overwrite_a_newer_destination_latest() -> None:
    async with fresh_memory() as src, fresh_memory() as dst:
        await write_run(src, "t", "older-there", finished=False, steps=1)  # seq 1..4
        await write_run(src, "t", "newer-there", finished=False, steps=1)
        await write_run(src, "t", "fresh", finished=False, steps=1)
        # In the destination, "newer-there" went on to seq 9; "older-there" only to seq 2.
        await write_run(dst, "t", "newer-there", finished=True, steps=2)
        await dst.append(cp("t", "older-there", 1, 0, Phase.RUN_STARTED))
        await dst.append(cp("t", "older-there", 2, 1, Phase.RUNTIME_STATE))
        before = await dump(dst, ["t"])
        report = await copy_store(src, dst)

        assert not report.ok
        assert [(r.run_id, r.source_seq, r.destination_seq) for r in report.refused] == [
            ("newer-there", 4, 8)
        ]
        assert "newer" in report.refused[0].reason
        after = await dump(dst, ["t"])
        newer_keys = [kv for kv in before["t"] if ":newer-there:" in kv[0]]
        assert [kv for kv in after["t"] if ":newer-there:" in kv[0]] == newer_keys
        assert (await dst.latest("t", "newer-there")).seq == 8
        assert (await dst.latest("t", "older-there")).seq == 4  # moved forward
        assert (await dst.latest("t", "fresh")).seq == 4
        assert report.runs_copied == 2


async def test_copy_refuses_same_seq_with_other_content() -> None:
    async with fresh_memory() as src, fresh_memory() as dst:
        await src.append(cp("t", "r", 1, 0, Phase.RUN_STARTED, agent_name="a"))
        await dst.append(cp("t", "r", 1, 0, Phase.RUN_STARTED, agent_name="b"))
        before = await dump(dst, ["t"])
        report = await copy_store(src, dst)
        assert [(r.run_id, r.source_seq, r.destination_seq) for r in report.refused] == [
            ("r", 1, 1)
        ]
        assert await dump(dst, ["t"]) == before


async def test_copy_one_run_only() -> None:
    async with fresh_memory() as src, fresh_memory() as dst:
        threads = await fill(src, "r-", suffixes=("a",))
        report = await copy_store(src, dst, run_id="done-run")
        assert report.ok
        keys = [k for k, _ in (await dump(dst, threads))[threads[0]]]
        assert keys
        assert all(":done-run:" in k for k in keys)
        want = [k for k, _ in (await dump(src, threads))[threads[0]] if ":done-run:" in k]
        assert keys == want


async def test_enumerating_threads_needs_list_threads() -> None:
    async with fresh_memory() as plain:
        await fill(plain, "n-", suffixes=("a",))
        src = MemoryStore(UnlistedBackend(plain.backend))
        async with fresh_memory() as dst:
            with pytest.raises(ThreadListingUnsupportedError, match="--thread"):
                await copy_store(src, dst)
            report = await copy_store(src, dst, thread_ids=["n-a"])
            assert report.ok
            assert report.written > 0


class LyingBackend(WrappedBackend):
    """Reads back something other than what was stored (a broken destination)."""

    async def get_many(self, thread_id: str, keys):  # type: ignore[no-untyped-def]
        values = await self.inner.get_many(thread_id, keys)
        return [None if v is None else v[:-1] + bytes([v[-1] ^ 1]) for v in values]


async def test_verification_stops_before_the_latest_moves() -> None:
    async with fresh_memory() as src:
        await write_run(src, "t", "r", finished=True)
        inner = MemoryBackend()
        with pytest.raises(AgentCheckpointCorruptionError, match="verification failed"):
            await copy_store(src, MemoryStore(LyingBackend(inner)))
        assert await inner.get("t", checkpoint_latest_key("r")) is None


async def test_encrypting_while_copying_and_back() -> None:
    cipher = AESGCMCipher({"k1": generate_key()})
    async with fresh_memory() as src, open_store("memory://", codec=Codec(cipher=cipher)) as enc:
        threads = await fill(src, "e-", suffixes=("a", "b/c"))
        original = await dump(src, threads)
        report = await copy_store(src, enc)
        assert report.ok
        stored = await dump(enc, threads)
        assert [k for k, _ in stored[threads[0]]] == [k for k, _ in original[threads[0]]]
        for values in stored.values():
            assert all(envelope_key_id(v) == "k1" for _, v in values)
        assert (await enc.latest(threads[0], "done-run")).is_terminal
        # Resume compares decoded values (nonces differ on every encryption): nothing to do.
        again = await copy_store(src, enc)
        assert again.written == 0
        assert again.ok
        # Decrypting on the way back gives the original bytes exactly.
        async with fresh_memory() as back:
            assert (await copy_store(enc, back)).ok
            assert await dump(back, threads) == original


async def test_encrypted_bytes_copy_opaquely_without_keys() -> None:
    cipher = AESGCMCipher({"k1": generate_key()})
    async with open_store("memory://", codec=Codec(cipher=cipher)) as enc:
        await enc.put_state("t", "notes", {"secret": 1})
        async with fresh_memory() as backup:
            # No keys on either side: state values travel as opaque bytes.
            report = await copy_store(MemoryStore(enc.backend), backup)
            assert report.ok
            assert await dump(backup, ["t"]) == await dump(enc, ["t"])


# -- every backend -----------------------------------------------------------------


@backend_params
async def test_round_trip_through_each_backend(server: ServerInfo) -> None:
    prefix = unique_prefix()
    async with fresh_memory() as src, open_store(server.url, **server.options) as mid:
        threads = await fill(src, prefix)
        original = await dump(src, threads)
        try:
            there = await copy_store(src, mid, thread_prefix=prefix)
            assert there.ok, there
            assert await dump(mid, threads) == original
            async with fresh_memory() as back:
                home = await copy_store(mid, back, thread_prefix=prefix)
                assert home.ok, home
                assert await dump(back, threads) == original
            assert (await copy_store(src, mid, thread_prefix=prefix)).written == 0
        finally:
            for thread in threads:
                await mid.delete_thread(thread)


@backend_params
async def test_resume_and_refusal_on_each_backend(server: ServerInfo) -> None:
    prefix = unique_prefix()
    async with fresh_memory() as src, open_store(server.url, **server.options) as dst:
        threads = await fill(src, prefix, suffixes=("a", "{b}/%"))
        original = await dump(src, threads)
        total = sum(len(v) for v in original.values())
        try:
            with pytest.raises(Exception, match="injected"):
                await copy_store(src, MemoryStore(FailAfter(dst.backend, total // 2)))
            report = await copy_store(src, dst, thread_ids=threads)
            assert report.ok
            assert report.written == total - total // 2
            assert await dump(dst, threads) == original

            # The destination run moves on; copying the older source must not undo it.
            live = threads[0]
            latest = await dst.latest(live, "live-run")
            await dst.append(cp(live, "live-run", latest.seq + 5, latest.step + 1, latest.phase))
            refused = await copy_store(src, dst, thread_ids=[live])
            assert [(r.run_id, r.destination_seq) for r in refused.refused] == [
                ("live-run", latest.seq + 5)
            ]
            assert (await dst.latest(live, "live-run")).seq == latest.seq + 5
        finally:
            for thread in threads:
                await dst.delete_thread(thread)


class SmallKeysBackend(WrappedBackend):
    """A destination that holds shorter ids than the source (e.g. an S3 key limit)."""

    @property
    def capabilities(self):  # type: ignore[no-untyped-def]
        from dataclasses import replace

        return replace(self.inner.capabilities, max_key_bytes=64, max_value_bytes=2000)


async def test_ids_and_values_the_destination_cannot_hold_are_reported_not_lost() -> None:
    async with fresh_memory() as src:
        long_thread = "t-" + "x" * 100
        await write_run(src, long_thread, "r", finished=True, steps=1)
        await write_run(src, "short", "r", finished=True, steps=1)
        await src.put_state("short", "big", {"blob": "y" * 5000})
        await src.put_state("short", "k" * 80, {"a": 1})
        inner = MemoryBackend()
        report = await copy_store(src, MemoryStore(SmallKeysBackend(inner)))
        assert not report.ok
        problems = {(t[:8], k[:8]) for t, k, _ in report.errors}
        assert problems == {(long_thread[:8], ""), ("short", "big"), ("short", "k" * 8)}
        assert [t async for t in inner.list_threads()] == ["short"]
        # The run itself fit, so it was copied whole, latest included.
        assert await inner.get("short", checkpoint_latest_key("r")) is not None
        assert await inner.get("short", "big") is None


async def test_a_run_with_a_record_too_large_keeps_its_destination_latest_unmoved() -> None:
    async with fresh_memory() as src:
        await src.append(cp("t", "r", 1, 0, Phase.RUN_STARTED))
        await src.append(cp("t", "r", 2, 1, Phase.PRE_LLM, note="z" * 5000))
        await src.append(cp("t", "r", 3, 1, Phase.POST_LLM))
        inner = MemoryBackend()
        report = await copy_store(src, MemoryStore(SmallKeysBackend(inner)))
        assert [k for _, k, _ in report.errors] == ["checkpoint:r:1:pre_llm", "checkpoint:r:latest"]
        assert await inner.get("t", checkpoint_latest_key("r")) is None
        assert report.runs_copied == 0


class Tally:
    def __init__(self) -> None:
        self.planned_items = self.planned_bytes = self.done_items = self.done_bytes = 0

    def planned(self, items: int, nbytes: int) -> None:
        self.planned_items += items
        self.planned_bytes += nbytes

    def advanced(self, items: int, nbytes: int) -> None:
        self.done_items += items
        self.done_bytes += nbytes


async def test_progress_ends_where_it_planned_also_with_refusals() -> None:
    async with fresh_memory() as src, fresh_memory() as dst:
        threads = await fill(src, "p-", suffixes=("a", "b"))
        await dst.append(cp(threads[0], "live-run", 50, 9, Phase.PRE_LLM))
        tally = Tally()
        report = await copy_store(src, dst, progress=tally)
        assert len(report.refused) == 1
        stored = await dump(src, threads)
        assert tally.planned_items == tally.done_items == sum(len(v) for v in stored.values())
        assert tally.planned_bytes == tally.done_bytes
