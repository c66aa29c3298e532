"""The MongoDB backend against a real MongoDB-wire server (see tests/servers/mongodb.py).

Each test gets a collection of its own (dropped afterwards) on the session's
database; ``raw`` is a plain PyMongo handle on the same collection, used as
ground truth and as a backdoor to damage data below the SPI.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pymongo import AsyncMongoClient, monitoring
from pymongo.asynchronous.collection import AsyncCollection

from checkpoint_stores import open_backend, open_store
from checkpoint_stores.backends.mongodb import MAX_VALUE_BYTES, MongoBackend
from checkpoint_stores.errors import AgentCheckpointCorruptionError, StoreUnavailableError
from checkpoint_stores.schema import Checkpoint, Phase
from checkpoint_stores.spi import Expirer, StorageBackend, ThreadLister
from tests.support import ServerInfo, free_port

pytestmark = pytest.mark.mongodb

Doc = dict[str, Any]

HOSTILE = [
    "../etc/passwd",
    "{tag}",
    "*",
    "%",
    "_",
    "a.b",
    "$where",
    "a\x00b",
    "\x00",
    "é",
    "\U0001f600",
    "\uffff",
    ":",
    "1:x",
    "x" * 4000,
]


def _with_query(url: str, extra: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{extra}"


def _collection_name() -> str:
    return f"t_{uuid.uuid4().hex[:10]}"


@pytest.fixture
def collection_name() -> str:
    return _collection_name()


@pytest.fixture
async def raw(
    mongodb_server: ServerInfo, collection_name: str
) -> AsyncIterator[AsyncCollection[Doc]]:
    client: AsyncMongoClient[Doc] = AsyncMongoClient(mongodb_server.url)
    coll = client.get_default_database().get_collection(collection_name)
    yield coll
    await coll.drop()
    await client.close()


@pytest.fixture
async def backend(
    mongodb_server: ServerInfo, collection_name: str, raw: AsyncCollection[Doc]
) -> AsyncIterator[MongoBackend]:
    b = MongoBackend(mongodb_server.url, collection=collection_name, **mongodb_server.options)
    await b.setup()
    yield b
    await b.close()


@pytest.fixture
async def ordered_backend(
    mongodb_server: ServerInfo, collection_name: str, raw: AsyncCollection[Doc]
) -> AsyncIterator[MongoBackend]:
    """The same server without transactions: the ordered (unfenced) commit path."""
    b = MongoBackend(
        mongodb_server.url, collection=collection_name, transactions="off", **mongodb_server.options
    )
    await b.setup()
    yield b
    await b.close()


async def _keys(b: MongoBackend, thread: str, prefix: str = "") -> list[str]:
    return [k async for k, _ in b.list(thread, prefix)]


# -- construction and options ------------------------------------------------------


def test_registered_for_both_schemes() -> None:
    for url in ("mongodb://localhost/db", "mongodb+srv://cluster.example.net/db"):
        b = open_backend(url)
        assert isinstance(b, MongoBackend)
        assert isinstance(b, StorageBackend)
        assert isinstance(b, ThreadLister)
        assert isinstance(b, Expirer)


def test_url_options_are_ours_and_the_rest_reaches_pymongo() -> None:
    b = MongoBackend(
        "mongodb://u:s3cret@h1:1,h2:2/runs?collection=agent&replicaSet=rs0"
        "&authMechanismProperties=SERVICE_NAME:x,CANONICALIZE_HOST_NAME:true&transactions=off"
    )
    assert b.database == "runs"
    assert b.collection == "agent"
    assert b._driver_url == (
        "mongodb://u:s3cret@h1:1,h2:2/runs?replicaSet=rs0"
        "&authMechanismProperties=SERVICE_NAME:x,CANONICALIZE_HOST_NAME:true"
    )
    assert not b.capabilities.atomic_commit
    assert "s3cret" not in repr(b)
    assert "***" in repr(b)


def test_keyword_options_override_the_url() -> None:
    b = MongoBackend("mongodb://h/db1?collection=a", database="db2", collection="b")
    assert (b.database, b.collection) == ("db2", "b")
    assert MongoBackend("mongodb://h").database == "checkpoint_stores"
    assert MongoBackend("mongodb://h").collection == "checkpoints"


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"collection": ""}, "collection name"),
        ({"collection": "a$b"}, "collection name"),
        ({"collection": "system.x"}, "collection name"),
        ({"collection": "a\x00"}, "collection name"),
        ({"database": "a.b"}, "database name"),
        ({"database": "a/b"}, "database name"),
        ({"database": "d" * 64}, "database name"),
        ({"w": 0}, "w=0"),
        ({"w": "0"}, "w=0"),
        ({"j": "maybe"}, "not a boolean"),
        ({"wtimeout": "soon"}, "write concern"),
        ({"w": -1}, "write concern"),
        ({"transactions": "sometimes"}, "not a boolean"),
        ({"commit_retry_seconds": "soon"}, "seconds"),
        ({"commit_retry_seconds": -1}, "seconds"),
    ],
)
def test_bad_options_are_refused_with_guidance(options: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        MongoBackend("mongodb://localhost", **options)


def test_not_a_mongodb_url() -> None:
    with pytest.raises(ValueError, match="not a MongoDB URL"):
        MongoBackend("redis://u:pw@localhost")


def test_client_must_be_an_async_client() -> None:
    from pymongo import MongoClient

    sync_client: MongoClient[Doc] = MongoClient("mongodb://localhost", connect=False)
    try:
        with pytest.raises(TypeError, match="AsyncMongoClient"):
            MongoBackend("mongodb://localhost", client=sync_client)
    finally:
        sync_client.close()


async def test_client_options_conflict_with_a_given_client() -> None:
    client: AsyncMongoClient[Doc] = AsyncMongoClient("mongodb://localhost", connect=False)
    try:
        with pytest.raises(TypeError, match="configure your client"):
            MongoBackend("mongodb://localhost", client=client, serverSelectionTimeoutMS=5)
    finally:
        await client.close()


async def test_a_callers_client_is_used_and_left_open(
    mongodb_server: ServerInfo, collection_name: str, raw: AsyncCollection[Doc]
) -> None:
    client: AsyncMongoClient[Doc] = AsyncMongoClient(mongodb_server.url)
    try:
        b = MongoBackend(mongodb_server.url, client=client, collection=collection_name)
        await b.put("t", "k", b"v")
        await b.close()
        # Still usable after the backend closed: it was not ours to close.
        doc = await client.get_default_database()[collection_name].find_one({"key": "k"})
        assert doc is not None
        assert doc["value"] == b"v"
    finally:
        await client.close()


async def test_write_concern_defaults_to_journaled_majority_and_is_configurable(
    mongodb_server: ServerInfo, collection_name: str, raw: AsyncCollection[Doc]
) -> None:
    b = MongoBackend(mongodb_server.url, collection=collection_name)
    await b.setup()
    assert b._coll is not None
    assert b._coll.write_concern.document == {"w": "majority", "j": True}
    assert b._coll.read_concern.level == "majority"
    await b.close()
    b = MongoBackend(mongodb_server.url, collection=collection_name, w=1, j=False, wtimeout=5000)
    await b.setup()
    assert b._coll is not None
    assert b._coll.write_concern.document == {"w": 1, "j": False, "wtimeout": 5000}
    await b.close()
    b = MongoBackend(_with_query(mongodb_server.url, "wtimeout=2000"), collection=collection_name)
    await b.setup()
    assert b._coll is not None
    assert b._coll.write_concern.document == {"w": "majority", "j": True, "wtimeout": 2000}
    await b.close()
    url = _with_query(mongodb_server.url, "w=1&readConcernLevel=local")
    b = MongoBackend(url, collection=collection_name)
    await b.setup()
    assert b._coll is not None
    assert b._coll.write_concern.document == {"w": 1, "j": True}
    assert b._coll.read_concern.level == "local"
    await b.close()
    # PyMongo's own URL options set the client's write concern, used as it is.
    b = MongoBackend(_with_query(mongodb_server.url, "journal=false"), collection=collection_name)
    await b.setup()
    assert b._coll is not None
    assert b._coll.write_concern.document == {"j": False}
    await b.close()


# -- setup -------------------------------------------------------------------------


async def test_setup_is_idempotent_and_creates_the_indexes(
    backend: MongoBackend, raw: AsyncCollection[Doc]
) -> None:
    await backend.setup()
    await backend.setup()
    indexes = await raw.index_information()
    assert indexes["thread_key"]["key"] == [("thread", 1), ("key", 1)]
    assert indexes["expires_at_ttl"]["expireAfterSeconds"] == 0
    assert indexes["expires_at_ttl"]["sparse"] is True


async def test_concurrent_setup_of_many_backends(
    mongodb_server: ServerInfo, collection_name: str, raw: AsyncCollection[Doc]
) -> None:
    backends = [MongoBackend(mongodb_server.url, collection=collection_name) for _ in range(6)]
    await asyncio.gather(*(b.setup() for b in backends))
    await asyncio.gather(*(b.put("t", f"k{i}", b"v") for i, b in enumerate(backends)))
    assert await raw.count_documents({}) == 6
    await asyncio.gather(*(b.close() for b in backends))


async def test_capabilities_follow_the_deployment(
    backend: MongoBackend, raw: AsyncCollection[Doc]
) -> None:
    hello = await raw.database.client.admin.command("hello")
    has_transactions = "setName" in hello or hello.get("msg") == "isdbgrid"
    caps = backend.capabilities
    assert caps.atomic_commit is has_transactions
    assert caps.fenced_commit is has_transactions
    assert caps.durable
    assert caps.cross_process
    assert caps.ttl
    assert caps.max_value_bytes == MAX_VALUE_BYTES


def test_capabilities_before_setup_claim_no_transactions_unless_forced() -> None:
    assert MongoBackend("mongodb://h").capabilities.atomic_commit is False
    assert MongoBackend("mongodb://h", transactions="on").capabilities.atomic_commit is True
    assert MongoBackend("mongodb://h", transactions="off").capabilities.fenced_commit is False


async def test_conflicting_index_is_reported(
    mongodb_server: ServerInfo, collection_name: str, raw: AsyncCollection[Doc]
) -> None:
    await raw.create_index("expires_at", name="expires_at_ttl", expireAfterSeconds=3600)
    b = MongoBackend(mongodb_server.url, collection=collection_name)
    with pytest.raises(StoreUnavailableError, match="conflicts"):
        await b.setup()
    await b.close()


# -- the SPI -----------------------------------------------------------------------


async def test_put_get_delete(backend: MongoBackend) -> None:
    assert await backend.get("t", "k") is None
    await backend.put("t", "k", b"one")
    await backend.put("t", "k", b"two")
    assert await backend.get("t", "k") == b"two"
    assert await backend.get("t2", "k") is None
    assert await backend.delete("t", "k") is True
    assert await backend.delete("t", "k") is False
    assert await backend.get("t", "k") is None


async def test_values_are_binary_and_ids_are_values_not_field_names(
    backend: MongoBackend, raw: AsyncCollection[Doc]
) -> None:
    await backend.put("th.r$ead", "ke.y$", b"\x00\xff")
    doc = await raw.find_one({})
    assert doc is not None
    assert set(doc) == {"_id", "thread", "key", "value"}
    assert (doc["thread"], doc["key"], doc["value"]) == ("th.r$ead", "ke.y$", b"\x00\xff")


async def test_get_many_in_order_with_missing_and_repeated(backend: MongoBackend) -> None:
    assert await backend.get_many("t", []) == []
    await backend.put("t", "a", b"1")
    await backend.put("t", "c", b"3")
    assert await backend.get_many("t", ["c", "b", "a", "c"]) == [b"3", None, b"1", b"3"]


async def test_create_is_first_writer_wins(backend: MongoBackend) -> None:
    assert await backend.create("t", "k", b"first") is True
    assert await backend.create("t", "k", b"second") is False
    assert await backend.get("t", "k") == b"first"


async def test_create_race_has_exactly_one_winner(backend: MongoBackend) -> None:
    results = await asyncio.gather(*(backend.create("t", "k", b"%d" % i) for i in range(20)))
    assert results.count(True) == 1
    winner = results.index(True)
    assert await backend.get("t", "k") == b"%d" % winner


async def test_hostile_ids_round_trip_without_collisions(backend: MongoBackend) -> None:
    for i, thread in enumerate(HOSTILE):
        for j, key in enumerate(HOSTILE):
            await backend.put(thread, key, f"{i}/{j}".encode())
    for i, thread in enumerate(HOSTILE):
        assert await _keys(backend, thread) == sorted(HOSTILE)
        for j, key in enumerate(HOSTILE):
            assert await backend.get(thread, key) == f"{i}/{j}".encode()
    threads = [t async for t in backend.list_threads()]
    assert threads == sorted(HOSTILE)


async def test_ids_that_a_naive_join_would_confuse(backend: MongoBackend) -> None:
    # "a:" + "b" and "a" + ":b" must stay apart, and so must thread/key splits.
    await backend.put("a:", "b", b"1")
    await backend.put("a", ":b", b"2")
    await backend.put("1:a", "b", b"3")
    assert await backend.get("a:", "b") == b"1"
    assert await backend.get("a", ":b") == b"2"
    assert await backend.get("1:a", "b") == b"3"
    assert await _keys(backend, "a") == [":b"]


async def test_longest_declared_ids_round_trip(backend: MongoBackend) -> None:
    limit = backend.capabilities.max_key_bytes
    thread = "é" * (limit // 2)
    key = "\U0001f600" * (limit // 4)
    assert len(thread.encode()) == len(key.encode()) == limit
    await backend.put(thread, key, b"v")
    assert await backend.get(thread, key) == b"v"
    assert await _keys(backend, thread) == [key]


async def test_list_is_sorted_in_utf8_byte_order_and_prefix_exact(backend: MongoBackend) -> None:
    keys = [
        "a",
        "a\x00",
        "a\x00b",
        "a\x01",
        "ab",
        "a%",
        "a_",
        "a*",
        "b",
        "é",
        "\uffff",
        "\U0001f600",
    ]
    for key in reversed(keys):
        await backend.put("t", key, key.encode())
    assert await _keys(backend, "t") == sorted(keys)
    assert sorted(keys) == sorted(keys, key=lambda k: k.encode())
    assert await _keys(backend, "t", "a\x00") == ["a\x00", "a\x00b"]
    assert await _keys(backend, "t", "a%") == ["a%"]
    assert await _keys(backend, "t", "a_") == ["a_"]
    assert await _keys(backend, "t", "a*") == ["a*"]
    assert await _keys(backend, "t", "\uffff") == ["\uffff"]
    assert await _keys(backend, "t", "c") == []
    assert [v async for _, v in backend.list("t", "é")] == ["é".encode()]


async def test_list_threads_sorted_and_prefix_exact(backend: MongoBackend) -> None:
    for thread in ["b", "a", "a%", "a_1", "ab", "z"]:
        await backend.put(thread, "k", b"v")
    assert [t async for t in backend.list_threads()] == ["a", "a%", "a_1", "ab", "b", "z"]
    assert [t async for t in backend.list_threads("a_")] == ["a_1"]
    await backend.delete_thread("z")
    assert [t async for t in backend.list_threads("z")] == []


async def test_delete_prefix_and_thread_are_exact(backend: MongoBackend) -> None:
    for key in ["run:1", "run:2", "run%", "ruN", "other"]:
        await backend.put("t", key, b"v")
    await backend.put("t2", "run:1", b"v")
    assert await backend.delete_prefix("t", "run:") == 2
    assert await _keys(backend, "t") == ["other", "ruN", "run%"]
    assert await backend.delete_thread("t") == 3
    assert await _keys(backend, "t") == []
    assert await _keys(backend, "t2") == ["run:1"]


async def test_largest_declared_value_round_trips_and_commits(backend: MongoBackend) -> None:
    big = bytes(range(256)) * (MAX_VALUE_BYTES // 256)
    assert len(big) == MAX_VALUE_BYTES
    await backend.put("t", "big", big)
    assert await backend.get("t", "big") == big
    assert await backend.commit("t", [("rec", big)], "head", big, 1) is True
    assert await backend.get_many("t", ["rec", "head"]) == [big, big]


# -- commit --------------------------------------------------------------------------


@pytest.fixture(params=["backend", "ordered_backend"])
def any_backend(request: pytest.FixtureRequest) -> MongoBackend:
    b: MongoBackend = request.getfixturevalue(request.param)
    return b


async def test_commit_moves_the_head_only_forward(any_backend: MongoBackend) -> None:
    b = any_backend
    assert await b.commit("t", [("r1", b"1")], "head", b"h1", 1) is True
    assert await b.commit("t", [("r3", b"3")], "head", b"h3", 3) is True
    assert await b.commit("t", [], "head", b"h3bis", 3) is False
    assert await b.get("t", "head") == b"h3"
    assert await b.commit("t", [("r4", b"4")], "head", b"h4", 4) is True
    assert await b.get_many("t", ["r1", "r3", "r4", "head"]) == [b"1", b"3", b"4", b"h4"]


async def test_seq_is_kept_beside_the_value(
    any_backend: MongoBackend, raw: AsyncCollection[Doc]
) -> None:
    big_seq = (7 << 32) | 5
    assert await any_backend.commit("t", [("r", b"x")], "head", b"{not parsed}", big_seq)
    head = await raw.find_one({"key": "head"})
    record = await raw.find_one({"key": "r"})
    assert head is not None
    assert record is not None
    assert head["seq"] == big_seq
    assert "seq" not in record
    assert await any_backend.commit("t", [], "head", b"h", big_seq - 1) is False


async def test_stale_commit_writes_nothing_in_a_transaction(
    backend: MongoBackend, raw: AsyncCollection[Doc]
) -> None:
    if not backend.capabilities.fenced_commit:
        pytest.fail("the session's server must support transactions (SecantusDB does)")
    assert await backend.commit("t", [("r", b"new")], "head", b"h10", 10)
    # A stale writer (lower seq) with records under new and existing keys.
    assert await backend.commit("t", [("r", b"zombie"), ("r-z", b"z")], "head", b"h5", 5) is False
    assert await backend.get("t", "r") == b"new"
    assert await backend.get("t", "r-z") is None
    assert await raw.count_documents({}) == 2


async def test_stale_commit_after_a_precheck_writes_nothing_without_transactions(
    ordered_backend: MongoBackend,
) -> None:
    b = ordered_backend
    assert not b.capabilities.atomic_commit
    assert not b.capabilities.fenced_commit
    assert await b.commit("t", [("r", b"new")], "head", b"h10", 10)
    assert await b.commit("t", [("r", b"zombie")], "head", b"h5", 5) is False
    assert await b.get("t", "r") == b"new"  # refused by the pre-check, before any write


async def test_head_written_by_put_counts_as_lowest(any_backend: MongoBackend) -> None:
    await any_backend.put("t", "head", b"plain")
    assert await any_backend.commit("t", [], "head", b"h0", 0) is True
    await any_backend.put("t", "head", b"plain again")  # put drops the seq
    assert await any_backend.commit("t", [], "head", b"h-1", -1) is True
    assert await any_backend.get("t", "head") == b"h-1"


async def test_seq_outside_int64_is_refused(backend: MongoBackend) -> None:
    with pytest.raises(ValueError, match="64-bit"):
        await backend.commit("t", [], "head", b"h", 1 << 63)
    assert await backend.get("t", "head") is None


async def test_concurrent_commits_keep_the_highest_seq(any_backend: MongoBackend) -> None:
    b = any_backend
    seqs = list(range(1, 41))
    results = await asyncio.gather(
        *(b.commit("t", [(f"r{s}", b"%d" % s)], "head", b"h%d" % s, s) for s in reversed(seqs))
    )
    assert results[0] is True  # seq 40 went first and nothing can beat it
    assert await b.get("t", "head") == b"h40"
    # Every commit that returned True left its record.
    for seq, won in zip(reversed(seqs), results, strict=True):
        if won:
            assert await b.get("t", f"r{seq}") == b"%d" % seq


async def test_racing_committers_of_one_head_never_go_backwards(backend: MongoBackend) -> None:
    async def writer(base: int) -> None:
        for i in range(15):
            seq = i * 10 + base
            await backend.commit("t", [(f"r{seq}", b"x")], "head", b"%d" % seq, seq)

    await asyncio.gather(*(writer(base) for base in range(1, 6)))
    assert await backend.get("t", "head") == b"145"


async def test_store_facade_roundtrip_and_stale_writer(
    mongodb_server: ServerInfo, collection_name: str, raw: AsyncCollection[Doc]
) -> None:
    from checkpoint_stores.errors import StaleWriterError

    async with open_store(mongodb_server.url, collection=collection_name) as store:
        cp = Checkpoint(
            run_id="r1", thread_id="th/1", seq=2, step=1, phase=Phase.PRE_LLM, payload={}
        )
        await store.append(cp)
        assert (await store.latest("th/1", "r1")).seq == 2
        with pytest.raises(StaleWriterError):
            await store.append(cp.model_copy(update={"seq": 1}))
        await store.put_state("th/1", "custom", {"x": [1, "\x00"]})
        assert await store.get_state("th/1", "custom") == {"x": [1, "\x00"]}


# -- damage below the SPI ------------------------------------------------------------


async def test_a_damaged_document_raises_corruption(
    backend: MongoBackend, raw: AsyncCollection[Doc]
) -> None:
    await backend.put("t", "k", b"v")
    await raw.update_one({"key": "k"}, {"$set": {"value": "not binary"}})
    with pytest.raises(AgentCheckpointCorruptionError, match="changed outside"):
        await backend.get("t", "k")
    with pytest.raises(AgentCheckpointCorruptionError):
        await backend.get_many("t", ["k"])
    with pytest.raises(AgentCheckpointCorruptionError):
        _ = [item async for item in backend.list("t")]
    await raw.update_one({"key": "k"}, {"$unset": {"value": ""}})
    with pytest.raises(AgentCheckpointCorruptionError):
        await backend.get("t", "k")


async def test_truncated_value_is_caught_by_the_codec(
    mongodb_server: ServerInfo, collection_name: str, raw: AsyncCollection[Doc]
) -> None:
    async with open_store(mongodb_server.url, collection=collection_name) as store:
        await store.put_state("t", "k", {"a": "b" * 100})
        doc = await raw.find_one({"key": "k"})
        assert doc is not None
        await raw.update_one({"key": "k"}, {"$set": {"value": doc["value"][:-7]}})
        with pytest.raises(AgentCheckpointCorruptionError):
            await store.get_state("t", "k")


# -- TTL -----------------------------------------------------------------------------


async def test_expire_prefix_hands_keys_to_the_ttl_monitor(
    backend: MongoBackend, raw: AsyncCollection[Doc]
) -> None:
    for key in ["run:1", "run:2", "keep"]:
        await backend.put("t", key, b"v")
    assert await backend.expire_prefix("t", "run:", 0) == 2
    assert await raw.count_documents({"expires_at": {"$exists": True}}) == 2
    # A key written again is not expired with the others.
    await backend.put("t", "run:2", b"rewritten")
    # The TTL monitor runs every second on the session's SecantusDB (every 60 s on mongod).
    for _ in range(200):
        if await backend.get("t", "run:1") is None:
            break
        await asyncio.sleep(0.1)
    assert await backend.get("t", "run:1") is None
    assert await _keys(backend, "t") == ["keep", "run:2"]


async def test_expire_prefix_validates_ttl(backend: MongoBackend) -> None:
    with pytest.raises(ValueError, match="finite"):
        await backend.expire_prefix("t", "", -1)
    with pytest.raises(ValueError, match="finite"):
        await backend.expire_prefix("t", "", float("nan"))


async def test_expiry_in_the_future_keeps_the_key(
    backend: MongoBackend, raw: AsyncCollection[Doc]
) -> None:
    await backend.put("t", "k", b"v")
    assert await backend.expire_prefix("t", "", 3600) == 1
    doc = await raw.find_one({"key": "k"})
    assert doc is not None
    assert doc["expires_at"] is not None
    assert await backend.get("t", "k") == b"v"


# -- unreachable server --------------------------------------------------------------


async def test_unreachable_server_is_a_clear_error_without_the_password() -> None:
    port = free_port()  # nothing listens there
    url = f"mongodb://app:hunter2@127.0.0.1:{port}/db?serverSelectionTimeoutMS=300"
    b = MongoBackend(url)
    with pytest.raises(StoreUnavailableError) as info:
        await b.get("t", "k")
    message = str(info.value)
    assert "hunter2" not in message
    assert "app:***@127.0.0.1" in message
    assert "unreachable" in message
    assert "hunter2" not in repr(b)
    await b.close()


async def test_bad_url_is_a_value_error_without_the_password() -> None:
    for url in ("mongodb://app:hun@ter2@127.0.0.1:1/db", "mongodb://app:hun@ter2@/db"):
        b = MongoBackend(url)
        with pytest.raises(ValueError, match="cannot use MongoDB URL") as info:
            await b.setup()
        assert "hun@ter2" not in str(info.value)
        assert "ter2" not in repr(b)


# -- transient errors injected by the server ------------------------------------------


class _FailedCommands(monitoring.CommandListener):
    """Names of the commands the server failed, in order."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        pass

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        # An abort after a failed statement finds no transaction: not what we count.
        if event.command_name != "abortTransaction":
            self.names.append(event.command_name)


async def _fail_point(client: AsyncMongoClient[Doc], mode: Any, data: Doc) -> None:
    await client.admin.command({"configureFailPoint": "failCommand", "mode": mode, "data": data})


async def test_transient_transaction_errors_are_retried(
    mongodb_server: ServerInfo, collection_name: str, raw: AsyncCollection[Doc]
) -> None:
    app = f"cs-{uuid.uuid4().hex[:8]}"
    failures = _FailedCommands()
    b = MongoBackend(
        mongodb_server.url, collection=collection_name, appname=app, event_listeners=[failures]
    )
    await b.setup()
    if not b.capabilities.atomic_commit:
        pytest.fail("the session's server must support transactions (SecantusDB does)")
    admin: AsyncMongoClient[Doc] = AsyncMongoClient(mongodb_server.url)
    try:
        # A write conflict on the first two attempts, as a concurrent committer would cause.
        await _fail_point(
            admin,
            {"times": 2},
            {
                "failCommands": ["update"],
                "errorCode": 112,
                "errorLabels": ["TransientTransactionError"],
                "appName": app,
            },
        )
        assert await b.commit("t", [("r", b"1")], "head", b"h", 1) is True
        assert failures.names == ["update", "update"]  # the fail point did fire
        assert await b.get_many("t", ["r", "head"]) == [b"1", b"h"]
        # The commit's outcome is unknown once; committing again is idempotent.
        await _fail_point(
            admin,
            {"times": 2},
            {
                "failCommands": ["commitTransaction"],
                "errorCode": 50,  # MaxTimeMSExpired: the outcome is unknown
                "errorLabels": ["UnknownTransactionCommitResult"],
                "appName": app,
            },
        )
        assert await b.commit("t", [("r2", b"2")], "head", b"h2", 2) is True
        assert failures.names[2:] == ["commitTransaction", "commitTransaction"]
        assert await b.get_many("t", ["r2", "head"]) == [b"2", b"h2"]
        # A non-transient failure is not retried and is reported, with nothing written.
        await _fail_point(
            admin,
            {"times": 1},
            {"failCommands": ["update"], "errorCode": 13, "appName": app},  # Unauthorized
        )
        with pytest.raises(StoreUnavailableError, match="refused"):
            await b.commit("t", [("r3", b"3")], "head", b"h3", 3)
        assert await b.get_many("t", ["r3", "head"]) == [None, b"h2"]
    finally:
        await _fail_point(admin, "off", {})
        await admin.close()
        await b.close()


# -- a standalone server: no transactions -------------------------------------------


_STANDALONE_CHILD = """
import signal, sys, threading
from secantus import SecantusDBServer
server = SecantusDBServer("127.0.0.1", int(sys.argv[1]), sys.argv[2], replica_set_name=None)
server.start()
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
stop.wait()
server.stop()
"""


@pytest.fixture(scope="module")
def standalone_url(mongodb_server: ServerInfo, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A SecantusDB that advertises itself as standalone (no ``setName``)."""
    if "SecantusDB" not in mongodb_server.description:
        pytest.skip("standalone detection is checked against SecantusDB started by the session")
    from tests.support import child_process, python_child, wait_port

    root = tmp_path_factory.mktemp("secantus-standalone")
    port = free_port()
    args = python_child(_STANDALONE_CHILD, str(port), str(root / "data"))
    with child_process(args, log=root / "log", cwd=root):
        wait_port("127.0.0.1", port, timeout=60)
        yield f"mongodb://127.0.0.1:{port}/standalone?serverSelectionTimeoutMS=10000"


async def test_standalone_server_is_detected(standalone_url: str) -> None:
    b = MongoBackend(standalone_url)
    await b.setup()
    try:
        assert b.capabilities.atomic_commit is False
        assert b.capabilities.fenced_commit is False
        assert "no transactions" in b.capabilities.notes
        assert await b.commit("t", [("r", b"1")], "head", b"h", 2) is True
        assert await b.commit("t", [("r", b"0")], "head", b"h", 1) is False
    finally:
        await b.close()
    forced = MongoBackend(standalone_url, transactions="on")
    with pytest.raises(StoreUnavailableError, match="standalone"):
        await forced.setup()
    await forced.close()


# -- a writer killed inside its transaction ------------------------------------------

_ORPHAN_CHILD = """
import sys, time
from pymongo import MongoClient
client = MongoClient(sys.argv[1])
coll = client.get_default_database()[sys.argv[2]]
session = client.start_session()
session.start_transaction()
coll.replace_one({"_id": sys.argv[3]}, {"_id": sys.argv[3], "value": b"orphan"}, upsert=True,
                 session=session)
print("in transaction", flush=True)
time.sleep(600)
"""


async def _leave_orphan_transaction(url: str, collection: str, doc_id: str) -> None:
    """A child process writes ``doc_id`` in a transaction and is SIGKILLed before committing."""
    import sys

    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _ORPHAN_CHILD,
        url,
        collection,
        doc_id,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        assert await asyncio.wait_for(proc.stdout.readline(), 60) == b"in transaction\n"
    finally:
        proc.kill()  # SIGKILL: the transaction stays open on the server
        await proc.wait()


async def test_a_writer_killed_inside_its_transaction_delays_but_never_blocks_others(
    mongodb_server: ServerInfo, collection_name: str, raw: AsyncCollection[Doc]
) -> None:
    from checkpoint_stores.backends.mongodb import _doc_id

    if "SecantusDB" not in mongodb_server.description:
        pytest.skip("needs the session's SecantusDB (5 s transaction lifetime)")
    url = mongodb_server.url
    b = MongoBackend(url, collection=collection_name)
    await b.put("t", "head", b"plain")
    await b.put("t", "r0", b"x")
    await _leave_orphan_transaction(url, collection_name, _doc_id("t", "head"))
    impatient = MongoBackend(url, collection=collection_name, commit_retry_seconds=0.5)
    with pytest.raises(StoreUnavailableError, match="WriteConflict"):
        await impatient.commit("t", [("r", b"x")], "head", b"h", 1)
    await impatient.close()
    assert await b.get_many("t", ["r", "head"]) == [None, b"plain"]
    # The default waits until the server aborts the dead writer's transaction.
    assert await asyncio.wait_for(b.commit("t", [("r", b"1")], "head", b"h1", 1), 60) is True
    assert await b.get_many("t", ["r", "head"]) == [b"1", b"h1"]
    # Deletes run in transactions too: they wait for the dead one to be aborted instead
    # of blocking inside the server (forever, on SecantusDB, without other transactions).
    await _leave_orphan_transaction(url, collection_name, _doc_id("t", "head"))
    assert await asyncio.wait_for(b.delete_thread("t"), 60) == 3
    assert await _keys(b, "t") == []
    await b.close()


async def test_bulk_deletes_and_expiry_work_in_chunks(
    any_backend: MongoBackend, raw: AsyncCollection[Doc]
) -> None:
    from checkpoint_stores.backends.mongodb import _doc_id

    keys = [f"run:{i:05d}" for i in range(2500)]
    docs = [{"_id": _doc_id("t", k), "thread": "t", "key": k, "value": b"v"} for k in keys]
    await raw.insert_many([*docs, {"_id": _doc_id("t", "other"), "thread": "t", "key": "other"}])
    assert await any_backend.expire_prefix("t", "run:", 3600) == 2500
    assert await raw.count_documents({"expires_at": {"$exists": True}}) == 2500
    assert await any_backend.delete_prefix("t", "run:01") == 1000
    assert await any_backend.delete_prefix("t", "run:") == 1500
    assert await any_backend.delete_thread("t") == 1
    assert await raw.count_documents({}) == 0


class _StartedCommands(monitoring.CommandListener):
    """Names of the commands the client sent, in order."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.names.append(event.command_name)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


async def test_stopping_a_listing_early_closes_its_cursor(
    mongodb_server: ServerInfo, collection_name: str, raw: AsyncCollection[Doc]
) -> None:
    sent = _StartedCommands()
    b = MongoBackend(mongodb_server.url, collection=collection_name, event_listeners=[sent])
    for i in range(300):  # more than one batch, so a cursor stays open on the server
        await b.put("t", f"k{i:03d}", b"v")
    listing = b.list("t")
    assert await anext(listing) == ("k000", b"v")
    sent.names.clear()
    await listing.aclose()
    assert sent.names == ["killCursors"]
    assert await _keys(b, "t", "k29") == [f"k29{i}" for i in range(10)]
    await b.close()
