"""Group 4, the StorageBackend SPI itself, called directly (bytes in, bytes out).

Each check targets a way real stores go wrong: LIKE or glob prefix scans,
pagination that drops keys, collations that merge ids, encodings that lose
NUL or astral characters, values cut at a driver limit, seqs compared as
floats, counts that are off, data that does not survive a reopen.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from checkpoint_stores import Capabilities, InvalidIdentifierError, StorageBackend
from checkpoint_stores.conformance.checks import CHECKS, check
from checkpoint_stores.conformance.context import CheckContext
from checkpoint_stores.conformance.samples import (
    HOSTILE_IDS,
    NEAR_IDENTICAL_IDS,
    PREFIX_TRAPS,
    SORT_SAMPLE,
    id_of_bytes,
    pattern_bytes,
)
from checkpoint_stores.spi import ThreadLister

__all__ = ["SpiChecks"]

_MiB = 1024 * 1024


async def _keys(backend: StorageBackend, thread: str, prefix: str = "") -> list[str]:
    return [key async for key, _ in backend.list(thread, prefix)]


def _diff(got: Sequence[str], want: Sequence[str]) -> str:
    extra = [k for k in got if k not in set(want)]
    missing = [k for k in want if k not in set(got)]
    parts = []
    if extra:
        parts.append(f"unexpected {extra[:5]!r}")
    if missing:
        parts.append(f"missing {missing[:5]!r}")
    if not parts:
        if len(got) != len(set(got)):
            parts.append("duplicates")
        else:
            parts.append(f"wrong order: {list(got)[:8]!r}...")
    return ", ".join(parts)


async def _put_all(
    backend: StorageBackend, thread: str, items: Sequence[tuple[str, bytes]], batch: int = 32
) -> None:
    for start in range(0, len(items), batch):
        await asyncio.gather(*(backend.put(thread, k, v) for k, v in items[start : start + batch]))


class SpiChecks:
    """Group 4 of the kit (``conformance_spi``). Mixed into ``StoreConformance``."""

    #: Largest value the kit writes (the declared maximum if smaller).
    large_value_bytes: int = 8 * _MiB
    #: Keys written by the list-completeness check (above common page sizes: 100, 1000).
    list_probe_keys: int = 1030
    #: Concurrent creators per key in the create race.
    create_racers: int = 16

    # -- basic reads and writes --------------------------------------------------------

    @check("spi.get_put_roundtrip")
    async def test_spi_get_put_roundtrip(self, ctx: CheckContext) -> None:
        """put stores bytes exactly (every byte value), upserts, and get returns bytes or None"""
        backend, thread = ctx.backend, ctx.thread()
        every_byte = bytes(range(256)) * 4
        missing = await backend.get(thread, "k")
        ctx.expect(missing is None, f"get from an unused thread returned {missing!r:.100}")
        await backend.put(thread, "k", every_byte)
        value = await backend.get(thread, "k")
        ctx.expect(
            isinstance(value, bytes),
            f"get returned {type(value).__name__}, the SPI returns bytes",
        )
        ctx.expect(value == every_byte, "a value holding every byte value 0..255 came back changed")
        await backend.put(thread, "k", b"second")
        value = await backend.get(thread, "k")
        ctx.expect(value == b"second", f"after an overwrite get returned {value!r:.100}")
        missing = await backend.get(thread, "other")
        ctx.expect(missing is None, f"get of a missing key returned {missing!r:.100}")

    @check("spi.empty_value")
    async def test_spi_empty_value(self, ctx: CheckContext) -> None:
        """an empty value is stored and returned as b'' (not None) by get, get_many, list, create
        and commit
        """
        backend, thread = ctx.backend, ctx.thread()
        await backend.put(thread, "empty", b"")
        ctx.expect(await backend.get(thread, "empty") == b"", "get of an empty value is not b''")
        many = await backend.get_many(thread, ["empty"])
        ctx.expect(many == [b""], f"get_many of an empty value returned {many!r}")
        listed = [item async for item in backend.list(thread)]
        ctx.expect(listed == [("empty", b"")], f"list with one empty value returned {listed!r}")
        ctx.expect(await backend.create(thread, "made", b""), "create with b'' returned False")
        ctx.expect(await backend.get(thread, "made") == b"", "a created empty value is not b''")
        ctx.expect(
            await backend.commit(thread, [("rec", b"")], "head", b"", 1),
            "commit of empty values returned False",
        )
        got = await backend.get_many(thread, ["rec", "head"])
        ctx.expect(got == [b"", b""], f"committed empty values read back as {got!r}")

    @check("spi.create_first_writer_wins")
    async def test_spi_create_first_writer_wins(self, ctx: CheckContext) -> None:
        """create stores only if the key is absent, returns whether it did, and never overwrites"""
        backend, thread = ctx.backend, ctx.thread()
        ctx.expect(await backend.create(thread, "c", b"first"), "create of an absent key: False")
        ctx.expect(not await backend.create(thread, "c", b"second"), "second create: True")
        value = await backend.get(thread, "c")
        ctx.expect(value == b"first", f"a refused create changed the value to {value!r}")
        await backend.put(thread, "p", b"put")
        ctx.expect(not await backend.create(thread, "p", b"x"), "create over a put key: True")
        ctx.expect(await backend.delete(thread, "c"), "delete of a created key: False")
        ctx.expect(await backend.create(thread, "c", b"third"), "create after delete: False")
        ctx.expect(await backend.get(thread, "c") == b"third", "create after delete did not store")

    @check("spi.create_race_tasks")
    async def test_spi_create_race_tasks(self, ctx: CheckContext) -> None:
        """of many tasks creating the same key at once, exactly one wins and its value is stored"""
        backend, thread = ctx.backend, ctx.thread()
        problems = []
        for key_no in range(8):
            key = f"race-{key_no}"
            results = await asyncio.gather(
                *(backend.create(thread, key, f"w{w}".encode()) for w in range(self.create_racers))
            )
            winners = [w for w, ok in enumerate(results) if ok]
            stored = await backend.get(thread, key)
            if len(winners) != 1:
                problems.append(f"{key}: {len(winners)} creators were told they won ({winners})")
            elif stored != f"w{winners[0]}".encode():
                problems.append(f"{key}: creator {winners[0]} won, but the key holds {stored!r}")
        ctx.expect(not problems, lambda: "\n".join(problems))

    @check("spi.create_race_processes", needs=("cross_process",))
    async def test_spi_create_race_processes(self, ctx: CheckContext) -> None:
        """of several OS processes creating the same keys at the same instants, exactly one wins
        each
        """
        from checkpoint_stores.conformance.processes import run_workers

        thread = ctx.thread()
        keys = [f"race-{i}" for i in range(12)]
        procs = 4
        specs = [
            ctx.worker_spec(
                "create_race", {"thread_id": thread, "keys": keys, "writer": w, "slot": 0.03}
            )
            for w in range(procs)
        ]
        results = await run_workers(specs)
        problems = []
        for i, key in enumerate(keys):
            winners = [w for w in range(procs) if results[w][i]]
            stored = await ctx.backend.get(thread, key)
            if len(winners) != 1:
                problems.append(f"{key}: {len(winners)} processes were told they won ({winners})")
            elif stored != f"writer-{winners[0]}".encode():
                problems.append(f"{key}: process {winners[0]} won, but the key holds {stored!r}")
        ctx.expect(not problems, lambda: "\n".join(problems))

    @check("spi.commit_semantics")
    async def test_spi_commit_semantics(self, ctx: CheckContext) -> None:
        """commit moves the head only above its stored seq, stores every write with it, and says
        whether it moved
        """
        backend, thread = ctx.backend, ctx.thread()
        await backend.put(thread, "w2", b"old")
        steps: list[tuple[int, bool, list[tuple[str, bytes]]]] = [
            (1, True, [("w1", b"one"), ("w2", b"two"), ("w3", b"three")]),
            (1, False, [("w4", b"stale")]),
            (0, False, [("w4", b"stale")]),
            (2, True, []),
            (2 << 32 | 7, True, [("w5", b"epoch 2")]),
            ((1 << 32) | 999_999, False, [("w4", b"older epoch")]),
            ((2 << 32) | 8, True, [("w1", b"one again")]),
        ]
        head_value = None
        for seq, want, writes in steps:
            value = f"head@{seq}".encode()
            moved = await backend.commit(thread, writes, "head", value, seq)
            ctx.expect(
                moved is want,
                f"commit(seq={seq}) returned {moved!r}, expected {want} (head seq was "
                f"{'absent' if head_value is None else head_value.decode()})",
            )
            if moved:
                head_value = value
            stored = await backend.get(thread, "head")
            ctx.expect(stored == head_value, f"after commit(seq={seq}) the head holds {stored!r}")
        got = await backend.get_many(thread, ["w1", "w2", "w3", "w4", "w5"])
        want_values = [b"one again", b"two", b"three", None, b"epoch 2"]
        ctx.expect(got == want_values, f"commit writes read back as {got!r}, want {want_values!r}")
        other = ctx.thread()
        ctx.expect(
            await backend.commit(other, [], "head", b"x", 1),
            "commit(seq=1) of the same head key in another thread was refused",
        )

    @check("spi.commit_large_seq")
    async def test_spi_commit_large_seq(self, ctx: CheckContext) -> None:
        """seqs up to 2**63-1 (epoch in the high bits) compare exactly, not as floats"""
        backend, thread = ctx.backend, ctx.thread()
        plan = [
            (2**53, True),
            (2**53 + 1, True),  # equal to 2**53 as a float
            (2**53, False),
            (2**62 + 1, True),
            (2**62, False),
            (2**63 - 2, True),
            (2**63 - 1, True),
            (2**63 - 2, False),
        ]
        for seq, want in plan:
            moved = await backend.commit(thread, [], "head", str(seq).encode(), seq)
            ctx.expect(moved is want, f"commit(seq={seq}) returned {moved!r}, expected {want}")

    # -- listing --------------------------------------------------------------------------

    @check("spi.list_sorted_complete")
    async def test_spi_list_sorted_complete(self, ctx: CheckContext) -> None:
        """list yields every key once, sorted in Python string (UTF-8 byte) order, with its value"""
        backend = ctx.backend
        thread = ctx.thread()
        await _put_all(backend, thread, [(k, k.encode("utf-8")) for k in SORT_SAMPLE])
        items = [item async for item in backend.list(thread)]
        got = [k for k, _ in items]
        want = sorted(SORT_SAMPLE)
        ctx.expect(got == want, lambda: f"list of {len(want)} tricky keys: {_diff(got, want)}")
        wrong = [k for k, v in items if v != k.encode("utf-8")]
        ctx.expect(not wrong, f"list returned wrong values for {wrong[:5]!r}")
        many = ctx.thread()
        keys = [f"k{i:05d}" for i in range(self.list_probe_keys)]
        shuffled = list(keys)
        ctx.rng.shuffle(shuffled)
        await _put_all(backend, many, [(k, k.encode()) for k in shuffled])
        got = await _keys(backend, many)
        ctx.expect(
            got == keys,
            lambda: (
                f"list of {len(keys)} keys returned {len(got)}: {_diff(got, keys)} (pagination?)"
            ),
        )
        got = await _keys(backend, many, "k0100")
        want = [k for k in keys if k.startswith("k0100")]
        ctx.expect(got == want, lambda: f"list(prefix='k0100'): {_diff(got, want)}")

    @check("spi.list_prefix_exact")
    async def test_spi_list_prefix_exact(self, ctx: CheckContext) -> None:
        """list(prefix) yields exactly the keys starting with prefix: %, _, *, ?, [, \\, :, {} are
        literal
        """
        backend, thread = ctx.backend, ctx.thread()
        all_keys = sorted({k for _, inside, outside in PREFIX_TRAPS for k in (*inside, *outside)})
        await _put_all(backend, thread, [(k, k.encode("utf-8")) for k in all_keys])
        problems = []
        for prefix, _, _ in PREFIX_TRAPS:
            got = await _keys(backend, thread, prefix)
            want = [k for k in all_keys if k.startswith(prefix)]
            if got != want:
                problems.append(f"list(prefix={prefix!r}): {_diff(got, want)}")
        ctx.expect(not problems, lambda: "\n".join(problems[:10]))

    # -- identifiers ----------------------------------------------------------------------

    @check("spi.hostile_ids_roundtrip")
    async def test_spi_hostile_ids_roundtrip(self, ctx: CheckContext) -> None:
        """hostile thread ids and keys (../, NUL, {, }, *, %, astral, RTL, ...) round-trip
        unchanged
        """
        backend = ctx.backend
        thread = ctx.thread()
        items = [(k, f"value of {k!r}".encode()) for k in HOSTILE_IDS]
        await _put_all(backend, thread, items)
        got = await _keys(backend, thread)
        want = sorted(HOSTILE_IDS)
        ctx.expect(got == want, lambda: f"list of hostile keys: {_diff(got, want)}")
        values = await backend.get_many(thread, [k for k, _ in items])
        wrong = [k for (k, v), got_v in zip(items, values, strict=True) if got_v != v]
        ctx.expect(not wrong, f"hostile keys read back wrong values: {wrong[:5]!r}")
        threads = [ctx.track(ctx.ns + h) for h in HOSTILE_IDS]
        threads += [ctx.track(h + ctx.ns) for h in ("../", "{", "\x00", "%", "*")]
        await asyncio.gather(*(backend.put(t, "k", t.encode("utf-8")) for t in threads))
        for t in threads:
            value = await backend.get(t, "k")
            ctx.expect(
                value == t.encode("utf-8"),
                f"thread {t!r} reads {value!r:.80} (ids collide or are rewritten)",
            )
            listed = await _keys(backend, t)
            ctx.expect(listed == ["k"], f"thread {t!r} lists {listed!r}")

    @check("spi.near_identical_ids_distinct")
    async def test_spi_near_identical_ids_distinct(self, ctx: CheckContext) -> None:
        """ids that differ only by case, padding, NUL, Unicode normalization or width never
        collide
        """
        backend, thread = ctx.backend, ctx.thread()
        await _put_all(backend, thread, [(k, k.encode("utf-8")) for k in NEAR_IDENTICAL_IDS])
        got = await _keys(backend, thread)
        want = sorted(NEAR_IDENTICAL_IDS)
        ctx.expect(got == want, lambda: f"list of near-identical keys: {_diff(got, want)}")
        for key in NEAR_IDENTICAL_IDS:
            value = await backend.get(thread, key)
            ctx.expect(value == key.encode("utf-8"), f"key {key!r} reads {value!r} (collision)")
        threads = [ctx.track(ctx.ns + "t" + k) for k in NEAR_IDENTICAL_IDS]
        await asyncio.gather(*(backend.put(t, "k", t.encode("utf-8")) for t in threads))
        for t in threads:
            value = await backend.get(t, "k")
            ctx.expect(value == t.encode("utf-8"), f"thread {t!r} reads {value!r} (collision)")

    @check("spi.long_ids_roundtrip")
    async def test_spi_long_ids_roundtrip(self, ctx: CheckContext) -> None:
        """thread ids and keys of exactly max_key_bytes round-trip and stay distinct to their last
        character
        """
        backend = ctx.backend
        limit = ctx.capabilities.max_key_bytes
        room = limit - len(ctx.ns.encode())
        ctx.expect(room >= 8, f"max_key_bytes={limit} leaves no room for a namespaced thread id")
        thread = ctx.track(ctx.ns + id_of_bytes(room, "thread"))
        stem = id_of_bytes(limit - 1, "key")
        keys = [stem + "a", stem + "b", id_of_bytes(limit, "other")]
        for key in keys:
            await backend.put(thread, key, key[-1].encode() + b"!")
        got = await _keys(backend, thread)
        ctx.expect(
            got == sorted(keys),
            lambda: (
                f"{len(keys)} keys of {limit} bytes listed as {len(got)} keys "
                f"(lengths {[len(k.encode()) for k in got]}): truncated or hashed lossily?"
            ),
        )
        values = await backend.get_many(thread, keys)
        ctx.expect(
            values == [b"a!", b"b!", keys[2][-1].encode() + b"!"],
            "keys of max_key_bytes that differ only in their last character collide",
        )
        try:
            await ctx.store.put_state(thread, stem + "ab", {"x": 1})
        except InvalidIdentifierError:
            pass
        else:
            ctx.fail(f"a key of {limit + 1} bytes was accepted though max_key_bytes is {limit}")

    # -- values -----------------------------------------------------------------------------

    @check("spi.large_values")
    async def test_spi_large_values(self, ctx: CheckContext) -> None:
        """values up to the declared maximum (8 MiB tested by default) round-trip through put,
        create, commit, get_many and list
        """
        backend, thread = ctx.backend, ctx.thread()
        declared = ctx.capabilities.max_value_bytes
        size = self.large_value_bytes if declared is None else min(declared, self.large_value_bytes)
        values = [pattern_bytes(size, seed) for seed in range(4)]
        await backend.put(thread, "put", values[0])
        ctx.expect(await backend.create(thread, "create", values[1]), "create of a large value")
        ctx.expect(
            await backend.commit(thread, [("write", values[2])], "head", values[3], 1),
            "commit of large values returned False",
        )
        keys = ["put", "create", "write", "head"]
        got = await backend.get_many(thread, keys)
        for key, want, value in zip(keys, values, got, strict=True):
            ctx.expect(
                value == want,
                f"a {size}-byte value stored by {key} came back as "
                f"{'None' if value is None else f'{len(value)} bytes, different'}",
            )
        listed = dict([item async for item in backend.list(thread)])
        ctx.expect(
            all(listed.get(k) == v for k, v in zip(keys, values, strict=True)),
            f"list returned the {size}-byte values changed or incomplete",
        )

    @check("spi.get_many")
    async def test_spi_get_many(self, ctx: CheckContext) -> None:
        """get_many returns values in the order asked, None for missing keys, repeats included"""
        backend, thread = ctx.backend, ctx.thread()
        await backend.put(thread, "a", b"A")
        await backend.put(thread, "b", b"B")
        await backend.put(thread, "e", b"")
        got = await backend.get_many(thread, ["b", "missing", "a", "b", "e"])
        ctx.expect(got == [b"B", None, b"A", b"B", b""], f"get_many returned {got!r}")
        ctx.expect(await backend.get_many(thread, []) == [], "get_many([]) is not []")
        unused = await backend.get_many(ctx.thread(), ["a", "b"])
        ctx.expect(unused == [None, None], f"get_many on an unused thread returned {unused!r}")

    # -- deleting -----------------------------------------------------------------------------

    @check("spi.delete_semantics")
    async def test_spi_delete_semantics(self, ctx: CheckContext) -> None:
        """delete, delete_prefix and delete_thread remove exactly what they name and count it"""
        backend, thread, other = ctx.backend, ctx.thread(), ctx.thread()
        all_keys = sorted({k for _, inside, outside in PREFIX_TRAPS for k in (*inside, *outside)})
        await _put_all(backend, thread, [(k, b"v") for k in all_keys])
        await backend.put(other, "p%", b"other thread")
        ctx.expect(await backend.delete(thread, "pz") is True, "delete of an existing key: False")
        ctx.expect(await backend.delete(thread, "pz") is False, "second delete: True")
        ctx.expect(await backend.get(thread, "pz") is None, "a deleted key still reads")
        remaining = [k for k in all_keys if k != "pz"]
        for prefix in ("p%", "p_", "p[", "p\\", "p{}", "P"):
            want = [k for k in remaining if k.startswith(prefix)]
            count = await backend.delete_prefix(thread, prefix)
            remaining = [k for k in remaining if not k.startswith(prefix)]
            got = await _keys(backend, thread)
            ctx.expect(
                count == len(want),
                f"delete_prefix({prefix!r}) returned {count}, {len(want)} keys matched",
            )
            ctx.expect(
                got == remaining,
                f"after delete_prefix({prefix!r}): {_diff(got, remaining)}",
            )
        count = await backend.delete_prefix(thread, "no-such-prefix")
        ctx.expect(count == 0, f"delete_prefix of a prefix nothing starts with returned {count}")
        count = await backend.delete_thread(thread)
        ctx.expect(
            count == len(remaining), f"delete_thread returned {count}, {len(remaining)} keys"
        )
        ctx.expect(await _keys(backend, thread) == [], "delete_thread left keys")
        ctx.expect(
            await backend.get(other, "p%") == b"other thread",
            "delete_prefix or delete_thread removed a key of another thread",
        )
        ctx.expect(
            await backend.delete_thread(thread) == 0, "delete_thread of an empty thread != 0"
        )
        unused = ctx.thread()
        ctx.expect(await backend.delete(unused, "k") is False, "delete in an unused thread: True")
        ctx.expect(await backend.delete_prefix(unused, "") == 0, "delete_prefix in unused thread")

    @check("spi.threads_isolated")
    async def test_spi_threads_isolated(self, ctx: CheckContext) -> None:
        """threads whose ids prefix each other (t, t:, t/, t%, t\\0, t{) never share keys"""
        backend = ctx.backend
        base = ctx.thread("iso")
        threads = [base] + [ctx.track(base + s) for s in (":", ":k", "/", "%", "\x00", "{", "}")]
        for t in threads:
            await backend.put(t, "k", t.encode("utf-8"))
            await backend.put(t, ":k", b"colon")
        for t in threads:
            listed = [item async for item in backend.list(t)]
            ctx.expect(
                listed == [(":k", b"colon"), ("k", t.encode("utf-8"))],
                f"thread {t!r} lists {listed!r:.200}",
            )
        ctx.expect(await backend.delete_thread(base) == 2, "delete_thread counted other threads")
        for t in threads[1:]:
            ctx.expect(
                await backend.get(t, "k") == t.encode("utf-8"),
                f"delete_thread({base!r}) removed data of thread {t!r}",
            )

    @check("spi.list_threads", needs=("list_threads",))
    async def test_spi_list_threads(self, ctx: CheckContext) -> None:
        """list_threads yields, sorted and prefix-exact, the thread ids that hold keys"""
        backend = ctx.backend
        assert isinstance(backend, ThreadLister)
        suffixes = ["a", "b", "p%", "p_", "pz", "p*", "\x00", "\U0001f600", "../x", "{t}"]
        threads = [ctx.track(ctx.ns + s) for s in suffixes]
        for t in threads:
            await backend.put(t, "k", b"v")
        got = [t async for t in backend.list_threads(ctx.ns)]
        ctx.expect(got == sorted(threads), lambda: f"list_threads: {_diff(got, sorted(threads))}")
        for prefix in ("p%", "p_", "p*"):
            got = [t async for t in backend.list_threads(ctx.ns + prefix)]
            ctx.expect(
                got == [ctx.ns + prefix],
                f"list_threads({ctx.ns + prefix!r}) returned {got!r} (wildcard over-match)",
            )
        await backend.delete_thread(threads[0])
        await backend.delete(threads[1], "k")
        got = [t async for t in backend.list_threads(ctx.ns)]
        want = sorted(threads[2:])
        ctx.expect(
            got == want,
            lambda: f"after deleting every key of two threads, list_threads: {_diff(got, want)}",
        )

    # -- lifecycle --------------------------------------------------------------------------

    @check("spi.setup_idempotent")
    async def test_spi_setup_idempotent(self, ctx: CheckContext) -> None:
        """setup is idempotent and safe when several instances start at once"""
        from checkpoint_stores import open_backend

        instances = [open_backend(ctx.url, **ctx.options) for _ in range(4)]
        try:
            await asyncio.gather(*(b.setup() for b in instances))
            await asyncio.gather(*(b.setup() for b in instances))
            thread = ctx.thread()
            await instances[0].put(thread, "k", b"v")
            if ctx.capabilities.cross_process:
                for b in instances[1:]:
                    value = await b.get(thread, "k")
                    ctx.expect(value == b"v", f"another instance of the store reads {value!r}")
            await instances[0].delete_thread(thread)
        finally:
            for b in instances:
                await b.close()

    @check("spi.durable_reopen", needs=("durable",))
    async def test_spi_durable_reopen(self, ctx: CheckContext) -> None:
        """what was written before close() is there after reopening, head seqs included"""
        backend, thread = ctx.backend, ctx.thread()
        await backend.put(thread, "put", b"P")
        await backend.create(thread, "created", b"C")
        await backend.commit(thread, [("rec", b"R")], "head", b"H5", 5)
        await backend.close()
        reopened = await ctx.new_backend()
        ctx.backend = reopened
        got = await reopened.get_many(thread, ["put", "created", "rec", "head"])
        ctx.expect(got == [b"P", b"C", b"R", b"H5"], f"after close and reopen the data is {got!r}")
        ctx.expect(
            not await reopened.commit(thread, [], "head", b"H4", 4),
            "after reopening, a commit with a lower seq moved the head: the seq was lost",
        )
        ctx.expect(
            await reopened.commit(thread, [], "head", b"H6", 6),
            "after reopening, a commit with a higher seq was refused",
        )

    @check("spi.capabilities_valid")
    async def test_spi_capabilities_valid(self, ctx: CheckContext) -> None:
        """capabilities is a Capabilities with sane limits and only known divergence names"""
        caps = ctx.capabilities
        ctx.expect(isinstance(caps, Capabilities), f"capabilities is {type(caps).__name__}")
        unknown = sorted(set(caps.divergences) - set(CHECKS))
        ctx.expect(
            not unknown,
            f"divergences names unknown checks {unknown}; known names: "
            "see checkpoint_stores.conformance.CHECKS",
        )
        ctx.expect(
            isinstance(caps.max_key_bytes, int) and caps.max_key_bytes >= 64,
            f"max_key_bytes is {caps.max_key_bytes!r}; ids of at least 64 bytes must be storable",
        )
        ctx.expect(
            caps.max_value_bytes is None or caps.max_value_bytes >= 64 * 1024,
            f"max_value_bytes is {caps.max_value_bytes!r}; checkpoints need at least 64 KiB",
        )
        again = (await ctx.new_backend()).capabilities
        ctx.expect(again == caps, "two instances of the same URL declare different capabilities")
