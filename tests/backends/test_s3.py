"""The s3:// backend against a real S3 API over HTTP (moto, or ``CHECKPOINT_STORES_TEST_S3_URL``).

SPI behaviour, the object-name encoding (order, prefixes, hashing of long ids),
the compare-and-swap paths of ``commit`` and ``create`` (lost races, retried
requests that landed), corruption detection, options, and error mapping.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from checkpoint_stores import (
    AgentCheckpointCorruptionError,
    Checkpoint,
    InvalidIdentifierError,
    Phase,
    StaleWriterError,
    StoreUnavailableError,
    open_backend,
    open_store,
)
from checkpoint_stores.backends.s3 import S3Backend
from tests.faultproxy import FaultProxy
from tests.servers.s3 import MOTO_CREDENTIALS, start_moto
from tests.support import ServerInfo, free_port

pytestmark = pytest.mark.s3

SECRET = "sekrit-Value-0123456789"


def _fresh() -> str:
    return f"t-{uuid.uuid4().hex}"


@pytest.fixture
async def backend(s3_server: ServerInfo) -> AsyncIterator[S3Backend]:
    b = open_backend(s3_server.url, **s3_server.options)
    assert isinstance(b, S3Backend)
    await b.setup()
    try:
        yield b
    finally:
        await b.close()


@pytest.fixture
async def raw(backend: S3Backend) -> AsyncIterator[Any]:
    """A plain aiobotocore client on the same bucket (for damage and inspection)."""
    from aiobotocore.session import get_session

    async with get_session().create_client(
        "s3",
        endpoint_url=backend._endpoint,
        region_name=backend._client.meta.region_name,
        **backend._secrets,
    ) as client:
        yield client


async def _items(b: S3Backend, thread: str, prefix: str = "") -> list[tuple[str, bytes]]:
    return [item async for item in b.list(thread, prefix)]


# -- basic SPI ---------------------------------------------------------------------


async def test_put_get_roundtrip_and_overwrite(backend: S3Backend) -> None:
    thread = _fresh()
    assert await backend.get(thread, "k") is None
    await backend.put(thread, "k", b"one")
    assert await backend.get(thread, "k") == b"one"
    await backend.put(thread, "k", b"")
    assert await backend.get(thread, "k") == b""
    await backend.put(thread, "k", bytes(range(256)) * 10)
    assert await backend.get(thread, "k") == bytes(range(256)) * 10


async def test_get_many_keeps_order_and_missing(backend: S3Backend) -> None:
    thread = _fresh()
    for i in range(5):
        await backend.put(thread, f"k{i}", f"v{i}".encode())
    keys = ["k3", "nope", "k0", "k4", "k3"]
    assert await backend.get_many(thread, keys) == [b"v3", None, b"v0", b"v4", b"v3"]
    assert await backend.get_many(thread, []) == []


async def test_create_is_first_writer_wins(backend: S3Backend) -> None:
    thread = _fresh()
    assert await backend.create(thread, "intent", b"first") is True
    assert await backend.create(thread, "intent", b"second") is False
    assert await backend.get(thread, "intent") == b"first"


async def test_create_race_has_exactly_one_winner(
    backend: S3Backend, s3_server: ServerInfo
) -> None:
    thread = _fresh()
    others = [open_backend(s3_server.url, **s3_server.options) for _ in range(3)]
    try:
        stores = [backend, *others]
        results = await asyncio.gather(
            *(stores[i % 4].create(thread, "intent", f"w{i}".encode()) for i in range(24))
        )
        assert results.count(True) == 1
        winner = results.index(True)
        assert await backend.get(thread, "intent") == f"w{winner}".encode()
    finally:
        for other in others:
            await other.close()


async def test_commit_moves_head_forward_only(backend: S3Backend) -> None:
    thread = _fresh()
    assert await backend.commit(thread, [("r:1", b"a")], "head", b"h1", 1) is True
    assert await backend.commit(thread, [("r:3", b"c")], "head", b"h3", 3) is True
    # Stale and equal seqs are refused and write nothing (detected before any write).
    assert await backend.commit(thread, [("r:2", b"b")], "head", b"h2", 2) is False
    assert await backend.commit(thread, [("r:3b", b"x")], "head", b"h3b", 3) is False
    assert await backend.get(thread, "head") == b"h3"
    assert await backend.get(thread, "r:2") is None
    assert await backend.get(thread, "r:3b") is None
    assert [k for k, _ in await _items(backend, thread)] == ["head", "r:1", "r:3"]


async def test_head_written_by_put_counts_as_lowest(backend: S3Backend) -> None:
    thread = _fresh()
    await backend.put(thread, "head", b"plain")
    assert await backend.commit(thread, [], "head", b"h1", 1) is True
    assert await backend.get(thread, "head") == b"h1"
    await backend.put(thread, "head", b"plain again")
    assert await backend.commit(thread, [], "head", b"h0", 0) is True


async def test_same_bytes_get_different_etags(backend: S3Backend, raw: Any) -> None:
    """The write id in every body defeats ABA: an If-Match on an old ETag cannot match a rewrite."""
    thread = _fresh()
    name = backend._object(thread, "k")
    await backend.put(thread, "k", b"same")
    first = (await raw.head_object(Bucket=backend.bucket, Key=name))["ETag"]
    await backend.put(thread, "k", b"same")
    second = (await raw.head_object(Bucket=backend.bucket, Key=name))["ETag"]
    assert first != second


async def test_commit_keeps_seq_beside_the_value(backend: S3Backend, raw: Any) -> None:
    thread = _fresh()
    await backend.commit(thread, [], "head", b"{not json", 7)
    head = await raw.head_object(Bucket=backend.bucket, Key=backend._object(thread, "head"))
    assert head["Metadata"]["seq"] == "7"
    assert await backend.get(thread, "head") == b"{not json"


# -- lost races inside commit / create ---------------------------------------------


async def test_commit_loses_race_to_newer_writer_after_writing_records(
    backend: S3Backend, s3_server: ServerInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A newer writer moves the head between our HEAD and our swap: False, head untouched.

    Ordered, not atomic: our record object was written before the swap failed.
    """
    thread = _fresh()
    assert await backend.commit(thread, [], "head", b"h1", 1)
    rival = open_backend(s3_server.url, **s3_server.options)
    real_put = backend._put
    head_name = backend._object(thread, "head")
    fired = False

    async def put(name: str, body: bytes, **kw: Any) -> None:
        nonlocal fired
        if name == head_name and not fired:
            fired = True
            assert await rival.commit(thread, [], "head", b"h9", 9)
        await real_put(name, body, **kw)

    monkeypatch.setattr(backend, "_put", put)
    try:
        assert await backend.commit(thread, [("r:5", b"five")], "head", b"h5", 5) is False
    finally:
        await rival.close()
    assert fired
    assert await backend.get(thread, "head") == b"h9"
    assert await backend.get(thread, "r:5") == b"five"  # the documented leftover


async def test_commit_retries_swap_when_rival_wrote_a_lower_head(
    backend: S3Backend, s3_server: ServerInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    thread = _fresh()
    assert await backend.commit(thread, [], "head", b"h1", 1)
    rival = open_backend(s3_server.url, **s3_server.options)
    real_put = backend._put
    head_name = backend._object(thread, "head")
    calls = 0

    async def put(name: str, body: bytes, **kw: Any) -> None:
        nonlocal calls
        if name == head_name:
            calls += 1
            if calls == 1:  # a rival moves the head to seq 3 (< ours): our swap must retry
                assert await rival.commit(thread, [], "head", b"h3", 3)
        await real_put(name, body, **kw)

    monkeypatch.setattr(backend, "_put", put)
    try:
        assert await backend.commit(thread, [], "head", b"h5", 5) is True
    finally:
        await rival.close()
    assert calls == 2
    assert await backend.get(thread, "head") == b"h5"


async def test_commit_first_head_race(
    backend: S3Backend, s3_server: ServerInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both see no head; the rival creates it with a higher seq; If-None-Match makes us lose."""
    thread = _fresh()
    rival = open_backend(s3_server.url, **s3_server.options)
    real_put = backend._put
    head_name = backend._object(thread, "head")

    async def put(name: str, body: bytes, **kw: Any) -> None:
        if name == head_name and kw.get("IfNoneMatch") == "*":
            assert await rival.commit(thread, [], "head", b"h8", 8)
        await real_put(name, body, **kw)

    monkeypatch.setattr(backend, "_put", put)
    try:
        assert await backend.commit(thread, [], "head", b"h2", 2) is False
    finally:
        await rival.close()
    assert await backend.get(thread, "head") == b"h8"


async def test_commit_recognises_its_own_landed_retry(
    backend: S3Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """botocore retried our swap after it had landed; the retry's 412 must not read as a loss."""
    from checkpoint_stores.backends import s3 as s3_module

    thread = _fresh()
    assert await backend.commit(thread, [], "head", b"h1", 1)
    real_put = backend._put
    head_name = backend._object(thread, "head")
    landed = False

    async def put(name: str, body: bytes, **kw: Any) -> None:
        nonlocal landed
        await real_put(name, body, **kw)
        if name == head_name and not landed:
            landed = True
            raise s3_module._Lost(conflict=False)

    monkeypatch.setattr(backend, "_put", put)
    assert await backend.commit(thread, [], "head", b"h2", 2) is True
    assert await backend.get(thread, "head") == b"h2"


async def test_create_recognises_its_own_landed_retry(
    backend: S3Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from checkpoint_stores.backends import s3 as s3_module

    thread = _fresh()
    real_put = backend._put

    async def put(name: str, body: bytes, **kw: Any) -> None:
        await real_put(name, body, **kw)
        raise s3_module._Lost(conflict=False)

    monkeypatch.setattr(backend, "_put", put)
    assert await backend.create(thread, "intent", b"mine") is True
    monkeypatch.undo()
    assert await backend.create(thread, "intent", b"other") is False


# -- names: order, prefixes, hashing -------------------------------------------------

LONG = "L" * 250
ORDER_KEYS = [
    "a",
    "a\x00",
    "a\x00b",
    "a/b",
    "a%",
    "a_",
    "a*",
    "ab",
    "b",
    "checkpoint:r1:latest",
    "checkpoint:r1:1:pre_llm",
    "checkpoint:r1:10:pre_llm",
    "checkpoint:r10:latest",
    "\x7f",
    "\u00e9",
    "e\u0301",
    "\uffff",
    "\U0001f600",
    "\U0010ffff",
    "K" * 200,  # exactly the verbatim limit
    "K" * 200 + "a",  # hashed, shares the 200-byte head with the one above
    "K" * 200 + "\x00",
    "K" * 199 + "J" + "z",
    LONG + "2",
    LONG + "1",
    LONG,
    LONG + "10",
    "L" * 5000,
    "\u00e9" * 150,  # 300 UTF-8 bytes: hashed, cut inside no character boundary issue
    "\u00e9" * 149 + "\u00ea",
]


async def test_list_is_sorted_prefix_exact_and_lossless(backend: S3Backend) -> None:
    thread = _fresh()
    await backend._gather(backend.put(thread, k, k.encode()) for k in ORDER_KEYS)
    items = await _items(backend, thread)
    assert [k for k, _ in items] == sorted(ORDER_KEYS)
    assert all(v == k.encode() for k, v in items)
    for prefix in [
        "a",
        "a\x00",
        "a%",
        "a_",
        "a*",
        "checkpoint:r1:",
        "checkpoint:r1:1",
        "K" * 200,
        "K" * 199,
        LONG,
        LONG + "1",
        "L" * 201,
        "\u00e9" * 100,
        "\u00e9" * 149,
        "zzz",
        "\U0010ffff",
    ]:
        got = [k for k, _ in await _items(backend, thread, prefix)]
        assert got == sorted(k for k in ORDER_KEYS if k.startswith(prefix)), prefix


async def test_list_pages_and_batches_keep_order(s3_server: ServerInfo) -> None:
    """Several ListObjectsV2 pages and fetch batches; a hashed group straddles page boundaries."""
    b = S3Backend(s3_server.url, page_size=3, concurrency=2, **s3_server.options)
    thread = _fresh()
    group = [LONG + suffix for suffix in ("e", "a", "d", "b", "c", "ab")]
    keys = [f"k{i:03d}" for i in range(70)] + group + ["L" * 250]
    try:
        await b._gather(b.put(thread, k, k.encode()) for k in keys)
        items = [item async for item in b.list(thread)]
        assert [k for k, _ in items] == sorted(keys)
        assert all(v == k.encode() for k, v in items)
        assert [k async for k, _ in b.list(thread, LONG + "a")] == [LONG + "a", LONG + "ab"]
        assert await b.delete_prefix(thread, "k01") == 10
        assert await b.delete_prefix(thread, LONG) == 7
        assert await b.delete_thread(thread) == 60
        tag = uuid.uuid4().hex
        threads = [tag + f"{i:02d}" for i in range(8)] + [tag + "T" * 120 + s for s in "cab"]
        for t in threads:
            await b.put(t, "k", b"v")
        assert [t async for t in b.list_threads(tag)] == sorted(threads)
        for t in threads:
            await b.delete_thread(t)
    finally:
        await b.close()


async def test_hostile_and_long_ids_roundtrip_without_collisions(
    backend: S3Backend, raw: Any
) -> None:
    ids = [
        "../",
        "..",
        ".",
        "a/b",
        "/abs",
        "\x00",
        "a\x00b",
        "{tag}",
        "*",
        "%",
        "%2e%2e%2f",
        "_",
        ":",
        " ",
        "new\nline",
        "CON",
        "\ufeffbom",
        "\U0010ffff",
        "T" * 96,
        "T" * 97,
        "T" * 96 + "\x00",
        "x" * (64 * 1024 - 32),  # with the 32-character tag: exactly the 64 KiB limit
        "\U0010ffff" * (16 * 1024 - 8),  # 4-byte characters up to the limit
    ]
    tag = uuid.uuid4().hex
    await backend._gather(
        backend.put(tag + thread_id, key, f"{len(thread_id)}|{len(key)}|{key[:3]}".encode())
        for thread_id in ids
        for key in ids
    )
    for thread_id in ids:
        thread = tag + thread_id
        items = await _items(backend, thread)
        assert [k for k, _ in items] == sorted(ids)
        for key, value in items:
            assert value == f"{len(thread_id)}|{len(key)}|{key[:3]}".encode()
    threads = [t async for t in backend.list_threads(tag)]
    assert threads == sorted(tag + t for t in ids)
    # Every object name fits S3's 1,024-byte key limit, even for 64 KiB ids.
    names: list[str] = []
    paginator = raw.get_paginator("list_objects_v2")
    async for page in paginator.paginate(Bucket=backend.bucket, Prefix=backend._root):
        names.extend(item["Key"] for item in page.get("Contents", ()))
    assert names
    assert max(len(n.encode()) for n in names) <= 1024
    for thread_id in ids:
        assert await backend.delete_thread(tag + thread_id) == len(ids)
    assert [t async for t in backend.list_threads(tag)] == []


async def test_list_threads_sorted_and_prefix_exact(backend: S3Backend) -> None:
    tag = uuid.uuid4().hex
    threads = [
        tag,
        tag + "%",
        tag + "_",
        tag + "a",
        tag + "a\x00",
        tag + "T" * 96,
        tag + "T" * 100,
        tag + "T" * 100 + "a",
        tag + "\U0010ffff",
    ]
    for thread in threads:
        await backend.put(thread, "k", b"v")
    assert [t async for t in backend.list_threads(tag)] == sorted(threads)
    assert [t async for t in backend.list_threads(tag + "T" * 97)] == sorted(
        t for t in threads if t.startswith(tag + "T" * 97)
    )
    assert [t async for t in backend.list_threads(tag + "%")] == [tag + "%"]
    await backend.delete(tag + "a", "k")
    assert tag + "a" not in [t async for t in backend.list_threads(tag)]
    for thread in threads:
        await backend.delete_thread(thread)


async def test_deletes_report_counts(backend: S3Backend) -> None:
    thread = _fresh()
    for key in ["a", "a%", "a_x", "ab", "b", LONG + "x", LONG + "y"]:
        await backend.put(thread, key, b"v")
    assert await backend.delete(thread, "b") is True
    assert await backend.delete(thread, "b") is False
    assert await backend.delete_prefix(thread, "a%") == 1
    assert await backend.delete_prefix(thread, "a_") == 1
    assert await backend.delete_prefix(thread, LONG + "x") == 1
    assert [k async for k, _ in backend.list(thread)] == [LONG + "y", "a", "ab"]
    assert await backend.delete_thread(thread) == 3
    assert await backend.delete_thread(thread) == 0


# -- corruption ---------------------------------------------------------------------


async def test_truncated_object_raises_corruption(backend: S3Backend, raw: Any) -> None:
    thread = _fresh()
    await backend.put(thread, "k", b"0123456789" * 10)
    name = backend._object(thread, "k")
    body = await (await raw.get_object(Bucket=backend.bucket, Key=name))["Body"].read()
    await raw.put_object(Bucket=backend.bucket, Key=name, Body=body[:-7])
    with pytest.raises(AgentCheckpointCorruptionError, match="truncated"):
        await backend.get(thread, "k")
    with pytest.raises(AgentCheckpointCorruptionError):
        await _items(backend, thread)


async def test_foreign_object_raises_corruption(backend: S3Backend, raw: Any) -> None:
    thread = _fresh()
    name = backend._object(thread, "k")
    await raw.put_object(Bucket=backend.bucket, Key=name, Body=b'{"run_id": "x"}')
    with pytest.raises(AgentCheckpointCorruptionError, match="not a checkpoint-stores object"):
        await backend.get(thread, "k")


async def test_object_copied_to_another_name_raises_corruption(
    backend: S3Backend, raw: Any
) -> None:
    thread = _fresh()
    await backend.put(thread, "a", b"value of a")
    await raw.copy_object(
        Bucket=backend.bucket,
        Key=backend._object(thread, "b"),
        CopySource={"Bucket": backend.bucket, "Key": backend._object(thread, "a")},
    )
    with pytest.raises(AgentCheckpointCorruptionError, match="not the one its name says"):
        await backend.get(thread, "b")
    with pytest.raises(AgentCheckpointCorruptionError):
        await _items(backend, thread)


async def test_damaged_seq_metadata_raises_corruption(backend: S3Backend, raw: Any) -> None:
    thread = _fresh()
    await backend.commit(thread, [], "head", b"h", 3)
    name = backend._object(thread, "head")
    body = await (await raw.get_object(Bucket=backend.bucket, Key=name))["Body"].read()
    await raw.put_object(Bucket=backend.bucket, Key=name, Body=body, Metadata={"seq": "x3"})
    with pytest.raises(AgentCheckpointCorruptionError, match="damaged seq"):
        await backend.commit(thread, [], "head", b"h4", 4)


async def test_foreign_names_under_the_prefix_are_ignored(backend: S3Backend, raw: Any) -> None:
    thread = _fresh()
    await backend.put(thread, "k", b"v")
    foreign = backend._thread_dir(thread) + "README.txt"
    await raw.put_object(Bucket=backend.bucket, Key=foreign, Body=b"hi")
    try:
        assert await _items(backend, thread) == [("k", b"v")]
        assert await backend.delete_thread(thread) == 1  # ours only
    finally:
        await raw.delete_object(Bucket=backend.bucket, Key=foreign)


# -- the facade on S3 -----------------------------------------------------------------


async def test_store_append_latest_and_stale_writer(s3_server: ServerInfo) -> None:
    thread = _fresh()
    async with open_store(s3_server.url, **s3_server.options) as store:
        for seq, phase in enumerate(
            [Phase.RUN_STARTED, Phase.STEP_STARTED, Phase.RUNTIME_STATE], 1
        ):
            await store.append(
                Checkpoint(
                    run_id="run-1", thread_id=thread, seq=seq, step=seq, phase=phase, payload={}
                )
            )
        latest = await store.latest(thread, "run-1")
        assert (latest.seq, latest.phase) == (3, Phase.RUNTIME_STATE)
        assert (await store.runtime_snapshot(thread, "run-1")) is not None
        with pytest.raises(StaleWriterError):
            await store.append(
                Checkpoint(
                    run_id="run-1", thread_id=thread, seq=2, step=9, phase=Phase.PRE_LLM, payload={}
                )
            )
        assert [cp.seq for cp in await store.history(thread, "run-1")] == [1, 2, 3]
        with pytest.raises(InvalidIdentifierError):
            await store.put_state("x" * (64 * 1024 + 1), "k", 1)


async def test_data_survives_close_and_reopen(s3_server: ServerInfo) -> None:
    thread = _fresh()
    first = open_backend(s3_server.url, **s3_server.options)
    await first.setup()
    await first.commit(thread, [("r", b"rec")], "head", b"h", 1)
    await first.close()
    second = open_backend(s3_server.url, **s3_server.options)
    try:
        assert await second.get(thread, "head") == b"h"  # first call sets up lazily
        assert await second.get(thread, "r") == b"rec"
    finally:
        await second.close()


# -- options, URLs, secrets ---------------------------------------------------------------


def test_url_query_options_and_repr_hide_secrets() -> None:
    b = S3Backend(
        f"s3://my-bucket/a/b?endpoint_url=http%3A%2F%2F127.0.0.1%3A9000&region=eu-west-1"
        f"&aws_secret_access_key={SECRET}&max_attempts=2",
        aws_access_key_id="AKIAEXAMPLE",
    )
    assert (b.bucket, b.prefix, b._root) == ("my-bucket", "a/b", "a/b/")
    assert b._endpoint == "http://127.0.0.1:9000"
    assert b._region == "eu-west-1"
    assert b._max_attempts == 2
    assert b._addressing_style == "path"
    assert SECRET not in repr(b)
    assert "AKIAEXAMPLE" not in repr(b)


@pytest.mark.parametrize(
    ("url", "options", "error", "match"),
    [
        ("s3://", {}, ValueError, "bucket name"),
        ("s3://user:pw@bucket/p", {}, ValueError, "credentials in an s3:// URL"),
        ("s3://bucket", {"colour": "red"}, TypeError, "colour"),
        ("s3://bucket", {"retry_mode": "eager"}, ValueError, "retry_mode"),
        ("s3://bucket", {"addressing_style": "sideways"}, ValueError, "addressing_style"),
        ("s3://bucket", {"create_bucket": "maybe"}, ValueError, "create_bucket"),
        ("s3://bucket/" + "p" * 300, {}, ValueError, "prefix"),
    ],
)
def test_bad_urls_and_options_say_what_to_do(
    url: str, options: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match) as info:
        S3Backend(url, **options)
    assert "pw" not in str(info.value)


async def test_unreachable_endpoint_is_store_unavailable_without_secrets() -> None:
    port = free_port()  # nothing listens there
    b = S3Backend(
        "s3://some-bucket/p",
        endpoint_url=f"http://127.0.0.1:{port}",
        aws_access_key_id="AKIAEXAMPLE",
        aws_secret_access_key=SECRET,
        max_attempts=1,
        connect_timeout=2,
    )
    with pytest.raises(StoreUnavailableError, match="cannot reach") as info:
        await b.setup()
    assert SECRET not in str(info.value)
    assert "AKIAEXAMPLE" not in str(info.value)
    assert f"127.0.0.1:{port}" in str(info.value)


async def test_missing_bucket_says_how_to_create_it(s3_server: ServerInfo) -> None:
    if "endpoint_url" not in s3_server.options:
        pytest.skip("creates buckets: moto only")
    options = dict(s3_server.options)
    bucket = f"missing-{uuid.uuid4().hex[:12]}"
    b = S3Backend(f"s3://{bucket}/p", **options)
    with pytest.raises(StoreUnavailableError, match="create_bucket=true"):
        await b.setup()
    created = S3Backend(f"s3://{bucket}/p", create_bucket=True, **options)
    try:
        await created.setup()
        await created.put("t", "k", b"v")
        assert await created.get("t", "k") == b"v"
    finally:
        await created.close()


async def test_layout_from_the_future_is_refused(
    backend: S3Backend, raw: Any, s3_server: ServerInfo
) -> None:
    base, sep, query = s3_server.url.partition("?")
    url = f"{base}/future-{uuid.uuid4().hex[:8]}{sep}{query}"
    other = S3Backend(url, **s3_server.options)
    marker = f"{other._root}.checkpoint-stores/layout"
    await raw.put_object(
        Bucket=backend.bucket, Key=marker, Body=b"checkpoint-stores s3 layout 99\n"
    )
    try:
        with pytest.raises(StoreUnavailableError, match="layout"):
            await other.setup()
    finally:
        await raw.delete_object(Bucket=backend.bucket, Key=marker)


async def test_blackholed_server_times_out_as_store_unavailable(s3_server: ServerInfo) -> None:
    endpoint = s3_server.options.get("endpoint_url")
    if not isinstance(endpoint, str):
        pytest.skip("needs the loopback moto server to put a fault proxy in front of")
    host, _, port = endpoint.removeprefix("http://").partition(":")
    with FaultProxy(host, int(port)) as proxy:
        options = {
            **s3_server.options,
            "endpoint_url": f"http://127.0.0.1:{proxy.port}",
            "max_attempts": 1,
            "read_timeout": 1,
            "connect_timeout": 1,
        }
        b = S3Backend(s3_server.url, **options)
        await b.setup()
        thread = _fresh()
        await b.put(thread, "k", b"v")
        proxy.blackhole = True
        proxy.cut()
        with pytest.raises(StoreUnavailableError, match="cannot reach"):
            await b.get(thread, "k")
        proxy.recover()
        assert await b.get(thread, "k") == b"v"
        await b.close()


async def test_server_that_ignores_conditional_writes_is_refused() -> None:
    """A server that drops If-None-Match / If-Match would let latest go backwards: setup says so."""
    server, endpoint, _ = start_moto(serialize_writes=False)
    try:
        from tests.servers.s3 import _create_bucket

        bucket = f"noconds-{uuid.uuid4().hex[:8]}"
        await _create_bucket(endpoint, bucket)
        # Strip the condition headers on their way into moto, like a server without the feature.
        app = server._server.app

        def stripping(environ: dict[str, Any], start_response: Any) -> Any:
            environ.pop("HTTP_IF_NONE_MATCH", None)
            environ.pop("HTTP_IF_MATCH", None)
            return app(environ, start_response)

        server._server.app = stripping
        b = S3Backend(f"s3://{bucket}/p", endpoint_url=endpoint, **MOTO_CREDENTIALS)
        with pytest.raises(StoreUnavailableError, match="ignored If-None-Match"):
            await b.setup()
        unchecked = S3Backend(
            f"s3://{bucket}/q",
            endpoint_url=endpoint,
            verify_conditional_writes=False,
            **MOTO_CREDENTIALS,
        )
        await unchecked.setup()  # the user opted out of the check
        await unchecked.close()
    finally:
        server.stop()
