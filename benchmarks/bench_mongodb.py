"""MongoDB: the backend and the store against raw PyMongo async doing the same work.

Server: ``CHECKPOINT_STORES_TEST_MONGODB_URL`` if set (a real ``mongod``),
else a SecantusDB started here in a child process on a free loopback port
(stopped at the end). Both sides use the same write concern (``majority``,
journaled), read concern (``majority``), document shape and indexes; the raw
side runs the same transaction (or the same ordered bulk write) by hand.

Compared, per operation:

* ``commit``: ``backend.commit`` (record + seq-guarded head) vs the raw transaction;
* ``append``: ``MemoryStore.append`` (encode + commit) vs the raw transaction;
* ``get``: ``backend.get`` of the head vs ``find_one`` by ``_id``;
* ``latest()``: ``MemoryStore.latest`` (get + decode + validate) vs ``find_one``.

Run: ``python -m benchmarks mongodb``.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import itertools
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

from benchmarks._harness import Report, Unavailable, compare

_CHILD = """
import signal, sys, threading
from secantus import SecantusDBServer
server = SecantusDBServer("127.0.0.1", int(sys.argv[1]), sys.argv[2])
server.start()
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
stop.wait()
server.stop()
"""


@contextlib.contextmanager
def _server() -> Iterator[tuple[str, str]]:
    """``(url, description)`` of the server to measure against."""
    external = os.environ.get("CHECKPOINT_STORES_TEST_MONGODB_URL", "").strip()
    if external:
        from checkpoint_stores.urls import redact_url

        yield external, f"MongoDB at {redact_url(external)}"
        return
    try:
        version = importlib.metadata.version("secantusdb")
    except importlib.metadata.PackageNotFoundError:
        raise Unavailable(
            "no server: set CHECKPOINT_STORES_TEST_MONGODB_URL or pip install secantusdb"
        ) from None
    from tests.support import free_port, wait_port

    with tempfile.TemporaryDirectory(prefix="bench-mongodb-") as root:
        port = free_port()
        with open(os.path.join(root, "log"), "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-c", _CHILD, str(port), os.path.join(root, "data")],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_port("127.0.0.1", port, timeout=60)
            yield (
                f"mongodb://127.0.0.1:{port}/?serverSelectionTimeoutMS=10000",
                f"SecantusDB {version} (child process, single-node replica set) on port {port}",
            )
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


async def main(report: Report) -> None:
    """Run the comparisons (raises Unavailable without a server or driver)."""
    try:
        from pymongo import AsyncMongoClient, ReplaceOne
        from pymongo.read_concern import ReadConcern
        from pymongo.write_concern import WriteConcern
    except ImportError as exc:
        raise Unavailable(f"pymongo is not installed ({exc})") from None
    from checkpoint_stores import Checkpoint, MemoryStore, Phase
    from checkpoint_stores.backends.mongodb import MongoBackend
    from checkpoint_stores.keys import checkpoint_key, checkpoint_latest_key

    with _server() as (url, description):
        report.console.print(f"  server: {description}")
        database = f"bench_{uuid.uuid4().hex[:8]}"
        backend = MongoBackend(url, database=database, collection="ours")
        try:
            await backend.setup()
        except Exception as exc:
            raise Unavailable(f"cannot reach {description}: {exc}") from None
        store = MemoryStore(backend)
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url)
        write_concern = WriteConcern(w="majority", j=True)
        read_concern = ReadConcern("majority")
        raw = client.get_database(database).get_collection(
            "raw", write_concern=write_concern, read_concern=read_concern
        )
        await raw.create_index([("thread", 1), ("key", 1)], name="thread_key")
        await raw.create_index(
            "expires_at", name="expires_at_ttl", expireAfterSeconds=0, sparse=True
        )
        transactions = backend.capabilities.atomic_commit
        report.console.print(f"  transactions: {transactions}")

        thread, run_id = "bench-thread", "bench-run"
        head_key = checkpoint_latest_key(run_id)
        sample = Checkpoint(
            run_id=run_id,
            thread_id=thread,
            seq=1,
            step=1,
            phase=Phase.POST_LLM,
            payload={"messages": [{"role": "assistant", "content": "x" * 600}], "usage": {"n": 1}},
        )
        value = store.encode_checkpoint(sample)
        seqs = itertools.count(1)

        def doc(key: str, data: bytes) -> dict[str, Any]:
            return {
                "_id": f"{len(thread)}:{thread}:{key}",
                "thread": thread,
                "key": key,
                "value": data,
            }

        async def raw_commit() -> None:
            seq = next(seqs)
            key = checkpoint_key(run_id, seq, "post_llm")
            head = doc(head_key, value) | {"seq": seq}
            guard = {"_id": head["_id"], "$or": [{"seq": {"$lt": seq}}, {"seq": None}]}
            ops = [
                ReplaceOne({"_id": doc(key, value)["_id"]}, doc(key, value), upsert=True),
                ReplaceOne(guard, head, upsert=True),
            ]
            if not transactions:
                await raw.bulk_write(ops, ordered=True)
                return
            async with client.start_session(causal_consistency=False) as session:
                await session.start_transaction(
                    read_concern=read_concern, write_concern=write_concern
                )
                await raw.bulk_write(ops, ordered=True, session=session)
                await session.commit_transaction()

        async def our_commit() -> None:
            seq = next(seqs)
            key = checkpoint_key(run_id, seq, "post_llm")
            assert await backend.commit(thread, [(key, value)], head_key, value, seq)

        async def our_append() -> None:
            seq = next(seqs)
            await store.append(sample.model_copy(update={"seq": seq, "step": seq}))

        await compare(report, "mongodb", "commit (backend)", our_commit, raw_commit, ops=100)
        await compare(report, "mongodb", "append (store)", our_append, raw_commit, ops=100)

        head_id = doc(head_key, b"")["_id"]

        async def raw_get() -> None:
            found = await raw.find_one({"_id": head_id}, {"value": 1})
            assert found is not None

        async def our_get() -> None:
            assert await backend.get(thread, head_key) is not None

        async def our_latest() -> None:
            await store.latest(thread, run_id)

        await compare(report, "mongodb", "get (backend)", our_get, raw_get, ops=200)
        await compare(report, "mongodb", "latest() (store)", our_latest, raw_get, ops=200)

        await client.drop_database(database)
        await client.close()
        await backend.close()
