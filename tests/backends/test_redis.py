"""Redis backend specifics, on the real standalone server and on the session's Cluster.

The kit (test_redis_conformance.py) checks the SPI contract; these tests check
what is particular to Redis: the key layout and hash slots, seq comparison in
Lua beyond float precision, native expiry, the thread registry, options and
URLs, and how foreign data under the prefix is reported.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis import exceptions as rexc
from redis.cluster import ClusterNode
from redis.crc import key_slot

from checkpoint_stores import MemoryStore, open_backend, open_store
from checkpoint_stores.backends.redis import MAX_KEY_BYTES, RedisBackend
from checkpoint_stores.errors import AgentCheckpointCorruptionError, StoreUnavailableError
from checkpoint_stores.schema import Checkpoint, Phase
from tests.support import ServerInfo, child_process, free_port, wait_port

pytestmark = pytest.mark.redis

HOSTILE_IDS = [
    "plain",
    "{tag}",
    "a}b{c",
    "}",
    "{",
    "*",
    "star*:colon:",
    "../../etc/passwd",
    "nul\x00inside",
    "%_\\[?]",
    "ünïcødé ✓ 🚀",
    "x" * 4000,
]


@pytest.fixture(params=["redis_server", "redis_cluster_server"], scope="module")
def server(request: pytest.FixtureRequest) -> ServerInfo:
    """Each test runs on the standalone server and on the Cluster."""
    info: ServerInfo = request.getfixturevalue(request.param)
    return info


def raw_client(server: ServerInfo) -> Any:
    """A plain synchronous redis-py client on the same server (the test's backdoor)."""
    if server.url.startswith("redis+cluster://"):
        nodes = [
            ClusterNode(h.rpartition(":")[0], int(h.rpartition(":")[2]))
            for h in server.url.partition("://")[2].split(",")
        ]
        return redis.cluster.RedisCluster(startup_nodes=nodes)
    return redis.Redis.from_url(server.url)


@pytest.fixture
def raw(server: ServerInfo) -> Iterator[Any]:
    client = raw_client(server)
    yield client
    client.close()


@pytest.fixture
async def backend(server: ServerInfo) -> AsyncIterator[RedisBackend]:
    b = open_backend(server.url, **server.options)
    assert isinstance(b, RedisBackend)
    await b.setup()
    yield b
    await b.close()


def tid(label: str = "t") -> str:
    return f"test-redis-{label}-{uuid.uuid4().hex[:8]}"


async def keys_of(backend: RedisBackend, thread_id: str, prefix: str = "") -> list[str]:
    return [k async for k, _ in backend.list(thread_id, prefix)]


async def threads(backend: RedisBackend, prefix: str) -> list[str]:
    return [t async for t in backend.list_threads(prefix)]


# -- key layout -----------------------------------------------------------------------


async def test_hostile_thread_ids_round_trip_in_one_slot_without_collisions(
    backend: RedisBackend, raw: Any
) -> None:
    base = tid("hostile")
    ids = [base + i for i in HOSTILE_IDS]
    for n, thread_id in enumerate(ids):
        await backend.commit(thread_id, [("rec:{*}", b"r%d" % n)], "head", b"h%d" % n, 1)
        await backend.put(thread_id, "k{}*:\x00", b"p%d" % n)
    for n, thread_id in enumerate(ids):
        assert await backend.get(thread_id, "head") == b"h%d" % n
        assert await backend.get_many(thread_id, ["rec:{*}", "k{}*:\x00", "nope"]) == [
            b"r%d" % n,
            b"p%d" % n,
            None,
        ]
        assert await keys_of(backend, thread_id) == ["head", "k{}*:\x00", "rec:{*}"]
        names = backend.key_names(thread_id)
        value_keys = [names.value_prefix + k.encode() for k in ("head", "rec:{*}", "k{}*:\x00")]
        slots = {key_slot(k) for k in [names.index_key, names.seqs_key, *value_keys]}
        assert len(slots) == 1, f"keys of {thread_id!r} span slots {slots}"
        assert raw.exists(*value_keys) == 3
    assert await threads(backend, base) == sorted(ids)
    for thread_id in ids:
        assert await backend.delete_thread(thread_id) == 3
    assert await threads(backend, base) == []


async def test_near_identical_ids_do_not_collide(backend: RedisBackend) -> None:
    base = tid("near")
    # Pairs a naive layout would merge: brace tags, separators, prefixes of each other.
    ids = [base + s for s in ["", "}", "{", "{}", ":v:", ":i", "a", "a:", "a}:v:b"]]
    for n, thread_id in enumerate(ids):
        await backend.put(thread_id, "k", b"%d" % n)
        await backend.put(thread_id, "k:v:x", b"x%d" % n)
    for n, thread_id in enumerate(ids):
        assert [kv async for kv in backend.list(thread_id)] == [
            ("k", b"%d" % n),
            ("k:v:x", b"x%d" % n),
        ]
    for thread_id in ids:
        await backend.delete_thread(thread_id)


async def test_longest_declared_key_round_trips(backend: RedisBackend) -> None:
    thread_id = tid("long") + "é" * 100
    key = "k" + "é" * ((MAX_KEY_BYTES - 1) // 2)
    assert len(key.encode()) <= MAX_KEY_BYTES
    assert await backend.create(thread_id, key, b"v")
    assert await keys_of(backend, thread_id) == [key]
    assert await backend.delete_thread(thread_id) == 1


async def test_values_up_to_the_declared_maximum(backend: RedisBackend) -> None:
    thread_id = tid("big")
    big = bytes(range(256)) * ((RedisBackend.capabilities.max_value_bytes or 0) // 256)
    assert len(big) == 64 * 1024 * 1024
    # The largest command the facade sends: record, runtime copy and head, each at the maximum.
    assert await backend.commit(thread_id, [("rec", big), ("runtime", big)], "head", big, 1)
    assert await backend.get_many(thread_id, ["rec", "runtime", "head"]) == [big, big, big]
    assert await backend.delete_thread(thread_id) == 3


# -- commit and seqs ------------------------------------------------------------------


async def test_commit_compares_seqs_beyond_float_precision(backend: RedisBackend, raw: Any) -> None:
    thread_id = tid("seq")
    big = 2**53
    # 2**53 + 1 is not representable as a double: a float compare would call it equal.
    assert await backend.commit(thread_id, [], "h", b"a", big)
    assert await backend.commit(thread_id, [], "h", b"b", big + 1)
    assert not await backend.commit(thread_id, [("w", b"stale")], "h", b"x", big + 1)
    assert not await backend.commit(thread_id, [], "h", b"x", big)
    assert await backend.commit(thread_id, [], "h", b"c", 2**64 + 3)
    assert not await backend.commit(thread_id, [], "h", b"x", 2**64 + 2)
    assert await backend.commit(thread_id, [], "h", b"d", 10**40)
    assert not await backend.commit(thread_id, [], "h", b"x", 9 * 10**39)
    assert await backend.get(thread_id, "h") == b"d"
    assert await backend.get(thread_id, "w") is None  # the stale commit wrote nothing
    names = backend.key_names(thread_id)
    assert raw.hget(names.seqs_key, "h") == str(10**40).encode()
    await backend.delete_thread(thread_id)


async def test_negative_seqs_order_correctly(backend: RedisBackend) -> None:
    thread_id = tid("neg")
    assert await backend.commit(thread_id, [], "h", b"a", -(2**60))
    assert not await backend.commit(thread_id, [], "h", b"x", -(2**60) - 1)
    assert await backend.commit(thread_id, [], "h", b"b", -5)
    assert not await backend.commit(thread_id, [], "h", b"x", -6)
    assert await backend.commit(thread_id, [], "h", b"c", 0)
    assert not await backend.commit(thread_id, [], "h", b"x", -1)
    assert await backend.get(thread_id, "h") == b"c"
    await backend.delete_thread(thread_id)


async def test_put_over_a_head_drops_its_seq(backend: RedisBackend, raw: Any) -> None:
    thread_id = tid("puthead")
    assert await backend.commit(thread_id, [], "h", b"a", 100)
    await backend.put(thread_id, "h", b"plain")
    assert raw.hget(backend.key_names(thread_id).seqs_key, "h") is None
    assert await backend.commit(thread_id, [], "h", b"low", 1)  # a put head counts as lowest
    assert await backend.get(thread_id, "h") == b"low"
    await backend.delete_thread(thread_id)


async def test_commit_writes_records_head_seq_and_index_together(
    backend: RedisBackend, raw: Any
) -> None:
    thread_id = tid("commit")
    writes = [("checkpoint:r:1:pre_llm", b"rec"), ("checkpoint:r:runtime", b"rt")]
    assert await backend.commit(thread_id, writes, "checkpoint:r:latest", b"rec", 7)
    names = backend.key_names(thread_id)
    assert raw.zrange(names.index_key, 0, -1) == sorted(
        [b"checkpoint:r:1:pre_llm", b"checkpoint:r:latest", b"checkpoint:r:runtime"]
    )
    assert raw.hgetall(names.seqs_key) == {b"checkpoint:r:latest": b"7"}
    assert raw.ttl(names.index_key) == -1  # no ttl option: everything persistent
    await backend.delete_thread(thread_id)
    assert not raw.exists(names.index_key, names.seqs_key)


# -- list -----------------------------------------------------------------------------


async def test_list_is_sorted_prefix_exact_and_pages(backend: RedisBackend) -> None:
    thread_id = tid("list")
    keys = [f"run:{i:04d}" for i in range(600)]  # more than two pages
    keys += ["run", "run;", "run:", "ru*", "run:\U0010ffff", "rum", "run\x00", "run:*", "run:?"]
    keys += ["a%", "a_", "a%b", "[x]", "\\", "{}", "é", "\x7f", "\u00ff", "\U0001f680"]
    for key in keys:
        await backend.put(thread_id, key, key.encode())
    listed = [kv async for kv in backend.list(thread_id)]
    assert listed == sorted((k, k.encode()) for k in keys)
    for prefix in ["run:", "run", "ru*", "a%", "a_", "[", "\\", "{", "run:\U0010ffff", "zzz"]:
        got = await keys_of(backend, thread_id, prefix)
        assert got == sorted(k for k in keys if k.startswith(prefix)), prefix
    assert await backend.delete_prefix(thread_id, "run:") == len(
        [k for k in keys if k.startswith("run:")]
    )
    assert await keys_of(backend, thread_id, "run:") == []
    assert "run" in await keys_of(backend, thread_id, "run")
    await backend.delete_thread(thread_id)


async def test_list_of_large_values_is_complete_and_ordered(backend: RedisBackend) -> None:
    """Pages shrink for large values (bounded replies) without losing or repeating keys."""
    thread_id = tid("listbig")
    values = {f"k{i:03d}": bytes([i]) * (1024 * 1024) for i in range(70)}
    for key, value in values.items():
        await backend.put(thread_id, key, value)
    listed = [kv async for kv in backend.list(thread_id)]
    assert [k for k, _ in listed] == sorted(values)
    assert all(v == values[k] for k, v in listed)
    assert await backend.delete_thread(thread_id) == 70


async def test_list_skips_and_prunes_entries_whose_value_vanished(
    backend: RedisBackend, raw: Any
) -> None:
    thread_id = tid("vanish")
    for key in ("a", "b", "c"):
        await backend.put(thread_id, key, b"v")
    names = backend.key_names(thread_id)
    raw.delete(names.value_prefix + b"b")  # as if it expired
    assert await keys_of(backend, thread_id) == ["a", "c"]
    assert raw.zrange(names.index_key, 0, -1) == [b"a", b"c"]
    await backend.delete_thread(thread_id)


# -- expiry ---------------------------------------------------------------------------


async def test_ttl_option_expires_every_written_key(server: ServerInfo, raw: Any) -> None:
    backend = open_backend(server.url, **{**server.options, "ttl": 1000})
    assert isinstance(backend, RedisBackend)
    thread_id = tid("ttl")
    try:
        await backend.commit(thread_id, [("r", b"1")], "h", b"1", 1)
        await backend.put(thread_id, "p", b"2")
        assert await backend.create(thread_id, "c", b"3")
        names = backend.key_names(thread_id)
        for key in [names.index_key, names.seqs_key] + [
            names.value_prefix + k for k in (b"r", b"h", b"p", b"c")
        ]:
            assert 0 < raw.pttl(key) <= 1_000_000, key
        # A writer without the ttl option makes what it writes, and the index, persistent.
        plain = open_backend(server.url, **server.options)
        await plain.put(thread_id, "forever", b"x")
        await plain.close()
        assert raw.pttl(names.value_prefix + b"forever") == -1
        assert raw.pttl(names.index_key) == -1
        assert 0 < raw.pttl(names.value_prefix + b"p") <= 1_000_000
    finally:
        await backend.delete_thread(thread_id)
        await backend.close()


async def test_expire_prefix_sets_ttls_and_keeps_index_alive_long_enough(
    backend: RedisBackend, raw: Any
) -> None:
    thread_id = tid("expire")
    await backend.commit(thread_id, [("checkpoint:r1:1:x", b"1")], "checkpoint:r1:latest", b"1", 1)
    await backend.commit(thread_id, [("checkpoint:r2:1:x", b"2")], "checkpoint:r2:latest", b"2", 1)
    names = backend.key_names(thread_id)
    assert await backend.expire_prefix(thread_id, "checkpoint:r1:", 500) == 2
    assert 0 < raw.pttl(names.value_prefix + b"checkpoint:r1:latest") <= 500_000
    assert raw.pttl(names.value_prefix + b"checkpoint:r2:latest") == -1
    assert raw.pttl(names.index_key) == -1  # r2 is persistent: so is the index
    assert await backend.expire_prefix(thread_id, "checkpoint:r2:", 900) == 2
    # Everything now expires; the index and seqs live exactly as long as the longest key.
    for key in (names.index_key, names.seqs_key):
        assert 500_000 < raw.pttl(key) <= 900_000
    assert await backend.expire_prefix(thread_id, "nothing-here", 5) == 0
    await backend.delete_thread(thread_id)


async def test_expired_thread_disappears_from_list_and_registry(
    backend: RedisBackend, raw: Any
) -> None:
    base = tid("gone")
    keep, doomed = base + "-keep", base + "-doomed"
    await backend.put(keep, "k", b"v")
    await backend.commit(doomed, [("r", b"1")], "h", b"1", 5)
    assert await threads(backend, base) == [doomed, keep]
    assert await backend.expire_prefix(doomed, "", 0.05) == 2
    names = backend.key_names(doomed)
    deadline = time.monotonic() + 30  # expiry is the server's job; wait for it, bounded
    while raw.exists(names.index_key) and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    assert not raw.exists(names.index_key, names.seqs_key, names.value_prefix + b"h")
    assert await keys_of(backend, doomed) == []
    assert await threads(backend, base) == [keep]
    assert raw.zscore(backend.key_prefix + "threads", doomed) is None  # pruned
    # An expired head leaves no fence: any seq may start it again.
    assert await backend.commit(doomed, [], "h", b"again", 1)
    assert await threads(backend, base) == [doomed, keep]
    await backend.delete_thread(doomed)
    await backend.delete_thread(keep)


async def test_expire_prefix_with_no_time_left_deletes(backend: RedisBackend) -> None:
    thread_id = tid("expire0")
    await backend.put(thread_id, "a:1", b"1")
    await backend.put(thread_id, "b:1", b"1")
    assert await backend.expire_prefix(thread_id, "a:", 0) == 1
    assert await keys_of(backend, thread_id) == ["b:1"]
    with pytest.raises(ValueError, match="finite"):
        await backend.expire_prefix(thread_id, "b:", float("nan"))
    await backend.delete_thread(thread_id)


# -- registry -------------------------------------------------------------------------


async def test_list_threads_is_sorted_and_prefix_exact(backend: RedisBackend) -> None:
    base = tid("reg")
    ids = [base + s for s in ["b", "a", "a%", "a_", "a*", "ab", "é", "a\x00"]]
    for thread_id in ids:
        await backend.put(thread_id, "k", b"v")
    assert await threads(backend, base) == sorted(ids)
    assert await threads(backend, base + "a") == sorted(i for i in ids if i.startswith(base + "a"))
    assert await threads(backend, base + "a%") == [base + "a%"]
    await backend.delete(base + "b", "k")  # the thread's last key: the thread is gone
    assert base + "b" not in await threads(backend, base)
    for thread_id in ids:
        await backend.delete_thread(thread_id)
    assert await threads(backend, base) == []


async def test_unregister_rechecks_so_a_recreated_thread_stays_listed(
    backend: RedisBackend,
) -> None:
    thread_id = tid("race")
    await backend.put(thread_id, "k", b"v")
    # What delete_thread/list_threads do after a concurrent writer recreated the
    # thread: the entry is removed, the index found alive, the entry restored.
    await backend._unregister([thread_id])
    assert await threads(backend, thread_id) == [thread_id]
    await backend.delete_thread(thread_id)


async def test_resent_write_after_a_lost_reply_reports_the_truth(
    backend: RedisBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reply lost after the server applied a script: the resend must not lie."""
    thread_id = tid("resend")
    lose = {"create": 0, "commit": 0}  # replies still to lose, per script

    for name in lose:
        real = backend._script(name)

        async def lose_reply(*args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            result = await _real(*args, **kw)  # the server applies it...
            if lose[_name]:
                lose[_name] -= 1
                raise rexc.ConnectionError("Connection reset by peer")  # ...the reply is lost
            return result

        monkeypatch.setitem(backend._scripts, name, lose_reply)

    lose["create"] = 1
    assert await backend.create(thread_id, "intent", b"mine")  # landed on the first try
    assert await threads(backend, thread_id) == [thread_id]  # registered despite the loss
    other = tid("resend-other")
    await backend.put(other, "intent", b"theirs")
    lose["create"] = 1
    assert not await backend.create(other, "intent", b"mine")  # someone else's: still False
    assert await backend.get(other, "intent") == b"theirs"

    lose["commit"] = 1
    assert await backend.commit(thread_id, [("rec", b"1")], "head", b"1", 1)  # ours, landed
    assert await backend.get(thread_id, "head") == b"1"
    await backend.commit(other, [], "head", b"newer", 9)
    lose["commit"] = 1
    assert not await backend.commit(other, [], "head", b"1", 5)  # a newer head: still False
    assert await backend.get(other, "head") == b"newer"

    store = MemoryStore(backend)  # and through the facade
    lose["commit"] = 1
    await store.append(
        Checkpoint(run_id="r", thread_id=thread_id, seq=2, phase=Phase.RUN_STARTED, payload={})
    )
    assert (await store.latest(thread_id, "r")).seq == 2
    await backend.delete_thread(thread_id)
    await backend.delete_thread(other)


# -- foreign data ---------------------------------------------------------------------


async def test_foreign_data_under_the_prefix_is_reported_not_returned(
    backend: RedisBackend, raw: Any
) -> None:
    thread_id = tid("foreign")
    names = backend.key_names(thread_id)
    raw.hset(names.value_prefix + b"k", "field", "x")  # a hash where a string belongs
    with pytest.raises(AgentCheckpointCorruptionError, match="WRONGTYPE"):
        await backend.get(thread_id, "k")
    raw.delete(names.value_prefix + b"k")
    raw.set(names.index_key, b"not a zset")
    with pytest.raises(AgentCheckpointCorruptionError, match="key_prefix"):
        await keys_of(backend, thread_id)
    raw.delete(names.index_key)
    raw.zadd(names.index_key, {b"\xff\xfe": 0})
    raw.set(names.value_prefix + b"\xff\xfe", b"v")
    with pytest.raises(AgentCheckpointCorruptionError, match="not UTF-8"):
        await keys_of(backend, thread_id)
    raw.delete(names.index_key, names.value_prefix + b"\xff\xfe")


# -- URLs and options -----------------------------------------------------------------


def test_options_from_url_query_and_keywords() -> None:
    b = RedisBackend("redis://h:1/0?key_prefix=q:&ttl=60&retries=2&socket_timeout=1.5")
    assert (b.key_prefix, b.ttl, b._retries, b._socket_timeout) == ("q:", 60.0, 2, 1.5)
    b = RedisBackend("redis://h:1/0?key_prefix=q:", key_prefix="kw:", ttl=None)
    assert (b.key_prefix, b.ttl) == ("kw:", None)
    assert RedisBackend("unix:///tmp/x.sock?db=2").cluster is False
    assert RedisBackend("redis+cluster://a:1,b:2").cluster is True


@pytest.mark.parametrize(
    ("url", "options", "error", "match"),
    [
        ("redis://h/0", {"bogus": 1}, TypeError, "bogus"),
        ("redis://h/0?nope=1", {}, TypeError, "nope"),
        ("redis://h/0", {"key_prefix": "a{b"}, ValueError, "hash slot"),
        ("redis://h/0", {"ttl": "soon"}, ValueError, "ttl"),
        ("redis://h/0", {"retries": -1}, ValueError, "retries"),
        ("http://h/0", {}, ValueError, "not a Redis URL"),
    ],
)
def test_bad_options_are_refused_clearly(
    url: str, options: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        RedisBackend(url, **options)


def test_string_options_are_typed() -> None:
    """CLI ``-o key=value`` options arrive as strings."""
    b = RedisBackend("redis://h/0", db="2", ssl_check_hostname="false", ttl="60", retries="1")
    assert b._driver_options == {"db": 2, "ssl_check_hostname": False}
    assert (b.ttl, b._retries) == (60.0, 1)


def test_cluster_urls() -> None:
    b = RedisBackend("redis+cluster://u:pw@a:7000, b:7001,[::1]:7002,c/0")
    assert b._cluster_seeds() == ("u:pw@", [("a", 7000), ("b", 7001), ("::1", 7002), ("c", 6379)])
    with pytest.raises(ValueError, match="database 0"):
        RedisBackend("redis+cluster://127.0.0.1:1/3")
    with pytest.raises(ValueError, match="names no node"):
        RedisBackend("redis+cluster://u:pw@/")


def test_repr_and_errors_hide_the_password() -> None:
    b = RedisBackend("redis://user:hunter2@h:1/0")
    assert "hunter2" not in repr(b)
    assert "***" in repr(b)
    b = RedisBackend("redis://h:1/0", password="hunter2")
    assert "hunter2" not in repr(b)
    assert (
        "hunter2" not in b._unavailable("get", rexc.ConnectionError("auth hunter2 failed")).args[0]
    )


def test_capabilities_are_declared() -> None:
    caps = RedisBackend.capabilities
    assert caps.atomic_commit
    assert caps.fenced_commit
    assert caps.cross_process
    assert caps.ttl
    assert caps.max_value_bytes == 64 * 1024 * 1024
    assert caps.max_key_bytes == MAX_KEY_BYTES


async def test_facade_round_trip(server: ServerInfo) -> None:
    thread_id = tid("facade")
    async with open_store(server.url, **server.options) as store:
        for seq, phase in enumerate([Phase.RUN_STARTED, Phase.RUNTIME_STATE, Phase.PRE_LLM], 1):
            await store.append(
                Checkpoint(
                    run_id="r1", thread_id=thread_id, seq=seq, step=seq, phase=phase, payload={}
                )
            )
        latest = await store.latest(thread_id, "r1")
        assert (latest.seq, latest.phase) == (3, Phase.PRE_LLM)
        snapshot = await store.runtime_snapshot(thread_id, "r1")
        assert snapshot is not None
        assert snapshot.seq == 2
        assert [c.seq for c in await store.history(thread_id, "r1")] == [1, 2, 3]
        await store.delete_thread(thread_id)


# -- unix socket ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def unix_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private redis-server listening on a Unix socket only."""
    root = tmp_path_factory.mktemp("redis-unix")
    sock = root / "redis.sock"
    args = ["redis-server", "--port", "0", "--unixsocket", str(sock), "--save", "",
            "--appendonly", "no", "--dir", str(root)]  # fmt: skip
    with child_process(args, log=root / "log") as proc:
        deadline = time.monotonic() + 20
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    f"redis-server on a unix socket did not start: {(root / 'log').read_text()}"
                )
            time.sleep(0.05)
        yield sock


async def test_unix_socket_url(unix_redis: Path) -> None:
    async with open_store(f"unix://{unix_redis}?db=1", key_prefix="u:") as store:
        await store.put_state("t", "k", {"v": 1})
        assert await store.get_state("t", "k") == {"v": 1}
    client = redis.Redis(unix_socket_path=str(unix_redis), db=1)
    assert client.exists(b"u:{dA}:v:k") == 1  # db and prefix taken from the URL and options
    client.close()


# -- TLS --------------------------------------------------------------------------------


def _write_tls_files(root: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1 (PEM files)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "checkpoint-stores test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = root / "ca.pem", root / "server.pem", root / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    """A private redis-server that speaks TLS only, with a throwaway CA."""
    root = tmp_path_factory.mktemp("redis-tls")
    ca, cert, key = _write_tls_files(root)
    port = free_port()
    args = ["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
            "--tls-cert-file", str(cert), "--tls-key-file", str(key),
            "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no",
            "--save", "", "--appendonly", "no", "--dir", str(root)]  # fmt: skip
    with child_process(args, log=root / "log"):
        wait_port("127.0.0.1", port, timeout=20)
        yield port, ca


async def test_rediss_url_with_the_servers_ca(tls_redis: tuple[int, Path]) -> None:
    port, ca = tls_redis
    async with open_store(f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca}") as store:
        await store.put_state("t", "k", {"tls": True})
        assert await store.get_state("t", "k") == {"tls": True}
    async with open_store(f"rediss://127.0.0.1:{port}/0", ssl_ca_certs=str(ca)) as store:
        assert await store.get_state("t", "k") == {"tls": True}
        await store.delete_thread("t")


async def test_rediss_with_an_unknown_ca_fails_clearly(tls_redis: tuple[int, Path]) -> None:
    port, _ = tls_redis
    store = open_store(f"rediss://127.0.0.1:{port}/0", retries=0)
    with pytest.raises(StoreUnavailableError, match=r"(?i)certificate"):
        await store.setup()
    await store.close()
