"""file://: commit against a raw loop of the same syscalls; latest() at 10 vs 100,000 records.

* commit: ``FileBackend.commit`` (pre-encoded bytes, one record plus the head)
  against a plain synchronous loop doing what a crash-safe commit needs and
  nothing else: take an ``flock``, read the head (a compare-and-set must know
  the stored seq), then for each of the two files a temp write, ``fsync``,
  ``os.replace`` and a directory ``fsync``. The raw loop runs on the event
  loop thread without a worker-thread hop, so the ratio also pays for
  ``asyncio.to_thread``, the seq comparison and the 28-byte file header with
  its CRC. For 1 KB and 100 KB records, fsync on (the default).
* append: ``MemoryStore.append`` (the checkpoint built, encoded, zstd above
  16 KiB, committed) against the same raw loop, reported for information.
* latest: ``MemoryStore.latest`` on a run of 100,000 records against one of
  10 records, in separate threads of one store (ratio = time at 10 / time at
  100,000; 1.0 means O(1)). The 100,000 records are written straight to disk
  for speed; the head goes through ``commit`` and the reads use the defaults.

Run: ``python -m benchmarks file`` (uses a temporary directory, removed afterwards;
the 100,000 small files take about 0.5 GB of disk while it runs).
"""

from __future__ import annotations

import asyncio
import fcntl
import itertools
import os
import tempfile
from pathlib import Path

from benchmarks._harness import Report, compare
from checkpoint_stores import Checkpoint, MemoryStore, Phase
from checkpoint_stores.backends.file import FileBackend, _name
from checkpoint_stores.keys import checkpoint_key, checkpoint_latest_key

SIZES = {"1 KB": 1024, "100 KB": 100 * 1024}
BIG_RUN = 100_000
# fsync latency on a shared disk swings from one second to the next: many short,
# interleaved rounds let both sides see the same weather, and the median drops bursts.
OPS, ROUNDS = 5, 41


def _raw_write(directory: Path, name: str, data: bytes, tag: str) -> None:
    tmp = directory / f".tmp-{tag}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, directory / name)
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _raw_commit(directory: Path, n: int, data: bytes) -> None:
    """What one commit must do on disk: flock, read the head, then record and head, durably."""
    lock = os.open(directory / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(directory / "head", "rb") as handle:
                handle.read()
        except FileNotFoundError:
            pass
        _raw_write(directory, f"record-{n}", data, f"{n}-r")
        _raw_write(directory, "head", data, f"{n}-h")
    finally:
        os.close(lock)


async def _commits(report: Report, root: Path) -> None:
    backend = FileBackend(f"file://{root}/commit")
    await backend.setup()
    raw_dir = root / "raw"
    raw_dir.mkdir()
    ours_n, raw_n = itertools.count(1), itertools.count(1)
    for label, size in SIZES.items():
        data = os.urandom(size)
        run_id = f"run-{size}"
        head = checkpoint_latest_key(run_id)

        async def ours(data: bytes = data, run_id: str = run_id, head: str = head) -> None:
            seq = next(ours_n)
            record = (checkpoint_key(run_id, seq, Phase.PRE_LLM.value), data)
            assert await backend.commit("bench", [record], head, data, seq)

        async def raw(data: bytes = data) -> None:
            _raw_commit(raw_dir, next(raw_n), data)

        await compare(
            report,
            "file",
            f"commit {label} (SPI, fsync)",
            ours,
            raw,
            ops=OPS,
            rounds=ROUNDS,
            warmup=10,
            target=0.8,
            note="raw: flock, head read, 2x(temp write, fsync, replace, dir fsync); no thread hop",
        )

    store = MemoryStore(backend)
    for label, size in SIZES.items():
        data = os.urandom(size)
        run_id = f"append-{size}"
        seqs = itertools.count(1)
        text = "lorem ipsum dolor sit amet " * (size // 27)

        async def append(
            run_id: str = run_id, seqs: itertools.count[int] = seqs, text: str = text
        ) -> None:
            seq = next(seqs)
            await store.append(
                Checkpoint(
                    thread_id="bench",
                    run_id=run_id,
                    seq=seq,
                    step=seq,
                    phase=Phase.POST_LLM,
                    payload={"messages": [{"role": "assistant", "content": text}]},
                )
            )

        async def raw(data: bytes = data) -> None:
            _raw_commit(raw_dir, next(raw_n), data)

        await compare(
            report,
            "file",
            f"append {label} (facade, encode included)",
            append,
            raw,
            ops=OPS,
            rounds=ROUNDS,
            warmup=10,
            target=None,
            note="for information: Checkpoint + orjson"
            + (" + zstd" if size > 16 * 1024 else "")
            + " + commit; raw as above",
        )


def _fill(backend: FileBackend, thread_id: str, run_id: str, count: int, value: bytes) -> None:
    """Write ``count`` step records straight into the thread directory (setup only)."""
    directory = backend._thread_dir(thread_id, create=True)
    assert directory is not None
    for step in range(count):
        key = checkpoint_key(run_id, step, Phase.PRE_LLM.value)
        (directory / _name("k", key)).write_bytes(FileBackend._record(key, value, None))


async def _latest(report: Report, root: Path) -> None:
    url = f"file://{root}/latest"
    setup = FileBackend(url)
    await setup.setup()
    store = MemoryStore(FileBackend(url))  # default settings: fsync on
    heads = {}
    for thread_id, count in (("small", 10), ("big", BIG_RUN)):
        checkpoint = Checkpoint(
            thread_id=thread_id,
            run_id="run",
            seq=count,
            step=count,
            phase=Phase.POST_LLM,
            payload={"messages": [{"role": "user", "content": "x" * 800}]},
        )
        value = store.encode_checkpoint(checkpoint)
        await asyncio.to_thread(_fill, setup, thread_id, "run", count, value)
        await store.append(checkpoint)
        heads[thread_id] = checkpoint
    files = len(os.listdir(setup._thread_dir("big", create=False) or root))
    assert files >= BIG_RUN, files

    async def big() -> None:
        assert await store.latest("big", "run") == heads["big"]

    async def small() -> None:
        assert await store.latest("small", "run") == heads["small"]

    await compare(
        report,
        "file",
        f"latest() at {BIG_RUN:,} vs 10 records",
        big,
        small,
        ops=200,
        rounds=21,
        warmup=50,
        target=1 / 1.2,
        note="raw column = latest() of a 10-record run; ratio >= 0.83 means within 1.2x",
    )


async def main(report: Report) -> None:
    """Run the file comparisons in a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="cs-bench-file-") as tmp:
        root = Path(tmp)
        await _commits(report, root)
        await _latest(report, root)
