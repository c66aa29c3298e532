"""file://: crash safety under SIGKILL, several writer processes, hostile names, damaged files.

The crash and multi-process tests run real child processes on a real directory
(fsync on, the default), kill them with SIGKILL at random moments and read
everything back with a fresh store.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from checkpoint_stores import (
    AgentCheckpointCorruptionError,
    Checkpoint,
    CheckpointNotFoundError,
    InvalidIdentifierError,
    MemoryStore,
    Phase,
    StaleWriterError,
    StoreUnavailableError,
    checkpoint_key,
    checkpoint_latest_key,
    open_backend,
    open_store,
    runtime_key,
)
from checkpoint_stores.backends.file import FileBackend, _name

pytestmark = pytest.mark.file


def url_of(root: Path) -> str:
    return f"file://{root}"


def cp(seq: int, *, run: str = "run-1", thread: str = "thread-1", **fields: Any) -> Checkpoint:
    values: dict[str, Any] = {"step": seq, "phase": Phase.PRE_LLM, "payload": {"seq": seq}}
    values.update(fields)
    return Checkpoint(thread_id=thread, run_id=run, seq=seq, **values)


def file_of(root: Path, thread_id: str, key: str) -> Path:
    return root / "threads" / _name("t", thread_id) / _name("k", key)


def all_paths(root: Path) -> list[Path]:
    return [Path(d) / n for d, dirs, files in os.walk(root) for n in [*dirs, *files]]


def read_lines(proc: subprocess.Popen[bytes]) -> list[str]:
    assert proc.stdout is not None
    return proc.stdout.read().decode().split("\n")


# -- (a) SIGKILL in the middle of many commits -----------------------------------------------------

CRASH_CHILD = r"""
import asyncio, os, sys
from checkpoint_stores import Checkpoint, CheckpointNotFoundError, Phase, open_store

async def main(url, thread, run, size):
    async with open_store(url) as store:
        try:
            seq = (await store.latest(thread, run)).seq
        except CheckpointNotFoundError:
            seq = 0
        os.write(1, f"start {seq}\n".encode())
        while True:
            seq += 1
            # Odd seqs are runtime snapshots: they also overwrite the runtime key.
            phase = Phase.RUNTIME_STATE if seq % 2 else Phase.PRE_LLM
            payload = {"seq": seq, "blob": os.urandom(size).hex()}
            await store.append(Checkpoint(thread_id=thread, run_id=run, seq=seq, step=seq,
                                          phase=phase, payload=payload))
            os.write(1, f"{seq}\n".encode())  # acknowledged: append returned

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
"""


async def check_run_after_crash(url: str, thread: str, run: str, acked: int) -> int:
    """Every key decodes, latest is not behind ``acked`` and names a record that exists."""
    async with open_store(url) as store:
        latest = await store.latest(thread, run)
        assert latest.seq >= acked, f"latest {latest.seq} is behind acknowledged commit {acked}"
        assert latest.payload["seq"] == latest.seq
        # The head never names a missing record: its step record is there, identical.
        assert await store.get_checkpoint(thread, run, latest.step, latest.phase) == latest
        # Every key holds a whole value: old or new, never a mix or a prefix.
        seqs = []
        async for key, raw in store.backend.list(thread):
            record = store.decode(raw, what=key)
            checkpoint = Checkpoint.model_validate(record)
            assert checkpoint.payload["seq"] == checkpoint.seq
            assert len(checkpoint.payload["blob"]) in (400, 80_000)
            if key == runtime_key(run):
                assert checkpoint.phase is Phase.RUNTIME_STATE
                # The runtime copy moves with its record: never behind the newest snapshot
                # the head has passed, never ahead of what was written.
                newest_runtime = latest.seq if latest.seq % 2 else latest.seq - 1
                assert newest_runtime <= checkpoint.seq <= latest.seq + 1
            elif key != checkpoint_latest_key(run):
                assert key == checkpoint_key(run, checkpoint.seq, checkpoint.phase.value)
                seqs.append(checkpoint.seq)
        # Records are durable before the head moves: all up to latest exist; at most one
        # extra (written, then killed before its head moved).
        assert sorted(seqs)[: latest.seq] == list(range(1, latest.seq + 1))
        assert max(seqs) in (latest.seq, latest.seq + 1)
        return latest.seq


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigkill_mid_commit_leaves_every_key_old_or_new(tmp_path: Path) -> None:
    root = tmp_path / "store"
    url, thread, run = url_of(root), "thread/../crash", "run-1"
    rng = random.Random(20240601)
    acked = 0
    rounds = 8
    for round_no in range(rounds):
        proc = subprocess.Popen(
            [sys.executable, "-c", CRASH_CHILD, url, thread, run, str(rng.choice([200, 40_000]))],
            stdout=subprocess.PIPE,
        )
        assert proc.stdout is not None
        start = proc.stdout.readline().decode()
        assert start.startswith("start "), start
        assert int(start.split()[1]) >= acked
        time.sleep(rng.uniform(0.0, 0.4))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        lines = [line for line in read_lines(proc) if line]
        acked = max([acked, *(int(line) for line in lines)])
        latest = asyncio.run(check_run_after_crash(url, thread, run, acked))
        assert latest >= acked, f"round {round_no}"
    assert acked > rounds  # the children really committed between kills
    # Killed writes leave temp files behind; reads never see them.
    leftovers = [p.name for p in all_paths(root) if p.name.startswith(".tmp-")]
    assert all(p.startswith(".tmp-") for p in leftovers)


# -- (b) several processes appending to one run ----------------------------------------------------

WRITER_CHILD = r"""
import asyncio, os, sys, time
from checkpoint_stores import Checkpoint, Phase, StaleWriterError, open_store

async def main(url, thread, run, index, writers, count, go):
    async with open_store(url) as store:
        os.write(1, b"ready\n")
        while not os.path.exists(go):
            time.sleep(0.001)
        for seq in range(index + 1, count + 1, writers):
            checkpoint = Checkpoint(thread_id=thread, run_id=run, seq=seq, step=seq,
                                    phase=Phase.POST_LLM, payload={"writer": index, "seq": seq})
            try:
                await store.append(checkpoint)
            except StaleWriterError:
                os.write(1, f"stale {seq}\n".encode())
                continue
            os.write(1, f"ok {seq}\n".encode())
            now = (await store.latest(thread, run)).seq
            if now < seq:
                os.write(1, f"backwards {seq} {now}\n".encode())

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], *map(int, sys.argv[4:7]), sys.argv[7]))
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("writers", [2, 4])
def test_processes_appending_to_one_run_leave_latest_at_the_highest_seq(
    tmp_path: Path, writers: int
) -> None:
    root = tmp_path / "store"
    # A fresh thread, so the processes also race to create its directory.
    url, thread, run, count = url_of(root), "shared {thread}", "run-x", 120
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                WRITER_CHILD,
                url,
                thread,
                run,
                *map(str, (i, writers, count, go)),
            ],
            stdout=subprocess.PIPE,
        )
        for i in range(writers)
    ]
    for proc in procs:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"ready\n"
    go.touch()
    outcomes: dict[int, str] = {}
    for proc in procs:
        lines = read_lines(proc)
        assert proc.wait(timeout=240) == 0
        for line in filter(None, lines):
            word, *numbers = line.split()
            assert word in {"ok", "stale"}, f"latest went backwards: {line}"
            outcomes[int(numbers[0])] = word
    assert sorted(outcomes) == list(range(1, count + 1))
    assert outcomes[count] == "ok"  # nobody can fence out the highest seq

    async def check() -> None:
        async with open_store(url) as store:
            latest = await store.latest(thread, run)
            assert latest.seq == count
            assert latest.payload == {"writer": (count - 1) % writers, "seq": count}
            for seq, outcome in outcomes.items():
                record = await store.get_checkpoint(thread, run, seq, Phase.POST_LLM)
                if outcome == "ok":
                    assert record is not None
                    assert record.seq == seq
                else:  # a fenced-out append wrote nothing
                    assert record is None, f"stale append {seq} left its record behind"
            assert [t async for t in store.backend.list_threads()] == [thread]  # type: ignore[attr-defined]

    asyncio.run(check())


async def test_concurrent_appends_in_one_process(tmp_store_dir: Path) -> None:
    async with open_store(url_of(tmp_store_dir)) as store:
        seqs = list(range(1, 41))
        random.Random(7).shuffle(seqs)

        async def attempt(seq: int) -> bool:
            try:
                await store.append(cp(seq))
            except StaleWriterError:
                return False
            return True

        results = await asyncio.gather(*(attempt(s) for s in seqs))
        assert dict(zip(seqs, results, strict=True))[40] is True
        assert (await store.latest("thread-1", "run-1")).seq == 40
        stored = {c.seq for c in await store.history("thread-1", "run-1")}
        assert stored == {s for s, ok in zip(seqs, results, strict=True) if ok}


# -- (c) hostile thread ids and keys ---------------------------------------------------------------

HOSTILE = [
    "../",
    "../../escape",
    "..",
    ".",
    "/",
    "/etc/passwd",
    "a/b",
    "\x00",
    "nul\x00byte",
    "CON",
    "con",
    "nul.txt",
    "NUL",
    "LPT1",
    "A",
    "a",
    "%2e%2e",
    "%2E%2E",
    "%",
    "_",
    "*",
    "{tag}",
    "?",
    "\\..\\",
    ".thread-id",
    ".locks",
    ".tmp-1-abc",
    "k",
    "h" + "0" * 64,
    "trailing. ",
    " ",
    "ü",
    "🙂",
    "x" * 10_000,
    "é" * 5_000,
]


def assert_nothing_escapes(parent: Path, root: Path) -> None:
    """Nothing outside the root; inside it, no name a filesystem could misread."""
    assert sorted(p.name for p in parent.iterdir()) == [root.name]
    resolved_root = root.resolve()
    paths = all_paths(root)
    for path in paths:
        assert path.resolve().is_relative_to(resolved_root), path
        assert len(path.name.encode()) <= 255
        stem = path.name.split(".")[0].upper()
        assert stem not in {"CON", "PRN", "AUX", "NUL", "COM1", "LPT1"}, path
    directories: dict[Path, list[str]] = {}
    for path in paths:
        directories.setdefault(path.parent, []).append(path.name.lower())
    for names in directories.values():  # upper/lower-case pairs stay apart on any filesystem
        assert len(names) == len(set(names))


async def test_hostile_thread_ids_and_keys_round_trip_inside_the_root(tmp_path: Path) -> None:
    root = tmp_path / "store"
    backend = FileBackend(url_of(root))
    await backend.setup()
    try:
        for thread in HOSTILE:
            for key in HOSTILE:
                await backend.put(thread, key, f"{thread!r}={key!r}".encode())
        for thread in HOSTILE:
            listed = [(k, v) async for k, v in backend.list(thread)]
            assert [k for k, _ in listed] == sorted(HOSTILE)
            for key, value in listed:
                assert value == f"{thread!r}={key!r}".encode()
            assert await backend.get_many(thread, HOSTILE[:3]) == [
                f"{thread!r}={k!r}".encode() for k in HOSTILE[:3]
            ]
        assert [t async for t in backend.list_threads()] == sorted(HOSTILE)
    finally:
        await backend.close()

    assert_nothing_escapes(tmp_path, root)


async def test_prefix_listing_is_exact_and_sorted_with_hostile_prefixes(
    tmp_store_dir: Path,
) -> None:
    backend = FileBackend(url_of(tmp_store_dir))
    await backend.setup()
    keys = [
        "%",
        "%a",
        "%%",
        "_",
        "_x",
        "a",
        "a%",
        "a_",
        "ab",
        "a" * 300,
        "a" * 300 + "b",
        "b",
        "\x00",
    ]
    for key in keys:
        await backend.put("t", key, key.encode())
    for prefix in ["", "%", "_", "a", "a" * 300, "\x00", "z"]:
        listed = [k async for k, _ in backend.list("t", prefix)]
        assert listed == sorted(k for k in keys if k.startswith(prefix)), prefix
    assert await backend.delete_prefix("t", "a" * 300) == 2
    assert await backend.delete_prefix("t", "%") == 3
    assert [k async for k, _ in backend.list("t")] == sorted(
        k for k in keys if not k.startswith(("%", "a" * 300))
    )


async def test_longest_id_round_trips_and_longer_is_refused(tmp_store_dir: Path) -> None:
    store = open_store(url_of(tmp_store_dir))
    limit = store.capabilities.max_key_bytes
    longest = "é" * (limit // 2)
    async with store:
        await store.put_state(longest, longest, {"ok": True})
        assert await store.get_state(longest, longest) == {"ok": True}
        assert await store.list_state(longest) == {longest: {"ok": True}}
        with pytest.raises(InvalidIdentifierError, match=f"at most {limit}"):
            await store.put_state(longest + "x", "k", 1)
        with pytest.raises(InvalidIdentifierError, match=f"at most {limit}"):
            await store.get_state("t", longest + "x")


# -- (d) damaged files -----------------------------------------------------------------------------


async def test_truncated_head_file_raises_corruption_at_every_length(tmp_store_dir: Path) -> None:
    async with open_store(url_of(tmp_store_dir)) as store:
        await store.append(cp(5))
        path = file_of(tmp_store_dir, "thread-1", checkpoint_latest_key("run-1"))
        good = path.read_bytes()
        for length in range(len(good)):
            path.write_bytes(good[:length])
            with pytest.raises(AgentCheckpointCorruptionError) as info:
                await store.latest("thread-1", "run-1")
            assert not isinstance(info.value, CheckpointNotFoundError), length
        path.write_bytes(good)
        assert (await store.latest("thread-1", "run-1")).seq == 5


async def test_bit_flipped_head_file_raises_corruption_at_every_bit(tmp_store_dir: Path) -> None:
    async with open_store(url_of(tmp_store_dir)) as store:
        await store.append(cp(5, payload={"seq": 5, "text": "hello"}))
        path = file_of(tmp_store_dir, "thread-1", checkpoint_latest_key("run-1"))
        good = path.read_bytes()
        for bit in range(len(good) * 8):
            damaged = bytearray(good)
            damaged[bit // 8] ^= 1 << (bit % 8)
            path.write_bytes(bytes(damaged))
            with pytest.raises(AgentCheckpointCorruptionError) as info:
                await store.latest("thread-1", "run-1")
            assert not isinstance(info.value, CheckpointNotFoundError), bit
        path.write_bytes(good)
        assert (await store.latest("thread-1", "run-1")).payload["text"] == "hello"


async def test_damaged_record_messages_name_the_file(tmp_store_dir: Path) -> None:
    async with open_store(url_of(tmp_store_dir)) as store:
        await store.append(cp(1))
        path = file_of(tmp_store_dir, "thread-1", checkpoint_key("run-1", 1, "pre_llm"))
        path.write_bytes(path.read_bytes()[:-4])
        with pytest.raises(AgentCheckpointCorruptionError) as info:
            await store.get_checkpoint("thread-1", "run-1", 1, Phase.PRE_LLM)
        assert path.name in str(info.value)
        assert "truncated" in str(info.value)
        with pytest.raises(AgentCheckpointCorruptionError):
            await store.history("thread-1", "run-1")


async def test_damaged_head_blocks_appends_until_the_run_is_deleted(tmp_store_dir: Path) -> None:
    async with open_store(url_of(tmp_store_dir)) as store:
        await store.append(cp(1))
        await store.append(cp(2, phase=Phase.RUNTIME_STATE))
        head = file_of(tmp_store_dir, "thread-1", checkpoint_latest_key("run-1"))
        head.write_bytes(head.read_bytes()[:30])
        # The stored seq is unreadable, so fencing cannot be checked: refuse, never guess.
        with pytest.raises(AgentCheckpointCorruptionError):
            await store.append(cp(3))
        assert await store.get_checkpoint("thread-1", "run-1", 3, Phase.PRE_LLM) is None
        # The remedy the error names works: the damaged run can be deleted.
        assert await store.delete_run("thread-1", "run-1") == 4
        with pytest.raises(CheckpointNotFoundError):
            await store.latest("thread-1", "run-1")
        await store.append(cp(1))
        assert (await store.latest("thread-1", "run-1")).seq == 1


async def test_damaged_files_do_not_block_deleting_their_thread(tmp_store_dir: Path) -> None:
    async with open_store(url_of(tmp_store_dir)) as store:
        long_key = "k" * 300  # stored under a hashed name: its key lives inside the file
        await store.put_state("t", long_key, 1)
        await store.put_state("t", "short", 2)
        directory = file_of(tmp_store_dir, "t", "short").parent
        for path in directory.iterdir():
            if path.is_file() and not path.name.startswith("."):
                path.write_bytes(b"\x00" * 5)
        with pytest.raises(AgentCheckpointCorruptionError):
            await store.list_state("t")
        assert await store.delete_state("t", "short") is True
        assert await store.delete_thread("t") == 1
        assert await store.list_state("t") == {}


async def test_foreign_files_in_a_thread_directory_are_not_read_as_keys(
    tmp_store_dir: Path,
) -> None:
    async with open_store(url_of(tmp_store_dir)) as store:
        await store.put_state("t", "a", 1)
        directory = file_of(tmp_store_dir, "t", "a").parent
        (directory / ".tmp-123-deadbeef").write_bytes(b"half a write")
        (directory / ".DS_Store").write_bytes(b"junk")
        assert await store.list_state("t") == {"a": 1}
        # A file under a key's name that holds another key is damage, not that key.
        other = file_of(tmp_store_dir, "t", "b")
        other.write_bytes(file_of(tmp_store_dir, "t", "a").read_bytes())
        with pytest.raises(AgentCheckpointCorruptionError):
            await store.get_state("t", "b")


# -- (e) close and reopen --------------------------------------------------------------------------


async def test_close_and_reopen_keeps_data_and_fencing(tmp_store_dir: Path) -> None:
    url = url_of(tmp_store_dir)
    async with open_store(url) as store:
        await store.append(cp(10, phase=Phase.RUNTIME_STATE, payload={"messages": []}))
        await store.put_state("thread-1", "note", {"n": 1})
    async with open_store(url) as reopened:
        latest = await reopened.latest("thread-1", "run-1")
        assert latest.seq == 10
        assert (await reopened.runtime_snapshot("thread-1", "run-1")) == latest
        assert await reopened.get_state("thread-1", "note") == {"n": 1}
        # The head's seq survived too: a lower seq is still fenced out.
        with pytest.raises(StaleWriterError):
            await reopened.append(cp(9))
        await reopened.append(cp(11))
    backend = open_backend(url)
    await backend.setup()
    assert await backend.get("thread-1", checkpoint_latest_key("run-1")) is not None
    await backend.close()


async def test_setup_is_idempotent_and_concurrent(tmp_path: Path) -> None:
    root = tmp_path / "deep" / "store"
    backends = [FileBackend(url_of(root)) for _ in range(8)]
    await asyncio.gather(*(b.setup() for b in backends))
    await backends[0].setup()
    assert (root / ".checkpoint-stores").read_text().startswith("layout ")


async def test_other_layout_is_refused(tmp_store_dir: Path) -> None:
    (tmp_store_dir / ".checkpoint-stores").write_text("layout 99\n")
    with pytest.raises(StoreUnavailableError, match="layout"):
        await FileBackend(url_of(tmp_store_dir)).setup()


async def test_unusable_root_is_store_unavailable(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreUnavailableError, match="cannot create the store directory"):
        await FileBackend(url_of(blocker / "store")).setup()


# -- URLs and options ------------------------------------------------------------------------------


def test_url_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert FileBackend("file://./rel/dir").root == tmp_path / "rel" / "dir"
    assert FileBackend(f"file://{tmp_path}/a%20b").root == tmp_path / "a b"
    assert FileBackend("file://~/x").root == Path("~/x").expanduser()
    with pytest.raises(ValueError, match="needs a path"):
        FileBackend("file://")
    with pytest.raises(ValueError, match="names a host"):
        FileBackend("file://server/share")
    with pytest.raises(TypeError, match="fsync"):
        FileBackend(f"file://{tmp_path}", pool=3)


@pytest.mark.parametrize("spelling", ["?fsync=false", "?fsync=0", "?fsync=no"])
async def test_fsync_option_from_the_url(tmp_path: Path, spelling: str) -> None:
    backend = FileBackend(f"file://{tmp_path}/s{spelling}")
    assert backend._fsync is False
    store = MemoryStore(backend)
    async with store:
        await store.append(cp(1))
        assert (await store.latest("thread-1", "run-1")).seq == 1
    assert FileBackend(f"file://{tmp_path}", fsync=True)._fsync is True
